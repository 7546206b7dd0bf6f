/*
 * sampler.c - per-request token sampling (see sampler.h for the model and
 * the order of the stages).
 *
 * How a step runs over a row of n_vocab logits:
 *
 *   - Stages 1-3 (bias, min_tokens masking, penalties) touch only a sparse
 *     set of entries. Each write goes through an undo log, so the row can be
 *     given back exactly as it came, and so the raw values that logprobs
 *     need are still known. Nothing else ever writes to the row: temperature
 *     is applied on the fly.
 *   - Greedy: one argmax pass.
 *   - top_k: radix select over the float bits (three 11/11/10-bit digit
 *     passes, fewer when a digit bucket settles it) finds the k-th largest
 *     key without moving the row; one more pass copies the k winners out.
 *   - top_p: a histogram of the tokens' distance from the top in nats
 *     (8 buckets per nat) finds the bucket where the mass crosses top_p;
 *     only tokens at or above it are sorted, and the exact cut is found in
 *     them. The buckets are monotone in the logit, so the tokens taken are
 *     a prefix of the fully sorted order and the cut is the full sort's.
 *   - Neither top_k nor top_p: nothing is materialized. One pass sums the
 *     weights per chunk of 1024 tokens; the draw finds its chunk from those
 *     sums and recomputes the weights of that one chunk.
 *
 * Penalty counts live in an open-addressing hash table (linear probing,
 * Fibonacci hashing) keyed by token, so memory follows the distinct tokens
 * seen, not the vocabulary. With penalty_last_n a ring of the last n tokens
 * decrements counts as tokens leave the window; entries that reach zero stay
 * until the next growth rehashes them away.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The draw must not depend on how the compiler fuses a * b + c: keep every
 * float operation of this file rounded on its own. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define CHUNK 1024    /* tokens per partial weight sum */
#define N_BUCKETS 512 /* top_p histogram buckets */
#define BUCKETS_PER_NAT 8.0f
#define SORT_ALL_MAX 256 /* top_k sets up to this size are sorted whole */
#define TAB_MIN_CAP 64u

enum { COUNT_REP = 1, COUNT_FREQ = 2 };

typedef struct {
    int32_t token;  /* -1 = empty */
    int32_t n_rep;  /* occurrences feeding repetition_penalty */
    int32_t n_freq; /* occurrences feeding presence/frequency penalties */
} pen_slot;

typedef struct {
    int32_t token;
    int32_t flags; /* COUNT_REP | COUNT_FREQ */
} ring_ent;

typedef struct {
    int32_t id;
    float logit; /* after stages 1-3 */
    float w;     /* exp((logit - max) / temperature) */
} cand;

typedef struct {
    int32_t id;
    float raw;
} undo_ent;

typedef enum { PLAN_GREEDY, PLAN_CAND, PLAN_SCAN } plan_kind;

/* What to draw from, built by prepare() over the processed row. */
typedef struct {
    plan_kind kind;
    int32_t token; /* GREEDY: the answer */
    int32_t n;     /* CAND: kept entries in s->cand[0..n) */
    float max;     /* SCAN: the row's largest processed logit */
    float inv_t;   /* SCAN: 1 / temperature */
    float min_w;   /* SCAN: weights below are dropped (min_p) */
    double z;      /* CAND, SCAN: sum of kept weights */
} plan;

struct cinfer_sampler {
    cinfer_sampler_params p; /* eog_tokens / logit_bias point at our copies */
    int32_t *eog;
    cinfer_logit_bias *bias;
    /* For cinfer_sampler_edits: logit_bias sorted by token (bias_dup: some
     * token twice, whose biases add one after another, so no edits), and
     * the distinct eog tokens, sorted. */
    cinfer_logit_bias *bias_sorted;
    int bias_dup;
    int32_t *eog_sorted;
    int32_t n_eog_sorted;
    uint64_t key;       /* the draws' key, mixed from params.seed */
    uint32_t n_draws;   /* draws at the current output position (since the
                           last accept) */
    int penalties;      /* some penalty is not neutral */
    int32_t n_accepted; /* output tokens accepted */
    const uint8_t *allowed; /* the next call's mask, or NULL */

    pen_slot *tab;     /* NULL until the first counted token */
    uint32_t tab_cap;  /* power of two */
    uint32_t tab_used; /* non-empty slots (zero counts included) */
    int tab_shift;     /* 32 - log2(tab_cap) */

    ring_ent *ring;    /* penalty_last_n entries, or NULL */
    int32_t ring_head; /* next write; the oldest entry once full */
    int32_t ring_count;

    cand *cand;
    int32_t cand_cap;
    undo_ent *undo;
    int32_t undo_cap;
    int32_t n_undo;
    double *chunk; /* [n_chunks] weight sums */
    int32_t n_chunks;
};

/* ---------------------------------------------------------------------- */
/* Draws: counter-based, keyed by (seed, position, draw)                  */
/* ---------------------------------------------------------------------- */

/* splitmix64's finalizer: a bijection of 64-bit words with full
 * avalanche. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t draw_key(uint64_t seed)
{
    return mix64(seed + 0x9e3779b97f4a7c15ULL);
}

/* Uniform in [0, 1) with 53 random bits: the draw-th draw at output
 * position pos (tokens accepted before it) of the stream keyed by key. A
 * pure function, so that a position's draw does not depend on how many
 * draws other positions took (speculative decoding verifies several
 * positions in one step). */
