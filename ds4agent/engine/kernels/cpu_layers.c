/* Part of cpu.c, which includes it (one translation unit, one library): Hyper-connections and the
 * routed experts (ds4_moe). */

/* -- hyper-connections ------------------------------------------------------------------ *
 * The residual stream is hc parallel copies; before each sublayer they are mixed into one
 * input and a Sinkhorn-balanced hc x hc comb, after it spread back (docs/model.md).
 * In MLX ops these are some hundred tiny operations per layer, a fifth of a decode step on
 * the CPU; here they are a few microseconds. Same formulas as model.hc_pre / hc_post. */
static inline float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

int ds4_hc_pre(const float *X, int64_t T, int64_t hc, int64_t E, const uint8_t *fn, int fn_type,
               int64_t fn_row_bytes, const float *scale, const float *base, float rms_eps, float eps,
               int iters, float *x_out, float *post_out, float *M_out, int alone) {
    deq_fn deq = dequantiser(fn_type);
    if (!deq || hc > 16) return -1;
    const int64_t F = hc * E, R = (2 + hc) * hc;
    float *flat = malloc((size_t)(T * F) * sizeof *flat), *mix = malloc((size_t)(T * R) * sizeof *mix);
    if (!flat || !mix) { free(flat); free(mix); return -2; }
    /* Tokens are independent in the norm and in everything after the product: each loop over
     * them is spread over the cores (a batch of sessions or a prefill chunk; one token's bits
     * do not depend on which core ran it). */
#pragma omp parallel for schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; t++) {
        const float *xt = X + t * F;
        double ss = 0.0;
        for (int64_t k = 0; k < F; k++) ss += (double)xt[k] * xt[k];
        const float r = 1.0f / sqrtf((float)(ss / (double)F) + rms_eps);
        for (int64_t k = 0; k < F; k++) flat[t * F + k] = xt[k] * r;
    }
    if (alone) {  /* different sessions' tokens: each as a product of its own (the matrix is small), */
        /* the tokens spread over the cores in one region (each product's own would be one per token) */
#pragma omp parallel for schedule(static) if (T > 1 && R * F >= (1 << 16))
        for (int64_t t = 0; t < T; t++) matmul(fn, deq, fn_row_bytes, R, F, flat + t * F, F, 1, mix + t * R, R);
    } else
        matmul(fn, deq, fn_row_bytes, R, F, flat, F, T, mix, R);
#pragma omp parallel for schedule(static) if (T > 1)
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
 *   ran only 1.35x faster than one). Each expert's outputs go to their own rows of one
 *   buffer, added into the tokens' outputs afterwards as below.
 *
 * - by rows (fewer: decode, where a token chooses 6 experts): every core takes the same share
 *   of the rows of every chosen expert's three matrices, so every core streams weights
 *   whatever their number (whole experts kept 6 of 16 cores busy at one token). Gate, up and
 *   the SwiGLU of a core's rows; a barrier; the down products' rows; a barrier.
 *
 * Either way each output is then the sum of its experts' outputs in ascending expert order
 * (add_in_expert_order): the same bits for any number of cores, either split, and any cut of
 * the experts into calls in ascending order. A selection of -1 leaves that (token, choice) out
 * of the call. */
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

/* The weights of one layer's experts and what the products need to read them. Each matrix is
 * found through a table of one address per expert (its first row), not a tensor base plus a
 * stride: the resident case points into the mapped file, the streamed case into the expert
 * pool's slots (docs/streaming.md), and the same products serve both. */
typedef struct {
    const uint8_t *const *gate, *const *up, *const *down;
    int gu_type, d_type;
    deq_fn deq_gu, deq_d;
    int64_t gu_row_bytes, d_row_bytes, E, F;
    float clamp;
    int int8;
    int alone;  /* the tokens are different sessions': each gets the bits it gets alone, this many tokens
                 * per pass (rows_alone); 0: one batch */
} moe_weights;

/* An expert's tokens' activations for one product, quantised once (format f, kprep's
 * arrangement xp where the kernel takes one). */
typedef struct {
    void *q;
    int8_t *xp;
    int f;
} moe_acts;

static int moe_quantise(moe_acts *a, int type, const float *X, int64_t m, int64_t n, int int8, int alone) {
    if (!(a->q = malloc(act_bytes(m, n)))) return -2;
    a->f = alone ? quantise_alone(type, X, m, n, int8, a->q) : quantise(type, X, m, n, int8, a->q);
    a->xp = a->f == 2 ? kprep(type, a->q, m, n / 256) : NULL;
    return 0;
}

