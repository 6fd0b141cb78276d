/* Part of cpu.c, which includes it (one translation unit, one library): The integer path:
 * activations quantised to 8 bits, Q8_0 rows' integer dots at one token. */

/* -- integer path: activations quantised to 8 bits ------------------------------------- *
 * On decode a product is bound by how fast weights stream through the cores, and widening
 * every 2-bit weight to a float costs more than reading it; on prefill integer dot products
 * do four times the work of a float FMA per instruction. Here each activation row is quantised once
 * per call to blocks of 32 (scale = max|x|/127, round to nearest even) and every weight block
 * is multiplied with integer instructions: the result is exactly sum_k w_k * xhat_k, where
 * xhat is the quantised activation and w the dequantised weight (tests check exactly this
 * against float64). Weights keep their exact values; only activations are rounded.
 *
 * Two activation formats. qblock (one scale per 32 values) serves Q8_0 and Q4_K, and every
 * format from 16 tokens up, where each weight row is decoded once for the whole batch.
 * kblock (one scale per 256 values, as llama.cpp's q8_K) serves the routed experts' IQ2_XXS
 * and Q2_K below 16 tokens, decode included: with one activation scale per 256-value
 * superblock a row's integer sums run over the whole superblock and meet a float once, where
 * the per-32 scales cost a conversion, a scalar product, a broadcast and an FMA per 32 values
 * and token (the experts are over half of a real-dimension prefill). */

typedef struct {
    float d;        /* xhat = d * q */
    int16_t s[2];   /* sum of q over elements 0..15 and 16..31 (K-quant minimums) */
    int8_t q[32];
    float ds[8];    /* d * s[0] in lanes 0..3, d * s[1] in 4..7: the minimum terms as a vector */
} qblock;

int ds4_int8_available(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* 256 activations of one token: the format the IQ2_XXS and Q2_K kernels read for few tokens. */
typedef struct {
    int8_t q[256];
    int16_t bsum[16];  /* sums of q over each 16 values: the terms of the Q2_K minimums */
    float d;           /* xhat = d * q */
    int32_t pad[7];    /* 320 bytes: every block starts 32-byte aligned when the first does */
} kblock;

#if defined(__AVX2__)
/* 16 values x times the inverse scale vid, rounded to nearest even (as nearbyintf in the
 * default mode), stored as 16 int8 at q; returns their sum. Both activation formats' AVX2
 * quantisers are made of these. */
static inline int quant16(const float *x, __m256 vid, int8_t *q) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xD8);
    _mm_storeu_si128((__m128i *)q, _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1)));
    const __m256i s8 = _mm256_add_epi32(a, c);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    return _mm_cvtsi128_si32(s4);
}
#endif

/* Quantise T rows of n floats (n a multiple of 256) into T * n/256 kblocks: scale
 * max|x|/127 per 256 values, round to nearest even. */
void ds4_quantize_k(const float *X, int64_t T, int64_t n, kblock *out) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < n / 256; b++) {
            const float *x = X + t * n + 256 * b;
            kblock *o = out + t * (n / 256) + b;
            memset(o->pad, 0, sizeof o->pad);
#if defined(__AVX2__)
            /* the same operations as the scalar loop below, eight lanes at a time (the float to
             * int conversion rounds to nearest even, as nearbyintf does in the default mode) */
            __m256 m = _mm256_setzero_ps();
            const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
            for (int l = 0; l < 256; l += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + l), abs_mask));
            const float amax = hmax8(m);
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const __m256 vid = _mm256_set1_ps(id);
            for (int j = 0; j < 16; j++) o->bsum[j] = (int16_t)quant16(x + 16 * j, vid, o->q + 16 * j);
            o->d = d;
#else
            float amax = 0.0f;
            for (int l = 0; l < 256; l++) amax = fmaxf(amax, fabsf(x[l]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int l = 16 * j; l < 16 * j + 16; l++) {
                    const int q = (int)nearbyintf(x[l] * id);
                    o->q[l] = (int8_t)q;
                    s += q;
                }
                o->bsum[j] = (int16_t)s;
            }
            o->d = d;
