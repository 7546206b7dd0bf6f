/*
 * bench_workload.c - cinfer-bench's workload: what each request asks for
 * and when it arrives, all fixed up front from one seed.
 *
 * Lengths follow vLLM's random dataset: with range ratio r, a request's
 * prompt and output lengths are uniform integers in [len*(1-r), len*(1+r)].
 * Synthetic prompts are token ids uniform over the vocabulary, sent as ids
 * (no tokenizer round trip, so every server sees exactly the same prompt).
 * Arrivals follow vLLM's `--request-rate` / `--burstiness`: the gaps between
 * requests are Gamma(shape = burstiness, scale = 1 / (rate * burstiness)),
 * mean 1 / rate; burstiness 1 is a Poisson process. The first request
 * arrives at 0. Lengths, prompts and arrivals draw from separate streams of
 * the seed, so changing the rate leaves the prompts as they were.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

double cinfer_bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------- */
/* Random numbers                                                         */
/* ---------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cinfer_bench_rng_init(cinfer_bench_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t cinfer_bench_rng_next(cinfer_bench_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double cinfer_bench_rng_uniform(cinfer_bench_rng *r)
{
    return (double)(cinfer_bench_rng_next(r) >> 11) * 0x1.0p-53;
}

int64_t cinfer_bench_rng_range(cinfer_bench_rng *r, int64_t lo, int64_t hi)
{
    CINFER_ASSERT(lo <= hi);
    uint64_t span = (uint64_t)(hi - lo) + 1;
    if (span == 0) /* the whole 64-bit range */
        return (int64_t)cinfer_bench_rng_next(r);
    /* Rejection keeps it unbiased. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t v;
    do {
        v = cinfer_bench_rng_next(r);
    } while (v >= limit);
    return lo + (int64_t)(v % span);
}

static double rng_normal(cinfer_bench_rng *r)
{
    double u1 = 1.0 - cinfer_bench_rng_uniform(r); /* (0, 1] */
    double u2 = cinfer_bench_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double cinfer_bench_rng_gamma(cinfer_bench_rng *r, double shape, double scale)
{
    CINFER_ASSERT(shape > 0 && scale > 0);
    if (shape < 1.0) {
        /* Gamma(a) = Gamma(a + 1) * U^(1/a). */
        double u = 1.0 - cinfer_bench_rng_uniform(r);
        return cinfer_bench_rng_gamma(r, shape + 1.0, scale) *
               pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0;
    double c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(r);
        double v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = 1.0 - cinfer_bench_rng_uniform(r);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * scale;
    }
}

/* ---------------------------------------------------------------------- */
/* Workload                                                               */
/* ---------------------------------------------------------------------- */

struct cinfer_bench_workload {
    int n;
    cinfer_bench_item *items;
    int32_t *ids;              /* every synthetic prompt, back to back */
    char *file_text;           /* the prompts file, lines NUL-terminated */
    char **lines;
    int n_lines;
};

cinfer_bench_workload_params cinfer_bench_workload_default_params(void)
{
    cinfer_bench_workload_params p;
    memset(&p, 0, sizeof p);
    p.num_requests = 100;
    p.input_len = 128;
    p.output_len = 128;
    p.range_ratio = 0;
    p.vocab_size = 0;
    p.prompts_file = NULL;
    p.rate_per_s = 0;
    p.burstiness = 1;
    p.seed = 0;
    return p;
}

/* Reads the prompts file into w->file_text / w->lines. */
static cinfer_status read_prompts(cinfer_bench_workload *w, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return cinfer_set_error(CINFER_E_IO, "prompts file %s: %s", path,
                                strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    if (!text)
        goto fail_nomem;
    for (;;) {
        if (len + 1 >= cap) {
            char *t = realloc(text, cap * 2);
            if (!t)
                goto fail_nomem;
            text = t;
            cap *= 2;
        }
        size_t k = fread(text + len, 1, cap - len - 1, f);
        if (k == 0)
            break;
        len += k;
    }
    if (ferror(f)) {
        free(text);
        fclose(f);
        return cinfer_set_error(CINFER_E_IO, "prompts file %s: read error",
                                path);
    }
    fclose(f);
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        free(text);
        return cinfer_set_error(CINFER_E_FORMAT,
                                "prompts file %s: holds a NUL byte", path);
    }

    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++)
        n_lines += text[i] == '\n';
    char **lines = malloc((n_lines + 1) * sizeof *lines);
    if (!lines) {
        free(text);
        return cinfer_set_error(CINFER_E_NOMEM, "prompts file: out of memory");
    }
    int n = 0;
    char *p = text;
    while (*p) {
        char *nl = strchr(p, '\n');
        char *next = nl ? nl + 1 : p + strlen(p);
        char *end = nl ? nl : next;
        if (end > p && end[-1] == '\r')
            end--;
        *end = '\0';
        if (end > p)
            lines[n++] = p;
        p = next;
    }
    if (n == 0) {
        free(lines);
        free(text);
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "prompts file %s: no non-empty line", path);
    }
    w->file_text = text;
    w->lines = lines;
    w->n_lines = n;
    return CINFER_OK;

