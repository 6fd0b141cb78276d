/* Part of cpu.c, which includes it (one translation unit, one library): Dequantisers, float dot
 * products and the float matmul (cpu-exact, F16/F32 weights). */

/* -- dequantisers: one row of n elements (a whole number of blocks) ------------------------ */

static void deq_f32(const uint8_t *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void deq_f16(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
#endif
    for (; i < n; i++) dst[i] = h2f(rd16(src + 2 * i));
}

static void deq_q8_0(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
        const float d = h2f(rd16(src));
        const int8_t *q = (const int8_t *)(src + 2);
#if defined(__AVX2__)
        const __m256 dv = _mm256_set1_ps(d);
        for (int l = 0; l < 32; l += 8) {
            const __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + l)));
            _mm256_storeu_ps(dst + l, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), dv));
        }
#else
        for (int l = 0; l < 32; l++) dst[l] = (float)q[l] * d;
#endif
    }
}

static void deq_q2_k(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, src += 84, dst += 256) {
        const uint8_t *sc = src, *qs = src + 16;
        const float d = h2f(rd16(src + 80)), dmin = h2f(rd16(src + 82));
        /* element 128h + 32j + l: bits 2j of qs[32h + l]; scale group = element / 16 */
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int half = 0; half < 2; half++) {
                    const int g = 8 * h + 2 * j + half;
                    const float dl = d * (float)(sc[g] & 0xF), ml = dmin * (float)(sc[g] >> 4);
                    float *y = dst + 16 * g;
                    const uint8_t *q = qs + 32 * h + 16 * half;
#if defined(__AVX2__)
                    const __m256 dv = _mm256_set1_ps(dl), mv = _mm256_set1_ps(ml);
                    const __m128i bytes = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)q), _mm_cvtsi32_si128(2 * j)),
                                                        _mm_set1_epi8(3));
                    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
                    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(dv, lo), mv));
                    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(dv, hi), mv));
#else
                    for (int l = 0; l < 16; l++) y[l] = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
#endif
                }
    }
}

/* Q4_K packs eight 6-bit scales and minimums into 12 bytes. */
static inline void q4k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void deq_q4_k(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, src += 144, dst += 256) {
        const float d = h2f(rd16(src)), dmin = h2f(rd16(src + 2));
        const uint8_t *s = src + 4, *qs = src + 16;
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            q4k_scale_min(s, j, &sc, &mn);
            const float dl = d * (float)sc, ml = dmin * (float)mn;
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);  /* low nibbles: even sub-block, high: odd */
            float *y = dst + 32 * j;
#if defined(__AVX2__)
            const __m256 dv = _mm256_set1_ps(dl), mv = _mm256_set1_ps(ml);
            for (int l = 0; l < 32; l += 16) {
                const __m128i bytes = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(q + l)), _mm_cvtsi32_si128(shift)),
                                                    _mm_set1_epi8(0xF));
                const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
                _mm256_storeu_ps(y + l, _mm256_sub_ps(_mm256_mul_ps(dv, lo), mv));
                _mm256_storeu_ps(y + l + 8, _mm256_sub_ps(_mm256_mul_ps(dv, hi), mv));
            }
#else
            for (int l = 0; l < 32; l++) y[l] = dl * (float)((q[l] >> shift) & 0xF) - ml;
#endif
        }
    }
}

static void deq_iq2_xxs(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, src += 66, dst += 256) {
        const float d = h2f(rd16(src));
        for (int g = 0; g < 8; g++) {
            const uint8_t *a0 = src + 2 + 8 * g;
            uint32_t a1;
            memcpy(&a1, a0 + 4, 4);
            const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const float *grid = IQ2_GRID + 8 * a0[l];
                const float *sign = IQ2_SIGNS + 8 * ((a1 >> (7 * l)) & 127);
                float *y = dst + 32 * g + 8 * l;
#if defined(__AVX2__)
                _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(db), _mm256_loadu_ps(grid)),
                                                  _mm256_loadu_ps(sign)));
#else
                for (int k = 0; k < 8; k++) y[k] = db * grid[k] * sign[k];
#endif
            }
        }
    }
}

/* MXFP4: 32 values in 17 bytes, an E8M0 exponent e and 16 bytes of codes (value l in the low
 * nibble of byte l, value l + 16 in the high one). The scale is 2^(e-127), halved for the doubled
 * code values: the float with exponent field e - 1, or below e = 2 the subnormal 2^21 << e. No
 * integer path: the experts' products take float activations (cpu-exact arithmetic). */
static void deq_mxfp4(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 17, dst += 32) {
        const uint32_t e = src[0];
        const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
        float d;
        memcpy(&d, &bits, 4);
        for (int l = 0; l < 16; l++) {
            dst[l] = d * MXFP4_VALUES[src[1 + l] & 0xF];
            dst[l + 16] = d * MXFP4_VALUES[src[1 + l] >> 4];
        }
    }
}

