/* Part of cpu.c, which includes it (one translation unit, one library): FP8/FP4 KV rounding, the
 * layouts around attention, attention itself. */

/* -- FP8 / FP4 KV simulation -------------------------------------------------------------- *
 * The same float32 operations as engine/qat.py, one row at a time (qat.py's docstring has the
 * why; tests/test_qat.py holds both to ds4's golden vectors bit for bit). In numpy these are
 * some fifteen passes over the array each, a quarter of a tiny model's prefill. Compiled
 * with -ffp-contract=off, so every product and sum rounds as numpy's do. */

static int32_t MIN_MANTISSA[256];  /* qat._ceil_log2_table(), handed over once at load */

void ds4_set_ceil_log2_table(const int32_t *table) { memcpy(MIN_MANTISSA, table, sizeof MIN_MANTISSA); }

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* 2^ceil(log2f(r)) for positive normal r (qat.pow2_ceil_log2) */
static inline float pow2_ceil_log2(float r) {
    const uint32_t bits = f2u(r), biased = (bits >> 23) & 0xFF, mant = bits & 0x7FFFFF;
    const uint32_t bump = (int32_t)mant >= MIN_MANTISSA[biased] && mant != 0;
    return u2f((biased + bump) << 23);
}

static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* qat._grid_round: nearest value with `mbits` mantissa bits, smallest normal exponent emin */
static inline float grid_round(float v, int mbits, int emin) {
    const float a = fabsf(v);
    int e = (int)((f2u(a) >> 23) & 0xFF) - 127;
    if (e < emin) e = emin;
    const float step = u2f((uint32_t)(e - mbits + 127) << 23);
    const float q = ((a / step + 12582912.0f) - 12582912.0f) * step;  /* qat._round_half_even */
    return v < 0 ? -q : q;
}

/* qat._block_round over one block of `n` values in place */
static void block_round(float *x, int64_t n, float qmax, float floor_, int mbits, int emin) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (!(amax >= floor_)) amax = floor_;
    const float scale = pow2_ceil_log2(amax / qmax);
    for (int64_t i = 0; i < n; i++)
        x[i] = grid_round(clampf(x[i] / scale, -qmax, qmax), mbits, emin) * scale;  /* qat's second clip is a no-op */
}

static inline float f16_round(float x) {
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
    return (float)(_Float16)x;
#endif
}

/* KV rows (rows, width): FP8 E4M3 in blocks of 64 on the first width - n_rot dims, then every
 * value to f16 (model._kv_round). In place. */
void ds4_kv_round(float *x, int64_t rows, int64_t width, int64_t n_rot) {
#pragma omp parallel for schedule(static) if (rows * width >= (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * width;
        for (int64_t b = 0; b + 64 <= width - n_rot; b += 64) block_round(row + b, 64, 448.0f, 1e-4f, 3, -6);
        for (int64_t i = 0; i < width; i++) row[i] = f16_round(row[i]);
    }
}

/* Indexer rows (rows, width), width a power of two: the Walsh-Hadamard butterfly in ds4's
 * order, times 1/sqrt(width), then FP4 E2M1 in blocks of 32 (qat.indexer_round). In place. */
void ds4_indexer_round(float *x, int64_t rows, int64_t width) {
    const float norm = (float)(1.0 / sqrt((double)width));
#pragma omp parallel for schedule(static) if (rows * width >= (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * width;
        for (int64_t h = 1; h < width; h *= 2)
            for (int64_t j = 0; j < width; j += 2 * h)
                for (int64_t k = j; k < j + h; k++) {
                    const float a = row[k], b = row[k + h];
                    row[k] = a + b;
                    row[k + h] = a - b;
                }
        for (int64_t i = 0; i < width; i++) row[i] *= norm;
        for (int64_t b = 0; b + 32 <= width; b += 32) block_round(row + b, 32, 6.0f, 6.0f * 0x1p-126f, 1, 0);
    }
}

