/* Part of cpu.c, which includes it (one translation unit, one library): Choosing the kernel for a
 * product: ds4_matmul, ds4_matmul_multi, ds4_matmul_grouped. */

/* Up to this many tokens read each weight block straight from the file per token (Q8_0 with
 * AVX-512 VNNI: up to Q8_FEW_MAX, cpu_q8.c); more tokens decode each row once into wblocks
 * first (measured crossover on AVX-512 Zen 4). */
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
#if defined(HAVE_Q8_FEW)
    if (type == T_Q8_0 && T <= Q8_FEW_MAX && nb % 8 == 0 &&
        !matmul_q8_0_few(W, row_bytes, out, nb, Xq, T, Y, y_stride, parallel))
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

/* Rows per run of the one-token-at-a-time products below: about this many bytes of weights, so
 * that a run stays in the core's L2 cache while every token of the batch passes over it. A run
 * is a multiple of 4 rows: the one-token Q8_0 kernel works in quads and then row by row, so
 * every row takes the path it takes in the whole matrix. */
#define ALONE_RUN_BYTES (192 << 10)

static int64_t alone_run(int64_t row_bytes) {
    const int64_t run = ALONE_RUN_BYTES / (row_bytes > 0 ? row_bytes : 1) / 4 * 4;
    return run < 4 ? 4 : run;
}

/* Quantise T tokens' activations in the format a product of one token takes (a token's blocks
 * do not depend on the others'); returns the format. */
static int quantise_alone(int type, const float *X, int64_t T, int64_t n, int int8, void *scratch) {
    const int f = act_format(type, 1, n, int8);
    if (f == 1) ds4_quantize_act(X, T, n, scratch);
    if (f == 2) ds4_quantize_k(X, T, n, scratch);
    return f;
}

/* The most tokens one pass of the alone products takes: the widths of the few-token Q8_0
 * kernel, the IQ2_XXS/Q2_K register kernels and the F16 one-token dots. */
#define ALONE_MAX_T 8
_Static_assert(ALONE_MAX_T >= F16_FEW_MAX && ALONE_MAX_T >= KT_MAX, "a pass must fit every few-token path");
#if defined(HAVE_Q8_FEW)
_Static_assert(ALONE_MAX_T >= Q8_FEW_MAX, "a pass must fit the few-token Q8_0 kernel");
#endif

int ds4_alone_max(void) { return ALONE_MAX_T; }

/* Rows 0 .. out of W for T tokens, each token's outputs exactly as the product of that token
 * alone computes them (T = 1), with each weight row still read from memory once for all the
 * tokens: run by run, every g tokens through the few-token path over the run. g is 1, or up to
 * ALONE_MAX_T where the caller found that path to compute each token, for every count of
 * tokens up to g, as the one-token path does (kernels/cpu.py alone_group checks it on the
 * matrix itself). ``acts``: the tokens quantised by quantise_alone (format f), ``xp`` their
 * kprep() arrangement or NULL. Serial: callers spread runs (or row ranges) over the cores.
 * Sessions decoding together in one batch so get the bits they would get alone
 * (docs/batching.md). */
static void rows_alone(const uint8_t *W, int type, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                       const float *X, int64_t T, float *Y, int64_t y_stride, int f, const void *acts,
                       const int8_t *xp, int g) {
    const size_t tb = f == 1 ? (size_t)(n / 32) * sizeof(qblock) : f == 2 ? (size_t)(n / 256) * sizeof(kblock) : 0;
    const int64_t run = alone_run(row_bytes);
    if (g < 1 || g > ALONE_MAX_T) g = 1;
    for (int64_t r0 = 0; r0 < out; r0 += run) {
        const int64_t nr = out - r0 < run ? out - r0 : run;
        for (int64_t t = 0; t < T; t += g)
            apply(W + r0 * row_bytes, type, deq, row_bytes, nr, n, X + t * n, T - t < g ? T - t : g,
                  Y + t * y_stride + r0, y_stride, f, (const char *)acts + t * tb,
                  xp ? xp + t * kprep_bytes(n / 256) : NULL);
    }
}

/* rows_alone over the whole matrix, its runs spread over the cores. A matrix of one run (the
 * output's hyper-connection mix: 4 rows) is still one parallel region, run by one core: the
 * products inside would otherwise each open a region of their own, one per pass, and waking
 * the other cores for each cost 0.1 ms against a few microseconds of work (8 sessions: 3 ms a
 * step for the 4 x 16384 output mix). */