static double draw_uniform(uint64_t key, int32_t pos, uint32_t draw)
{
    uint64_t c = ((uint64_t)(uint32_t)pos << 32) | draw;
    uint64_t z = mix64(c * 0x9e3779b97f4a7c15ULL + key);
    z = mix64(z ^ key);
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---------------------------------------------------------------------- */
/* Small helpers                                                          */
/* ---------------------------------------------------------------------- */

/* Orders floats as unsigned integers; -0.0 and +0.0 get the same key. */
static inline uint32_t float_key(float f)
{
    f += 0.0f; /* -0.0 + 0.0 = +0.0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Larger logit first, then lower id. */
static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Larger p first, then lower id. */
static int cmp_bias_token(const void *a, const void *b)
{
    int32_t x = ((const cinfer_logit_bias *)a)->token;
    int32_t y = ((const cinfer_logit_bias *)b)->token;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_token_prob(const void *a, const void *b)
{
    const cinfer_token_prob *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->token > y->token) - (x->token < y->token);
}

/* e^x for x <= 0, four lanes at a time, with the libm left out on purpose:
 * glibc picks its expf at run time by CPU (an FMA variant where there is
 * FMA), the variants may round differently, and then the same seed could
 * draw a different token on another machine. This is plain IEEE single
 * arithmetic in GCC/clang vector extensions (SSE2 on x86-64, NEON on arm64;
 * no FMA contraction, see the pragmas above), so its bits are the same
 * everywhere, and a lane gives the same bits whatever its neighbours. Within
 * 1 ulp of the correctly rounded value over every float in [-87, 0], exactly
 * 1 at 0; below -87 (under FLT_MIN) and for -inf it is 0.
 * Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-7
 * polynomial, times 2^n through the exponent bits. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f exp4_neg(v4f x)
{
    const v4f lo = {-87.0f, -87.0f, -87.0f, -87.0f};
    const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
    v4i keep = x >= lo; /* all ones where the result is not 0 */
    v4i below = x < lo;
    v4f xc = (v4f)(((v4i)x & ~below) | ((v4i)lo & below));
    v4i above = xc > zero;
    xc = (v4f)((v4i)xc & ~above);
    /* n = round(x / ln2) by the 1.5 * 2^23 trick */
    v4f n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    v4f r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v4f q = r * 1.9875691500e-4f + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    v4f e = q * r * r + r + 1.0f;
    v4i scale = (__builtin_convertvector(n, v4i) + 127) << 23; /* 2^n */
    e = e * (v4f)scale;
    return (v4f)((v4i)e & keep);
}

/* w = exp((logit - max) * inv_t), 0 where below min_w: the weight of a
 * token relative to the top one (1), and what every pass uses. */
static inline v4f weight4(v4f logit, float max, float inv_t, float min_w)
{
    v4f e = exp4_neg((logit - max) * inv_t);
    v4i ok = e >= min_w;
    return (v4f)((v4i)e & ok);
}

static inline float weight(float logit, float max, float inv_t, float min_w)
{
    v4f v = {logit, logit, logit, logit};
    return weight4(v, max, inv_t, min_w)[0];
}

/* w[0..n) = weight(x[0..n)); the same bits as weight() per element. */
static void weights(const float *x, int32_t n, float max, float inv_t,
                    float min_w, float *w)
{
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f v;
        memcpy(&v, x + i, sizeof v);
        v4f r = weight4(v, max, inv_t, min_w);
        memcpy(w + i, &r, sizeof r);
    }
    for (; i < n; i++)
        w[i] = weight(x[i], max, inv_t, min_w);
}

/* Sum of w[0..n) in double over four interleaved accumulators: a fixed
 * order (reproducible), without one long chain of dependent adds. */
static double sum_weights(const float *w, int32_t n)
{
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += w[i];
        a1 += w[i + 1];
        a2 += w[i + 2];
        a3 += w[i + 3];
    }
    for (; i < n; i++)
        a0 += w[i];
    return (a0 + a1) + (a2 + a3);
}

static inline int bucket_of(float logit, float max, float inv_t)
{
    float d = (max - logit) * inv_t * BUCKETS_PER_NAT; /* >= 0, +inf for -inf */
    return d < (float)(N_BUCKETS - 1) ? (int)d : N_BUCKETS - 1;
}

/* Grows *buf to hold n elements of size `elem`; keeps contents. */
static cinfer_status grow(void **buf, int32_t *cap, int32_t n, size_t elem,
                          const char *what)
{
    if (n <= *cap)
        return CINFER_OK;
    int32_t c = *cap > 0 ? *cap : 64;
    while (c < n)
        c = c > INT32_MAX / 2 ? n : c * 2;
    void *nb = realloc(*buf, (size_t)c * elem);
    if (!nb)
        return cinfer_set_error(CINFER_E_NOMEM, "sampler: cannot grow %s to %d",
                                what, c);
    *buf = nb;
    *cap = c;
    return CINFER_OK;
}

/* First index holding NaN or +inf (-1 if none) and the largest value, over
 * x[0..n). The main loop has no early exit so the compiler can vectorize
 * it; the bad index is looked for only when there is one. */
static int32_t scan_max(const float *x, int32_t n, float *max)
{
    float m = -INFINITY;
    int bad = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = x[i];
        bad |= !(v < INFINITY);
        m = v > m ? v : m;
    }
    if (bad) {
        for (int32_t i = 0; i < n; i++)
            if (!(x[i] < INFINITY))
                return i;
    }
    *max = m;
    return -1;
}

static cinfer_status bad_logit(const float *x, int32_t i, const char *what)
{
    return cinfer_set_error(CINFER_E_RANGE,
                            "%s[%d] is %s (logits must be finite or -inf)",
                            what, i, isnan(x[i]) ? "NaN" : "+inf");
}

/* ---------------------------------------------------------------------- */
/* Penalty counts                                                         */
/* ---------------------------------------------------------------------- */

static inline uint32_t tab_index(const cinfer_sampler *s, int32_t token)
{
    return ((uint32_t)token * 2654435769u) >> s->tab_shift;
}

/* The slot of `token`, created empty if absent. Capacity must be reserved. */
static pen_slot *tab_slot(cinfer_sampler *s, int32_t token)
{
    uint32_t mask = s->tab_cap - 1;
    uint32_t i = tab_index(s, token);
    while (s->tab[i].token != token && s->tab[i].token != -1)
        i = (i + 1) & mask;
    if (s->tab[i].token == -1) {
        s->tab[i].token = token;
        s->tab[i].n_rep = 0;
        s->tab[i].n_freq = 0;
        s->tab_used++;
    }
    return &s->tab[i];
}

/* The slot of `token`, or NULL if it has none. */
static const pen_slot *tab_find(const cinfer_sampler *s, int32_t token)
{
    if (!s->tab)
        return NULL;
    uint32_t mask = s->tab_cap - 1;
    for (uint32_t i = tab_index(s, token);; i = (i + 1) & mask) {
        if (s->tab[i].token == token)
            return &s->tab[i];
        if (s->tab[i].token == -1)
            return NULL;
    }
}

/* Makes room for `extra` more distinct tokens at load <= 1/2. Growth drops
 * entries whose counts fell to zero. */
static cinfer_status tab_reserve(cinfer_sampler *s, int64_t extra)
{
    int64_t need = (int64_t)s->tab_used + extra;
    if (need > s->p.n_vocab)
        need = s->p.n_vocab; /* entries are distinct tokens */
    if (s->tab && need <= (int64_t)(s->tab_cap / 2))
        return CINFER_OK;

    int64_t live = 0;
    for (uint32_t i = 0; i < s->tab_cap; i++)
        if (s->tab[i].token >= 0 && (s->tab[i].n_rep || s->tab[i].n_freq))
            live++;
    int64_t want = live + extra;
    if (want > s->p.n_vocab)
        want = s->p.n_vocab;
    uint32_t cap = TAB_MIN_CAP;
    int shift = 32 - 6;
    while ((int64_t)(cap / 2) < want) {
        cap *= 2;
        shift--;
    }
    pen_slot *nt = malloc((size_t)cap * sizeof *nt);
    if (!nt)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "sampler: cannot grow the penalty table to %u",
                                cap);
    memset(nt, 0xff, (size_t)cap * sizeof *nt);

    pen_slot *old = s->tab;
    uint32_t old_cap = s->tab_cap;
    s->tab = nt;
    s->tab_cap = cap;
    s->tab_shift = shift;
    s->tab_used = 0;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].token < 0 || !(old[i].n_rep || old[i].n_freq))
            continue;
        pen_slot *d = tab_slot(s, old[i].token);
        d->n_rep = old[i].n_rep;
        d->n_freq = old[i].n_freq;
    }
    free(old);
    return CINFER_OK;
}

