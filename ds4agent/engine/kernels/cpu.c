/* ds4agent CPU kernels: matrix products that read GGUF block formats in place.
 *
 * Weights are never copied out of the model file: every function takes a pointer into the
 * mmap and dequantises a few rows at a time into a small per-thread buffer (L1/L2 sized),
 * then takes dot products against every token's activation row. On decode (one token) the
 * cost is the bytes of the weights, as in any memory-bound engine; on prefill each dequantised
 * row is reused by every token of the batch.
 *
 * Numerics. The dequantisers perform the same float32 operations in the same order as the
 * `gguf` package (no fused multiply-add: compiled with -ffp-contract=off), so ds4_dequant()
 * is bit-exact with gguf.quants.dequantize (tests/test_kernels.py). Dot products accumulate in
 * float32 in SIMD lanes, so products agree with the MLX reference to rounding, not bitwise.
 *
 * Compiled at first use by kernels/cpu.py (cc -O3 -march=native -fopenmp when available).
 */
#define _GNU_SOURCE /* syscall(), to ask Linux for the AMX tile state */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#else /* one thread: the parallel regions below run as plain loops */
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
#endif

enum { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, T_Q2_K = 10, T_Q4_K = 12, T_IQ2_XXS = 16 };

/* IQ2_XXS lookup tables, handed over at load from the gguf package (never in our source):
 * 256 grid rows of 8 magnitudes and 128 sign patterns expanded to +-1.0 per lane. */
static float IQ2_GRID[256 * 8];
static float IQ2_SIGNS[128 * 8];

/* The same tables as bytes for the integer dot products: grid magnitudes (small integers) and
 * sign patterns as +1/-1 bytes, eight per 64-bit word. */
static uint64_t IQ2_GRID8[256];
static uint64_t IQ2_SIGN8[128];
/* and as bit masks (bit k: weight k of the eight is negative), for AVX-512 masked negation */
static uint8_t IQ2_SMASK[128] __attribute__((aligned(64)));
/* For the AVX-512 IQ2_XXS kernel (iq2_xxs_planes): the grid holds three magnitudes, low < mid
 * < high; each row's eight as 2-bit codes 0, 1, 2, four to a byte (IQ2_CODES[0]: weights 0-3,
 * [1]: 4-7, weight i in bits 2i), and IQ2_GF[p] the GF(2) affine map that takes the code in bits
 * 2p, 2p+1 of a byte to its magnitude (x -> A x ^ IQ2_LOW: code bit 0 flips the bits low ^ mid,
 * code bit 1 the bits low ^ high). IQ2_LOW is an instruction immediate, so it is a constant
 * here, checked against the gguf table at load (iq2_codes_ok: the kernel is not used if the
 * table were ever different). */
#define IQ2_LOW 8
static uint8_t IQ2_CODES[2][256] __attribute__((aligned(64)));
static uint64_t IQ2_GF[4];
static int iq2_codes_ok;

void ds4_set_iq2_tables(const float *grid, const float *signs) {
    memcpy(IQ2_GRID, grid, sizeof IQ2_GRID);
    memcpy(IQ2_SIGNS, signs, sizeof IQ2_SIGNS);
    for (int i = 0; i < 256; i++) {
        uint8_t b[8];
        for (int k = 0; k < 8; k++) b[k] = (uint8_t)grid[8 * i + k];
        memcpy(&IQ2_GRID8[i], b, 8);
    }
    for (int i = 0; i < 128; i++) {
        int8_t b[8];
        for (int k = 0; k < 8; k++) b[k] = signs[8 * i + k] < 0 ? -1 : 1;
        memcpy(&IQ2_SIGN8[i], b, 8);
        IQ2_SMASK[i] = 0;
        for (int k = 0; k < 8; k++) IQ2_SMASK[i] |= (uint8_t)((signs[8 * i + k] < 0) << k);
    }
    int mag[3] = {256, 256, 256}, n = 0, ok = 1;  /* the distinct magnitudes, ascending */
    for (int i = 0; i < 256 * 8 && ok; i++) {
        const int v = (int)grid[i];
        int j = 0;
        while (j < n && mag[j] < v) j++;
        if (j < n && mag[j] == v) continue;
        if (n == 3 || v != grid[i] || v < 0 || v > 255) ok = 0;
        else {
            memmove(mag + j + 1, mag + j, (size_t)(n - j) * sizeof *mag);
            mag[j] = v, n++;
        }
    }
    iq2_codes_ok = ok && n == 3 && mag[0] == IQ2_LOW;
    if (!iq2_codes_ok) return;
    for (int i = 0; i < 256; i++) {
        IQ2_CODES[0][i] = IQ2_CODES[1][i] = 0;
        for (int k = 0; k < 8; k++) {
            const int v = (int)grid[8 * i + k], code = v == mag[0] ? 0 : v == mag[1] ? 1 : 2;
            IQ2_CODES[k / 4][i] |= (uint8_t)(code << (2 * (k % 4)));
        }
    }
    for (int p = 0; p < 4; p++) {
        /* output bit i (matrix byte 7 - i) = parity of the input bits the row selects */
        const int bit0 = mag[1] ^ mag[0], bit1 = mag[2] ^ mag[0];
        IQ2_GF[p] = 0;
        for (int i = 0; i < 8; i++)
            IQ2_GF[p] |= (uint64_t)((((bit0 >> i) & 1) << (2 * p)) | (((bit1 >> i) & 1) << (2 * p + 1))) << (8 * (7 - i));
    }
}

int ds4_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void ds4_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* Software prefetch distances, measured per machine (kernels/cpu_tune.py measures them once
 * and caches them; DS4_PREFETCH overrides): pf_q8 bytes ahead in the few-token Q8_0 and F16
 * products, where a core streams one run of rows; pf_rows rows ahead in the expert kernels (at
 * least 1). How far ahead pays differs by machine: on 2 cores of an AMD EPYC VM the Q8_0
 * kernel ran best with none (the hardware prefetchers kept up), on 2 cores of an Intel Xeon VM
 * (AVX-512, AMX) 2 KB ahead took the Flash output head from 26 to 29 GB/s and a 36 MB
 * projection from 19 to 23, where 4 KB and more was slower again. */
static int64_t pf_q8 = 0, pf_rows = 2;

void ds4_set_prefetch(int64_t q8_bytes, int64_t expert_rows) {
    pf_q8 = q8_bytes > 0 ? q8_bytes : 0;
    pf_rows = expert_rows > 0 ? expert_rows : 1;
}

void ds4_get_prefetch(int64_t out[2]) {
    out[0] = pf_q8;
    out[1] = pf_rows;
}

/* The read-bandwidth probe (`ds4 bench`'s first line, bench/cpu_bandwidth.py): n bytes at p
 * read on every core, each core a contiguous share (as the products split their rows), 128
 * bytes per step folded into a value the compiler must keep; the caller times it. Reading
 * the model's own mapping measures what decode reads from: page-cache pages, their page
 * walks and the hardware prefetchers' stops at every 4 KB page included. */
uint64_t ds4_read(const uint8_t *p, int64_t n) {
    uint64_t total = 0;
#pragma omp parallel reduction(^ : total)
    {
#ifdef _OPENMP
        const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
#else
        const int64_t nt = 1, me = 0;
#endif
        const int64_t lo = n * me / nt / 128 * 128, hi = me + 1 == nt ? n / 128 * 128 : n * (me + 1) / nt / 128 * 128;
        uint64_t fold = 0;
#if defined(__AVX2__)
        __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
        for (int64_t i = lo; i < hi; i += 128) {
            a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(p + i)));
            b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
            c = _mm256_xor_si256(c, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
            d = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
        }
        const __m256i v = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
        fold = (uint64_t)_mm256_extract_epi64(v, 0) ^ (uint64_t)_mm256_extract_epi64(v, 1) ^
               (uint64_t)_mm256_extract_epi64(v, 2) ^ (uint64_t)_mm256_extract_epi64(v, 3);
#else
        for (int64_t i = lo; i < hi; i += 8) { uint64_t w; memcpy(&w, p + i, 8); fold ^= w; }
#endif
        total ^= fold;
    }
    return total;
}

/* IEEE half -> float, exact for every input (subnormals, infinities, NaN payloads). */
static inline float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

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

typedef void (*deq_fn)(const uint8_t *, float *, int64_t);

static deq_fn dequantiser(int type) {
    switch (type) {
    case T_F32: return deq_f32;
    case T_F16: return deq_f16;
    case T_Q8_0: return deq_q8_0;
    case T_Q2_K: return deq_q2_k;
    case T_Q4_K: return deq_q4_k;
    case T_IQ2_XXS: return deq_iq2_xxs;
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

static void matmul(const uint8_t *W, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                   const float *X, int64_t x_stride, int64_t T, float *Y, int64_t y_stride) {
#ifdef HAVE_DOT_F16
    if (deq == deq_f16 && T <= 3) {
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

/* The IQ2_XXS and Q2_K products against kblock activations: nt (1..KT_MAX) tokens (x rows
 * nsb superblocks apart) per pass over one packed row. Each 32-weight group is decoded in
 * registers once for all nt tokens (no decoded copy is written or read back), and each
 * token's sum is exact int32 over a superblock, scaled once. An expert's share of a prefill
 * chunk is typically 2-10 tokens, so a pass takes up to 8 where AVX-512VL gives the 32
 * registers to keep 8 tokens' sums live (4 on plain AVX2). The one-token product is the
 * nt = 1 case of the same code and every token's sum is formed in the same order whatever nt
 * is, so a token's result is the same bits alone or with others. nt is a constant at every
 * call (see KT_CALL), so the sums stay in registers.
 *
 * Some kernels read the activations rearranged (xp, made once per product by kprep(): the
 * order in which the weights come out of their registers). Every build forms the same exact
 * integers and meets the floats in the same order (ksum8 below), so an AVX2 build and an
 * AVX-512 build give the same bits (tests/test_kernels.py builds both). */
#if defined(__AVX512VL__)
#define KT_MAX 8
#else
#define KT_MAX 4
#endif

/* Bytes of kprep()'s arrangement per token: whole pairs of superblocks (see kprep). */
static inline int64_t kprep_bytes(int64_t nsb) { return (nsb + 1) / 2 * 512 + ((4 * nsb + 63) & ~63); }

/* The float part of an IQ2_XXS row, the same in every build: superblock b's exact integer
 * sum S[b] times its scale dd[b] (d_w / 8 * d_x), added into lane b mod 8 of acc, eight
 * superblocks at a time (a short last group padded with S = 0, dd = 0); the row's result is
 * hsum8 of the lanes. */
static inline __m256 ksum8(__m256 acc, __m256i S, __m256 dd) {
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(S), dd));
}

/* The exact sum of eight int32 lanes. */
static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* IQ2_XXS: w = d/8 * ls * grid * sign with ls = 2*s4 + 1 per 32 weights. The sign goes onto
 * the activation (signs are +-1: exact), grid magnitudes (8, 25, 43) times activations pair
 * up in int16 (at most 2 * 43 * 127), times ls in int32 (a superblock's sum stays under 2^26). */
static inline __attribute__((always_inline)) void iq2_xxs_k(const uint8_t *w, const kblock *x, const int8_t *xp,
                                                            int64_t nsb, const int nt, float *out) {
    (void)xp;
    __m256 acc[KT_MAX];
    int32_t S[KT_MAX][8];
    float dd[KT_MAX][8];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, w += 66) {
        __m256i sum[KT_MAX];
        for (int t = 0; t < nt; t++) sum[t] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const uint8_t *a0 = w + 2 + 8 * g;
            uint32_t a1;
            memcpy(&a1, a0 + 4, 4);
            const __m256i grid = _mm256_set_epi64x((long long)IQ2_GRID8[a0[3]], (long long)IQ2_GRID8[a0[2]],
                                                   (long long)IQ2_GRID8[a0[1]], (long long)IQ2_GRID8[a0[0]]);
            const __m256i sign = _mm256_set_epi64x((long long)IQ2_SIGN8[(a1 >> 21) & 127], (long long)IQ2_SIGN8[(a1 >> 14) & 127],
                                                   (long long)IQ2_SIGN8[(a1 >> 7) & 127], (long long)IQ2_SIGN8[a1 & 127]);
            const __m256i ls = _mm256_set1_epi16((short)(2 * (a1 >> 28) + 1));
            for (int t = 0; t < nt; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t * nsb + b].q + 32 * g));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(grid, _mm256_sign_epi8(xq, sign)), ls));
            }
        }
        const float d = h2f_fast(w) * 0.125f;
        const int j = (int)(b % 8);
        for (int t = 0; t < nt; t++) {
            S[t][j] = hsum_i32(sum[t]);
            dd[t][j] = d * x[t * nsb + b].d;
        }
        if (j == 7 || b + 1 == nsb)
            for (int t = 0; t < nt; t++) {
                for (int i = j + 1; i < 8; i++) S[t][i] = 0, dd[t][i] = 0.0f;
                acc[t] = ksum8(acc[t], _mm256_loadu_si256((const __m256i *)S[t]), _mm256_loadu_ps(dd[t]));
            }
    }
    for (int t = 0; t < nt; t++) out[t] = hsum8(acc[t]);
}