typedef void (*deq_fn)(const uint8_t *, float *, int64_t);

static deq_fn dequantiser(int type) {
    switch (type) {
    case T_F32: return deq_f32;
    case T_F16: return deq_f16;
    case T_Q8_0: return deq_q8_0;
    case T_Q2_K: return deq_q2_k;
    case T_Q4_K: return deq_q4_k;
    case T_IQ2_XXS: return deq_iq2_xxs;
    case T_MXFP4: return deq_mxfp4;
    default: return 0;
    }
}

/* Dequantise `rows` rows of n elements each (row_bytes apart). Returns -1 on unknown type. */
int ds4_dequant(const uint8_t *src, int type, int64_t row_bytes, int64_t rows, int64_t n, float *dst) {
    deq_fn f = dequantiser(type);
    if (!f) return -1;
    for (int64_t r = 0; r < rows; r++) f(src + r * row_bytes, dst + r * n, n);
    return 0;
}

#if defined(__AVX__)
/* The sum of a vector's eight lanes. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The largest of a vector's eight lanes (exact in any order). */
static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* -- dot products: 4 weight rows against one activation row ------------------------------- */

/* The AVX-512 and AVX2 branches are the same loop at two widths on purpose: 16 lanes measured
 * 10-15% faster on float products here; tests build the AVX2 and plain branches too. */
static inline void dot4p(const float *w0, const float *w1, const float *w2, const float *w3, int64_t n,
                         const float *x, float out[4]) {
    int64_t k = 0;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 16 <= n; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + k), xv, a3);
    }
    s0 = _mm512_reduce_add_ps(a0); s1 = _mm512_reduce_add_ps(a1);
    s2 = _mm512_reduce_add_ps(a2); s3 = _mm512_reduce_add_ps(a3);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 8 <= n; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
    }
    s0 = hsum8(a0); s1 = hsum8(a1); s2 = hsum8(a2); s3 = hsum8(a3);
#elif defined(__ARM_NEON)
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 4 <= n; k += 4) {
        const float32x4_t xv = vld1q_f32(x + k);
        a0 = vfmaq_f32(a0, vld1q_f32(w0 + k), xv);
        a1 = vfmaq_f32(a1, vld1q_f32(w1 + k), xv);
        a2 = vfmaq_f32(a2, vld1q_f32(w2 + k), xv);
        a3 = vfmaq_f32(a3, vld1q_f32(w3 + k), xv);
    }
    s0 = vaddvq_f32(a0); s1 = vaddvq_f32(a1); s2 = vaddvq_f32(a2); s3 = vaddvq_f32(a3);
#endif
    for (; k < n; k++) {
        s0 += w0[k] * x[k]; s1 += w1[k] * x[k]; s2 += w2[k] * x[k]; s3 += w3[k] * x[k];
    }
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

/* Four consecutive rows of w (n floats each). */
static inline void dot4(const float *w, int64_t n, const float *x, float out[4]) {
    dot4p(w, w + n, w + 2 * n, w + 3 * n, n, x, out);
}

#if defined(__AVX512F__)
#define HAVE_DOT4X4 1
/* Four consecutive rows of w against four activation rows (x_stride apart): out[t][r]. Each
 * weight and activation vector loaded feeds four FMAs (dot4 feeds four per five loads), which
 * is what the float products of a prefill chunk (the F16 compressor, indexer and router
 * matrices) are bound by. Each sum is dot4's: the same lanes, the same order. */
static inline void dot4x4(const float *w, int64_t n, const float *x, int64_t x_stride, float out[4][4]) {
    __m512 a[4][4];
    for (int t = 0; t < 4; t++)
        for (int r = 0; r < 4; r++) a[t][r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 wv[4];
        for (int r = 0; r < 4; r++) wv[r] = _mm512_loadu_ps(w + r * n + k);
        for (int t = 0; t < 4; t++) {
            const __m512 xv = _mm512_loadu_ps(x + t * x_stride + k);
            for (int r = 0; r < 4; r++) a[t][r] = _mm512_fmadd_ps(wv[r], xv, a[t][r]);
        }
    }
    for (int t = 0; t < 4; t++)
        for (int r = 0; r < 4; r++) {
            float sum = _mm512_reduce_add_ps(a[t][r]);
            for (int64_t j = k; j < n; j++) sum += w[r * n + j] * x[t * x_stride + j];
            out[t][r] = sum;
        }
}
#endif

/* Rows per work item. Decode wants many small items so both cores stream weights; prefill
 * wants each dequantised block reused across the batch while it sits in L2. */
