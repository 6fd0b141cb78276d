/* Part of cpu.c, which includes it (one translation unit, one library): Weight rows decoded once
 * into blocks for several tokens, their dots against 1-4 tokens; what the integer path offers per
 * weight type (and its stand-ins without AVX2). */

/* The row decoder and its dots have one signature with or without AVX2 (without it the block
 * is a stand-in and int8_decoder offers nothing). */
typedef struct wblock wblock;
typedef void (*idec_fn)(const uint8_t *, wblock *, int64_t);
typedef float (*wdot_fn)(const wblock *, const qblock *, int64_t);
typedef void (*wdot2_fn)(const wblock *, const qblock *, const qblock *, int64_t, float *);
typedef void (*wdot4_fn)(const wblock *, const qblock *, int64_t, float *);
typedef void (*wdot2x4_fn)(const wblock *, const wblock *, const qblock *, int64_t, float *);

#if defined(__AVX2__) && defined(__FMA__)  /* (cpu_int8.c's block, continued) */

/* For several tokens, each weight row is first decoded once into 32-weight blocks of small
 * integers with float scales (and minimums, for the K-quants) laid out as 8-lane vectors,
 * then every token takes a short integer dot with it: table lookups and bit unpacking are
 * paid once per row, not once per token. Signed formats keep magnitudes and signs apart so
 * the per-token work is one sign, one unsigned-by-signed dot and two FMAs per block. */
struct wblock {
    uint8_t q[32];   /* magnitudes (IQ2_XXS, Q8_0) or the unsigned quants (K-quants) */
    int8_t sg[32];   /* +1/-1 signs (signed formats only) */
    float sc[8];     /* scale of elements 0..15 in lanes 0..3, of 16..31 in lanes 4..7 */
    float mn[8];     /* minimum, same layout (K-quants only) */
};

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
struct wblock { int dummy; };
static idec_fn int8_decoder(int type, wdot_fn *dot, wdot2_fn *dot2, wdot4_fn *dot4, wdot2x4_fn *dot2x4) {
    (void)type; (void)dot; (void)dot2; (void)dot4; (void)dot2x4; return 0;
}
#endif