static void count_add(cinfer_sampler *s, int32_t token, int flags, int delta)
{
    pen_slot *e = tab_slot(s, token);
    if (flags & COUNT_REP)
        e->n_rep += delta;
    if (flags & COUNT_FREQ)
        e->n_freq += delta;
    CINFER_ASSERT(e->n_rep >= 0 && e->n_freq >= 0);
}

/* Appends one token to the penalty history. Capacity must be reserved. */
static void history_push(cinfer_sampler *s, int32_t token, int flags)
{
    int32_t n = s->p.penalty_last_n;
    if (n > 0) {
        if (s->ring_count == n) {
            ring_ent old = s->ring[s->ring_head];
            count_add(s, old.token, old.flags, -1);
        } else {
            s->ring_count++;
        }
        s->ring[s->ring_head].token = token;
        s->ring[s->ring_head].flags = flags;
        s->ring_head = s->ring_head + 1 == n ? 0 : s->ring_head + 1;
    }
    count_add(s, token, flags, +1);
}

/* ---------------------------------------------------------------------- */
/* Create, destroy, accept, reset                                         */
/* ---------------------------------------------------------------------- */

cinfer_sampler_params cinfer_sampler_default_params(void)
{
    cinfer_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.penalty_prompt = CINFER_PENALTY_PROMPT_REPETITION;
    return p;
}

