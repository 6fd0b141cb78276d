/* Part of cpu.c, which includes it (one translation unit, one library): Q8_0 products: 16+ tokens
 * on AMX tiles or AVX-512 VNNI registers, 1-8 tokens streamed once. */

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
/* Q8_0 rows r0 .. r1 against NT (1..Q8_FEW_MAX) quantised tokens, each row read once, straight
 * from the file: the decode products (the output head, attention, shared expert) and those of
 * sessions decoding together. VNNI multiplies unsigned by signed bytes, so each weight byte is
 * made unsigned with one xor (w + 128) and the excess, 128 * sum(x) per activation block, comes
 * off once per eight blocks (cx: d_x * 128 * sum(q), made with the activations). One 512-bit
 * VPDPBUSD takes two blocks; its sixteen int32 lanes (eight per block) become floats and meet
 * their blocks' scales d_w * d_x lane by lane (the eight blocks' scales made once per token and
 * spread over the lanes by one permute per block pair), so a token costs four products, four
 * conversions, four permutes and four FMAs per eight blocks and no horizontal sum until the
 * row ends. Summing each block's lanes first in integers (the kernel this replaced) cost a
 * token about twice the instructions, mostly shuffles on one port: fine for one token, which
 * waits for memory anyway, but it made eight sessions decoding together pay eight times the
 * arithmetic of one. A token's sums are the same operations in the same order whatever NT is,
 * so a token gets the same bits in a pass of NT tokens as alone (kernels/cpu.py alone_group
 * checks it); every sum is exact in int32, and the float order differs from the kernels for
 * more tokens, within the tests' float32 bounds. */
#define Q8_FEW_MAX 8
static inline __attribute__((always_inline)) void q8_0_few(const uint8_t *W, int64_t row_bytes, int64_t r0,
                                                           int64_t r1, const qblock *Xq, const int8_t *xq,
                                                           const float *xd, const float *cx, int64_t nb, const int NT,
                                                           float *Y, int64_t y_stride) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    const __m256i at34 = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    /* pair k of the eight blocks: block 2k's scale in lanes 0-7, block 2k + 1's in lanes 8-15 */
    __m512i pick[4];
    for (int k = 0; k < 4; k++)
        pick[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * k)), _mm256_set1_epi32(2 * k + 1), 1);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = W + r * row_bytes;
        __m512 acc[Q8_FEW_MAX];
        __m256 corr[Q8_FEW_MAX];
        for (int t = 0; t < NT; t++) {
            acc[t] = _mm512_setzero_ps();
            corr[t] = _mm256_setzero_ps();
        }
        int64_t b = 0;
        for (; b + 8 <= nb; b += 8) {
            const uint8_t *g = w + 34 * b;
            if (pf_q8)
                for (int o = 0; o < 8 * 34; o += 64) __builtin_prefetch(g + pf_q8 + o, 0, 3);
            const __m256i dh = _mm256_and_si256(_mm256_i32gather_epi32((const int *)g, at34, 1), low16);
            const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dh));
            __m512i u[4];
            for (int k = 0; k < 4; k++) {
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(g + 34 * (2 * k) + 2));
                const __m256i hi = _mm256_loadu_si256((const __m256i *)(g + 34 * (2 * k + 1) + 2));
                u[k] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
            }
            for (int t = 0; t < NT; t++) {
                const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(xd + t * nb + b)));
                const int8_t *x = xq + 32 * (t * nb + b);
                for (int k = 0; k < 4; k++) {
                    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[k],
                                                          _mm512_load_si512((const void *)(x + 64 * k)));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(pick[k], sc), acc[t]);
                }
                corr[t] = _mm256_fmadd_ps(dw, _mm256_loadu_ps(cx + t * nb + b), corr[t]);
            }
        }
        float tail[Q8_FEW_MAX] = {0.0f};
        for (; b < nb; b++) {  /* rows of fewer than 8 blocks left over (no tensor here has any) */
            const float dw1 = h2f_fast(w + 34 * b);
            for (int t = 0; t < NT; t++) {
                int32_t sum = 0;
                for (int l = 0; l < 32; l++) sum += (int32_t)((const int8_t *)(w + 34 * b + 2))[l] * Xq[t * nb + b].q[l];
                tail[t] += dw1 * Xq[t * nb + b].d * (float)sum;
            }
        }
        for (int t = 0; t < NT; t++) {
            const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(acc[t]), _mm512_extractf32x8_ps(acc[t], 1));
            Y[t * y_stride + r] = hsum8(_mm256_sub_ps(halves, corr[t])) + tail[t];
        }
    }
}

/* Y (T, out) for T = 1..Q8_FEW_MAX tokens through q8_0_few, rows split in contiguous runs per
 * core: each core streams one run, which the hardware prefetchers follow as they follow the
 * read probe (software prefetching 0.5 to 8 KB ahead measured no better on 2 Zen 4 cores, and
 * 2-8 KB ahead a third slower; on the Intel VM 2 KB ahead pays: cpu.c pf_q8). The four-row
 * kernel it replaces read four rows at once with the next four prefetched: on the same cores
 * the output head went from 22 to 57 GB/s. */
static int matmul_q8_0_few(const uint8_t *W, int64_t row_bytes, int64_t out, int64_t nb, const qblock *Xq,
                           int64_t T, float *Y, int64_t y_stride, int parallel) {
    /* the activations' quants side by side (64-byte aligned: half the cache lines of the
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
        switch (T) {  /* a copy of the loop per token count, its accumulators in registers */
#define Q8_FEW(n) case n: q8_0_few(W, row_bytes, r0, r1, Xq, xq, xd, cx, nb, n, Y, y_stride); break;
        Q8_FEW(1) Q8_FEW(2) Q8_FEW(3) Q8_FEW(4) Q8_FEW(5) Q8_FEW(6) Q8_FEW(7) default: Q8_FEW(8)
#undef Q8_FEW
        }
    }
    free(xq);
    return 0;
}
#endif