/* A Q2_K superblock's 16 scale bytes sc as a table of 16 dwords in four pieces: dword k holds
 * the bytes 0, s_k, 2 s_k, 3 s_k (s_k the low nibble of scale byte k), for pshufb to index
 * with the 2-bit quants. */
static inline void q2_k_table(__m128i sc, __m128i pieces[4]) {
    const __m128i s1 = _mm_and_si128(sc, _mm_set1_epi8(0xF)), s2 = _mm_add_epi8(s1, s1), s3 = _mm_add_epi8(s2, s1);
    const __m128i z01 = _mm_unpacklo_epi8(_mm_setzero_si128(), s1), z23 = _mm_unpacklo_epi8(s2, s3);
    const __m128i h01 = _mm_unpackhi_epi8(_mm_setzero_si128(), s1), h23 = _mm_unpackhi_epi8(s2, s3);
    pieces[0] = _mm_unpacklo_epi16(z01, z23);
    pieces[1] = _mm_unpackhi_epi16(z01, z23);
    pieces[2] = _mm_unpacklo_epi16(h01, h23);
    pieces[3] = _mm_unpackhi_epi16(h01, h23);
}

/* Q2_K: w = d * sc * q - dmin * m per 16 weights (q 0..3, sc and m 0..15). sc * q is at most
 * 45, so it is formed as a byte by table lookup (AVX2 has no byte multiply: each scale's
 * products 0, s, 2s, 3s sit in four bytes that pshufb indexes with q) and every token then
 * takes one unsigned-by-signed dot per 32 weights. The minimums meet the activations' 16-sums
 * once per superblock. Int32 lane i holds weights 4i..4i+3 of each 32 (the AVX-512 kernel's
 * halves, added). */
static inline __attribute__((always_inline)) void q2_k_k(const uint8_t *w, const kblock *x, const int8_t *xp,
                                                         int64_t nsb, const int nt, float *out) {
    (void)xp;
    __m256 acc[KT_MAX];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    const __m256i three = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nsb; b++, w += 84) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)w);
        __m128i pieces[4];
        q2_k_table(sc, pieces);
        uint32_t tab[16];  /* tab[k] = bytes 0, s_k, 2 s_k, 3 s_k */
        for (int i = 0; i < 4; i++) _mm_storeu_si128((__m128i *)(tab + 4 * i), pieces[i]);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xF)));
        __m256i sum[KT_MAX];
        for (int t = 0; t < nt; t++) sum[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * h));
            for (int j = 0; j < 4; j++) {
                /* weights 128h + 32j .. +31 are bits 2j of qs[32h + l]; their scales are
                 * 8h + 2j (first 16) and 8h + 2j + 1 */
                const int g = 8 * h + 2 * j;
                const __m256i q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * j)), three);
                const __m256i wq = _mm256_shuffle_epi8(_mm256_set_m128i(_mm_set1_epi32((int)tab[g + 1]), _mm_set1_epi32((int)tab[g])), q);
                for (int t = 0; t < nt; t++)
                    sum[t] = dpbusd(sum[t], wq, _mm256_loadu_si256((const __m256i *)(x[t * nsb + b].q + 128 * h + 32 * j)));
            }
        }
        const float d = h2f_fast(w + 80), dmin = h2f_fast(w + 82);
        for (int t = 0; t < nt; t++) {
            const kblock *xt = x + t * nsb + b;
            const __m256i m = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xt->bsum));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * xt->d), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * xt->d), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = hsum8(acc[t]);
}

/* The same two products on AVX-512 (VNNI, VBMI; GFNI for IQ2_XXS), both on activations
 * rearranged once per product so that the weights need no shuffling into place:
 *
 * IQ2_XXS, two superblocks (64 groups of 8 weights) at a time, one byte per group in each of
 * eight "planes": plane k holds weight k of every group, and the activations are laid out the
 * same way (xp). Two 128-entry byte permutes (VPERMI2B) look up all 64 grid rows' 2-bit
 * magnitude codes of four planes at once (IQ2_CODES: the grid has three magnitudes), and one
 * GF(2) affine byte transform per plane turns a byte of four codes into that plane's
 * magnitude (the map code -> magnitude is affine over GF(2) because code 3 never occurs). A
 * plane's sign bits become a mask with one test, negate the activation bytes, and one VNNI dot
 * per plane sums four groups, that is one 32-weight block, into each int32 lane, so a lane
 * meets its block scale ls with one multiply per two superblocks. The eight planes cost
 * about 50 instructions per 512 weights, where fetching eight-byte grid rows with scalar loads
 * and inserting them cost about 150 (37 -> 13.5 cycles per superblock on one core of an
 * Intel Xeon VM, hot in L2; 14.4 with a product's per-row costs).
 *
 * Q2_K: the 64 quant bytes hold four 2-bit planes, plane j the weights 32j + l and
 * 128 + 32j + l; xp holds each plane's 64 activations side by side. Each 16-weight run (one
 * 128-bit lane of a plane) has its own scale, so per plane one word multiply makes a table of
 * sc * (0..3) per lane and one pshufb indexes it with a nibble of the quant bytes (the low
 * nibble carries planes 0 and 1, the high one 2 and 3: the tables ignore the other plane's
 * bits). The int32 lanes hold the same partial sums as the AVX2 kernel's (18 -> 13 cycles per
 * superblock). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__)
#define HAVE_K512 1

static inline __m256i halves_sum(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static inline __attribute__((always_inline)) void q2_k_k512(const uint8_t *w, const kblock *x, const int8_t *xp,
                                                            int64_t nsb, const int nt, float *out) {
    const int64_t stride = kprep_bytes(nsb);
    __m256 acc[KT_MAX];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    const __m512i nib = _mm512_set1_epi8(0x0F);
    /* the products k * sc, k = 0..3, as bytes of words (k1 << 8 | k0) times the scale word:
     * k = index & 3 (planes 0, 2) and k = index >> 2 (planes 1, 3) for the 16 nibble values */
    const __m512i low_k = _mm512_set1_epi64(0x0302010003020100LL);
    const __m512i high_k = _mm512_set4_epi64(0x0303030302020202LL, 0x0101010100000000LL, 0x0303030302020202LL,
                                             0x0101010100000000LL);
    /* the scale byte of plane j's 128-bit lane L is 8 (L / 2) + 2 j + L % 2, into even bytes */
    const __m512i sc_of[4] = {
        _mm512_set_epi32(0x09090909, 0x09090909, 0x09090909, 0x09090909, 0x08080808, 0x08080808, 0x08080808, 0x08080808,
                         0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0, 0, 0),
        _mm512_set_epi32(0x0B0B0B0B, 0x0B0B0B0B, 0x0B0B0B0B, 0x0B0B0B0B, 0x0A0A0A0A, 0x0A0A0A0A, 0x0A0A0A0A, 0x0A0A0A0A,
                         0x03030303, 0x03030303, 0x03030303, 0x03030303, 0x02020202, 0x02020202, 0x02020202, 0x02020202),
        _mm512_set_epi32(0x0D0D0D0D, 0x0D0D0D0D, 0x0D0D0D0D, 0x0D0D0D0D, 0x0C0C0C0C, 0x0C0C0C0C, 0x0C0C0C0C, 0x0C0C0C0C,
                         0x05050505, 0x05050505, 0x05050505, 0x05050505, 0x04040404, 0x04040404, 0x04040404, 0x04040404),
        _mm512_set_epi32(0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F, 0x0E0E0E0E, 0x0E0E0E0E, 0x0E0E0E0E, 0x0E0E0E0E,
                         0x07070707, 0x07070707, 0x07070707, 0x07070707, 0x06060606, 0x06060606, 0x06060606, 0x06060606)};
    const __mmask64 even_bytes = 0x5555555555555555ULL;
    const __m256i at84 = _mm256_setr_epi32(80, 164, 248, 332, 416, 500, 584, 668);  /* d, dmin of 8 superblocks */
    const float *xd = (const float *)(xp + (nsb + 1) / 2 * 512);  /* the tokens' superblock scales (kprep) */
    float dd[KT_MAX][8], ddmin[KT_MAX][8];  /* d * d_x and dmin * d_x, eight superblocks at a time */
    for (int64_t b = 0; b < nsb; b++, w += 84) {
        if (b % 8 == 0) {
            const __mmask8 real = nsb - b >= 8 ? 0xFF : (__mmask8)((1u << (nsb - b)) - 1);
            const __m256i h = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), real, at84, w, 1);
            const __m256 d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(h)), dmin = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(h, 16)));
            for (int t = 0; t < nt; t++) {
                const __m256 xdt = _mm256_maskz_loadu_ps(real, xd + t * stride / 4 + b);
                _mm256_storeu_ps(dd[t], _mm256_mul_ps(d, xdt));
                _mm256_storeu_ps(ddmin[t], _mm256_mul_ps(dmin, xdt));
            }
        }
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)w);
        const __m512i sc = _mm512_and_si512(_mm512_broadcast_i32x4(sc16), nib);
        const __m512i raw = _mm512_loadu_si512(w + 16);
        const __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc16, 4), _mm_set1_epi8(0xF)));
        __m512i sum[KT_MAX];
        for (int t = 0; t < nt; t++) sum[t] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m512i table = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(even_bytes, sc_of[j], sc), j & 1 ? high_k : low_k);
            const __m512i wq = _mm512_shuffle_epi8(table, j < 2 ? lo : hi);
            for (int t = 0; t < nt; t++)
                sum[t] = _mm512_dpbusd_epi32(sum[t], wq, _mm512_loadu_si512(xp + t * stride + 256 * b + 64 * j));
        }
        for (int t = 0; t < nt; t++) {
            const kblock *xt = x + t * nsb + b;
            const __m256i m = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xt->bsum));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(halves_sum(sum[t])), _mm256_broadcast_ss(&dd[t][b % 8]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_broadcast_ss(&ddmin[t][b % 8]), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = hsum8(acc[t]);
}
#define Q2_K_K q2_k_k512

#if defined(__GFNI__)
#define HAVE_IQ2_PLANES 1
/* Lanes summed in pairs across two vectors: a0+a1, a2+a3, ..., a14+a15, b0+b1, ..., b14+b15. */
static inline __m512i pair_sums(__m512i a, __m512i b) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

