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
 * Compiled at first use by kernels/cpu.py (cc -O3 -march=native -fopenmp when available), as one
 * translation unit: this file and the parts it includes below, in order (each part uses what
 * the ones before it define).
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

enum { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, T_Q2_K = 10, T_Q4_K = 12, T_IQ2_XXS = 16, T_MXFP4 = 39 };

/* MXFP4's 16 code values (E2M1, doubled), handed over at load from the gguf package. */
static float MXFP4_VALUES[16];

void ds4_set_mxfp4_values(const float *v) { memcpy(MXFP4_VALUES, v, sizeof MXFP4_VALUES); }

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

#include "cpu_float.c"
#include "cpu_int8.c"
#include "cpu_experts.c"
#include "cpu_rows.c"
#include "cpu_q8.c"
#include "cpu_matmul.c"
#include "cpu_attention.c"
#include "cpu_layers.c"