static cinfer_status validate(const cinfer_sampler_params *p)
{
    const cinfer_status E = CINFER_E_INVALID_ARG;
    if (p->n_vocab < 1 || p->n_vocab > CINFER_SAMPLER_MAX_VOCAB)
        return cinfer_set_error(E, "n_vocab must be in [1, %d] (got %d)",
                                CINFER_SAMPLER_MAX_VOCAB, p->n_vocab);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return cinfer_set_error(E,
                                "temperature must be >= 0 and finite (got %g)",
                                (double)p->temperature);
    if (p->top_k < 0)
        return cinfer_set_error(E, "top_k must be >= 0, 0 = off (got %d)",
                                p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return cinfer_set_error(E, "top_p must be in (0, 1] (got %g)",
                                (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return cinfer_set_error(E, "min_p must be in [0, 1] (got %g)",
                                (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return cinfer_set_error(
            E, "repetition_penalty must be > 0 and finite (got %g)",
            (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return cinfer_set_error(E,
                                "presence_penalty must be in [-2, 2] (got %g)",
                                (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return cinfer_set_error(E,
                                "frequency_penalty must be in [-2, 2] (got %g)",
                                (double)p->frequency_penalty);
    if (p->penalty_last_n < 0)
        return cinfer_set_error(E,
                                "penalty_last_n must be >= 0, 0 = all (got %d)",
                                p->penalty_last_n);
    if (p->penalty_prompt != CINFER_PENALTY_PROMPT_REPETITION &&
        p->penalty_prompt != CINFER_PENALTY_PROMPT_NONE &&
        p->penalty_prompt != CINFER_PENALTY_PROMPT_ALL)
        return cinfer_set_error(E, "penalty_prompt must be 0, 1 or 2 (got %d)",
                                (int)p->penalty_prompt);
    if (p->n_logprobs < 0 || p->n_logprobs > CINFER_SAMPLER_MAX_LOGPROBS)
        return cinfer_set_error(E, "n_logprobs must be in [0, %d] (got %d)",
                                CINFER_SAMPLER_MAX_LOGPROBS, p->n_logprobs);
    if (p->min_tokens < 0)
        return cinfer_set_error(E, "min_tokens must be >= 0 (got %d)",
                                p->min_tokens);
    if (p->n_eog_tokens < 0)
        return cinfer_set_error(E, "n_eog_tokens must be >= 0 (got %d)",
                                p->n_eog_tokens);
    if (p->n_eog_tokens > 0 && !p->eog_tokens)
        return cinfer_set_error(E, "eog_tokens is NULL but n_eog_tokens is %d",
                                p->n_eog_tokens);
    for (int32_t i = 0; i < p->n_eog_tokens; i++)
        if (p->eog_tokens[i] < 0 || p->eog_tokens[i] >= p->n_vocab)
            return cinfer_set_error(
                E, "eog_tokens[%d] = %d is outside [0, n_vocab = %d)", i,
                p->eog_tokens[i], p->n_vocab);
    if (p->n_logit_bias < 0)
        return cinfer_set_error(E, "n_logit_bias must be >= 0 (got %d)",
                                p->n_logit_bias);
    if (p->n_logit_bias > 0 && !p->logit_bias)
        return cinfer_set_error(E, "logit_bias is NULL but n_logit_bias is %d",
                                p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const cinfer_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= p->n_vocab)
            return cinfer_set_error(
                E, "logit_bias[%d].token = %d is outside [0, n_vocab = %d)", i,
                b->token, p->n_vocab);
        if (!(b->bias < INFINITY)) /* NaN or +inf */
            return cinfer_set_error(
                E, "logit_bias[%d].bias must be finite or -inf (got %g)", i,
                (double)b->bias);
    }
    return CINFER_OK;
}

cinfer_status cinfer_sampler_create(const cinfer_sampler_params *p,
                                    cinfer_sampler **out)
{
    if (!p || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_create: %s is NULL", p ? "out" : "p");
    cinfer_status st = validate(p);
    if (st != CINFER_OK)
        return st;

    cinfer_sampler *s = calloc(1, sizeof *s);
    if (!s)
        goto fail_nomem;
    s->p = *p;
    if (p->n_eog_tokens > 0) {
        s->eog = malloc((size_t)p->n_eog_tokens * sizeof *s->eog);
        if (!s->eog)
            goto fail_alloc;
        memcpy(s->eog, p->eog_tokens, (size_t)p->n_eog_tokens * sizeof *s->eog);
    }
    s->p.eog_tokens = s->eog;
    if (p->n_logit_bias > 0) {
        s->bias = malloc((size_t)p->n_logit_bias * sizeof *s->bias);
        if (!s->bias)
            goto fail_alloc;
        memcpy(s->bias, p->logit_bias,
               (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    if (p->n_logit_bias > 0) {
        s->bias_sorted = malloc((size_t)p->n_logit_bias * sizeof *s->bias);
        if (!s->bias_sorted)
            goto fail_alloc;
        memcpy(s->bias_sorted, s->bias,
               (size_t)p->n_logit_bias * sizeof *s->bias);
        qsort(s->bias_sorted, (size_t)p->n_logit_bias, sizeof *s->bias,
              cmp_bias_token);
        for (int32_t i = 1; i < p->n_logit_bias; i++)
            s->bias_dup |= s->bias_sorted[i].token ==
                           s->bias_sorted[i - 1].token;
    }
    if (p->n_eog_tokens > 0) {
        s->eog_sorted = malloc((size_t)p->n_eog_tokens * sizeof *s->eog);
        if (!s->eog_sorted)
            goto fail_alloc;
        memcpy(s->eog_sorted, s->eog, (size_t)p->n_eog_tokens * sizeof *s->eog);
        qsort(s->eog_sorted, (size_t)p->n_eog_tokens, sizeof *s->eog,
              cmp_i32);
        int32_t m = 0;
        for (int32_t i = 0; i < p->n_eog_tokens; i++)
            if (m == 0 || s->eog_sorted[m - 1] != s->eog_sorted[i])
                s->eog_sorted[m++] = s->eog_sorted[i];
        s->n_eog_sorted = m;
    }
    s->penalties = p->repetition_penalty != 1.0f ||
                   p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (s->penalties && p->penalty_last_n > 0) {
        s->ring = malloc((size_t)p->penalty_last_n * sizeof *s->ring);
        if (!s->ring)
            goto fail_alloc;
    }
    s->n_chunks = (int32_t)(((int64_t)p->n_vocab + CHUNK - 1) / CHUNK);
    s->chunk = malloc((size_t)s->n_chunks * sizeof *s->chunk);
    if (!s->chunk)
        goto fail_alloc;
    s->key = draw_key(p->seed);
    *out = s;
    return CINFER_OK;

fail_alloc:
    cinfer_sampler_destroy(s);
fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM, "sampler_create: out of memory");
}

void cinfer_sampler_destroy(cinfer_sampler *s)
{
    if (!s)
        return;
    free(s->chunk);
    free(s->undo);
    free(s->cand);
    free(s->ring);
    free(s->tab);
    free(s->bias);
    free(s->eog);
    free(s->bias_sorted);
    free(s->eog_sorted);
    free(s);
}

const cinfer_sampler_params *cinfer_sampler_get_params(const cinfer_sampler *s)
{
    return &s->p;
}

int32_t cinfer_sampler_n_accepted(const cinfer_sampler *s)
{
    return s->n_accepted;
}

cinfer_status cinfer_sampler_accept_prompt(cinfer_sampler *s,
                                           const int32_t *tokens, int32_t n)
{
    if (!s || n < 0 || (n > 0 && !tokens))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_accept_prompt: %s",
                                !s      ? "s is NULL"
                                : n < 0 ? "n must be >= 0"
                                        : "tokens is NULL");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->p.n_vocab)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "prompt token [%d] = %d is outside [0, n_vocab = %d)", i,
                tokens[i], s->p.n_vocab);
    int flags = s->p.penalty_prompt == CINFER_PENALTY_PROMPT_ALL
                    ? COUNT_REP | COUNT_FREQ
                : s->p.penalty_prompt == CINFER_PENALTY_PROMPT_REPETITION
                    ? COUNT_REP
                    : 0;
    if (!s->penalties || flags == 0 || n == 0)
        return CINFER_OK;
    cinfer_status st = tab_reserve(s, n);
    if (st != CINFER_OK)
        return st;
    for (int32_t i = 0; i < n; i++)
        history_push(s, tokens[i], flags);
    return CINFER_OK;
}

cinfer_status cinfer_sampler_accept(cinfer_sampler *s, int32_t token)
{
    if (!s)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_accept: s is NULL");
    if (token < 0 || token >= s->p.n_vocab)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "sampler_accept: token %d is outside [0, n_vocab = %d)", token,
            s->p.n_vocab);
    if (s->penalties) {
        cinfer_status st = tab_reserve(s, 1);
        if (st != CINFER_OK)
            return st;
        history_push(s, token, COUNT_REP | COUNT_FREQ);
    }
    s->n_accepted++;
    s->n_draws = 0;
    return CINFER_OK;
}

void cinfer_sampler_set_allowed(cinfer_sampler *s, const uint8_t *allowed)
{
    if (s)
        s->allowed = allowed;
}

void cinfer_sampler_reset(cinfer_sampler *s)
{
    if (!s)
        return;
    if (s->tab)
        memset(s->tab, 0xff, (size_t)s->tab_cap * sizeof *s->tab);
    s->tab_used = 0;
    s->ring_head = 0;
    s->ring_count = 0;
    s->n_accepted = 0;
    s->n_undo = 0;
    s->key = draw_key(s->p.seed);
    s->n_draws = 0;
}

/* ---------------------------------------------------------------------- */
/* Stages 1-3 over the row, with undo                                      */
/* ---------------------------------------------------------------------- */

static cinfer_status undo_reserve(cinfer_sampler *s)
{
    int64_t need = (int64_t)s->p.n_logit_bias + s->p.n_eog_tokens + s->tab_used +
                   (s->allowed ? s->p.n_vocab : 0);
    if (need > INT32_MAX)
        return cinfer_set_error(CINFER_E_NOMEM, "sampler: undo log too large");
    void *buf = s->undo;
    cinfer_status st = grow(&buf, &s->undo_cap, (int32_t)need, sizeof(undo_ent),
                            "the undo log");
    s->undo = buf;
    return st;
}

static inline void set_logit(cinfer_sampler *s, float *x, int32_t id, float v)
{
    s->undo[s->n_undo].id = id;
    s->undo[s->n_undo].raw = x[id];
    s->n_undo++;
    x[id] = v;
}

static void apply_stages(cinfer_sampler *s, float *x)
{
    s->n_undo = 0;
    for (int32_t i = 0; i < s->p.n_logit_bias; i++)
        set_logit(s, x, s->bias[i].token,
                  x[s->bias[i].token] + s->bias[i].bias);
    if (s->allowed) {
        for (int32_t t = 0; t < s->p.n_vocab; t++)
            if (!s->allowed[t])
                set_logit(s, x, t, -INFINITY);
        s->allowed = NULL; /* one call's */
    }
    if (s->n_accepted < s->p.min_tokens)
        for (int32_t i = 0; i < s->p.n_eog_tokens; i++)
            set_logit(s, x, s->eog[i], -INFINITY);
    if (!s->penalties || !s->tab)
        return;
    const float rp = s->p.repetition_penalty;
    const float pres = s->p.presence_penalty;
    const float freq = s->p.frequency_penalty;
    for (uint32_t i = 0; i < s->tab_cap; i++) {
        const pen_slot *e = &s->tab[i];
        if (e->token < 0 || !(e->n_rep || e->n_freq))
            continue;
        float v = x[e->token];
        if (e->n_rep > 0)
            v = v > 0.0f ? v / rp : v * rp;
        if (e->n_freq > 0) {
            v -= freq * (float)e->n_freq;
            v -= pres;
        }
        set_logit(s, x, e->token, v);
    }
}

/* Puts back the first recorded (raw) value of every written entry. */
static void restore(cinfer_sampler *s, float *x)
{
    for (int32_t i = s->n_undo - 1; i >= 0; i--)
        x[s->undo[i].id] = s->undo[i].raw;
    s->n_undo = 0;
}

/* ---------------------------------------------------------------------- */
/* Selection                                                              */
/* ---------------------------------------------------------------------- */

/* Copies the k entries of x[0..n) with the largest (key, then lowest id)
 * into out[0..k), in id order. 0 < k < n. */
static void select_top_k(const float *x, int32_t n, int32_t k, cand *out)
{
    static const int shifts[3] = {21, 10, 0};
    static const int widths[3] = {11, 11, 10};
    uint32_t hist[1u << 11];
    uint32_t prefix = 0, mask = 0;
    int64_t need = k;     /* still to take from inside the current prefix */
    int64_t quota_eq = k; /* how many entries equal to the threshold to take */
    int settled = 0;

    for (int pass = 0; pass < 3 && !settled; pass++) {
        const int shift = shifts[pass];
        const uint32_t nb = 1u << widths[pass];
        const uint32_t dmask = nb - 1;
        memset(hist, 0, nb * sizeof hist[0]);
        for (int32_t i = 0; i < n; i++) {
            uint32_t key = float_key(x[i]);
            if ((key & mask) == prefix)
                hist[(key >> shift) & dmask]++;
        }
        int64_t above = 0;
        int32_t b = (int32_t)nb - 1;
        for (; b >= 0; b--) {
            if (above + hist[b] >= need)
                break;
            above += hist[b];
        }
        CINFER_ASSERT(b >= 0);
        need -= above;
        prefix |= (uint32_t)b << shift;
        mask |= dmask << shift;
        if ((int64_t)hist[b] == need) {
            /* The whole bucket is taken: keys >= prefix are exactly k. */
            settled = 1;
            quota_eq = INT32_MAX;
        }
    }
    if (!settled)
        quota_eq = need; /* prefix is the k-th key; take the lowest ids */

    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t key = float_key(x[i]);
        if (key > prefix || (key == prefix && quota_eq > 0)) {
            if (key == prefix)
                quota_eq--;
            out[m].id = i;
            out[m].logit = x[i];
            m++;
        }
    }
    CINFER_ASSERT(m == k);
}

/* Finds the first histogram bucket where the running mass reaches target. */
static int cut_bucket(const double *mass, double target)
{
    double cum = 0.0;
    for (int b = 0; b < N_BUCKETS; b++) {
        cum += mass[b];
        if (cum >= target)
            return b;
    }
    return N_BUCKETS - 1;
}

/* Sorts c[0..n) and returns the length of the smallest prefix whose weight
 * reaches target (n if rounding keeps it short). */
static int32_t sorted_cut(cand *c, int32_t n, double target)
{
    qsort(c, (size_t)n, sizeof *c, cmp_cand);
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].w;
        if (cum >= target)
            return i + 1;
    }
    return n;
}

/* Keeps the entries of c[0..n) with w > 0 and w >= min_w, in order; sums
 * their weights into *z. */
static int32_t keep_min_w(cand *c, int32_t n, float min_w, double *z)
{
    int32_t m = 0;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].w > 0.0f && c[i].w >= min_w) {
            c[m++] = c[i];
            sum += c[i].w;
        }
    }
    *z = sum;
    return m;
}

/* ---------------------------------------------------------------------- */
/* Planning and drawing                                                   */
/* ---------------------------------------------------------------------- */

static cinfer_status all_masked(void)
{
    return cinfer_set_error(
        CINFER_E_RANGE, "no token left to sample: every logit is -inf after "
                        "logit_bias, min_tokens masking and penalties");
}

/* Stages 4-8 over the processed row x. */
static cinfer_status build_plan(cinfer_sampler *s, const float *x, plan *pl)
{
    const int32_t n = s->p.n_vocab;
    const float temp = s->p.temperature;
    float max;
    int32_t bad = scan_max(x, n, &max);
    if (bad >= 0) {
        /* Raw values were checked; a written entry can still overflow. */
        for (int32_t i = 0; i < s->n_undo; i++)
            if (s->undo[i].id == bad)
                return bad_logit(x, bad, "processed logits");
        return bad_logit(x, bad, "logits");
    }
    if (max == -INFINITY)
        return all_masked();

    if (temp < CINFER_SAMPLER_GREEDY_EPS) {
        pl->kind = PLAN_GREEDY;
        pl->token = cinfer_sampler_argmax(x, n);
        return CINFER_OK;
    }

    const float inv_t = 1.0f / temp;
    const float min_w = s->p.min_p;
    const int use_top_p = s->p.top_p < 1.0f;
    cinfer_status st;
    void *buf;

    if (s->p.top_k > 0 && s->p.top_k < n) {
        const int32_t k = s->p.top_k;
        buf = s->cand;
        st = grow(&buf, &s->cand_cap, k, sizeof(cand), "candidates");
        s->cand = buf;
        if (st != CINFER_OK)
            return st;
        cand *c = s->cand;
        select_top_k(x, n, k, c);
        double z = 0.0;
        for (int32_t i = 0; i < k; i++) {
            c[i].w = weight(c[i].logit, max, inv_t, 0.0f);
            z += c[i].w;
        }
        int32_t kept = k;
        if (use_top_p) {
            double target = (double)s->p.top_p * z;
            if (k <= SORT_ALL_MAX) {
                kept = sorted_cut(c, k, target);
            } else {
                double mass[N_BUCKETS] = {0};
                for (int32_t i = 0; i < k; i++)
                    mass[bucket_of(c[i].logit, max, inv_t)] += c[i].w;
                int cb = cut_bucket(mass, target);
                int32_t front = 0; /* move bucket <= cb to the front */
                for (int32_t i = 0; i < k; i++) {
                    if (bucket_of(c[i].logit, max, inv_t) <= cb) {
                        cand t = c[front];
                        c[front] = c[i];
                        c[i] = t;
                        front++;
                    }
                }
                kept = sorted_cut(c, front, target);
            }
        }
        pl->kind = PLAN_CAND;
        pl->n = keep_min_w(c, kept, min_w, &pl->z);
        CINFER_ASSERT(pl->n > 0);
        return CINFER_OK;
    }

    if (use_top_p) {
        double mass[N_BUCKETS] = {0};
        int32_t count[N_BUCKETS] = {0};
        float w[CHUNK];
        double z = 0.0;
        for (int32_t lo = 0; lo < n; lo += CHUNK) {
            int32_t len = n - lo < CHUNK ? n - lo : CHUNK;
            weights(x + lo, len, max, inv_t, 0.0f, w);
            z += sum_weights(w, len);
            for (int32_t i = 0; i < len; i++) {
                int b = bucket_of(x[lo + i], max, inv_t);
                mass[b] += w[i];
                count[b]++;
            }
        }
        double target = (double)s->p.top_p * z;
        int cb = cut_bucket(mass, target);
        int32_t m = 0;
        for (int b = 0; b <= cb; b++)
            m += count[b];
        buf = s->cand;
        st = grow(&buf, &s->cand_cap, m, sizeof(cand), "candidates");
        s->cand = buf;
        if (st != CINFER_OK)
            return st;
        cand *c = s->cand;
        int32_t j = 0;
        for (int32_t i = 0; i < n; i++) {
            if (bucket_of(x[i], max, inv_t) <= cb) {
                c[j].id = i;
                c[j].logit = x[i];
                c[j].w = weight(x[i], max, inv_t, 0.0f);
                j++;
            }
        }
        CINFER_ASSERT(j == m);
        int32_t kept = sorted_cut(c, m, target);
        pl->kind = PLAN_CAND;
        pl->n = keep_min_w(c, kept, min_w, &pl->z);
        CINFER_ASSERT(pl->n > 0);
        return CINFER_OK;
    }

    /* Whole row, min_p at most: per-chunk sums only. */
    float w[CHUNK];
    double z = 0.0;
    for (int32_t c = 0; c < s->n_chunks; c++) {
        int32_t lo = c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
        weights(x + lo, len, max, inv_t, min_w, w);
        s->chunk[c] = sum_weights(w, len);
        z += s->chunk[c];
    }
    pl->kind = PLAN_SCAN;
    pl->max = max;
    pl->inv_t = inv_t;
    pl->min_w = min_w;
    pl->z = z;
    return CINFER_OK;
}

/* Stages 1-8: processes the row (recording undo), checks it, builds the
 * plan. On error the row is already restored. */
static cinfer_status prepare(cinfer_sampler *s, float *x, plan *pl)
{
    cinfer_status st = undo_reserve(s);
    if (st != CINFER_OK) {
        s->allowed = NULL; /* one call's, even a failed one */
        return st;
    }
    apply_stages(s, x);
    /* Entries written by stages 1-3 are checked through their raw values;
     * build_plan checks the processed row (which covers the rest). */
    for (int32_t i = 0; i < s->n_undo; i++) {
        float raw = s->undo[i].raw;
        if (!(raw < INFINITY)) {
            int32_t id = s->undo[i].id;
            restore(s, x);
            return bad_logit(x, id, "logits");
        }
    }
    st = build_plan(s, x, pl);
    if (st != CINFER_OK)
        restore(s, x);
    return st;
}

static int32_t draw(cinfer_sampler *s, const float *x, const plan *pl)
{
    if (pl->kind == PLAN_GREEDY)
        return pl->token;
    const double target =
        draw_uniform(s->key, s->n_accepted, s->n_draws++) * pl->z;
    if (pl->kind == PLAN_CAND) {
        double cum = 0.0;
        for (int32_t i = 0; i < pl->n; i++) {
            cum += s->cand[i].w;
            if (cum > target)
                return s->cand[i].id;
        }
        return s->cand[pl->n - 1].id;
    }
    const int32_t n = s->p.n_vocab;
    double cum = 0.0;
    int32_t c = 0, last_nonempty = -1;
    for (; c < s->n_chunks; c++) {
        if (s->chunk[c] > 0.0)
            last_nonempty = c;
        if (s->chunk[c] > 0.0 && cum + s->chunk[c] > target)
            break;
        cum += s->chunk[c];
    }
    if (c == s->n_chunks) {
        c = last_nonempty; /* rounding at the very end */
        cum = -INFINITY;   /* take the chunk's last kept token */
    }
    CINFER_ASSERT(c >= 0);
    float w[CHUNK];
    int32_t lo = c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
    weights(x + lo, len, pl->max, pl->inv_t, pl->min_w, w);
    int32_t last = -1;
    for (int32_t i = 0; i < len; i++) {
        if (w[i] > 0.0f) {
            last = lo + i;
            cum += w[i];
            if (cum > target)
                return lo + i;
        }
    }
    CINFER_ASSERT(last >= 0);
    return last;
}

/* ---------------------------------------------------------------------- */
/* Logprobs                                                               */
/* ---------------------------------------------------------------------- */

_Static_assert(CINFER_SAMPLER_MAX_LOGPROBS == CINFER_LOGPROBS_MAX_TOP,
               "backend.h's cinfer_row_logprobs holds the sampler's tops");

/* lp from a row's parts (backend.h's cinfer_row_logprobs): the log-softmax
 * finished as both fill_logprobs and a backend's row give it. */
static void finish_logprobs(const cinfer_row_logprobs *r, cinfer_logprobs *lp)
{
    const double lse = (double)r->max + log(r->sum);
    lp->logprob = (float)((double)r->logit - lse);
    lp->rank = (int32_t)(r->better + 1);
    lp->n_top = r->n_top;
    for (int32_t j = 0; j < r->n_top; j++) {
        lp->top_tokens[j] = r->top_id[j];
        lp->top_logprobs[j] = (float)((double)r->top_logit[j] - lse);
    }
}

/* The parts of x's log-softmax for token (backend.h's
 * cinfer_row_logprobs). x is a valid raw row with at least one finite
 * entry. */
static void row_parts(const cinfer_sampler *s, const float *x, int32_t token,
                      cinfer_row_logprobs *out)
{
    const int32_t n = s->p.n_vocab;
    int32_t n_top = s->p.n_logprobs < n ? s->p.n_logprobs : n;
    cinfer_row_logprobs r;
    memset(&r, 0, sizeof r);
    int32_t bad = scan_max(x, n, &r.max);
    CINFER_ASSERT(bad < 0 && r.max > -INFINITY);

    int32_t n_have = 0;
    r.sum = 0.0;
    float w[CHUNK];
    for (int32_t lo = 0; lo < n; lo += CHUNK) {
        int32_t len = n - lo < CHUNK ? n - lo : CHUNK;
        weights(x + lo, len, r.max, 1.0f, 0.0f, w);
        r.sum += sum_weights(w, len);
    }
    r.logit = x[token];
    const float xt = r.logit;
    int64_t better = 0;
    float *top_v = r.top_logit;
    int32_t *top_id = r.top_id;
    for (int32_t i = 0; i < n; i++) {
        float v = x[i];
        if (v > xt || (v == xt && i < token))
            better++;
        if (n_top == 0 || (n_have == n_top && !(v > top_v[n_top - 1])))
            continue;
        /* Insert after every entry >= v: earlier (lower) ids win ties. */
        int32_t pos = n_have < n_top ? n_have++ : n_top - 1;
        while (pos > 0 && v > top_v[pos - 1]) {
            top_id[pos] = top_id[pos - 1];
            top_v[pos] = top_v[pos - 1];
            pos--;
        }
        top_id[pos] = i;
        top_v[pos] = v;
    }
    r.better = better;
    r.n_top = n_top;
    *out = r;
}

static void fill_logprobs(const cinfer_sampler *s, const float *x,
                          int32_t token, cinfer_logprobs *lp)
{
    cinfer_row_logprobs r;
    row_parts(s, x, token, &r);
    finish_logprobs(&r, lp);
}

cinfer_status cinfer_sampler_take_logprobs(const cinfer_sampler *s,
                                           const cinfer_row_logprobs *r,
                                           int32_t token, cinfer_logprobs *lp)
{
    if (!s || !r || !lp)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_take_logprobs: an argument is NULL");
    const int32_t n = s->p.n_vocab;
    const int32_t n_top = s->p.n_logprobs < n ? s->p.n_logprobs : n;
    const char *bad = token < 0 || token >= n       ? "token"
                      : r->n_top != n_top           ? "n_top"
                      : !(r->sum >= 1.0 && r->sum < INFINITY) ? "sum"
                      : r->better < 0 || r->better >= n ? "better"
                      : !(r->max < INFINITY && r->max > -INFINITY) ? "max"
                      : !(r->logit <= r->max)       ? "logit"
                                                    : NULL;
    for (int32_t j = 0; !bad && j < r->n_top; j++)
        if (r->top_id[j] < 0 || r->top_id[j] >= n ||
            !(r->top_logit[j] <= r->max))
            bad = "top";
    if (bad)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_take_logprobs: the row's %s does not "
                                "fit token %d of a vocabulary of %d (n_top "
                                "%d)",
                                bad, token, n, n_top);
    finish_logprobs(r, lp);
    return CINFER_OK;
}