static inline __attribute__((always_inline)) void iq2_xxs_planes(const uint8_t *w, const kblock *x, const int8_t *xp,
                                                                 int64_t nsb, const int nt, float *out) {
    (void)x;  /* the scales and quants are read from xp */
    const int64_t stride = kprep_bytes(nsb), nch = (nsb + 1) / 2;
    const __m512i sgn0 = _mm512_load_si512(IQ2_SMASK), sgn1 = _mm512_load_si512(IQ2_SMASK + 64);
    const __m512i c00 = _mm512_load_si512(IQ2_CODES[0]), c01 = _mm512_load_si512(IQ2_CODES[0] + 64);
    const __m512i c02 = _mm512_load_si512(IQ2_CODES[0] + 128), c03 = _mm512_load_si512(IQ2_CODES[0] + 192);
    const __m512i c10 = _mm512_load_si512(IQ2_CODES[1]), c11 = _mm512_load_si512(IQ2_CODES[1] + 64);
    const __m512i c12 = _mm512_load_si512(IQ2_CODES[1] + 128), c13 = _mm512_load_si512(IQ2_CODES[1] + 192);
    /* the two superblocks' 16 qwords, as dwords: grid indices (even dwords), sign and scale
     * words (odd dwords) */
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    /* a sign word's four 7-bit fields (bits 0, 7, 14, 21) into bytes, twice per qword */
    const __m512i sign_fields = _mm512_set1_epi64(0x352E2720150E0700LL);
    const __m512i at66 = _mm512_setr_epi32(0, 66, 132, 198, 264, 330, 396, 462, 528, 594, 660, 726, 792, 858, 924, 990);
    const float *xd = (const float *)(xp + 512 * nch);  /* the tokens' superblock scales (kprep) */
    __m256 acc[KT_MAX];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < nch; c0 += 8) {
        const int nc = nch - c0 < 8 ? (int)(nch - c0) : 8;
        __m512i lanes[KT_MAX][8];  /* per pair of superblocks: lane 8s + i = block i of superblock s */
        for (int ci = 0; ci < nc; ci++) {
            const int64_t c = c0 + ci;
            const uint8_t *q = w + 132 * c + 2;
            const __m512i a = _mm512_loadu_si512(q), b = 2 * c + 1 < nsb ? _mm512_loadu_si512(q + 66) : _mm512_setzero_si512();
            const __m512i grid = _mm512_permutex2var_epi32(a, even, b), aux = _mm512_permutex2var_epi32(a, odd, b);
            const __m512i signs = _mm512_permutex2var_epi8(sgn0, _mm512_multishift_epi64_epi8(sign_fields, aux), sgn1);
            /* 2 s + 1 for the block scale s in bits 28-31 (bit 27, a sign bit, is covered by the 1) */
            const __m512i ls = _mm512_or_si512(_mm512_srli_epi32(aux, 27), _mm512_set1_epi32(1));
            /* rows 128-255 in a second permute, into the bytes the first left as they were */
            const __mmask64 upper = _mm512_movepi8_mask(grid);
            __m512i codes0 = _mm512_mask2_permutex2var_epi8(c00, grid, ~upper, c01);
            codes0 = _mm512_mask2_permutex2var_epi8(c02, codes0, upper, c03);
            __m512i codes1 = _mm512_mask2_permutex2var_epi8(c10, grid, ~upper, c11);
            codes1 = _mm512_mask2_permutex2var_epi8(c12, codes1, upper, c13);
            __m512i sum[KT_MAX];
            for (int t = 0; t < nt; t++) sum[t] = _mm512_setzero_si512();
#define IQ2_PLANE(k, codes)                                                                                       \
    {                                                                                                             \
        const __m512i mag = _mm512_gf2p8affine_epi64_epi8(codes, _mm512_set1_epi64((long long)IQ2_GF[(k) % 4]), IQ2_LOW); \
        const __mmask64 neg = _mm512_test_epi8_mask(signs, _mm512_set1_epi8((char)(1 << (k))));                  \
        for (int t = 0; t < nt; t++) {                                                                            \
            const __m512i xq = _mm512_load_si512(xp + t * stride + 512 * c + 64 * (k));                           \
            sum[t] = _mm512_dpbusd_epi32(sum[t], mag, _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq));  \
        }                                                                                                         \
    }
            IQ2_PLANE(0, codes0) IQ2_PLANE(1, codes0) IQ2_PLANE(2, codes0) IQ2_PLANE(3, codes0)
            IQ2_PLANE(4, codes1) IQ2_PLANE(5, codes1) IQ2_PLANE(6, codes1) IQ2_PLANE(7, codes1)
#undef IQ2_PLANE
            for (int t = 0; t < nt; t++) lanes[t][ci] = _mm512_mullo_epi32(sum[t], ls);
        }
        /* each superblock's eight block sums added into one lane: S[j] is superblock 2 c0 + j;
         * the sixteen superblocks' scales d / 8 gathered at once (zero past the row's end) */
        const int64_t sb0 = 2 * c0;
        const __mmask16 real = nsb - sb0 >= 16 ? 0xFFFF : (__mmask16)((1u << (nsb - sb0)) - 1);
        const __m512i dh = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, at66, w + 66 * sb0, 1);
        const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh)), _mm512_set1_ps(0.125f));
        for (int t = 0; t < nt; t++) {
            for (int ci = nc; ci < 8; ci++) lanes[t][ci] = _mm512_setzero_si512();
            const __m512i S = pair_sums(pair_sums(pair_sums(lanes[t][0], lanes[t][1]), pair_sums(lanes[t][2], lanes[t][3])),
                                        pair_sums(pair_sums(lanes[t][4], lanes[t][5]), pair_sums(lanes[t][6], lanes[t][7])));
            const __m512 dd = _mm512_maskz_mul_ps(real, d, _mm512_loadu_ps(xd + t * stride / 4 + sb0));
            acc[t] = ksum8(acc[t], _mm512_castsi512_si256(S), _mm512_castps512_ps256(dd));
            if (sb0 + 8 < nsb) acc[t] = ksum8(acc[t], _mm512_extracti64x4_epi64(S, 1), _mm512_extractf32x8_ps(dd, 1));
        }
    }
    for (int t = 0; t < nt; t++) out[t] = hsum8(acc[t]);
}
#define IQ2_XXS_K iq2_xxs_planes
#endif
#endif
#ifndef Q2_K_K
#define Q2_K_K q2_k_k
#endif
#ifndef IQ2_XXS_K
#define IQ2_XXS_K iq2_xxs_k
#endif

/* The activations rearranged for the AVX-512 kernels above (kprep_bytes per token): IQ2_XXS
 * per pair of superblocks, plane k's 64 bytes = weight k of each group; Q2_K per superblock,
 * plane j = values 32j .. 32j+31 and 128+32j .. 128+32j+31. NULL where the kernel reads the
 * kblocks as they are (or on a failed allocation: the caller then takes the float path). */
static int8_t *kprep(int type, const kblock *x, int64_t T, int64_t nsb) {
#if defined(HAVE_K512)
#if !defined(HAVE_IQ2_PLANES)
    if (type == T_IQ2_XXS) return NULL;
#endif
    if (type == T_IQ2_XXS && !iq2_codes_ok) return NULL;
    const int64_t stride = kprep_bytes(nsb);
    int8_t *xp = aligned_alloc(64, (size_t)(T * stride));
    if (!xp) return NULL;
    for (int64_t t = 0; t < T; t++) {
        int8_t *o = xp + t * stride;
        const kblock *xt = x + t * nsb;
        if (type == T_IQ2_XXS) {
            memset(o, 0, (size_t)stride);
            float *d = (float *)(o + (nsb + 1) / 2 * 512);  /* then the superblocks' scales */
            for (int64_t b = 0; b < nsb; b++) {
                for (int g = 0; g < 32; g++)
                    for (int k = 0; k < 8; k++) o[512 * (b / 2) + 64 * k + 32 * (b % 2) + g] = xt[b].q[8 * g + k];
                d[b] = xt[b].d;
            }
        } else {
            float *d = (float *)(o + (nsb + 1) / 2 * 512);  /* after the quants, as for IQ2_XXS */
            for (int64_t b = 0; b < nsb; b++) d[b] = xt[b].d;
            for (int64_t b = 0; b < nsb; b++)
                for (int j = 0; j < 4; j++) {
                    memcpy(o + 256 * b + 64 * j, xt[b].q + 32 * j, 32);
                    memcpy(o + 256 * b + 64 * j + 32, xt[b].q + 128 + 32 * j, 32);
                }
        }
    }
    return xp;
#else
    (void)type, (void)x, (void)T, (void)nsb;
    return NULL;
#endif
}

/* The row loop of krows() around one kernel, NT tokens. */
#define KT_ROWS(fn, NT)                                                                     \
    for (int64_t r = r0; r < r1; r++) {                                                     \
        float y[KT_MAX];                                                                    \
        if (ahead && r + pf_rows < out) {                                                   \
            const uint8_t *next = W + (r + pf_rows) * row_bytes;                            \
            for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(next + o, 0, 3); \
        }                                                                                   \
        fn(W + r * row_bytes, x, xp, nsb, (NT), y);                                         \
        for (int j = 0; j < (NT); j++) Y[j * y_stride + r] = y[j];                          \
    }
/* One switch per kernel so that nt is a constant inside each instance. */
#define KT_CALL(fn)                                                                         \
    switch (nt) {                                                                           \
    case 1: KT_ROWS(fn, 1) break;                                                           \
    case 2: KT_ROWS(fn, 2) break;                                                           \
    case 3: KT_ROWS(fn, 3) break;                                                           \
    case 4: KT_ROWS(fn, KT_MAX < 4 ? KT_MAX : 4) break;                                     \
    case 5: KT_ROWS(fn, KT_MAX < 5 ? KT_MAX : 5) break;                                     \
    case 6: KT_ROWS(fn, KT_MAX < 6 ? KT_MAX : 6) break;                                     \
    case 7: KT_ROWS(fn, KT_MAX < 7 ? KT_MAX : 7) break;                                     \
    default: KT_ROWS(fn, KT_MAX) break;                                                     \
    }

/* Rows r0 .. r1 of W (row_bytes apart) against nt tokens (x, and xp: kprep()'s arrangement
 * of them where the kernel takes one, else NULL) into Y[t * y_stride + r]. With ahead, each
 * row is asked for pf_rows rows before it is decoded (up to row out). The row loop sits inside
 * each kernel's instance, so what a kernel sets up per call stays in registers across rows. */
static void krows(int type, const uint8_t *W, int64_t row_bytes, int64_t r0, int64_t r1, int64_t out, const kblock *x,
                  const int8_t *xp, int64_t nsb, int nt, float *Y, int64_t y_stride, int ahead) {
    if (type == T_IQ2_XXS) {
        if (xp) {
            KT_CALL(IQ2_XXS_K)
        } else {
            KT_CALL(iq2_xxs_k)
        }
    } else if (xp) {
        KT_CALL(Q2_K_K)
    } else {
        KT_CALL(q2_k_k)
    }
}
#undef KT_CALL
#undef KT_ROWS

static float idot_q4_k(const uint8_t *w, const qblock *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    const __m256i low4 = _mm256_set1_epi8(0xF);
    for (int64_t b = 0; b < nb / 8; b++, w += 144) {
        const float d = h2f_fast(w), dmin = h2f_fast(w + 2);
        const uint8_t *s = w + 4, *qs = w + 16;
        float m = 0.0f;
        for (int j = 0; j < 8; j++, x++) {
            int sc, mn;
            q4k_scale_min(s, j, &sc, &mn);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            const __m256i q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(4 * (j & 1))), low4);
            const __m256i p = dot_u8s8(q, _mm256_loadu_si256((const __m256i *)x->q));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * (float)sc * x->d), acc);
            m += x->d * (float)(mn * (x->s[0] + x->s[1]));
        }
        mins += dmin * m;
    }
    return hsum8(acc) - mins;
}

/* For several tokens, each weight row is first decoded once into 32-weight blocks of small
 * integers with float scales (and minimums, for the K-quants) laid out as 8-lane vectors,
 * then every token takes a short integer dot with it: table lookups and bit unpacking are
 * paid once per row, not once per token. Signed formats keep magnitudes and signs apart so
 * the per-token work is one sign, one unsigned-by-signed dot and two FMAs per block. */
typedef struct {
    uint8_t q[32];   /* magnitudes (IQ2_XXS, Q8_0) or the unsigned quants (K-quants) */
    int8_t sg[32];   /* +1/-1 signs (signed formats only) */
    float sc[8];     /* scale of elements 0..15 in lanes 0..3, of 16..31 in lanes 4..7 */
    float mn[8];     /* minimum, same layout (K-quants only) */
} wblock;