/* One product of an expert's m tokens: as one batch, or (alone) each token as by itself. */
static void moe_apply(const moe_weights *mw, const uint8_t *W, int type, deq_fn deq, int64_t row_bytes, int64_t out,
                      int64_t n, const float *X, int64_t m, float *Y, int64_t y_stride, const moe_acts *a) {
    if (in_passes(mw->alone, m))
        rows_alone(W, type, deq, row_bytes, out, n, X, m, Y, y_stride, a->f, a->q, a->xp, mw->alone);
    else
        apply(W, type, deq, row_bytes, out, n, X, m, Y, y_stride, a->f, a->q, a->xp);
}

static void moe_acts_free(moe_acts *a) {
    free(a->q);
    free(a->xp);
}

typedef struct {
    float *xs, *g, *u;
} moe_scratch;

/* Expert e over its m tokens (slots order[0..m) of the call): their outputs to o, m rows of E. */
static int moe_expert(const moe_weights *mw, int64_t e, const float *X, int64_t k, const int64_t *order, int64_t m,
                      const float *route_w, moe_scratch *sc, float *o) {
    const int64_t E = mw->E, F = mw->F;
    for (int64_t j = 0; j < m; j++) memcpy(sc->xs + j * E, X + (order[j] / k) * E, (size_t)E * 4);
    moe_acts a = {0}, h = {0};
    if (moe_quantise(&a, mw->gu_type, sc->xs, m, E, mw->int8, mw->alone)) return -2;  /* once for gate and up */
    moe_apply(mw, mw->gate[e], mw->gu_type, mw->deq_gu, mw->gu_row_bytes, F, E, sc->xs, m, sc->g, F, &a);
    moe_apply(mw, mw->up[e], mw->gu_type, mw->deq_gu, mw->gu_row_bytes, F, E, sc->xs, m, sc->u, F, &a);
    moe_acts_free(&a);
    swiglu(sc->g, sc->u, F, 0, F, m, order, route_w, mw->clamp);
    if (moe_quantise(&h, mw->d_type, sc->g, m, F, mw->int8, mw->alone)) return -2;
    moe_apply(mw, mw->down[e], mw->d_type, mw->deq_d, mw->d_row_bytes, E, F, sc->g, m, o, E, &h);
    moe_acts_free(&h);
    return 0;
}

/* Y[token] += each slot's output, slots in ascending expert order (count/order sort them so):
 * the additions into one output happen in the same order however the work was spread over
 * cores, and a call over a later range of experts continues exactly where an earlier one
 * stopped (the expert pool splits a layer's experts into calls that fit its slots). Run
 * inside a parallel region: the cores share the columns. */
static void add_in_expert_order(float *Y, const float *o, const int64_t *order, int64_t S, int64_t k, int64_t E) {
    enum { COLS = 256 };
#pragma omp for schedule(static)
    for (int64_t c0 = 0; c0 < E; c0 += COLS) {
        const int64_t c1 = E - c0 < COLS ? E : c0 + COLS;
        for (int64_t s = 0; s < S; s++) {
            float *y = Y + (order[s] / k) * E;
            const float *os = o + s * E;
            for (int64_t col = c0; col < c1; col++) y[col] += os[col];
        }
    }
}

/* o holds every slot's output (S rows of E), written by whichever core ran its expert. */
static int moe_by_expert(const moe_weights *mw, const float *X, int64_t S, int64_t k, const int64_t *count,
                         const int64_t *order, const int64_t *chosen, int64_t n_chosen, int64_t most,
                         const float *route_w, float *Y, int threads) {
    const int64_t E = mw->E, F = mw->F;
    float *o = malloc((size_t)(S * E) * 4);
    int rc = o ? 0 : -2;
    if (rc) return rc;
#pragma omp parallel num_threads(threads)
    {
        moe_scratch sc = {malloc((size_t)(most * E) * 4), malloc((size_t)(most * F) * 4), malloc((size_t)(most * F) * 4)};
        const int ok = sc.xs && sc.g && sc.u;
        if (!ok) {
#pragma omp atomic write
            rc = -2;
        }
        /* every thread meets the work-sharing loop, even one whose buffers failed */
#pragma omp for schedule(static, 1)
        for (int64_t c = 0; c < n_chosen; c++) {
            if (!ok) continue;
            const int64_t e = chosen[c], lo = count[e];
            if (moe_expert(mw, e, X, k, order + lo, count[e + 1] - lo, route_w, &sc, o + lo * E)) {
#pragma omp atomic write
                rc = -2;
            }
        }
        free(sc.xs); free(sc.g); free(sc.u);
        /* (the loop's barrier: every slot's output is written, and rc is the same for all) */
        if (!rc) add_in_expert_order(Y, o, order, S, k, E);
    }
    free(o);
    return rc;
}