static int row_block(int64_t T, int64_t n) {
    int rb = T > 1 ? 16 : 4;
    while (rb > 4 && (int64_t)rb * n * 4 > (256 << 10)) rb /= 2;
    return rb;
}

/* Y[t, r] = sum_k X[t, k] W[r, k] for r in [0, out): W has `out` rows of row_bytes packed bytes
 * holding n elements each. X rows are x_stride floats apart, Y rows y_stride. */
#if defined(__F16C__) && defined(__FMA__)
/* One F16 row against one activation row, converting in registers (no dequantised buffer):
 * on decode the F16 matrices (compressors, indexer, router) then stream at memory speed. */
static float dot_f16(const uint8_t *w, const float *x, int64_t n) {
    int64_t k = 0;
#if defined(__AVX512F__)
    /* 64 weights a step over four accumulators: one conversion and one FMA per 16 weights is
     * the whole loop, and four chains keep the FMA latency out of it */
    __m512 z0 = _mm512_setzero_ps(), z1 = z0, z2 = z0, z3 = z0;
    for (; k + 64 <= n; k += 64) {
        if (pf_q8) {  /* a row streamed as the Q8_0 kernel streams them (see pf_q8) */
            __builtin_prefetch(w + 2 * k + pf_q8, 0, 3);
            __builtin_prefetch(w + 2 * k + pf_q8 + 64, 0, 3);
        }
        z0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k))), _mm512_loadu_ps(x + k), z0);
        z1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k + 32))),
                             _mm512_loadu_ps(x + k + 16), z1);
        z2 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k + 64))),
                             _mm512_loadu_ps(x + k + 32), z2);
        z3 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k + 96))),
                             _mm512_loadu_ps(x + k + 48), z3);
    }
    const __m512 z = _mm512_add_ps(_mm512_add_ps(z0, z1), _mm512_add_ps(z2, z3));
    __m256 a0 = _mm512_castps512_ps256(z), a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
#else
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
#endif
    for (; k + 16 <= n; k += 16) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * k))), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * k + 16))), _mm256_loadu_ps(x + k + 8), a1);
    }
    float sum = hsum8(_mm256_add_ps(a0, a1));
    for (; k < n; k++) sum += h2f(rd16(w + 2 * k)) * x[k];
    return sum;
}
#define HAVE_DOT_F16 1
#endif

#define F16_FEW_MAX 8

static void matmul(const uint8_t *W, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                   const float *X, int64_t x_stride, int64_t T, float *Y, int64_t y_stride) {
#ifdef HAVE_DOT_F16
    /* Up to F16_FEW_MAX tokens (a batch of sessions, a verification pass) each take the
     * one-token dot row by row, so each token's sums are those it gets alone and a batch reads
     * the matrix once in one pass (kernels/cpu.py alone_group); more tokens (a prefill chunk)
     * the decoded-row tiles below. */
    if (deq == deq_f16 && T <= F16_FEW_MAX) {
#pragma omp parallel for schedule(static) if (out * n >= (1 << 16))
        for (int64_t r = 0; r < out; r++)
            for (int64_t t = 0; t < T; t++) Y[t * y_stride + r] = dot_f16(W + r * row_bytes, X + t * x_stride, n);
        return;
    }
#endif
    const int rb = row_block(T, n);
    const int64_t blocks = (out + rb - 1) / rb;
    const int parallel = out * n >= (1 << 16);
    (void)parallel;
#pragma omp parallel if (parallel)
    {
        float *buf = (float *)aligned_alloc(64, (((size_t)rb * n * 4) + 63) / 64 * 64);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t r0 = b * rb, nr = out - r0 < rb ? out - r0 : rb;
            for (int64_t r = 0; r < nr; r++) deq(W + (r0 + r) * row_bytes, buf + r * n, n);
            /* a partial last block is padded by repeating its first row (results dropped) */
            for (int64_t r = nr; r < rb; r++) memcpy(buf + r * n, buf, (size_t)n * 4);
            int64_t t = 0;
#if defined(HAVE_DOT4X4)
            for (; t + 4 <= T; t += 4)
                for (int r = 0; r < rb; r += 4) {
                    float s4[4][4];
                    dot4x4(buf + (int64_t)r * n, n, X + t * x_stride, x_stride, s4);
                    for (int j = 0; j < 4; j++)
                        for (int i = 0; i < 4 && r + i < nr; i++) Y[(t + j) * y_stride + r0 + r + i] = s4[j][i];
                }
#endif
            for (; t < T; t++) {
                const float *x = X + t * x_stride;
                float *y = Y + t * y_stride + r0;
                for (int r = 0; r < rb; r += 4) {
                    float s[4];
                    dot4(buf + (int64_t)r * n, n, x, s);
                    for (int i = 0; i < 4 && r + i < nr; i++) y[r + i] = s[i];
                }
            }
        }
        free(buf);
    }
}