/* lo in lanes 0..3, hi in 4..7, as one vector store (eight scalar stores were a fifth of
 * decoding a row). */
static inline void put8(float *v, float lo, float hi) {
    _mm256_storeu_ps(v, _mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo)));
}

static void dec_q8_0(const uint8_t *w, wblock *o, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, w += 34, o++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        _mm256_storeu_si256((__m256i *)o->q, _mm256_sign_epi8(q, q));
        _mm256_storeu_si256((__m256i *)o->sg, _mm256_or_si256(_mm256_cmpgt_epi8(_mm256_setzero_si256(), q),
                                                               _mm256_set1_epi8(1)));
        const float d = h2f_fast(w);
        put8(o->sc, d, d);
    }
}

static void dec_iq2_xxs(const uint8_t *w, wblock *o, int64_t nb) {
    for (int64_t b = 0; b < nb / 8; b++, w += 66) {
        const float d = h2f_fast(w);
        for (int g = 0; g < 8; g++, o++) {
            const uint8_t *a0 = w + 2 + 8 * g;
            uint32_t a1;
            memcpy(&a1, a0 + 4, 4);
            _mm256_storeu_si256((__m256i *)o->q, _mm256_set_epi64x((long long)IQ2_GRID8[a0[3]], (long long)IQ2_GRID8[a0[2]],
                                                                   (long long)IQ2_GRID8[a0[1]], (long long)IQ2_GRID8[a0[0]]));
            _mm256_storeu_si256((__m256i *)o->sg, _mm256_set_epi64x((long long)IQ2_SIGN8[(a1 >> 21) & 127],
                                                                    (long long)IQ2_SIGN8[(a1 >> 14) & 127],
                                                                    (long long)IQ2_SIGN8[(a1 >> 7) & 127],
                                                                    (long long)IQ2_SIGN8[a1 & 127]));
            const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
            put8(o->sc, db, db);
        }
    }
}

static void dec_q2_k(const uint8_t *w, wblock *o, int64_t nb) {
    for (int64_t b = 0; b < nb / 8; b++, w += 84) {
        const uint8_t *sc = w, *qs = w + 16;
        const float d = h2f_fast(w + 80), dmin = h2f_fast(w + 82);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++, o++) {
                const int g = 8 * h + 2 * j;
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
                _mm256_storeu_si256((__m256i *)o->q, _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * j)),
                                                                      _mm256_set1_epi8(3)));
                put8(o->sc, d * (float)(sc[g] & 0xF), d * (float)(sc[g + 1] & 0xF));
                put8(o->mn, dmin * (float)(sc[g] >> 4), dmin * (float)(sc[g + 1] >> 4));
            }
    }
}

static void dec_q4_k(const uint8_t *w, wblock *o, int64_t nb) {
    for (int64_t b = 0; b < nb / 8; b++, w += 144) {
        const float d = h2f_fast(w), dmin = h2f_fast(w + 2);
        const uint8_t *s = w + 4, *qs = w + 16;
        for (int j = 0; j < 8; j++, o++) {
            int sc, mn;
            q4k_scale_min(s, j, &sc, &mn);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            _mm256_storeu_si256((__m256i *)o->q, _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(4 * (j & 1))),
                                                                  _mm256_set1_epi8(0xF)));
            put8(o->sc, d * (float)sc, d * (float)sc);
            put8(o->mn, dmin * (float)mn, dmin * (float)mn);
        }
    }
}

/* sum_k w_k xhat_k for a decoded row: signed formats (no minimums) */
static float wdot_signed(const wblock *w, const qblock *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w++, x++) {
        const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->q), _mm256_loadu_si256((const __m256i *)w->sg));
        const __m256i p = dot_u8s8(_mm256_loadu_si256((const __m256i *)w->q), xs);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_loadu_ps(w->sc)), _mm256_broadcast_ss(&x->d), acc);
    }
    return hsum8(acc);
}

/* ... and the K-quants: unsigned quants, a minimum per 16 against the activation sums */
static float wdot_kquant(const wblock *w, const qblock *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w++, x++) {
        const __m256i p = dot_u8s8(_mm256_loadu_si256((const __m256i *)w->q), _mm256_loadu_si256((const __m256i *)x->q));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_loadu_ps(w->sc)), _mm256_broadcast_ss(&x->d), acc);
        mins = _mm256_fmadd_ps(_mm256_loadu_ps(w->mn), _mm256_loadu_ps(x->ds), mins);
    }
    /* each lane of mins holds a quarter of a half-block's minimum term */
    return hsum8(acc) - hsum8(mins) * 0.25f;
}

/* Two tokens at once: each decoded weight block is loaded once for both. */
static void wdot2_signed(const wblock *w, const qblock *x, const qblock *z, int64_t nb, float *out) {
    __m256 ax = _mm256_setzero_ps(), az = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w++, x++, z++) {
        const __m256i sg = _mm256_loadu_si256((const __m256i *)w->sg), q = _mm256_loadu_si256((const __m256i *)w->q);
        const __m256 sc = _mm256_loadu_ps(w->sc);
        const __m256i px = dot_u8s8(q, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->q), sg));
        const __m256i pz = dot_u8s8(q, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)z->q), sg));
        ax = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(px), sc), _mm256_broadcast_ss(&x->d), ax);
        az = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(pz), sc), _mm256_broadcast_ss(&z->d), az);
    }
    out[0] = hsum8(ax);
    out[1] = hsum8(az);
}

static void wdot2_kquant(const wblock *w, const qblock *x, const qblock *z, int64_t nb, float *out) {
    __m256 ax = _mm256_setzero_ps(), az = _mm256_setzero_ps(), mx = _mm256_setzero_ps(), mz = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w++, x++, z++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)w->q);
        const __m256 sc = _mm256_loadu_ps(w->sc), mn = _mm256_loadu_ps(w->mn);
        const __m256i px = dot_u8s8(q, _mm256_loadu_si256((const __m256i *)x->q));
        const __m256i pz = dot_u8s8(q, _mm256_loadu_si256((const __m256i *)z->q));
        ax = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(px), sc), _mm256_broadcast_ss(&x->d), ax);
        az = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(pz), sc), _mm256_broadcast_ss(&z->d), az);
        mx = _mm256_fmadd_ps(mn, _mm256_loadu_ps(x->ds), mx);
        mz = _mm256_fmadd_ps(mn, _mm256_loadu_ps(z->ds), mz);
    }
    out[0] = hsum8(ax) - hsum8(mx) * 0.25f;
    out[1] = hsum8(az) - hsum8(mz) * 0.25f;
}

/* Four tokens (x rows nb blocks apart): the decoded block is loaded once for all four. */
static void wdot4_signed(const wblock *w, const qblock *x, int64_t nb, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t b = 0; b < nb; b++, w++) {
        const __m256i sg = _mm256_loadu_si256((const __m256i *)w->sg), q = _mm256_loadu_si256((const __m256i *)w->q);
        const __m256 sc = _mm256_loadu_ps(w->sc);
#define TOKEN(i, acc)                                                                                          \
        {                                                                                                      \
            const qblock *xi = x + (i) * nb + b;                                                               \
            const __m256i p = dot_u8s8(q, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xi->q), sg));  \
            acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), sc), _mm256_broadcast_ss(&xi->d), acc); \
        }
        TOKEN(0, a0) TOKEN(1, a1) TOKEN(2, a2) TOKEN(3, a3)
#undef TOKEN
    }
    out[0] = hsum8(a0); out[1] = hsum8(a1); out[2] = hsum8(a2); out[3] = hsum8(a3);
}

static void wdot4_kquant(const wblock *w, const qblock *x, int64_t nb, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, m0 = a0, m1 = a0, m2 = a0, m3 = a0;
    for (int64_t b = 0; b < nb; b++, w++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)w->q);
        const __m256 sc = _mm256_loadu_ps(w->sc), mn = _mm256_loadu_ps(w->mn);
#define TOKEN(i, acc, mins)                                                                                    \
        {                                                                                                      \
            const qblock *xi = x + (i) * nb + b;                                                               \
            const __m256i p = dot_u8s8(q, _mm256_loadu_si256((const __m256i *)xi->q));                         \
            acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), sc), _mm256_broadcast_ss(&xi->d), acc); \
            mins = _mm256_fmadd_ps(mn, _mm256_loadu_ps(xi->ds), mins);                                          \
        }
        TOKEN(0, a0, m0) TOKEN(1, a1, m1) TOKEN(2, a2, m2) TOKEN(3, a3, m3)
#undef TOKEN
    }
    out[0] = hsum8(a0) - hsum8(m0) * 0.25f;
    out[1] = hsum8(a1) - hsum8(m1) * 0.25f;
    out[2] = hsum8(a2) - hsum8(m2) * 0.25f;
    out[3] = hsum8(a3) - hsum8(m3) * 0.25f;
}

/* Two decoded rows (w and v, nb blocks each) against four tokens: out[r * 4 + t]. Each token
 * block is loaded once for both rows and each weight block once for all four tokens. The
 * one-row kernels above read about 3.3 bytes from L2 per multiply-add (a 4096-wide row's
 * wblocks and four tokens' blocks do not fit in L1); this one about 2, which is what bounded
 * prefill products. Every (row, token) sum is accumulated in the same order as wdot4_*, so
 * the results are the same bits. */
static void wdot2x4_signed(const wblock *w, const wblock *v, const qblock *x, int64_t nb, float *out) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w++, v++) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)w->q), ws = _mm256_loadu_si256((const __m256i *)w->sg);
        const __m256i vq = _mm256_loadu_si256((const __m256i *)v->q), vs = _mm256_loadu_si256((const __m256i *)v->sg);
        const __m256 wsc = _mm256_loadu_ps(w->sc), vsc = _mm256_loadu_ps(v->sc);
        for (int t = 0; t < 4; t++) {
            const qblock *xt = x + t * nb + b;
            const __m256i xq = _mm256_loadu_si256((const __m256i *)xt->q);
            const __m256 xd = _mm256_broadcast_ss(&xt->d);
            const __m256i pw = dot_u8s8(wq, _mm256_sign_epi8(xq, ws)), pv = dot_u8s8(vq, _mm256_sign_epi8(xq, vs));
            a[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(pw), wsc), xd, a[t]);
            a[4 + t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(pv), vsc), xd, a[4 + t]);
        }
    }
    for (int i = 0; i < 8; i++) out[i] = hsum8(a[i]);
}

static void wdot2x4_kquant(const wblock *w, const wblock *v, const qblock *x, int64_t nb, float *out) {
    __m256 a[8], m[8];
    for (int i = 0; i < 8; i++) a[i] = m[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w++, v++) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)w->q), vq = _mm256_loadu_si256((const __m256i *)v->q);
        const __m256 wsc = _mm256_loadu_ps(w->sc), vsc = _mm256_loadu_ps(v->sc);
        const __m256 wmn = _mm256_loadu_ps(w->mn), vmn = _mm256_loadu_ps(v->mn);
        for (int t = 0; t < 4; t++) {
            const qblock *xt = x + t * nb + b;
            const __m256i xq = _mm256_loadu_si256((const __m256i *)xt->q);
            const __m256 xd = _mm256_broadcast_ss(&xt->d), ds = _mm256_loadu_ps(xt->ds);
            a[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot_u8s8(wq, xq)), wsc), xd, a[t]);
            a[4 + t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot_u8s8(vq, xq)), vsc), xd, a[4 + t]);
            m[t] = _mm256_fmadd_ps(wmn, ds, m[t]);
            m[4 + t] = _mm256_fmadd_ps(vmn, ds, m[4 + t]);
        }
    }
    for (int i = 0; i < 8; i++) out[i] = hsum8(a[i]) - hsum8(m[i]) * 0.25f;
}

typedef void (*idec_fn)(const uint8_t *, wblock *, int64_t);
typedef float (*wdot_fn)(const wblock *, const qblock *, int64_t);
typedef void (*wdot2_fn)(const wblock *, const qblock *, const qblock *, int64_t, float *);
typedef void (*wdot4_fn)(const wblock *, const qblock *, int64_t, float *);
typedef void (*wdot2x4_fn)(const wblock *, const wblock *, const qblock *, int64_t, float *);