#endif
        }
}

/* Quantise T rows of n floats (n a multiple of 32) into T * n/32 blocks. */
void ds4_quantize_act(const float *X, int64_t T, int64_t n, qblock *out) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < n / 32; b++) {
            const float *x = X + t * n + 32 * b;
            qblock *o = out + t * (n / 32) + b;
#if defined(__AVX2__)
            /* the scalar loop below eight lanes at a time, as ds4_quantize_k does (a decode step
             * quantises some fifty rows: scalar, they cost more than the smaller products) */
            const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
            __m256 m = _mm256_and_ps(_mm256_loadu_ps(x), abs_mask);
            for (int l = 8; l < 32; l += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + l), abs_mask));
            const float amax = hmax8(m);
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const __m256 vid = _mm256_set1_ps(id);
            const int s0 = quant16(x, vid, o->q), s1 = quant16(x + 16, vid, o->q + 16);
#else
            float amax = 0.0f;
            for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[l]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                const int q = (int)nearbyintf(x[l] * id);
                o->q[l] = (int8_t)q;
                if (l < 16) s0 += q; else s1 += q;
            }
#endif
            o->d = d;
            o->s[0] = (int16_t)s0;
            o->s[1] = (int16_t)s1;
            for (int l = 0; l < 4; l++) {
                o->ds[l] = d * (float)s0;
                o->ds[4 + l] = d * (float)s1;
            }
        }
}

#if defined(__AVX2__) && defined(__FMA__)
static inline float h2f_fast(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss(rd16(p));
#else
    return h2f(rd16(p));
#endif
}

/* 8 int32 sums of four products each of unsigned bytes u (at most 128) and signed bytes s.
 * The pairwise int16 sums of the plain AVX2 form cannot saturate: 2 * 128 * 127 < 32768. */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* The same for two signed byte vectors (w = -128 becomes 128 unsigned: still exact). */
static inline __m256i dot_i8(__m256i w, __m256i x) {
    return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* Two float accumulators where a row has blocks to spare: a single FMA chain waits out the
 * FMA latency at every block. */
static inline __m256 q8_0_block(const uint8_t *w, const qblock *x, __m256 acc) {
    const __m256i p = dot_i8(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_loadu_si256((const __m256i *)x->q));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f_fast(w) * x->d), acc);
}

static float idot_q8_0(const uint8_t *w, const qblock *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 68) {
        a0 = q8_0_block(w, x + b, a0);
        a1 = q8_0_block(w + 34, x + b + 1, a1);
    }
    if (b < nb) a0 = q8_0_block(w, x + b, a0);
    return hsum8(_mm256_add_ps(a0, a1));
}

/* Four Q8_0 rows against one token, each summed in exactly idot_q8_0's order (even and odd
 * blocks apart), so the results are the same bits. Each activation block is loaded once for
 * four rows, and four rows stream at once: on decode the output head (0.55 GB on Flash) and
 * the attention matrices read faster this way. */
static void idot4_q8_0(const uint8_t *w, int64_t row_bytes, const qblock *x, int64_t nb, float out[4]) {
    __m256 e[4], o[4];
    for (int r = 0; r < 4; r++) e[r] = o[r] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2)
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * row_bytes + 34 * b;
            e[r] = q8_0_block(wr, x + b, e[r]);
            o[r] = q8_0_block(wr + 34, x + b + 1, o[r]);
        }
    if (b < nb)
        for (int r = 0; r < 4; r++) e[r] = q8_0_block(w + r * row_bytes + 34 * b, x + b, e[r]);
    for (int r = 0; r < 4; r++) out[r] = hsum8(_mm256_add_ps(e[r], o[r]));
}

/* acc + the 8 int32 sums of four products of unsigned bytes u and signed bytes s (u*s pair
 * sums below 2^15 for the plain AVX2 form: the callers' u are at most 45). */
static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
#endif /* the AVX2 block goes on in cpu_experts.c and cpu_rows.c */