cinfer_status cinfer_sampler_logprob_parts(const cinfer_sampler *s,
                                           const float *logits, int32_t token,
                                           cinfer_row_logprobs *r)
{
    cinfer_logprobs lp;
    cinfer_status st = cinfer_sampler_logprobs(s, logits, token, &lp);
    if (st == CINFER_OK)
        row_parts(s, logits, token, r);
    return st;
}

cinfer_status cinfer_sampler_logprobs(const cinfer_sampler *s,
                                      const float *logits, int32_t token,
                                      cinfer_logprobs *lp)
{
    if (!s || !logits || !lp)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_logprobs: %s is NULL",
                                !s        ? "s"
                                : !logits ? "logits"
                                          : "lp");
    if (token < 0 || token >= s->p.n_vocab)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "sampler_logprobs: token %d is outside [0, n_vocab = %d)", token,
            s->p.n_vocab);
    float max;
    int32_t bad = scan_max(logits, s->p.n_vocab, &max);
    if (bad >= 0)
        return bad_logit(logits, bad, "logits");
    if (max == -INFINITY)
        return cinfer_set_error(CINFER_E_RANGE, "every logit is -inf");
    fill_logprobs(s, logits, token, lp);
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Sample, candidates, process                                            */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_sampler_sample(cinfer_sampler *s, float *logits,
                                    int32_t *token, cinfer_logprobs *lp)
{
    if (!s || !logits || !token)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_sample: %s is NULL",
                                !s        ? "s"
                                : !logits ? "logits"
                                          : "token");
    plan pl;
    cinfer_status st = prepare(s, logits, &pl);
    if (st != CINFER_OK)
        return st;
    int32_t t = draw(s, logits, &pl);
    restore(s, logits);
    *token = t;
    if (lp)
        fill_logprobs(s, logits, t, lp);
    return CINFER_OK;
}