static idec_fn int8_decoder(int type, wdot_fn *dot, wdot2_fn *dot2, wdot4_fn *dot4, wdot2x4_fn *dot2x4) {
    const int k = type == T_Q2_K || type == T_Q4_K;
    *dot = k ? wdot_kquant : wdot_signed;
    *dot2 = k ? wdot2_kquant : wdot2_signed;
    *dot4 = k ? wdot4_kquant : wdot4_signed;
    *dot2x4 = k ? wdot2x4_kquant : wdot2x4_signed;
    switch (type) {
    case T_Q8_0: return dec_q8_0;
    case T_Q2_K: return dec_q2_k;
    case T_Q4_K: return dec_q4_k;
    case T_IQ2_XXS: return dec_iq2_xxs;
    default: return 0;
    }
}

typedef float (*idot_fn)(const uint8_t *, const qblock *, int64_t);

/* The one-token dot against qblocks (IQ2_XXS and Q2_K take kblocks at one token: kdot). */
static idot_fn int8_dot(int type) {
    switch (type) {
    case T_Q8_0: return idot_q8_0;
    case T_Q4_K: return idot_q4_k;
    default: return 0;
    }
}

static int has_int8(int type) { return type == T_Q8_0 || type == T_Q4_K || type == T_IQ2_XXS || type == T_Q2_K; }
#else
typedef float (*idot_fn)(const uint8_t *, const qblock *, int64_t);
static idot_fn int8_dot(int type) { (void)type; return 0; }
static int has_int8(int type) { (void)type; return 0; }
static void krows(int type, const uint8_t *W, int64_t row_bytes, int64_t r0, int64_t r1, int64_t out, const kblock *x,
                  const int8_t *xp, int64_t nsb, int nt, float *Y, int64_t y_stride, int ahead) {
    (void)type; (void)W; (void)row_bytes; (void)r0; (void)r1; (void)out; (void)x; (void)xp; (void)nsb; (void)nt;
    (void)Y; (void)y_stride; (void)ahead;
}
static int8_t *kprep(int type, const kblock *x, int64_t T, int64_t nsb) {
    (void)type; (void)x; (void)T; (void)nsb;
    return NULL;
}
static inline int64_t kprep_bytes(int64_t nsb) { return nsb; }
#define KT_MAX 1
typedef struct { int dummy; } wblock;
typedef void (*idec_fn)(const uint8_t *, wblock *, int64_t);
typedef float (*wdot_fn)(const wblock *, const qblock *, int64_t);
typedef void (*wdot2_fn)(const wblock *, const qblock *, const qblock *, int64_t, float *);
typedef void (*wdot4_fn)(const wblock *, const qblock *, int64_t, float *);
typedef void (*wdot2x4_fn)(const wblock *, const wblock *, const qblock *, int64_t, float *);
static idec_fn int8_decoder(int type, wdot_fn *dot, wdot2_fn *dot2, wdot4_fn *dot4, wdot2x4_fn *dot2x4) {
    (void)type; (void)dot; (void)dot2; (void)dot4; (void)dot2x4; return 0;
}
#endif

/* -- Q8_0 products of 16 tokens and more: tiles of 16 tokens ---------------------------- *
 * Both wide kernels below (AMX tiles, AVX-512 VNNI registers) read the activations as token
 * tiles: per (16 tokens, block), 8 rows of 16 tokens x 4 consecutive quants, 64 bytes each
 * (the tile unit's B layout, and one 512-bit register per row), and the 16 tokens' scales.
 * Tokens past T are zeros. flip is XORed into every quant (0x80 stores x + 128, unsigned). */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define WIDE_MIN_T 16

static int pack_token_tiles(const qblock *Xq, int64_t T, int64_t nb, uint8_t flip, uint8_t **Bp, float **Dp) {
    const int64_t ntile = (T + 15) / 16;
    uint8_t *B = aligned_alloc(64, (size_t)(ntile * nb) * 512);
    float *D = aligned_alloc(64, (size_t)(ntile * nb) * 64);
    if (!B || !D) {
        free(B); free(D);
        return -1;
    }
    for (int64_t j = 0; j < ntile; j++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *bt = B + (j * nb + b) * 512;
            float *dt = D + (j * nb + b) * 16;
            for (int c = 0; c < 16; c++) {
                const int64_t t = 16 * j + c;
                for (int kk = 0; kk < 8; kk++)
                    for (int i = 0; i < 4; i++)
                        bt[kk * 64 + c * 4 + i] = (uint8_t)((t < T ? (uint8_t)Xq[t * nb + b].q[4 * kk + i] : 0) ^ flip);
                dt[c] = t < T ? Xq[t * nb + b].d : 0.0f;
            }
        }
    *Bp = B;
    *Dp = D;
    return 0;
}

/* A row tile's 16 rows, padded with zero rows into pad when fewer remain. */
static const uint8_t *row_tile(const uint8_t *W, int64_t row_bytes, int64_t out, int64_t rt, uint8_t *pad,
                               int64_t *rows) {
    *rows = out - 16 * rt < 16 ? out - 16 * rt : 16;
    const uint8_t *A = W + 16 * rt * row_bytes;
    if (*rows == 16) return A;
    memset(pad, 0, (size_t)(16 * row_bytes));
    memcpy(pad, A, (size_t)(*rows * row_bytes));
    return pad;
}

/* acc[r] (16 tokens in lanes) into Y, the first nt tokens and rows rows. */
static void store_tile(const __m512 acc[16], int64_t nt, int64_t rows, float *Y, int64_t y_stride) {
    float tmp[256] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++) _mm512_store_ps(tmp + 16 * r, acc[r]);
    for (int64_t c = 0; c < nt; c++)
        for (int64_t r = 0; r < rows; r++) Y[c * y_stride + r] = tmp[16 * r + c];
}
#endif

/* -- AMX: Q8_0 products of 16 tokens and more ------------------------------------------- *
 * Intel's tile unit multiplies a 16 x 64-byte int8 tile by a 64 x 16 one in one instruction
 * (TDPBSSD: 16 rows x 16 columns x 64 products, against 32-64 per AVX-512 VNNI instruction).
 * For Q8_0 the weights need no decoding at all: a tile row is 32 quants of one block, loaded
 * straight from the file with the row length as stride. Each block has its own weight and
 * activation scales, so a tile product covers one block (K = 32) and its 16 x 16 int32 sums
 * are scaled into float accumulators at once: the same sum_b w_scale * x_scale * int_dot as
 * the AVX2 kernels, formed in a different order. Linux hands out the tile state only on
 * request (arch_prctl), once per process; ds4_set_amx turns the path off for tests and
 * comparisons. */
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX 1

static int amx_state = -1;  /* -1 not asked yet, 0 off or refused, 1 on */

static int amx_on(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
        __atomic_store_n(&amx_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

int ds4_set_amx(int on) {
    if (!on) {
        __atomic_store_n(&amx_state, 0, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_store_n(&amx_state, -1, __ATOMIC_RELAXED);
    return amx_on();
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* Y[t, r] for Q8_0 rows against qblock activations, T >= 1 (tokens are padded to 16 with
 * zeros). Returns -1 without touching Y when scratch memory runs out. */
static int matmul_q8_0_amx(const uint8_t *W, int64_t row_bytes, int64_t out, int64_t nb, const qblock *Xq,
                           int64_t T, float *Y, int64_t y_stride, int parallel) {
    const int64_t ntile = (T + 15) / 16, nrt = (out + 15) / 16;
    uint8_t *B;
    float *D;
    if (pack_token_tiles(Xq, T, nb, 0, &B, &D)) return -1;
    int failed = 0;
#pragma omp parallel if (parallel)
    {
        tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        cfg.rows[0] = 16; cfg.colsb[0] = 64;  /* tile 0: 16 rows x 16 int32 sums */
        cfg.rows[1] = 16; cfg.colsb[1] = 32;  /* tile 1: 16 weight rows x one block's quants */
        cfg.rows[2] = 8;  cfg.colsb[2] = 64;  /* tile 2: 32 quants x 16 tokens, four per row */
        _tile_loadconfig(&cfg);
        float *wd = aligned_alloc(64, (size_t)nb * 64);   /* weight scales, [block][row] */
        uint8_t *pad = malloc((size_t)(16 * row_bytes));  /* the last rows when out % 16 != 0 */
        int32_t C[256] __attribute__((aligned(64)));
        if (!wd || !pad) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t rt = 0; rt < nrt; rt++) {
            if (!wd || !pad) continue;
            int64_t rows;
            const uint8_t *A = row_tile(W, row_bytes, out, rt, pad, &rows);
            for (int64_t b = 0; b < nb; b++)
                for (int r = 0; r < 16; r++) wd[b * 16 + r] = h2f_fast(A + r * row_bytes + 34 * b);
            for (int64_t j = 0; j < ntile; j++) {
                __m512 acc[16];
                for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
                for (int64_t b = 0; b < nb; b++) {
                    _tile_zero(0);
                    _tile_loadd(1, A + 34 * b + 2, row_bytes);
                    _tile_loadd(2, B + (j * nb + b) * 512, 64);
                    _tile_dpbssd(0, 1, 2);
                    _tile_stored(0, C, 64);
                    const __m512 xd = _mm512_load_ps(D + (j * nb + b) * 16);
                    for (int r = 0; r < 16; r++)
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(C + 16 * r)),
                                                 _mm512_mul_ps(xd, _mm512_set1_ps(wd[b * 16 + r])), acc[r]);
                }
                const int64_t nt = T - 16 * j < 16 ? T - 16 * j : 16;
                store_tile(acc, nt, rows, Y + 16 * j * y_stride + 16 * rt, y_stride);
            }
        }
        _tile_release();
        free(wd);
        free(pad);
    }
    free(B);
    free(D);
    return failed ? -1 : 0;
}
#else
int ds4_set_amx(int on) { (void)on; return 0; }
#endif

/* -- AVX-512 VNNI: the same products without tiles -------------------------------------- *
 * One 512-bit register holds a token tile's row (16 tokens x 4 quants of one block) and
 * VPDPBUSD multiplies it with 4 quants of one weight row broadcast straight from the file: 64
 * products per instruction, no weight decoding, each token tile reused for 16 rows from
 * registers. VPDPBUSD takes unsigned by signed bytes, so the activations are stored as x + 128
 * and each row's sum starts from -128 * (the sum of its block's 32 quants): the int32 sums
 * are exact, the same as the tiles', and they are scaled in the same order, so this kernel
 * and the AMX one give the same bits. On 2 Zen 5 cores the dense products of a 4-layer
 * real-dimension prefill of 256 tokens took 0.62 s this way, 1.84 s on the decoded-row
 * kernels (which pay a sign, a dot and two FMAs per 32 products and token). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define HAVE_VNNI512 1

static int vnni512_on_ = 1;

int ds4_set_vnni512(int on) {
    __atomic_store_n(&vnni512_on_, on != 0, __ATOMIC_RELAXED);
    return on != 0;
}

/* -128 * (the sum of 32 signed quants at q). */
static inline int32_t neg128_sum32(const uint8_t *q) {
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q), _mm256_set1_epi8((char)0x80));
    const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256());  /* sums of q + 128 */
    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const int64_t sum = _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1) - 32 * 128;
    return (int32_t)(-128 * sum);
}

