/* Part of cpu.c, which includes it (one translation unit, one library): IQ2_XXS and Q2_K at 1-15
 * tokens decoded in registers (AVX2, AVX-512 planes), the activations' arrangement for them, their
 * row loop; Q4_K's one-token dot. */

#if defined(__AVX2__) && defined(__FMA__)  /* (cpu_int8.c's block, continued) */

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

#endif