/* -- query and output layouts around attention ------------------------------------------- *
 * The attention kernel wants each head's rows together (H, T, D); the projections produce
 * and consume tokens' rows (T, H*D). In numpy the per-head norm, RoPE and the two transposes
 * were ~10% of a Flash-width prefill (strided copies of 32 MB per layer, one core); here each
 * (head, token) row is read once and written once in its new place, on every core. The
 * arithmetic is model.rms_norm and Rope.apply's, product by product (no fused multiply-add),
 * except that the sum of squares is accumulated in double. */

/* dst = RoPE of src's last n_rot dims by (c, s) pairs, earlier dims copied; src scaled by
 * `scale` first (exactly as numpy rounds y = x * scale, then rotates y). */
static void rope_row(const float *src, float *dst, int64_t D, int64_t n_rot, const float *c, const float *s,
                     float scale, int scaled) {
    const int64_t d0 = D - n_rot;
    for (int64_t i = 0; i < d0; i++) dst[i] = scaled ? src[i] * scale : src[i];
    for (int64_t k = 0; k < n_rot / 2; k++) {
        const float a = scaled ? src[d0 + 2 * k] * scale : src[d0 + 2 * k];
        const float b = scaled ? src[d0 + 2 * k + 1] * scale : src[d0 + 2 * k + 1];
        dst[d0 + 2 * k] = a * c[k] - b * s[k];
        dst[d0 + 2 * k + 1] = a * s[k] + b * c[k];
    }
}

/* q (T, H*D) -> out (H, T, D): each head's row RMS-normalised without weight, then rotated
 * by the token's (cos, sin) rows (T, n_rot/2) (model._query). */
void ds4_queries(const float *q, int64_t T, int64_t H, int64_t D, int64_t n_rot, const float *cos_,
                 const float *sin_, float eps, float *out) {
#pragma omp parallel for schedule(static) if (T * H * D >= (1 << 16))
    for (int64_t ht = 0; ht < H * T; ht++) {
        const int64_t h = ht / T, t = ht % T;
        const float *src = q + (t * H + h) * D;
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) ss += (double)src[i] * src[i];
        const float r = 1.0f / sqrtf((float)ss / (float)D + eps);
        rope_row(src, out + ht * D, D, n_rot, cos_ + t * (n_rot / 2), sin_ + t * (n_rot / 2), r, 1);
    }
}

/* o (H, T, D) -> slabs (G, T, (H/G)*D): each head's output rotated back (RoPE by -sin), the
 * heads of group g side by side in slab g, the layout ds4_matmul_grouped reads. */
void ds4_unrotate(const float *o, int64_t T, int64_t H, int64_t D, int64_t n_rot, const float *cos_,
                  const float *sin_, int64_t G, float *slabs) {
    const int64_t hpg = H / G, half = n_rot / 2;
#pragma omp parallel for schedule(static) if (T * H * D >= (1 << 16))
    for (int64_t ht = 0; ht < H * T; ht++) {
        const int64_t h = ht / T, t = ht % T, g = h / hpg;
        float neg[256];  /* -sin, as Rope.apply(inverse=True) forms it; n_rot/2 <= 256 */
        for (int64_t k = 0; k < half; k++) neg[k] = -sin_[t * half + k];
        rope_row(o + ht * D, slabs + ((g * T + t) * hpg + (h - g * hpg)) * D, D, n_rot, cos_ + t * half, neg, 1.0f, 0);
    }
}

/* -- attention ----------------------------------------------------------------------------- *
 * Softmax attention with one learned sink logit per head over rows that are both keys and
 * values (kernels.reference.attend_mx): q (H, T, D), keys (N, D), mask (T, N) bytes (nonzero
 * = visible), sinks (H) -> out (H, T, D). Work items are (query, four heads): the four heads
 * share the query's visible rows, so each row is loaded once for four dot products and once
 * for four weighted sums, and only visible rows are touched (a prefill chunk's mask is mostly
 * empty). */

#if defined(__AVX2__) && defined(__FMA__)
/* e^x for x <= 0, eight lanes: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to
 * r^7 (truncation below 1e-8 relative), times 2^n through the exponent bits. Below -87 the
 * result is 0 (2^n would leave the normal range). Within 2 ulp of expf. */