static int matmul_q8_0_vnni(const uint8_t *W, int64_t row_bytes, int64_t out, int64_t nb, const qblock *Xq,
                            int64_t T, float *Y, int64_t y_stride, int parallel) {
    const int64_t ntile = (T + 15) / 16, nrt = (out + 15) / 16;
    uint8_t *B;
    float *D;
    if (pack_token_tiles(Xq, T, nb, 0x80, &B, &D)) return -1;
    int failed = 0;
#pragma omp parallel if (parallel)
    {
        float *wd = aligned_alloc(64, (size_t)nb * 64);     /* weight scales, [block][row] */
        int32_t *ws = aligned_alloc(64, (size_t)nb * 64);   /* -128 * quant sums, [block][row] */
        uint8_t *pad = malloc((size_t)(16 * row_bytes));
        if (!wd || !ws || !pad) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t rt = 0; rt < nrt; rt++) {
            if (!wd || !ws || !pad) continue;
            int64_t rows;
            const uint8_t *A = row_tile(W, row_bytes, out, rt, pad, &rows);
            for (int64_t b = 0; b < nb; b++)
                for (int r = 0; r < 16; r++) {
                    wd[b * 16 + r] = h2f_fast(A + r * row_bytes + 34 * b);
                    ws[b * 16 + r] = neg128_sum32(A + r * row_bytes + 34 * b + 2);
                }
            for (int64_t j = 0; j < ntile; j++) {
                __m512 acc[16];
                for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *bt = B + (j * nb + b) * 512;
                    __m512i x[8];
                    for (int kk = 0; kk < 8; kk++) x[kk] = _mm512_load_si512(bt + 64 * kk);
                    const __m512 xd = _mm512_load_ps(D + (j * nb + b) * 16);
                    for (int r = 0; r < 16; r++) {
                        const uint8_t *q = A + r * row_bytes + 34 * b + 2;
                        __m512i sum = _mm512_set1_epi32(ws[b * 16 + r]);
                        for (int kk = 0; kk < 8; kk++) {
                            int32_t w4;
                            memcpy(&w4, q + 4 * kk, 4);
                            sum = _mm512_dpbusd_epi32(sum, x[kk], _mm512_set1_epi32(w4));
                        }
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(xd, _mm512_set1_ps(wd[b * 16 + r])),
                                                 acc[r]);
                    }
                }
                const int64_t nt = T - 16 * j < 16 ? T - 16 * j : 16;
                store_tile(acc, nt, rows, Y + 16 * j * y_stride + 16 * rt, y_stride);
            }
        }
        free(wd);
        free(ws);
        free(pad);
    }
    free(B);
    free(D);
    return failed ? -1 : 0;
}
#else
int ds4_set_vnni512(int on) { (void)on; return 0; }
#endif

#if defined(HAVE_VNNI512) && defined(__AVX512VL__)
#define HAVE_Q8_FEW 1
/* The lane sums of eight int32 vectors: lane j of the result is the sum of v[j]'s lanes. */
static inline __m256i lane_sums8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);  /* halves of 0-3, 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* Q8_0 rows r0 .. r1 against NT (1..3) quantised tokens, each row read once, straight from the
 * file: the decode products (the output head, attention, shared expert). VNNI multiplies
 * unsigned by signed bytes, so each weight byte is made unsigned with one xor (w + 128) and the
 * excess, 128 * sum(x) per activation block, comes off once per eight blocks (cx: d_x * 128 *
 * sum(q), made with the activations). A block's eight int32 lanes are summed in integers
 * (lane_sums8) and meet their scales d_w * d_x eight blocks at a time, gathered from the row:
 * per block there is no float conversion, broadcast or scalar product left, which is what
 * held one core to about half of its read bandwidth. Every sum is exact in int32; the float
 * order differs from the kernels for more tokens, within the tests' float32 bounds. */
static inline __attribute__((always_inline)) void q8_0_few(const uint8_t *W, int64_t row_bytes, int64_t r0,
                                                           int64_t r1, const qblock *Xq, const int8_t *xq,
                                                           const float *xd, const float *cx, int64_t nb, const int NT,
                                                           float *Y, int64_t y_stride) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), low16 = _mm256_set1_epi32(0xFFFF);
    const __m256i at34 = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = W + r * row_bytes;
        __m256 acc[3], corr[3];
        for (int t = 0; t < NT; t++) acc[t] = corr[t] = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 8 <= nb; b += 8) {
            const uint8_t *g = w + 34 * b;
            if (pf_q8)
                for (int o = 0; o < 8 * 34; o += 64) __builtin_prefetch(g + pf_q8 + o, 0, 3);
            const __m256i dh = _mm256_and_si256(_mm256_i32gather_epi32((const int *)g, at34, 1), low16);
            const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dh));
            __m256i p[3][8];
            for (int j = 0; j < 8; j++) {
                const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(g + 34 * j + 2)), flip);
                for (int t = 0; t < NT; t++)
                    p[t][j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
                                                  _mm256_load_si256((const __m256i *)(xq + 32 * (t * nb + b + j))));
            }
            for (int t = 0; t < NT; t++) {
                const __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + t * nb + b));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums8(p[t])), sc, acc[t]);
                corr[t] = _mm256_fmadd_ps(dw, _mm256_loadu_ps(cx + t * nb + b), corr[t]);
            }
        }
        float tail[3] = {0.0f, 0.0f, 0.0f};
        for (; b < nb; b++) {  /* rows of fewer than 8 blocks left over (no tensor here has any) */
            const float dw1 = h2f_fast(w + 34 * b);
            for (int t = 0; t < NT; t++) {
                int32_t sum = 0;
                for (int l = 0; l < 32; l++) sum += (int32_t)((const int8_t *)(w + 34 * b + 2))[l] * Xq[t * nb + b].q[l];
                tail[t] += dw1 * Xq[t * nb + b].d * (float)sum;
            }
        }
        for (int t = 0; t < NT; t++) Y[t * y_stride + r] = hsum8(_mm256_sub_ps(acc[t], corr[t])) + tail[t];
    }
}

/* Y (T, out) for T = 1..3 tokens through q8_0_few, rows split in contiguous runs per core: each
 * core streams one run, which the hardware prefetchers follow as they follow the read probe
 * (software prefetching 0.5 to 8 KB ahead measured no better on 2 Zen 4 cores, and 2-8 KB
 * ahead a third slower). The four-row kernel it replaces read four rows at once with the
 * next four prefetched: on the same cores the output head went from 22 to 57 GB/s. */
static int matmul_q8_0_few(const uint8_t *W, int64_t row_bytes, int64_t out, int64_t nb, const qblock *Xq,
                           int64_t T, float *Y, int64_t y_stride, int parallel) {
    /* the activations' quants side by side (32-byte aligned: half the cache lines of the
     * qblocks, whose other fields these loops do not read), their scales, their excess terms */
    int8_t *xq = aligned_alloc(64, (size_t)(T * nb * 32 + 8 * T * nb) + 64);
    if (!xq) return -1;
    float *xd = (float *)(xq + T * nb * 32), *cx = xd + T * nb;
    for (int64_t i = 0; i < T * nb; i++) {
        memcpy(xq + 32 * i, Xq[i].q, 32);
        xd[i] = Xq[i].d;
        cx[i] = Xq[i].d * (float)(128 * ((int32_t)Xq[i].s[0] + Xq[i].s[1]));
    }
    (void)parallel;
#pragma omp parallel if (parallel)
    {
#ifdef _OPENMP
        const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
#else
        const int64_t nt = 1, me = 0;
#endif
        const int64_t r0 = out * me / nt, r1 = out * (me + 1) / nt;
        if (T == 1) q8_0_few(W, row_bytes, r0, r1, Xq, xq, xd, cx, nb, 1, Y, y_stride);
        else if (T == 2) q8_0_few(W, row_bytes, r0, r1, Xq, xq, xd, cx, nb, 2, Y, y_stride);
        else q8_0_few(W, row_bytes, r0, r1, Xq, xq, xd, cx, nb, 3, Y, y_stride);
    }
    free(xq);
    return 0;
}
#endif

/* Up to this many tokens read each weight block straight from the file per token; more
 * tokens decode each row once into wblocks first (measured crossover on AVX-512 Zen 4). */
#define DIRECT_MAX_T 3
#define REG_MAX_T 16
/* The expert kernels ask for the row pf_rows ahead, all of it, before decoding this one. A
 * routed expert's rows are a 2-3 MB run the demand misses walk one line at a time; the
 * hardware prefetchers stop at every 4 KB page, and where page walks are dear (a virtual
 * machine) one core streamed 1.7 GB/s of expert rows at one token, 5 GB/s with this (the
 * kernel's own speed). Where the few-token Q8_0 kernel above is not built (no AVX-512 VNNI),
 * the one-token Q8_0 product asks for its next four rows the same way: on 2 cores of an AMD
 * EPYC (Zen 5) VM the Flash output head went from 22 to 16 ms (25 -> 35 GB/s; a plain read of
 * the same mapping runs at 45), where on an Intel Xeon VM an earlier row-ahead prefetch had
 * measured no gain. */

/* Y[t, r] = sum_k xhat[t, k] W[r, k] with the activations already quantised (Xq: T rows of
 * n/32 blocks, or Xk: kblocks, with xp their kprep() arrangement if the caller made it).
 * Rows are spread over the cores; each weight row is read once for all tokens. */
static void matmul_int8(const uint8_t *W, int type, int64_t row_bytes, int64_t out, int64_t n,
                        const qblock *Xq, const kblock *Xk, const int8_t *xp, int64_t T, float *Y, int64_t y_stride) {
    const int64_t nb = n / 32;
    const int parallel = out * n >= (1 << 16);
    (void)parallel;
    /* IQ2_XXS and Q2_K below REG_MAX_T tokens (Xk: kblocks). Packed rows decoded in
     * registers for up to KT_MAX tokens at a time beat decoding each row once into wblocks
     * up to about 16 tokens; past that the table lookups and bit unpacking repeated per pass
     * cost more. */
    if (Xk) {
        const int64_t nsb = n / 256;
        int8_t *own = xp ? NULL : kprep(type, Xk, T, nsb);
        if (own) xp = own;
        enum { RB = 16 };
        const int64_t nblk = (out + RB - 1) / RB;
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t r0 = blk * RB, r1 = out - r0 < RB ? out : r0 + RB;
            for (int64_t t = 0; t < T; t += KT_MAX) {
                const int nt = T - t < KT_MAX ? (int)(T - t) : KT_MAX;
                krows(type, W, row_bytes, r0, r1, out, Xk + t * nsb, xp ? xp + t * kprep_bytes(nsb) : NULL, nsb, nt,
                      Y + t * y_stride, y_stride, t == 0);
            }
        }
        free(own);
        return;
    }
#if defined(HAVE_AMX)
    if (type == T_Q8_0 && T >= WIDE_MIN_T && amx_on() && !matmul_q8_0_amx(W, row_bytes, out, nb, Xq, T, Y, y_stride, parallel))
        return;
#endif
#if defined(HAVE_VNNI512)
    if (type == T_Q8_0 && T >= WIDE_MIN_T && __atomic_load_n(&vnni512_on_, __ATOMIC_RELAXED) &&
        !matmul_q8_0_vnni(W, row_bytes, out, nb, Xq, T, Y, y_stride, parallel))
        return;
#endif
    if (T > DIRECT_MAX_T) {
        wdot_fn wdot = 0;
        wdot2_fn wdot2 = 0;
        wdot4_fn wdot4 = 0;
        wdot2x4_fn wdot2x4 = 0;
        idec_fn dec = int8_decoder(type, &wdot, &wdot2, &wdot4, &wdot2x4);
        /* Rows are decoded RB at a time and each pair of tokens visits all RB of them, so a
         * token's activations are read from L1 RB times instead of streaming the whole
         * batch from L3 once per row. */
        enum { RB = 8 };
        const int64_t nblk = (out + RB - 1) / RB;
#pragma omp parallel if (parallel)
        {
            wblock *rows = malloc((size_t)(RB * nb) * sizeof *rows);
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = blk * RB, nr = out - r0 < RB ? out - r0 : RB;
                for (int64_t i = 0; i < nr; i++) dec(W + (r0 + i) * row_bytes, rows + i * nb, nb);
                int64_t t = 0;
                for (; t + 4 <= T; t += 4) {
                    int64_t i = 0;
                    for (; i + 2 <= nr; i += 2) {
                        float eight[8];
                        wdot2x4(rows + i * nb, rows + (i + 1) * nb, Xq + t * nb, nb, eight);
                        for (int j = 0; j < 4; j++) {
                            Y[(t + j) * y_stride + r0 + i] = eight[j];
                            Y[(t + j) * y_stride + r0 + i + 1] = eight[4 + j];
                        }
                    }
                    for (; i < nr; i++) {
                        float four[4];
                        wdot4(rows + i * nb, Xq + t * nb, nb, four);
                        for (int j = 0; j < 4; j++) Y[(t + j) * y_stride + r0 + i] = four[j];
                    }
                }
                for (; t + 2 <= T; t += 2)
                    for (int64_t i = 0; i < nr; i++) {
                        float two[2];
                        wdot2(rows + i * nb, Xq + t * nb, Xq + (t + 1) * nb, nb, two);
                        Y[t * y_stride + r0 + i] = two[0];
                        Y[(t + 1) * y_stride + r0 + i] = two[1];
                    }
                for (; t < T; t++)
                    for (int64_t i = 0; i < nr; i++) Y[t * y_stride + r0 + i] = wdot(rows + i * nb, Xq + t * nb, nb);
            }
            free(rows);
        }
        return;
    }
    idot_fn dot = int8_dot(type);
