/*
 * scheduler.c - iteration-level scheduling over the paged KV cache.
 *
 * Each engine iteration picks the rows of one forward step (Orca's
 * iteration-level scheduling, vLLM's block manager):
 *
 *   1. Running decodes: one row each, in queue order (priority, arrival).
 *   2. Running prefills (long prompts in chunks, or sequences recomputing
 *      after preemption): as many rows as the token budget leaves.
 *   3. Admissions from the waiting queue, in order, while the budget, the
 *      sequence cap and free blocks allow; none in a step that preempted.
 *   4. Drafts (speculative decoding, spec_ngram_k): while at most
 *      spec_max_seqs sequences run, a sequence whose rows reach its last
 *      token gets up to k more rows, the tokens that followed the last
 *      occurrence of its final n-gram earlier in its prompt or output
 *      (prompt lookup). They take only the budget the other rows left and
 *      free blocks only, so under load (a full budget, many sequences)
 *      there are none.
 *
 * Decodes go first so that a long prefill never stalls the streams already
 * producing tokens; prefills then fill the rest of max_batched_tokens, and
 * at least min_prefill_tokens rows when the decodes left fewer (a large
 * running set would otherwise starve the prompts of newcomers). A step
 * with no decode row at all takes up to max_prefill_tokens rows: with no
 * stream waiting on it, a long prompt goes through in larger chunks.
 *
 * Blocks: a sequence holds ceil(n_computed_after_step / block_size) blocks.
 * When a running sequence needs a block and none is free (free or evictable
 * cached), the newest running sequence (lowest priority, latest arrival) is
 * preempted: its blocks are released and it goes back to the waiting queue
 * with its tokens, to be recomputed as one longer prompt. If the newest is
 * the one asking, it is the one preempted. A sequence never needs more than
 * the whole cache (the engine caps its length), so the oldest running
 * sequence always progresses. A running prefill whose chunk does not fit
 * takes a shorter chunk before anything is preempted.
 *
 * Drafts and the cache: a draft row writes its K/V like any row, but
 * n_computed advances only over the drafts its samples took
 * (sched_spec_rollback); the blocks past the next token are released, and
 * only blocks whose every position is computed and verified are ever
 * registered in the prefix cache. K/V left at positions >= n_computed is
 * overwritten before any row reads it (a row reads positions up to its
 * own, which it writes first).
 *
 * Reuse at admission: with the prefix cache, full blocks whose token prefix
 * is registered are taken from the cache (hash chain lookup); without it,
 * samples of one request share the prompt blocks a running sibling has
 * computed. Either way the last token is always computed, so its logits
 * come out, and shared blocks are full (nobody writes to them). A request
 * with prompt embeddings, whose blocks token hashes do not name, shares
 * between its samples only, as without the cache.
 *
 * Sliding windows (a model with a window pool, gemma3's local layers): a
 * sequence has a second block table, in the pool e->skv, as long as its
 * first and grown with it (a new block index takes a block of each, so a
 * step fits when both pools have room). After each step the window
 * blocks that no row from n_computed on can see (every position p in
 * them has n_computed - p >= window) are released, so a sequence holds at
 * most (window - 1) / block_size + 2 of them while it decodes; the
 * global table keeps every block. Window blocks are registered in skv's
 * prefix cache under the same keys as the global ones before they are
 * released (so a released one stays cached until evicted), and a prefix
 * is reused only as far as both caches hold it: every global block and
 * the window blocks of its last window, since a local layer's K/V there
 * depends on the whole prefix and cannot be recomputed alone. Samples
 * share the window blocks of the shared prompt likewise.
 */
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

/* ---------------------------------------------------------------------- */
/* queues                                                                 */
/* ---------------------------------------------------------------------- */

int sched_before(const eng_seq *a, const eng_seq *b)
{
    if (a->req->priority != b->req->priority)
        return a->req->priority > b->req->priority;
    if (a->req->arrival != b->req->arrival)
        return a->req->arrival < b->req->arrival;
    return a->index < b->index;
}

/* Index where s goes in a sorted array. */
static int position(eng_seq *const *arr, int n, const eng_seq *s)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (sched_before(arr[mid], s))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void insert_at(eng_seq **arr, int *n, int at, eng_seq *s)
{
    memmove(arr + at + 1, arr + at, sizeof *arr * (size_t)(*n - at));
    arr[at] = s;
    (*n)++;
}