static inline __m256 exp8_nonpos(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);   /* ln2, high bits */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);      /* ln2 - high */
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
}
#endif

/* p[0..n) = exp(p - m); returns their sum. n is padded to a multiple of 8 by the caller with
 * values far below m, which come out as 0. */
static float exp_shift_sum(float *p, int64_t n, float m) {
    float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (int64_t v = 0; v < n; v += 8) {
        const __m256 e = exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(p + v), _mm256_set1_ps(m)));
        _mm256_storeu_ps(p + v, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum8(acc);
#else
    for (int64_t v = 0; v < n; v++) sum += (p[v] = expf(p[v] - m));
#endif
    return sum;
}

int ds4_attend(const float *q, int64_t H, int64_t T, int64_t D, const float *keys, int64_t N,
               const uint8_t *mask, const float *sinks, float *out) {
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t groups = (H + 3) / 4, padded = (N + 7) / 8 * 8;
    int failed = 0;
#pragma omp parallel if (T * H * N * D >= (1 << 18))
    {
        int64_t *cols = malloc((size_t)(N + 1) * sizeof *cols);
        float *p = malloc((size_t)(4 * padded + 8) * sizeof *p), *scratch = malloc((size_t)D * sizeof *scratch);
        int64_t last = -1, nv = 0;
        if (!cols || !p || !scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t item = 0; item < T * groups; item++) {
            if (!cols || !p || !scratch) continue;  /* reported through `failed` */
            const int64_t t = item / groups, h0 = (item % groups) * 4, nh = H - h0 < 4 ? H - h0 : 4;
            if (t != last) {
                nv = 0;
                for (int64_t j = 0; j < N; j++)
                    if (mask[t * N + j]) cols[nv++] = j;
                last = t;
            }
            const int64_t nvp = (nv + 7) / 8 * 8;
            const float *qh[4];
            for (int i = 0; i < 4; i++) qh[i] = q + ((h0 + (i < nh ? i : 0)) * T + t) * D;
            for (int64_t v = 0; v < nv; v++) {
                float s[4];
                dot4p(qh[0], qh[1], qh[2], qh[3], D, keys + cols[v] * D, s);
                for (int i = 0; i < 4; i++) p[i * padded + v] = s[i] * scale;
            }
            float den[4] = {1.0f, 1.0f, 1.0f, 1.0f}, *o[4];
            for (int64_t i = 0; i < 4; i++) {
                float *pi = p + i * padded;
                o[i] = i < nh ? out + ((h0 + i) * T + t) * D : scratch;
                if (i >= nh) {  /* a missing head of the last group: zero weights, output discarded */
                    for (int64_t v = 0; v < nv; v++) pi[v] = 0.0f;
                    continue;
                }
                const float sink = sinks[h0 + i];
                float m = sink;
                for (int64_t v = 0; v < nv; v++) m = pi[v] > m ? pi[v] : m;
                for (int64_t v = nv; v < nvp; v++) pi[v] = -1e30f;
                den[i] = exp_shift_sum(pi, nvp, m) + expf(sink - m);
            }
            for (int i = 0; i < 4; i++)
                for (int64_t d = 0; d < D; d++) o[i][d] = 0.0f;
            for (int64_t v = 0; v < nv; v++) {
                const float *k = keys + cols[v] * D;
                const float e0 = p[v], e1 = p[padded + v], e2 = p[2 * padded + v], e3 = p[3 * padded + v];
                float *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
                for (int64_t d = 0; d < D; d++) {
                    const float kd = k[d];
                    o0[d] += e0 * kd; o1[d] += e1 * kd; o2[d] += e2 * kd; o3[d] += e3 * kd;
                }
            }
            for (int64_t i = 0; i < nh; i++)
                for (int64_t d = 0; d < D; d++) o[i][d] /= den[i];
        }
        free(cols);
        free(p);
        free(scratch);
    }
    return failed ? -2 : 0;
}