#if defined(HAVE_Q8_FEW)
    if (type == T_Q8_0 && nb % 8 == 0 && !matmul_q8_0_few(W, row_bytes, out, nb, Xq, T, Y, y_stride, parallel))
        return;
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (type == T_Q8_0 && T == 1) {
        const int64_t quads = out / 4;
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t g = 0; g < quads; g++) {
            float four[4];
            if (g + 1 < quads) {  /* the next four rows, whole (see pf_rows) */
                const uint8_t *next = W + 4 * (g + 1) * row_bytes;
                for (int64_t o = 0; o < 4 * row_bytes; o += 64) __builtin_prefetch(next + o, 0, 3);
            }
            idot4_q8_0(W + 4 * g * row_bytes, row_bytes, Xq, nb, four);
            memcpy(Y + 4 * g, four, sizeof four);
        }
        for (int64_t r = 4 * quads; r < out; r++) Y[r] = dot(W + r * row_bytes, Xq, nb);
        return;
    }
#endif
    /* Contiguous halves per thread: each core streams one run of rows, which the hardware
     * prefetchers follow (explicit prefetching measured 2x slower on the output head). */
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < out; r++)
        for (int64_t t = 0; t < T; t++) Y[t * y_stride + r] = dot(W + r * row_bytes, Xq + t * nb, nb);
}

/* The activations a product of T tokens takes: 0 floats (no integer path for this type, or
 * the exact kernels), 1 qblocks, 2 kblocks (IQ2_XXS and Q2_K below REG_MAX_T tokens). */
static int act_format(int type, int64_t T, int64_t n, int int8) {
    if (!int8 || !has_int8(type) || n % 32) return 0;
    return (type == T_IQ2_XXS || type == T_Q2_K) && T < REG_MAX_T ? 2 : 1;
}

/* Scratch bytes for either format (a kblock covers 256 values in fewer bytes than 8 qblocks). */
_Static_assert(sizeof(kblock) <= 8 * sizeof(qblock), "kblocks must fit a qblock scratch");
static size_t act_bytes(int64_t T, int64_t n) { return (size_t)(T * (n / 32 + 1)) * sizeof(qblock); }

/* Quantise X into scratch in the format a product with this weight type takes; returns it. */
static int quantise(int type, const float *X, int64_t T, int64_t n, int int8, void *scratch) {
    const int f = act_format(type, T, n, int8);
    if (f == 1) ds4_quantize_act(X, T, n, scratch);
    if (f == 2) ds4_quantize_k(X, T, n, scratch);
    return f;
}

/* The product with X already quantised (acts, format f; xp: kprep()'s arrangement of kblocks,
 * or NULL) or, f = 0, through float rows. */
static void apply(const uint8_t *W, int type, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                  const float *X, int64_t T, float *Y, int64_t y_stride, int f, const void *acts, const int8_t *xp) {
    if (f)
        matmul_int8(W, type, row_bytes, out, n, f == 1 ? acts : NULL, f == 2 ? acts : NULL, xp, T, Y, y_stride);
    else
        matmul(W, deq, row_bytes, out, n, X, n, T, Y, y_stride);
}

static void product(const uint8_t *W, int type, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                    const float *X, int64_t T, float *Y, int64_t y_stride, int int8, void *scratch) {
    apply(W, type, deq, row_bytes, out, n, X, T, Y, y_stride, quantise(type, X, T, n, int8, scratch), scratch, NULL);
}

/* Y (T, out) = X (T, n) W^T; int8: take the integer path where the weight type has one. */
int ds4_matmul(const uint8_t *W, int type, int64_t row_bytes, int64_t out, int64_t n, const float *X,
               int64_t T, float *Y, int int8) {
    deq_fn deq = dequantiser(type);
    if (!deq) return -1;
    void *scratch = NULL;
    if (act_format(type, T, n, int8) && !(scratch = malloc(act_bytes(T, n)))) return -2;
    product(W, type, deq, row_bytes, out, n, X, T, Y, out, int8, scratch);
    free(scratch);
    return 0;
}

/* Several matrices sharing one input X (T, n) into Y[m] (T, out[m]): one call from Python and
 * one quantisation of X per activation format for all of them (a layer asks for up to seven
 * products of the same normalised activations; on decode each separate call cost more than
 * its arithmetic). */
int ds4_matmul_multi(int64_t M, const int64_t *W, const int32_t *type, const int64_t *row_bytes,
                     const int64_t *out, int64_t n, const float *X, int64_t T, const int64_t *Y, int int8) {
    int need[3] = {0, 0, 0};
    for (int64_t m = 0; m < M; m++) {
        if (!dequantiser(type[m])) return -1;
        need[act_format(type[m], T, n, int8)] = 1;
    }
    void *acts[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (int f = 1; f < 3; f++)
        if (need[f] && !(acts[f] = malloc(act_bytes(T, n)))) rc = -2;
    if (rc) goto done;
    if (need[1]) ds4_quantize_act(X, T, n, acts[1]);
    if (need[2]) ds4_quantize_k(X, T, n, acts[2]);
    for (int64_t m = 0; m < M; m++) {
        const int f = act_format(type[m], T, n, int8);
        apply((const uint8_t *)(intptr_t)W[m], type[m], dequantiser(type[m]), row_bytes[m], out[m], n, X, T,
              (float *)(intptr_t)Y[m], out[m], f, acts[f], NULL);
    }
done:
    free(acts[1]);
    free(acts[2]);
    return rc;
}

/* Grouped product: group g of X (G contiguous (T, n) slabs) times rows g*R .. (g+1)*R of W,
 * into columns g*R .. (g+1)*R of Y (T, G*R). The attention output projection in one call. */
int ds4_matmul_grouped(const uint8_t *W, int type, int64_t row_bytes, int64_t G, int64_t R, int64_t n,
                       const float *X, int64_t T, float *Y, int int8) {
    deq_fn deq = dequantiser(type);
    if (!deq) return -1;
    void *scratch = NULL;
    if (act_format(type, T, n, int8) && !(scratch = malloc(act_bytes(T, n)))) return -2;
    for (int64_t g = 0; g < G; g++)
        product(W + g * R * row_bytes, type, deq, row_bytes, R, n, X + g * T * n, T, Y + g * R, G * R, int8, scratch);
    free(scratch);
    return 0;
}

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

/* -- hyper-connections ------------------------------------------------------------------ *
 * The residual stream is hc parallel copies; before each sublayer they are mixed into one
 * input and a Sinkhorn-balanced hc x hc comb, after it spread back (docs/model.md).
 * In MLX ops these are some hundred tiny operations per layer, a fifth of a decode step on
 * the CPU; here they are a few microseconds. Same formulas as model.hc_pre / hc_post. */
static inline float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

int ds4_hc_pre(const float *X, int64_t T, int64_t hc, int64_t E, const uint8_t *fn, int fn_type,
               int64_t fn_row_bytes, const float *scale, const float *base, float rms_eps, float eps,
               int iters, float *x_out, float *post_out, float *M_out) {
    deq_fn deq = dequantiser(fn_type);
    if (!deq || hc > 16) return -1;
    const int64_t F = hc * E, R = (2 + hc) * hc;
    float *flat = malloc((size_t)(T * F) * sizeof *flat), *mix = malloc((size_t)(T * R) * sizeof *mix);
    if (!flat || !mix) { free(flat); free(mix); return -2; }
    for (int64_t t = 0; t < T; t++) {
        const float *xt = X + t * F;
        double ss = 0.0;
        for (int64_t k = 0; k < F; k++) ss += (double)xt[k] * xt[k];
        const float r = 1.0f / sqrtf((float)(ss / (double)F) + rms_eps);
        for (int64_t k = 0; k < F; k++) flat[t * F + k] = xt[k] * r;
    }
    matmul(fn, deq, fn_row_bytes, R, F, flat, F, T, mix, R);
    for (int64_t t = 0; t < T; t++) {
        const float *m = mix + t * R;
        float pre[16], *post = post_out + t * hc, *M = M_out + t * hc * hc;
        for (int64_t i = 0; i < hc; i++) {
            pre[i] = sigmoidf(m[i] * scale[0] + base[i]) + eps;
            post[i] = 2.0f * sigmoidf(m[hc + i] * scale[1] + base[hc + i]);
        }
        for (int64_t i = 0; i < hc; i++) {  /* M[src][dst]: softmax over dst */
            float *row = M + i * hc, mx = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < hc; j++) {
                row[j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
                mx = row[j] > mx ? row[j] : mx;
            }
            for (int64_t j = 0; j < hc; j++) sum += (row[j] = expf(row[j] - mx));
            for (int64_t j = 0; j < hc; j++) row[j] = row[j] / sum + eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0)  /* rows (over dst), from the second round on */
                for (int64_t i = 0; i < hc; i++) {
                    float sum = 0.0f;
                    for (int64_t j = 0; j < hc; j++) sum += M[i * hc + j];
                    for (int64_t j = 0; j < hc; j++) M[i * hc + j] /= sum + eps;
                }
            for (int64_t j = 0; j < hc; j++) {  /* columns (over src) */
                float sum = 0.0f;
                for (int64_t i = 0; i < hc; i++) sum += M[i * hc + j];
                for (int64_t i = 0; i < hc; i++) M[i * hc + j] /= sum + eps;
            }
        }
        float *xo = x_out + t * E;
        const float *xt = X + t * F;
        for (int64_t c = 0; c < E; c++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < hc; i++) acc += pre[i] * xt[i * E + c];
            xo[c] = acc;
        }
    }
    free(flat);
    free(mix);
    return 0;
}

/* X_new[t, j] = post[t, j] * y[t] + sum_i M[t, i, j] X[t, i] (the transpose of the comb). */
void ds4_hc_post(const float *y, const float *X, const float *post, const float *M, int64_t T, int64_t hc,
                 int64_t E, float *out) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < hc; j++) {
            float *o = out + (t * hc + j) * E;
            const float pj = post[t * hc + j];
            for (int64_t c = 0; c < E; c++) o[c] = pj * y[t * E + c];
            for (int64_t i = 0; i < hc; i++) {
                const float mij = M[(t * hc + i) * hc + j];
                const float *xi = X + (t * hc + i) * E;
                for (int64_t c = 0; c < E; c++) o[c] += mij * xi[c];
            }
        }
}

/* -- routed experts ----------------------------------------------------------------------- *
 * For every expert chosen by some token: gather those tokens' rows, gate and up products,
 * clamped SwiGLU scaled by the routing weight, down product, added into the tokens' outputs.
 * Only the chosen experts' rows are read.
 *
 * Two ways to spread the work over the cores, by how many experts there are to go round:
 *
 * - by expert (at least MOE_BY_EXPERT chosen experts per core: a prefill chunk's tokens
 *   choose nearly all of them): the cores take whole experts, round robin in ascending id. A
 *   256-token chunk gives each expert about 6 tokens, and splitting three small products per
 *   expert across the cores cost a barrier each and left the SwiGLU to one core (two cores
 *   ran only 1.35x faster than one). Each core sums its experts' outputs in ascending expert
 *   order into its own buffer; the buffers are added in core order, so the result depends on
 *   the thread count but not on scheduling.
 *
 * - by rows (fewer: decode, where a token chooses 6 experts): every core takes the same share
 *   of the rows of every chosen expert's three matrices, so every core streams weights
 *   whatever their number (whole experts kept 6 of 16 cores busy at one token). Gate, up and
 *   the SwiGLU of a core's rows; a barrier; the down products' rows; a barrier; then each
 *   output is the sum of the experts' outputs in ascending expert order: the same bits for
 *   any number of cores. */