static void apply_alone(const uint8_t *W, int type, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                        const float *X, int64_t T, float *Y, int64_t y_stride, int int8, void *scratch, int g) {
    const int f = quantise_alone(type, X, T, n, int8, scratch);
    const int64_t run = alone_run(row_bytes), nrun = (out + run - 1) / run;
#pragma omp parallel for schedule(static) if (out * n >= (1 << 16))
    for (int64_t j = 0; j < nrun; j++) {
        const int64_t r0 = j * run, nr = out - r0 < run ? out - r0 : run;
        rows_alone(W + r0 * row_bytes, type, deq, row_bytes, nr, n, X, T, Y + r0, y_stride, f, scratch, NULL, g);
    }
}

/* Whether alone products of T tokens (``alone`` per pass) need rows_alone's passes over runs:
 * with no more tokens than one pass takes, the plain product over the whole matrix is already
 * that pass (alone_group checked every count up to ``alone``; a row's result does not depend
 * on which rows share its call), and it spreads the rows over the cores without the runs'
 * per-pass setup. */
static int in_passes(int alone, int64_t T) { return alone && T > alone; }

static void product(const uint8_t *W, int type, deq_fn deq, int64_t row_bytes, int64_t out, int64_t n,
                    const float *X, int64_t T, float *Y, int64_t y_stride, int int8, void *scratch, int alone) {
    if (in_passes(alone, T))
        apply_alone(W, type, deq, row_bytes, out, n, X, T, Y, y_stride, int8, scratch, alone);
    else
        apply(W, type, deq, row_bytes, out, n, X, T, Y, y_stride, quantise(type, X, T, n, int8, scratch), scratch, NULL);
}

/* The activations' scratch for T tokens in the format a product takes (alone: the one-token
 * format for each of them); NULL where it takes none, *failed set when memory ran out. */
static void *act_scratch(int type, int64_t T, int64_t n, int int8, int alone, int *failed) {
    if (!act_format(type, alone ? 1 : T, n, int8)) return NULL;
    void *p = malloc(act_bytes(T, n));
    if (!p) *failed = 1;
    return p;
}

/* Y (T, out) = X (T, n) W^T; int8: take the integer path where the weight type has one; alone
 * (0: no): each token's row as by itself, ``alone`` tokens per pass (rows_alone). */
int ds4_matmul(const uint8_t *W, int type, int64_t row_bytes, int64_t out, int64_t n, const float *X,
               int64_t T, float *Y, int int8, int alone) {
    deq_fn deq = dequantiser(type);
    if (!deq) return -1;
    int failed = 0;
    void *scratch = act_scratch(type, T, n, int8, alone, &failed);
    if (failed) return -2;
    product(W, type, deq, row_bytes, out, n, X, T, Y, out, int8, scratch, alone);
    free(scratch);
    return 0;
}

/* Several matrices sharing one input X (T, n) into Y[m] (T, out[m]): one call from Python and
 * one quantisation of X per activation format for all of them (a layer asks for up to seven
 * products of the same normalised activations; on decode each separate call cost more than
 * its arithmetic). ``alone``: each matrix as ds4_matmul's ``alone`` (apply_alone). */
int ds4_matmul_multi(int64_t M, const int64_t *W, const int32_t *type, const int64_t *row_bytes,
                     const int64_t *out, int64_t n, const float *X, int64_t T, const int64_t *Y, int int8,
                     int alone) {
    if (in_passes(alone, T)) {
        for (int64_t m = 0; m < M; m++) {
            const int rc = ds4_matmul((const uint8_t *)(intptr_t)W[m], type[m], row_bytes[m], out[m], n, X, T,
                                      (float *)(intptr_t)Y[m], int8, alone);
            if (rc) return rc;
        }
        return 0;
    }
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
                       const float *X, int64_t T, float *Y, int int8, int alone) {
    deq_fn deq = dequantiser(type);
    if (!deq) return -1;
    int failed = 0;
    void *scratch = act_scratch(type, T, n, int8, alone, &failed);
    if (failed) return -2;
    for (int64_t g = 0; g < G; g++)
        product(W + g * R * row_bytes, type, deq, row_bytes, R, n, X + g * T * n, T, Y + g * R, G * R, int8, scratch,
                alone);
    free(scratch);
    return 0;
}