float cinfer_sampler_weight(float logit, float max, float inv_t, float min_w)
{
    return weight(logit, max, inv_t, min_w);
}

/* Nothing for stages 1-3 to apply to the next row. */
static int nothing_to_apply(const cinfer_sampler *s)
{
    return s->p.n_logit_bias == 0 && !s->allowed && !s->penalties &&
           !(s->n_accepted < s->p.min_tokens && s->p.n_eog_tokens > 0);
}

int cinfer_sampler_plain_greedy(const cinfer_sampler *s)
{
    return s && s->p.temperature < CINFER_SAMPLER_GREEDY_EPS &&
           nothing_to_apply(s);
}

int cinfer_sampler_backend_choice(const cinfer_sampler *s)
{
    if (!s || s->allowed || s->bias_dup)
        return 0;
    return s->p.temperature < CINFER_SAMPLER_GREEDY_EPS ? 1 : 2;
}

/* Whether stage 2's end-of-generation mask applies to the next row. */
static int eog_masked(const cinfer_sampler *s)
{
    return s->n_accepted < s->p.min_tokens;
}

int64_t cinfer_sampler_edits_bound(const cinfer_sampler *s)
{
    if (!cinfer_sampler_backend_choice(s))
        return -1;
    return (int64_t)s->p.n_logit_bias +
           (eog_masked(s) ? s->n_eog_sorted : 0) +
           (s->penalties && s->tab ? s->tab_used : 0);
}