static int moe_by_rows(const moe_weights *mw, const float *X, int64_t S, int64_t k, const int64_t *count,
                       const int64_t *order, const int64_t *chosen, int64_t n_chosen, const float *route_w, float *Y) {
    const int64_t E = mw->E, F = mw->F;  /* S slots (token, choice), expert by expert in order */
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
                if (moe_quantise(a + c, mw->gu_type, xs + lo * E, m, E, mw->int8, mw->alone)) {
#pragma omp atomic write
                    rc = -2;
                }
            }
            /* (the loop's barrier: every input is ready, and rc is the same for all) */
            if (!rc) {
                const int64_t f0 = F * me / nt, f1 = F * (me + 1) / nt;
                for (int64_t c = 0; c < n_chosen; c++) {
                    const int64_t e = chosen[c], lo = count[e], m = count[e + 1] - lo;
                    moe_apply(mw, mw->gate[e] + f0 * mw->gu_row_bytes, mw->gu_type, mw->deq_gu, mw->gu_row_bytes,
                              f1 - f0, E, xs + lo * E, m, g + lo * F + f0, F, a + c);
                    moe_apply(mw, mw->up[e] + f0 * mw->gu_row_bytes, mw->gu_type, mw->deq_gu, mw->gu_row_bytes,
                              f1 - f0, E, xs + lo * E, m, u + lo * F + f0, F, a + c);
                    swiglu(g + lo * F, u + lo * F, F, f0, f1, m, order + lo, route_w, mw->clamp);
                }
            }
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t c = 0; c < n_chosen; c++) {
                const int64_t lo = count[chosen[c]], m = count[chosen[c] + 1] - lo;
                if (!rc && moe_quantise(h + c, mw->d_type, g + lo * F, m, F, mw->int8, mw->alone)) {
#pragma omp atomic write
                    rc = -2;
                }
            }
            if (!rc) {
                const int64_t r0 = E * me / nt, r1 = E * (me + 1) / nt;
                for (int64_t c = 0; c < n_chosen; c++) {
                    const int64_t e = chosen[c], lo = count[e], m = count[e + 1] - lo;
                    moe_apply(mw, mw->down[e] + r0 * mw->d_row_bytes, mw->d_type, mw->deq_d, mw->d_row_bytes,
                              r1 - r0, F, g + lo * F, m, o + lo * E + r0, E, h + c);
                }
            }
#pragma omp barrier
            if (!rc) add_in_expert_order(Y, o, order, S, k, E);
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
            const uint8_t *const *gate, const uint8_t *const *up, int gu_type, int64_t gu_row_bytes,
            const uint8_t *const *down, int d_type, int64_t d_row_bytes, float clamp, float *Y, int int8,
            int alone) {
    const moe_weights mw = {gate, up, down, gu_type, d_type, dequantiser(gu_type), dequantiser(d_type),
                            gu_row_bytes, d_row_bytes, E, F, clamp, int8, alone};
    if (!mw.deq_gu || !mw.deq_d) return -1;
    for (int64_t i = 0; i < T * k; i++)
        if (sel[i] < -1 || sel[i] >= n_expert) return -3;
    int64_t *count = calloc((size_t)n_expert + 1, sizeof *count), *fill = calloc((size_t)n_expert, sizeof *fill);
    int64_t *order = malloc((size_t)(T * k) * sizeof *order), *chosen = malloc((size_t)n_expert * sizeof *chosen);
    int rc = 0;
    if (!count || !fill || !order || !chosen) { rc = -2; goto done; }
    int64_t S = 0;  /* the slots taken: -1 leaves a (token, choice) to another call */
    for (int64_t i = 0; i < T * k; i++)
        if (sel[i] >= 0) count[sel[i] + 1]++, S++;
    if (!S) goto done;
    int64_t n_chosen = 0, most = 0;
    for (int64_t e = 0; e < n_expert; e++) {
        const int64_t m = count[e + 1];
        if (m) chosen[n_chosen++] = e;
        if (m > most) most = m;
        count[e + 1] += count[e];
    }
    for (int64_t i = 0; i < T * k; i++)  /* token-major per expert */
        if (sel[i] >= 0) order[count[sel[i]] + fill[sel[i]]++] = i;
    const int threads = omp_get_max_threads();
    if (n_chosen >= MOE_BY_EXPERT * threads)
        rc = moe_by_expert(&mw, X, S, k, count, order, chosen, n_chosen, most, route_w, Y, threads);
    else
        rc = moe_by_rows(&mw, X, S, k, count, order, chosen, n_chosen, route_w, Y);
done:
    free(count); free(fill); free(order); free(chosen);
    return rc;
}