enum { MOE_BY_EXPERT = 4 };

/* Rows f0 .. f1 of the m tokens' gate rows g (F apart) become the clamped SwiGLU times the
 * token's routing weight (slot order[j] of route_w). */
static void swiglu(float *g, const float *u, int64_t F, int64_t f0, int64_t f1, int64_t m, const int64_t *order,
                   const float *route_w, float clamp) {
    for (int64_t j = 0; j < m; j++) {
        const float w = route_w[order[j]];
        float *gj = g + j * F;
        const float *uj = u + j * F;
        for (int64_t f = f0; f < f1; f++) {
            const float gv = gj[f] < clamp ? gj[f] : clamp;
            const float uv = uj[f] < -clamp ? -clamp : (uj[f] > clamp ? clamp : uj[f]);
            gj[f] = gv / (1.0f + expf(-gv)) * uv * w;
        }
    }
}

/* The weights of one layer's experts and what the products need to read them. */
typedef struct {
    const uint8_t *gate, *up, *down;
    int gu_type, d_type;
    deq_fn deq_gu, deq_d;
    int64_t gu_row_bytes, d_row_bytes, E, F;
    float clamp;
    int int8;
} moe_weights;

/* An expert's tokens' activations for one product, quantised once (format f, kprep's
 * arrangement xp where the kernel takes one). */
typedef struct {
    void *q;
    int8_t *xp;
    int f;
} moe_acts;

static int moe_quantise(moe_acts *a, int type, const float *X, int64_t m, int64_t n, int int8) {
    if (!(a->q = malloc(act_bytes(m, n)))) return -2;
    a->f = quantise(type, X, m, n, int8, a->q);
    a->xp = a->f == 2 ? kprep(type, a->q, m, n / 256) : NULL;
    return 0;
}

static void moe_acts_free(moe_acts *a) {
    free(a->q);
    free(a->xp);
}

typedef struct {
    float *xs, *g, *u, *o, *y;
} moe_scratch;

static int moe_expert(const moe_weights *mw, int64_t e, const float *X, int64_t k, const int64_t *order, int64_t m,
                      const float *route_w, moe_scratch *sc) {
    const int64_t E = mw->E, F = mw->F;
    for (int64_t j = 0; j < m; j++) memcpy(sc->xs + j * E, X + (order[j] / k) * E, (size_t)E * 4);
    moe_acts a = {0}, h = {0};
    if (moe_quantise(&a, mw->gu_type, sc->xs, m, E, mw->int8)) return -2;  /* once for gate and up */
    apply(mw->gate + e * F * mw->gu_row_bytes, mw->gu_type, mw->deq_gu, mw->gu_row_bytes, F, E, sc->xs, m, sc->g, F,
          a.f, a.q, a.xp);
    apply(mw->up + e * F * mw->gu_row_bytes, mw->gu_type, mw->deq_gu, mw->gu_row_bytes, F, E, sc->xs, m, sc->u, F, a.f,
          a.q, a.xp);
    moe_acts_free(&a);
    swiglu(sc->g, sc->u, F, 0, F, m, order, route_w, mw->clamp);
    if (moe_quantise(&h, mw->d_type, sc->g, m, F, mw->int8)) return -2;
    apply(mw->down + e * E * mw->d_row_bytes, mw->d_type, mw->deq_d, mw->d_row_bytes, E, F, sc->g, m, sc->o, E, h.f,
          h.q, h.xp);
    moe_acts_free(&h);
    for (int64_t j = 0; j < m; j++) {
        float *y = sc->y + (order[j] / k) * E;
        const float *oj = sc->o + j * E;
        for (int64_t c = 0; c < E; c++) y[c] += oj[c];
    }
    return 0;
}

static int moe_by_expert(const moe_weights *mw, const float *X, int64_t T, int64_t k, const int64_t *count,
                         const int64_t *order, const int64_t *chosen, int64_t n_chosen, int64_t most,
                         const float *route_w, float *Y, int threads) {
    const int64_t E = mw->E, F = mw->F;
    int rc = 0;
    float **partial = calloc((size_t)threads, sizeof *partial);
    if (!partial) return -2;
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num();
        moe_scratch sc = {malloc((size_t)(most * E) * 4), malloc((size_t)(most * F) * 4), malloc((size_t)(most * F) * 4),
                          malloc((size_t)(most * E) * 4), me ? calloc((size_t)(T * E), 4) : Y};
        partial[me] = sc.y;
        const int ok = sc.xs && sc.g && sc.u && sc.o && sc.y;
        if (!ok) {
#pragma omp atomic write
            rc = -2;
        }
        /* every thread meets the work-sharing loop, even one whose buffers failed */
#pragma omp for schedule(static, 1)
        for (int64_t c = 0; c < n_chosen; c++) {
            if (!ok) continue;
            const int64_t e = chosen[c], lo = count[e];
            if (moe_expert(mw, e, X, k, order + lo, count[e + 1] - lo, route_w, &sc)) {
#pragma omp atomic write
                rc = -2;
            }
        }
        free(sc.xs); free(sc.g); free(sc.u); free(sc.o);
#pragma omp barrier
        /* add the other cores' sums into Y (thread 0's buffer), in core order */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < T * E; i++)
            for (int t = 1; t < threads; t++)
                if (partial[t]) Y[i] += partial[t][i];
        if (me) free(sc.y);
    }
    free(partial);
    return rc;
}

static int moe_by_rows(const moe_weights *mw, const float *X, int64_t T, int64_t k, const int64_t *count,
                       const int64_t *order, const int64_t *chosen, int64_t n_chosen, const float *route_w, float *Y) {
    const int64_t E = mw->E, F = mw->F, S = T * k;  /* S slots (token, choice), expert by expert in order */
    float *xs = malloc((size_t)(S * E) * 4), *g = malloc((size_t)(S * F) * 4), *u = malloc((size_t)(S * F) * 4);
    float *o = malloc((size_t)(S * E) * 4);
    moe_acts *a = calloc((size_t)n_chosen, sizeof *a), *h = calloc((size_t)n_chosen, sizeof *h);
    int rc = xs && g && u && o && a && h ? 0 : -2;
    if (!rc) {
#pragma omp parallel
        {
            const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
            /* each expert's inputs gathered and quantised once, for gate and up */
#pragma omp for schedule(static)
            for (int64_t c = 0; c < n_chosen; c++) {
                const int64_t lo = count[chosen[c]], m = count[chosen[c] + 1] - lo;
                for (int64_t j = 0; j < m; j++) memcpy(xs + (lo + j) * E, X + (order[lo + j] / k) * E, (size_t)E * 4);
                if (moe_quantise(a + c, mw->gu_type, xs + lo * E, m, E, mw->int8)) {
#pragma omp atomic write
                    rc = -2;
                }
            }
            /* (the loop's barrier: every input is ready, and rc is the same for all) */
            if (!rc) {
                const int64_t f0 = F * me / nt, f1 = F * (me + 1) / nt;
                for (int64_t c = 0; c < n_chosen; c++) {
                    const int64_t e = chosen[c], lo = count[e], m = count[e + 1] - lo;
                    const int64_t at = e * F + f0;
                    apply(mw->gate + at * mw->gu_row_bytes, mw->gu_type, mw->deq_gu, mw->gu_row_bytes, f1 - f0, E,
                          xs + lo * E, m, g + lo * F + f0, F, a[c].f, a[c].q, a[c].xp);
                    apply(mw->up + at * mw->gu_row_bytes, mw->gu_type, mw->deq_gu, mw->gu_row_bytes, f1 - f0, E,
                          xs + lo * E, m, u + lo * F + f0, F, a[c].f, a[c].q, a[c].xp);
                    swiglu(g + lo * F, u + lo * F, F, f0, f1, m, order + lo, route_w, mw->clamp);
                }
            }
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t c = 0; c < n_chosen; c++) {
                const int64_t lo = count[chosen[c]], m = count[chosen[c] + 1] - lo;
                if (!rc && moe_quantise(h + c, mw->d_type, g + lo * F, m, F, mw->int8)) {
#pragma omp atomic write
                    rc = -2;
                }
            }
            if (!rc) {
                const int64_t r0 = E * me / nt, r1 = E * (me + 1) / nt;
                for (int64_t c = 0; c < n_chosen; c++) {
                    const int64_t e = chosen[c], lo = count[e], m = count[e + 1] - lo;
                    apply(mw->down + (e * E + r0) * mw->d_row_bytes, mw->d_type, mw->deq_d, mw->d_row_bytes, r1 - r0, F,
                          g + lo * F, m, o + lo * E + r0, E, h[c].f, h[c].q, h[c].xp);
                }
            }
#pragma omp barrier
            /* each output in ascending expert order (slots are expert by expert) */
            enum { COLS = 256 };
#pragma omp for schedule(static)
            for (int64_t c0 = 0; c0 < E; c0 += COLS) {
                const int64_t c1 = E - c0 < COLS ? E : c0 + COLS;
                for (int64_t s = 0; s < S && !rc; s++) {
                    float *y = Y + (order[s] / k) * E;
                    const float *os = o + s * E;
                    for (int64_t col = c0; col < c1; col++) y[col] += os[col];
                }
            }
        }
    }
    for (int64_t c = 0; a && h && c < n_chosen; c++) {
        moe_acts_free(a + c);
        moe_acts_free(h + c);
    }
    free(xs); free(g); free(u); free(o); free(a); free(h);
    return rc;
}

int ds4_moe(const float *X, int64_t T, int64_t E, int64_t F, int64_t n_expert, int64_t k,
            const int32_t *sel, const float *route_w,
            const uint8_t *gate, const uint8_t *up, int gu_type, int64_t gu_row_bytes,
            const uint8_t *down, int d_type, int64_t d_row_bytes, float clamp, float *Y, int int8) {
    const moe_weights mw = {gate, up, down, gu_type, d_type, dequantiser(gu_type), dequantiser(d_type),
                            gu_row_bytes, d_row_bytes, E, F, clamp, int8};
    if (!mw.deq_gu || !mw.deq_d) return -1;
    for (int64_t i = 0; i < T * k; i++)
        if (sel[i] < 0 || sel[i] >= n_expert) return -3;
    int64_t *count = calloc((size_t)n_expert + 1, sizeof *count), *fill = calloc((size_t)n_expert, sizeof *fill);
    int64_t *order = malloc((size_t)(T * k) * sizeof *order), *chosen = malloc((size_t)n_expert * sizeof *chosen);
    int rc = 0;
    if (!count || !fill || !order || !chosen) { rc = -2; goto done; }
    for (int64_t i = 0; i < T * k; i++) count[sel[i] + 1]++;
    int64_t n_chosen = 0, most = 0;
    for (int64_t e = 0; e < n_expert; e++) {
        const int64_t m = count[e + 1];
        if (m) chosen[n_chosen++] = e;
        if (m > most) most = m;
        count[e + 1] += count[e];
    }
    for (int64_t i = 0; i < T * k; i++) order[count[sel[i]] + fill[sel[i]]++] = i;  /* token-major per expert */
    const int threads = omp_get_max_threads();
    if (n_chosen >= MOE_BY_EXPERT * threads)
        rc = moe_by_expert(&mw, X, T, k, count, order, chosen, n_chosen, most, route_w, Y, threads);
    else
        rc = moe_by_rows(&mw, X, T, k, count, order, chosen, n_chosen, route_w, Y);
done:
    free(count); free(fill); free(order); free(chosen);
    return rc;
}