static int has_token(const int32_t *v, int32_t n, int32_t token)
{
    return bsearch(&token, v, (size_t)n, sizeof *v, cmp_i32) != NULL;
}

static int has_bias(const cinfer_sampler *s, int32_t token)
{
    cinfer_logit_bias key = {token, 0.0f};
    return bsearch(&key, s->bias_sorted, (size_t)s->p.n_logit_bias,
                   sizeof key, cmp_bias_token) != NULL;
}

/* Stage 3's part of the entry of e's token, as apply_stages computes it. */
static void pen_edit(const cinfer_sampler *s, const pen_slot *e,
                     cinfer_logit_edit *d)
{
    if (!s->penalties || !e)
        return;
    if (e->n_rep > 0) {
        d->flags |= CINFER_EDIT_REP;
        d->rp = s->p.repetition_penalty;
    }
    if (e->n_freq > 0) {
        d->flags |= CINFER_EDIT_FREQ;
        d->fn = s->p.frequency_penalty * (float)e->n_freq;
        d->pres = s->p.presence_penalty;
    }
}

int64_t cinfer_sampler_edits(const cinfer_sampler *s, int32_t row,
                             cinfer_logit_edit *out)
{
    if (cinfer_sampler_edits_bound(s) < 0)
        return -1;
    const int32_t nb = s->p.n_logit_bias;
    const int32_t ne = eog_masked(s) ? s->n_eog_sorted : 0;
    int64_t n = 0;
    /* The biased and masked tokens, merged in token order, with their
     * penalties... */
    for (int32_t i = 0, j = 0; i < nb || j < ne;) {
        int32_t tb = i < nb ? s->bias_sorted[i].token : INT32_MAX;
        int32_t te = j < ne ? s->eog_sorted[j] : INT32_MAX;
        int32_t t = tb < te ? tb : te;
        cinfer_logit_edit *d = &out[n++];
        *d = (cinfer_logit_edit){.row = row, .token = t};
        if (tb == t) {
            d->flags |= CINFER_EDIT_BIAS;
            d->bias = s->bias_sorted[i++].bias;
        }
        if (te == t) {
            d->flags |= CINFER_EDIT_MASK;
            j++;
        }
        pen_edit(s, tab_find(s, t), d);
    }
    if (!s->penalties || !s->tab)
        return n;
    /* ... then the other penalized tokens. */
    for (uint32_t i = 0; i < s->tab_cap; i++) {
        const pen_slot *e = &s->tab[i];
        if (e->token < 0 || !(e->n_rep || e->n_freq))
            continue;
        if ((nb && has_bias(s, e->token)) ||
            (ne && has_token(s->eog_sorted, ne, e->token)))
            continue;
        cinfer_logit_edit *d = &out[n++];
        *d = (cinfer_logit_edit){.row = row, .token = e->token};
        pen_edit(s, e, d);
    }
    return n;
}