fail_nomem:
    free(text);
    fclose(f);
    return cinfer_set_error(CINFER_E_NOMEM, "prompts file: out of memory");
}

static void length_bounds(int len, double r, int *lo, int *hi)
{
    *lo = (int)floor(len * (1.0 - r));
    *hi = (int)ceil(len * (1.0 + r));
    if (*lo < 1)
        *lo = 1;
    if (*hi < *lo)
        *hi = *lo;
}

cinfer_status cinfer_bench_workload_create(
    const cinfer_bench_workload_params *p, cinfer_bench_workload **out)
{
    *out = NULL;
    if (p->num_requests < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "num_requests must be >= 1");
    if (p->input_len < 1 || p->output_len < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "input_len and output_len must be >= 1");
    if (!(p->range_ratio >= 0 && p->range_ratio < 1))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "range_ratio must be in [0, 1)");
    if (!p->prompts_file && p->vocab_size < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "vocab_size must be >= 1 for synthetic "
                                "prompts");
    if (!(p->rate_per_s >= 0) || !isfinite(p->rate_per_s))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rate_per_s must be finite and >= 0");
    if (!(p->burstiness >= 0) || !isfinite(p->burstiness))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "burstiness must be finite and >= 0 (0 = 1)");

    cinfer_status st;
    cinfer_bench_workload *w = calloc(1, sizeof *w);
    if (!w)
        return cinfer_set_error(CINFER_E_NOMEM, "workload: out of memory");
    w->n = p->num_requests;
    w->items = calloc((size_t)w->n, sizeof *w->items);
    if (!w->items) {
        st = cinfer_set_error(CINFER_E_NOMEM, "workload: out of memory");
        goto fail;
    }
    if (p->prompts_file) {
        st = read_prompts(w, p->prompts_file);
        if (st != CINFER_OK)
            goto fail;
    }

    /* Lengths. */
    cinfer_bench_rng rl, rp, ra;
    cinfer_bench_rng_init(&rl, p->seed ^ 0x6c656e67746873ull);
    cinfer_bench_rng_init(&rp, p->seed ^ 0x70726f6d707473ull);
    cinfer_bench_rng_init(&ra, p->seed ^ 0x6172726976616cull);
    int in_lo, in_hi, out_lo, out_hi;
    length_bounds(p->input_len, p->range_ratio, &in_lo, &in_hi);
    length_bounds(p->output_len, p->range_ratio, &out_lo, &out_hi);
    size_t total_ids = 0;
    for (int i = 0; i < w->n; i++) {
        cinfer_bench_item *it = &w->items[i];
        int in = (int)cinfer_bench_rng_range(&rl, in_lo, in_hi);
        it->output_len = (int)cinfer_bench_rng_range(&rl, out_lo, out_hi);
        if (w->lines) {
            it->prompt_text = w->lines[i % w->n_lines];
        } else {
            it->input_len = in;
            total_ids += (size_t)in;
        }
    }

    /* Synthetic prompts. */
    if (!w->lines) {
        w->ids = malloc(total_ids * sizeof *w->ids);
        if (!w->ids) {
            st = cinfer_set_error(CINFER_E_NOMEM, "workload: out of memory");
            goto fail;
        }
        size_t at = 0;
        for (int i = 0; i < w->n; i++) {
            cinfer_bench_item *it = &w->items[i];
            it->prompt_ids = w->ids + at;
            for (int k = 0; k < it->input_len; k++)
                w->ids[at++] =
                    (int32_t)cinfer_bench_rng_range(&rp, 0, p->vocab_size - 1);
        }
    }

    /* Arrivals. */
    double shape = p->burstiness > 0 ? p->burstiness : 1.0;
    double t = 0;
    for (int i = 0; i < w->n; i++) {
        w->items[i].arrival_s = t;
        if (p->rate_per_s > 0)
            t += cinfer_bench_rng_gamma(&ra, shape,
                                        1.0 / (p->rate_per_s * shape));
    }
    *out = w;
    return CINFER_OK;

fail:
    cinfer_bench_workload_destroy(w);
    return st;
}

void cinfer_bench_workload_destroy(cinfer_bench_workload *w)
{
    if (!w)
        return;
    free(w->items);
    free(w->ids);
    free(w->lines);
    free(w->file_text);
    free(w);
}

int cinfer_bench_workload_count(const cinfer_bench_workload *w)
{
    return w->n;
}

const cinfer_bench_item *cinfer_bench_workload_item(
    const cinfer_bench_workload *w, int i)
{
    CINFER_ASSERT(i >= 0 && i < w->n);
    return &w->items[i];
}