static void remove_from(eng_seq **arr, int *n, const eng_seq *s)
{
    for (int i = 0; i < *n; i++) {
        if (arr[i] == s) {
            memmove(arr + i, arr + i + 1, sizeof *arr * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
    }
    CINFER_ASSERT(!"sequence not in its queue");
}

cinfer_status sched_waiting_insert(cinfer_engine *e, eng_seq *s)
{
    if (e->n_waiting == e->cap_waiting) {
        int cap = e->cap_waiting ? 2 * e->cap_waiting : 64;
        eng_seq **nw = realloc(e->waiting, sizeof *nw * (size_t)cap);
        if (!nw)
            return cinfer_set_error(CINFER_E_NOMEM, "engine: out of memory");
        e->waiting = nw;
        e->cap_waiting = cap;
    }
    insert_at(e->waiting, &e->n_waiting,
              position(e->waiting, e->n_waiting, s), s);
    s->state = SEQ_WAITING;
    return CINFER_OK;
}

void sched_waiting_remove(cinfer_engine *e, eng_seq *s)
{
    remove_from(e->waiting, &e->n_waiting, s);
}

void sched_running_remove(cinfer_engine *e, eng_seq *s)
{
    remove_from(e->running, &e->n_running, s);
}

static void running_insert(cinfer_engine *e, eng_seq *s)
{
    CINFER_ASSERT(e->n_running < e->max_seqs);
    insert_at(e->running, &e->n_running,
              position(e->running, e->n_running, s), s);
    s->state = SEQ_RUNNING;
}

/* ---------------------------------------------------------------------- */
/* blocks                                                                 */
/* ---------------------------------------------------------------------- */

static int32_t blocks_for(const cinfer_engine *e, int32_t n_tokens)
{
    return (n_tokens + e->block_size - 1) / e->block_size;
}

/* Blocks a sequence can grow by now: free plus cached, in both pools
 * (a new block index takes a block of each). */
static int avail(const cinfer_engine *e)
{
    int a = cinfer_kv_cache_available(e->kv);
    if (e->skv) {
        int b = cinfer_kv_cache_available(e->skv);
        a = b < a ? b : a;
    }
    return a;
}

/* The first window-pool block a row at a position >= pos reads. */
static int32_t swa_first(const cinfer_engine *e, int32_t pos)
{
    int32_t lo = pos - e->swa_window + 1;
    return lo > 0 ? lo / e->block_size : 0;
}

/* Releases the window-pool blocks of s that no row from n_computed on
 * reads: every position in them is out of the window of all of them. */
static void swa_release_behind(cinfer_engine *e, eng_seq *s)
{
    if (!e->skv)
        return;
    int32_t first = swa_first(e, s->n_computed);
    if (first > s->n_blocks)
        first = s->n_blocks;
    while (s->s_first < first) {
        cinfer_kv_cache_release(e->skv, s->sblocks[s->s_first]);
        s->sblocks[s->s_first++] = e->swa_null;
    }
}

void sched_release_blocks(cinfer_engine *e, eng_seq *s)
{
    for (int32_t i = s->n_blocks - 1; e->skv && i >= s->s_first; i--)
        cinfer_kv_cache_release(e->skv, s->sblocks[i]);
    s->s_first = 0;
    for (int32_t i = s->n_blocks - 1; i >= 0; i--)
        cinfer_kv_cache_release(e->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_computed = 0;
    s->n_hashed = 0;
}

/* Allocates blocks so that s can hold n_tokens; the caller checked that
 * enough are available. */
static void grow_to(cinfer_engine *e, eng_seq *s, int32_t n_tokens)
{
    int32_t need = blocks_for(e, n_tokens);
    CINFER_ASSERT(need <= e->max_blocks);
    while (s->n_blocks < need) {
        int32_t b = cinfer_kv_cache_alloc(e->kv);
        CINFER_ASSERT(b >= 0);
        if (e->skv) {
            int32_t sb = cinfer_kv_cache_alloc(e->skv);
            CINFER_ASSERT(sb >= 0);
            s->sblocks[s->n_blocks] = sb;
        }
        s->blocks[s->n_blocks++] = b;
    }
}

void sched_preempt(cinfer_engine *e, eng_seq *s)
{
    sched_running_remove(e, s);
    sched_release_blocks(e, s);
    s->step_rows = 0;
    /* Memory was checked when the request came in: the queue grows only
     * on submit, so this insert has room. */
    cinfer_status st = sched_waiting_insert(e, s);
    CINFER_ASSERT(st == CINFER_OK);
    e->st.preemptions++;
}

/* Takes s off this step's schedule (it is about to be preempted). */
static void unschedule(cinfer_engine *e, eng_seq *s, int *budget)
{
    for (int i = 0; i < e->n_sched; i++) {
        if (e->sched[i] == s) {
            *budget += s->step_rows;
            s->step_rows = 0;
            memmove(e->sched + i, e->sched + i + 1,
                    sizeof *e->sched * (size_t)(e->n_sched - i - 1));
            e->n_sched--;
            return;
        }
    }
}

/* Whether the window pool holds, cached, the blocks of the last window
 * before block k of s (s->hashes[0..k) set). */
static int swa_cached(const cinfer_engine *e, const eng_seq *s, int32_t k)
{
    int32_t bs = e->block_size;
    for (int32_t i = swa_first(e, k * bs); i < k; i++) {
        uint64_t parent = i ? s->hashes[i - 1] : CINFER_KV_ROOT_HASH;
        if (cinfer_kv_cache_peek(e->skv, parent, s->hashes[i],
                                 s->tokens + (size_t)i * (size_t)bs) < 0)
            return 0;
    }
    return 1;
}

/* Prefix-cache reuse with a window pool: the global blocks of the longest
 * cached prefix whose last window the pool still holds too (a local
 * layer's K/V there cannot be recomputed without the whole prefix), and
 * those window blocks; the ones before the window stay released. */
static void reuse_cached_swa(cinfer_engine *e, eng_seq *s, int32_t limit)
{
    int32_t bs = e->block_size, k = 0;
    uint64_t parent = CINFER_KV_ROOT_HASH;
    for (; k < limit; k++) {
        const int32_t *t = s->tokens + (size_t)k * (size_t)bs;
        uint64_t h = cinfer_kv_cache_hash(parent, t, bs);
        if (cinfer_kv_cache_peek(e->kv, parent, h, t) < 0)
            break;
        s->hashes[k] = h;
        parent = h;
    }
    while (k > 0 && !swa_cached(e, s, k))
        k--;
    int32_t first = swa_first(e, k * bs);
    for (int32_t i = 0; i < k; i++) {
        const int32_t *t = s->tokens + (size_t)i * (size_t)bs;
        parent = i ? s->hashes[i - 1] : CINFER_KV_ROOT_HASH;
        s->blocks[i] = cinfer_kv_cache_lookup(e->kv, parent, s->hashes[i], t);
        CINFER_ASSERT(s->blocks[i] >= 0);
        s->sblocks[i] = e->swa_null;
        if (i >= first) {
            s->sblocks[i] = cinfer_kv_cache_lookup(e->skv, parent,
                                                   s->hashes[i], t);
            CINFER_ASSERT(s->sblocks[i] >= 0);
        }
    }
    s->n_blocks = s->n_hashed = k;
    s->s_first = first;
}

/* Reused full blocks for a sequence being admitted: prefix-cache hits, or
 * the prompt blocks of a running sibling. Takes a reference on each and
 * sets n_blocks, n_hashed, n_computed (and the window pool's table).
 * Leaves at least one token to compute. */
static void reuse_prefix(cinfer_engine *e, eng_seq *s)
{
    int32_t bs = e->block_size;
    int32_t limit = (s->n_tokens - 1) / bs; /* full blocks we may reuse */
    s->n_blocks = 0;
    s->n_hashed = 0;
    s->s_first = 0;
    /* Prompt embeddings are not named by token ids: such a request neither
     * takes cached blocks nor registers its own (publish_blocks), and its
     * samples share theirs as without the cache. */
    if (e->prefix_cache && !s->req->n_embeds && e->skv) {
        reuse_cached_swa(e, s, limit);
    } else if (e->prefix_cache && !s->req->n_embeds) {
        uint64_t parent = CINFER_KV_ROOT_HASH;
        for (int32_t i = 0; i < limit; i++) {
            const int32_t *t = s->tokens + (size_t)i * (size_t)bs;
            uint64_t h = cinfer_kv_cache_hash(parent, t, bs);
            int32_t b = cinfer_kv_cache_lookup(e->kv, parent, h, t);
            if (b < 0)
                break;
            s->blocks[s->n_blocks++] = b;
            s->hashes[s->n_hashed++] = h;
            parent = h;
        }
    } else if (s->req->n_samples > 1) {
        const eng_request *r = s->req;
        int32_t lim = limit < r->n_prompt / bs ? limit : r->n_prompt / bs;
        const eng_seq *best = NULL;
        int32_t best_n = 0;
        for (int k = 0; k < r->n_samples; k++) {
            const eng_seq *o = &r->seqs[k];
            if (o == s || o->state != SEQ_RUNNING)
                continue;
            int32_t n = o->n_computed / bs;
            if (n > lim)
                n = lim;
            /* the window before block n must still be o's */
            if (e->skv && o->s_first > swa_first(e, n * bs))
                continue;
            if (n > best_n) {
                best = o;
                best_n = n;
            }
        }
        int32_t first = e->skv ? swa_first(e, best_n * bs) : 0;
        for (int32_t i = 0; i < best_n; i++) {
            cinfer_kv_cache_retain(e->kv, best->blocks[i]);
            if (e->skv) {
                s->sblocks[i] = i < first ? e->swa_null : best->sblocks[i];
                if (i >= first)
                    cinfer_kv_cache_retain(e->skv, best->sblocks[i]);
            }
            s->blocks[s->n_blocks++] = best->blocks[i];
        }
        s->s_first = first;
    }
    s->n_computed = s->n_blocks * bs;
}

/* A sample waits while a running sibling is still computing the prompt
 * blocks it could share, and none has them yet. */
static int wait_for_sibling(const cinfer_engine *e, const eng_seq *s)
{
    const eng_request *r = s->req;
    int32_t bs = e->block_size;
    int32_t target = (s->n_tokens - 1) / bs;
    if (target > r->n_prompt / bs)
        target = r->n_prompt / bs;
    if (r->n_samples < 2 || target == 0)
        return 0;
    int computing = 0;
    for (int k = 0; k < r->n_samples; k++) {
        const eng_seq *o = &r->seqs[k];
        if (o == s || o->state != SEQ_RUNNING)
            continue;
        if (o->n_computed / bs >= target)
            return 0;
        computing = 1;
    }
    return computing;
}

static void add_sched(cinfer_engine *e, eng_seq *s, int32_t rows)
{
    s->step_rows = rows;
    s->step_prefill = s->n_generated == 0 || s->n_tokens - s->n_computed > 1;
    e->sched[e->n_sched++] = s;
}

/* ---------------------------------------------------------------------- */
/* step-time model and deadlines                                          */
/* ---------------------------------------------------------------------- */

/* Weight of the previous sums at each new step: about the last 20 steps. */
#define SCHED_MODEL_DECAY 0.95
/* Predictions are taken this much longer, for what the model misses
 * (sampling, streaming, the client's side). */
#define SCHED_MODEL_MARGIN 1.15

void sched_observe_step(cinfer_engine *e, int rows, int64_t ns)
{
    if (rows <= 0 || ns < 0)
        return;
    const double x = rows, y = (double)ns, k = SCHED_MODEL_DECAY;
    e->tm_w = k * e->tm_w + 1.0;
    e->tm_x = k * e->tm_x + x;
    e->tm_y = k * e->tm_y + y;
    e->tm_xx = k * e->tm_xx + x * x;
    e->tm_xy = k * e->tm_xy + x * y;
    if (e->tm_n < INT32_MAX)
        e->tm_n++;
}

void sched_predict_step(const cinfer_engine *e, int rows, int64_t *step_ns,
                        int64_t *row_ns)
{
    *step_ns = *row_ns = 0;
    if (e->tm_n == 0 || e->tm_x <= 0.0)
        return;
    const double w = e->tm_w, mx = e->tm_x / w, my = e->tm_y / w;
    const double var = e->tm_xx / w - mx * mx;
    double a = 0.0, b = my / mx; /* one row count seen: proportional */
    if (var >= 1.0) {            /* rows varied: a line */
        b = (e->tm_xy / w - mx * my) / var;
        if (b < 0.0)
            b = 0.0;
        a = my - b * mx;
        if (a < 0.0) { /* through the origin instead */
            a = 0.0;
            b = e->tm_xy / e->tm_xx;
        }
    }
    *step_ns = (int64_t)((a + b * rows) * SCHED_MODEL_MARGIN);
    *row_ns = (int64_t)(b * SCHED_MODEL_MARGIN);
}

static void heap_down(int64_t *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < n && h[l] < h[m])
            m = l;
        if (l + 1 < n && h[l + 1] < h[m])
            m = l + 1;
        if (m == i)
            return;
        int64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int64_t seq_left(const eng_seq *s)
{
    int64_t left = s->req->max_tokens - s->n_generated;
    return left < 1 ? 1 : left;
}

static int has_deadline(const eng_seq *s) { return s->req->deadline_ns != 0; }

/* Whether the running sequences with deadlines, and s (NULL: a newcomer
 * without its prefill counted), still meet them with s in the running set.
 * A running sequence that will miss its deadline anyway does not hold the
 * others back. */
static int deadlines_hold(const cinfer_engine *e, const eng_seq *s,
                          int64_t now_ns)
{
    int64_t step_ns, row_ns, now_step_ns, unused;
    sched_predict_step(e, e->n_running + 1, &step_ns, &row_ns);
    sched_predict_step(e, e->n_running, &now_step_ns, &unused);
    /* the newcomer's prefill rows, spread over the coming steps */
    const int64_t extra = s ? (int64_t)(s->n_tokens - s->n_computed) * row_ns : 0;
    for (int i = s ? -1 : 0; i < e->n_running; i++) {
        const eng_seq *r = i < 0 ? s : e->running[i];
        if (!has_deadline(r))
            continue;
        const int64_t left = seq_left(r);
        if (i >= 0 && now_ns + left * now_step_ns > r->req->deadline_ns)
            continue;
        if (now_ns + extra + left * step_ns > r->req->deadline_ns)
            return 0;
    }
    return 1;
}

/* Whether one more sequence (its prefill not counted) may join the
 * running set now as far as the running ones' deadlines go. */
static int room_for_one(const cinfer_engine *e, int64_t now_ns)
{
    return !e->hold_for_deadlines || deadlines_hold(e, NULL, now_ns);
}

int sched_predict_start(const cinfer_engine *e, int64_t now_ns,
                        int64_t *start_ns, int64_t *step_ns, int64_t *row_ns)
{
    *start_ns = *step_ns = *row_ns = 0;
    if (e->tm_n < SCHED_MODEL_MIN_STEPS)
        return 0;
    int64_t unused;
    sched_predict_step(e, e->n_running + 1, step_ns, row_ns);
    if (e->n_running < e->max_seqs && e->n_waiting == 0 &&
        room_for_one(e, now_ns))
        return 1; /* a slot is free */
    /* the slots: as many as run now (what deadlines and memory allow) */
    int k = e->n_running > 0 ? e->n_running : 1;
    int64_t t_step;
    sched_predict_step(e, k, &t_step, &unused);
    int64_t *h = e->pred_slots;
    for (int i = 0; i < k; i++)
        h[i] = i < e->n_running ? seq_left(e->running[i]) * t_step : 0;
    for (int i = k / 2 - 1; i >= 0; i--)
        heap_down(h, k, i);
    for (int j = 0; j < e->n_waiting; j++) {
        const eng_seq *w = e->waiting[j];
        h[0] += (int64_t)(w->n_tokens - w->n_computed) * *row_ns +
                seq_left(w) * t_step;
        heap_down(h, k, 0);
    }
    *start_ns = h[0];
    return 1;
}

/* Whether s may join the running set now as far as deadlines go (see
 * engine_impl.h). */
static int deadlines_allow(const cinfer_engine *e, const eng_seq *s,
                           int64_t now_ns)
{
    if (!e->hold_for_deadlines || e->n_running == 0 ||
        e->tm_n < SCHED_MODEL_MIN_STEPS)
        return 1;
    int any = has_deadline(s);
    for (int i = 0; i < e->n_running && !any; i++)
        any = has_deadline(e->running[i]);
    return !any || deadlines_hold(e, s, now_ns);
}

/* ---------------------------------------------------------------------- */
/* the schedule                                                           */
/* ---------------------------------------------------------------------- */

int sched_schedule(cinfer_engine *e, int64_t now_ns)
{
    int budget = e->max_batched;
    int preempted = 0;
    int32_t bs = e->block_size;
    e->n_sched = 0;
    for (int i = 0; i < e->n_running; i++) {
        e->running[i]->step_rows = 0;
        e->running[i]->n_draft = 0;
    }

    /* 1-2: running sequences, decodes then prefills */
    for (int pass = 0; pass < 2; pass++) {
        /* prefill gets at least min_prefill rows, whatever the decodes took,
         * and max_prefill in a step with no decode row */
        if (pass == 1 && budget < e->min_prefill)
            budget = e->min_prefill;
        if (pass == 1 && e->n_sched == 0 && budget < e->max_prefill)
            budget = e->max_prefill;
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            eng_seq *s = e->running[i];
            int32_t remaining = s->n_tokens - s->n_computed;
            CINFER_ASSERT(remaining >= 1);
            if ((remaining == 1) != (pass == 0) || s->step_rows)
                continue;
            int32_t rows = remaining < budget ? remaining : budget;
            if (pass == 1) {
                /* a shorter chunk rather than a preemption */
                int32_t fit = (s->n_blocks + avail(e)) *
                                  bs - s->n_computed;
                if (fit > 0 && fit < rows)
                    rows = fit;
            }
            int self = 0;
            while (blocks_for(e, s->n_computed + rows) - s->n_blocks >
                   avail(e)) {
                eng_seq *victim = e->running[e->n_running - 1];
                preempted = 1;
                if (victim == s) {
                    sched_preempt(e, s);
                    self = 1;
                    break;
                }
                unschedule(e, victim, &budget);
                sched_preempt(e, victim);
            }
            if (self) {
                i--; /* s left the array; the loop ends since it was last */
                continue;
            }
            grow_to(e, s, s->n_computed + rows);
            add_sched(e, s, rows);
            budget -= rows;
        }
    }

    /* 3: admissions */
    for (int j = 0; !preempted && j < e->n_waiting && budget > 0 &&
                    e->n_running < e->max_seqs;) {
        eng_seq *s = e->waiting[j];
        if (wait_for_sibling(e, s)) {
            j++;
            continue;
        }
        if (!deadlines_allow(e, s, now_ns))
            break; /* first come, first served, as below */
        reuse_prefix(e, s);
        int32_t remaining = s->n_tokens - s->n_computed;
        int32_t rows = remaining < budget ? remaining : budget;
        if (e->skv) {
            /* a window pool smaller than a chunk: a shorter first chunk */
            int32_t fit = (s->n_blocks + cinfer_kv_cache_available(e->skv)) *
                              bs - s->n_computed;
            if (fit > 0 && fit < rows)
                rows = fit;
        }
        int32_t need = blocks_for(e, s->n_computed + rows) - s->n_blocks;
        if (need > avail(e)) {
            sched_release_blocks(e, s);
            break; /* first come, first served: nobody jumps the queue */
        }
        grow_to(e, s, s->n_computed + rows);
        sched_waiting_remove(e, s);
        running_insert(e, s);
        if (!s->admitted) {
            s->admitted = 1;
            s->first_sched_ns = now_ns;
            int32_t reused = s->n_computed < s->req->n_prompt
                                 ? s->n_computed
                                 : s->req->n_prompt;
            s->cached_tokens = reused;
            e->st.cached_tokens += (uint64_t)reused;
        }
        add_sched(e, s, rows);
        budget -= rows;
    }

    /* 4: drafts, in the rows left over, while few sequences run */
    if (e->spec_k > 0 && e->n_running <= e->spec_max_seqs)
        for (int i = 0; i < e->n_sched && budget > 0; i++)
            sched_add_drafts(e, e->sched[i], &budget);

    int rows = 0;
    for (int i = 0; i < e->n_sched; i++)
        rows += e->sched[i]->step_rows;
    return rows;
}

/* ---------------------------------------------------------------------- */
/* speculative decoding                                                   */
/* ---------------------------------------------------------------------- */

int32_t sched_ngram_draft(const int32_t *t, int32_t n_tokens, int nmin,
                          int nmax, int32_t k, int32_t *out)
{
    if (k <= 0)
        return 0;
    for (int32_t len = nmax < n_tokens - 1 ? nmax : n_tokens - 1;
         len >= nmin && len >= 1; len--) {
        const int32_t *suffix = t + n_tokens - len;
        for (int32_t at = n_tokens - len - 1; at >= 0; at--) {
            if (t[at + len - 1] != suffix[len - 1] ||
                memcmp(t + at, suffix, sizeof *t * (size_t)len) != 0)
                continue;
            /* Element by element: where the source reaches past n_tokens
             * it reads drafts written here, so a loop repeats. */
            const int32_t *src = t + at + len;
            for (int32_t j = 0; j < k; j++) {
                int32_t from = at + len + j;
                out[j] = from < n_tokens ? src[j] : out[from - n_tokens];
            }
            return k;
        }
    }
    return 0;
}

void sched_add_drafts(cinfer_engine *e, eng_seq *s, int *budget)
{
    /* only a sequence whose rows reach its last token */
    if (s->n_computed + s->step_rows != s->n_tokens || s->n_draft)
        return;
    int32_t k = s->spec_len > 0 && s->spec_len < e->spec_k ? s->spec_len
                                                            : e->spec_k;
    if (k > *budget)
        k = *budget;
    /* the accepted drafts plus the token sampled after them must fit the
     * request's max_tokens and the sequence's room */
    int32_t left = s->req->max_tokens - s->n_generated - 1;
    if (k > left)
        k = left;
    if (k > s->cap - s->n_tokens - 1)
        k = s->cap - s->n_tokens - 1;
    /* blocks on the free list (drafts neither preempt nor evict cached
     * prefixes) */
    cinfer_kv_cache_stats ks;
    cinfer_kv_cache_get_stats(e->kv, &ks);
    int free_blocks = ks.n_free;
    if (e->skv) {
        cinfer_kv_cache_get_stats(e->skv, &ks);
        free_blocks = ks.n_free < free_blocks ? ks.n_free : free_blocks;
    }
    int32_t room = (s->n_blocks + free_blocks) * e->block_size - s->n_tokens;
    if (k > room)
        k = room;
    if (k <= 0)
        return;
    int32_t d = sched_ngram_draft(s->tokens, s->n_tokens, e->spec_nmin,
                                  e->spec_nmax, k, s->tokens + s->n_tokens);
    if (d <= 0)
        return;
    grow_to(e, s, s->n_tokens + d);
    s->n_draft = d;
    s->step_rows += d;
    *budget -= d;
}

/* Registers the full blocks of s whose K/V is computed (positions below
 * n_computed) and not registered yet. */
static void publish_blocks(cinfer_engine *e, eng_seq *s)
{
    if (!e->prefix_cache || s->req->n_embeds)
        return;
    int32_t bs = e->block_size;
    int32_t full = s->n_computed / bs;
    for (int32_t i = s->n_hashed; i < full; i++) {
        const int32_t *t = s->tokens + (size_t)i * (size_t)bs;
        uint64_t parent = i ? s->hashes[i - 1] : CINFER_KV_ROOT_HASH;
        uint64_t h = cinfer_kv_cache_hash(parent, t, bs);
        s->hashes[i] = h;
        cinfer_kv_cache_publish(e->kv, s->blocks[i], parent, h, t);
        if (e->skv) { /* released only once registered (sched_commit) */
            CINFER_ASSERT(i >= s->s_first);
            cinfer_kv_cache_publish(e->skv, s->sblocks[i], parent, h, t);
        }
    }
    if (full > s->n_hashed)
        s->n_hashed = full;
}

void sched_spec_rollback(cinfer_engine *e, eng_seq *s)
{
    CINFER_ASSERT(s->n_tokens >= 1 && s->n_tokens - 1 >= s->n_computed);
    s->n_computed = s->n_tokens - 1;
    publish_blocks(e, s);
    /* Blocks past the next token's hold only rejected drafts' K/V. They
     * were never registered (registration needs computed positions) and
     * are this sequence's alone (shared blocks are full and computed). */
    int32_t keep = blocks_for(e, s->n_tokens);
    while (s->n_blocks > keep) {
        int32_t b = s->blocks[--s->n_blocks];
        CINFER_ASSERT(!cinfer_kv_cache_is_registered(e->kv, b));
        cinfer_kv_cache_release(e->kv, b);
        if (e->skv) /* past s_first: n_blocks >= keep >= it */
            cinfer_kv_cache_release(e->skv, s->sblocks[s->n_blocks]);
    }
    swa_release_behind(e, s);
}

void sched_build_step(cinfer_engine *e, cinfer_step *step)
{
    int32_t bs = e->block_size;
    int32_t stride = 1;
    for (int k = 0; k < e->n_sched; k++)
        if (e->sched[k]->n_blocks > stride)
            stride = e->sched[k]->n_blocks;
    int32_t n = 0, n_out = 0;
    int embd = 0; /* a row takes a prompt embedding */
    for (int k = 0; k < e->n_sched; k++)
        embd |= e->sched[k]->n_computed < e->sched[k]->req->n_embeds;
    const size_t d = embd ? (size_t)e->info->n_embd : 0;
    for (int k = 0; k < e->n_sched; k++) {
        eng_seq *s = e->sched[k];
        int32_t *tab = e->s_tables + (size_t)k * (size_t)stride;
        memcpy(tab, s->blocks, sizeof *tab * (size_t)s->n_blocks);
        for (int32_t i = s->n_blocks; i < stride; i++)
            tab[i] = 0;
        if (e->skv) {
            int32_t *st = e->s_swa_tables + (size_t)k * (size_t)stride;
            memcpy(st, s->sblocks, sizeof *st * (size_t)s->n_blocks);
            for (int32_t i = s->n_blocks; i < stride; i++)
                st[i] = e->swa_null;
        }
        for (int32_t j = 0; j < s->step_rows; j++, n++) {
            int32_t pos = s->n_computed + j;
            e->s_tokens[n] = s->tokens[pos];
            e->s_pos[n] = pos;
            e->s_row_seq[n] = k;
            e->s_slots[n] = s->blocks[pos / bs] * bs + pos % bs;
            if (e->skv)
                e->s_swa_slots[n] = s->sblocks[pos / bs] * bs + pos % bs;
            /* generated tokens (also when recomputed after preemption) */
            e->s_gen[n] = pos >= s->req->n_prompt;
            if (embd)
                e->s_embd[n] = pos < s->req->n_embeds
                                   ? s->req->embeds + (size_t)pos * d
                                   : NULL;
        }
        if (s->n_computed + s->step_rows == s->n_tokens + s->n_draft) {
            /* the last token's row and each draft's */
            s->step_out = n_out;
            for (int32_t j = s->n_draft; j >= 0; j--)
                e->s_out_rows[n_out++] = n - 1 - j;
        } else {
            s->step_out = -1;
        }
    }
    memset(step, 0, sizeof *step);
    step->n_rows = n;
    step->n_seqs = e->n_sched;
    step->block_size = bs;
    step->max_blocks = stride;
    step->tokens = e->s_tokens;
    step->positions = e->s_pos;
    step->row_seq = e->s_row_seq;
    step->slots = e->s_slots;
    step->block_tables = e->s_tables;
    if (n_out == 0) {
        /* The model wants at least one output row; this one is ignored. */
        e->s_out_rows[n_out++] = n - 1;
    }
    step->n_out = n_out;
    step->out_rows = e->s_out_rows;
    step->row_gen = e->s_gen;
    if (e->skv) {
        step->swa_slots = e->s_swa_slots;
        step->swa_block_tables = e->s_swa_tables;
    }
    step->row_embd = embd ? e->s_embd : NULL;
}

void sched_commit(cinfer_engine *e)
{
    for (int k = 0; k < e->n_sched; k++) {
        eng_seq *s = e->sched[k];
        /* drafts count once verified (sched_spec_rollback) */
        int32_t rows = s->step_rows - s->n_draft;
        s->n_computed += rows;
        if (s->step_prefill)
            e->st.prompt_tokens += (uint64_t)rows;
        publish_blocks(e, s);
        swa_release_behind(e, s);
    }
}