cinfer_status cinfer_sampler_draw_params(cinfer_sampler *s, cinfer_draw *d)
{
    if (!s || !d)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_draw_params: %s is NULL",
                                !s ? "s" : "d");
    if (cinfer_sampler_backend_choice(s) != 2)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_draw_params: the sampler has a mask "
                                "or a token biased twice to apply, or is "
                                "greedy");
    /* as build_plan and draw() take them */
    d->inv_t = 1.0f / s->p.temperature;
    d->min_w = s->p.min_p;
    d->top_k = s->p.top_k > 0 && s->p.top_k < s->p.n_vocab ? s->p.top_k : 0;
    d->top_p = s->p.top_p;
    d->u = draw_uniform(s->key, s->n_accepted, s->n_draws++);
    return CINFER_OK;
}

cinfer_status cinfer_sampler_take_code(cinfer_sampler *s, int32_t code,
                                       int32_t *token)
{
    if (!s || !token)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_take_code: %s is NULL",
                                !s ? "s" : "token");
    if (!cinfer_sampler_backend_choice(s))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_take_code: the sampler has a mask "
                                "or a token biased twice to apply");
    if (code >= s->p.n_vocab)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_take_code: token %d of a vocabulary "
                                "of %d",
                                code, s->p.n_vocab);
    if (code >= 0) {
        *token = code;
        return CINFER_OK;
    }
    if (code == -1)
        return all_masked();
    int64_t k = -2 - (int64_t)code; /* 2 i + nan */
    if (k / 2 >= s->p.n_vocab)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_take_code: code %d names no entry of "
                                "a vocabulary of %d",
                                code, s->p.n_vocab);
    return cinfer_set_error(CINFER_E_RANGE,
                            "logits[%d] is %s (logits must be finite or -inf)",
                            (int32_t)(k / 2), k % 2 ? "NaN" : "+inf");
}

cinfer_status cinfer_sampler_candidates(cinfer_sampler *s, float *logits,
                                        cinfer_token_prob *out, int32_t cap,
                                        int32_t *n_out)
{
    if (!s || !logits || !n_out || (cap > 0 && !out) || cap < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_candidates: bad argument (%s)",
                                !s        ? "s is NULL"
                                : !logits ? "logits is NULL"
                                : !n_out  ? "n_out is NULL"
                                : cap < 0 ? "cap < 0"
                                          : "out is NULL");
    plan pl;
    cinfer_status st = prepare(s, logits, &pl);
    if (st != CINFER_OK)
        return st;
    int32_t m = 0;
    if (pl.kind == PLAN_GREEDY) {
        m = 1;
    } else if (pl.kind == PLAN_CAND) {
        m = pl.n;
    } else {
        for (int32_t i = 0; i < s->p.n_vocab; i++)
            m += weight(logits[i], pl.max, pl.inv_t, pl.min_w) > 0.0f;
    }
    *n_out = m;
    if (m > cap) {
        restore(s, logits);
        return cinfer_set_error(
            CINFER_E_RANGE, "sampler_candidates: %d candidates, room for %d", m,
            cap);
    }
    if (pl.kind == PLAN_GREEDY) {
        out[0].token = pl.token;
        out[0].p = 1.0f;
    } else if (pl.kind == PLAN_CAND) {
        for (int32_t i = 0; i < m; i++) {
            out[i].token = s->cand[i].id;
            out[i].p = (float)(s->cand[i].w / pl.z);
        }
    } else {
        int32_t j = 0;
        for (int32_t i = 0; i < s->p.n_vocab; i++) {
            float w = weight(logits[i], pl.max, pl.inv_t, pl.min_w);
            if (w > 0.0f) {
                out[j].token = i;
                out[j].p = (float)(w / pl.z);
                j++;
            }
        }
    }
    restore(s, logits);
    qsort(out, (size_t)m, sizeof *out, cmp_token_prob);
    return CINFER_OK;
}

cinfer_status cinfer_sampler_process_logits(cinfer_sampler *s, float *logits)
{
    if (!s || !logits)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampler_process_logits: %s is NULL",
                                !s ? "s" : "logits");
    cinfer_status st = undo_reserve(s);
    if (st != CINFER_OK) {
        s->allowed = NULL; /* one call's, even a failed one */
        return st;
    }
    apply_stages(s, logits);
    s->n_undo = 0;
    return CINFER_OK;
}

int32_t cinfer_sampler_argmax(const float *logits, int32_t n)
{
    int32_t best = -1;
    float bv = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (v != v)
            continue;
        if (best < 0 || v > bv) {
            best = i;
            bv = v;
        }
    }
    return best;
}
