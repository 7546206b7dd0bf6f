/*
 * test_scheduler.c - the scheduler without a model.
 *
 * A fake model stands in for the forward pass: it records which token
 * (and position) each KV slot holds, and for every row checks what the
 * attention of that row would read through its block table: positions
 * 0..pos of its own sequence, each slot holding exactly that sequence's
 * token at that position. Any mistake in block tables, slots, prefix-cache
 * reuse, sharing between samples or recomputation after preemption shows up
 * as a wrong slot. Around it: fixed scenarios (decodes before prefill
 * chunks, the token budget, who gets preempted, what is reused) and a
 * randomized simulation with invariant checks after every step.
 */
#include "engine/engine_impl.h"
#include "harness.h"

#include <stdlib.h>

/* ---------------------------------------------------------------------- */
/* a hand-built engine (no thread, no model)                              */
/* ---------------------------------------------------------------------- */

typedef struct {
    int32_t tok;
    int32_t pos;
    int valid;
} slot_rec;

static slot_rec *kvmem; /* [n_blocks * block_size] */

/* Speculative decoding in the fake engines made next: draft tokens per
 * step (0 = off) and the most running sequences that draft. */
static int sim_spec_k, sim_spec_max_seqs = 4;

static cinfer_engine *fake_engine(int n_blocks, int bs, int max_seqs,
                                  int max_batched, int prefix, int ctx)
{
    cinfer_engine *e = calloc(1, sizeof *e);
    e->max_seqs = max_seqs;
    e->max_batched = max_batched;
    e->prefix_cache = prefix;
    e->hold_for_deadlines = 1;
    e->block_size = bs;
    e->ctx_cap = ctx;
    e->max_blocks = (ctx + bs - 1) / bs;
    cinfer_kv_cache_params kp = cinfer_kv_cache_default_params();
    kp.n_blocks = n_blocks;
    kp.block_size = bs;
    kp.prefix_cache = prefix;
    CHECK_OK(cinfer_kv_cache_create(&kp, &e->kv));
    e->running = calloc((size_t)max_seqs, sizeof *e->running);
    e->pred_slots = calloc((size_t)max_seqs, sizeof *e->pred_slots);
    e->sched = calloc((size_t)max_seqs, sizeof *e->sched);
    e->max_rows = max_batched;
    e->spec_k = sim_spec_k;
    e->spec_nmin = 1;
    e->spec_nmax = 3;
    e->spec_max_seqs = sim_spec_max_seqs;
    size_t rows = (size_t)max_batched + 16; /* room for a prefill floor */
    e->s_tokens = calloc(rows, sizeof(int32_t));
    e->s_pos = calloc(rows, sizeof(int32_t));
    e->s_row_seq = calloc(rows, sizeof(int32_t));
    e->s_slots = calloc(rows, sizeof(int32_t));
    e->s_out_rows = calloc(rows, sizeof(int32_t));
    e->s_gen = calloc(rows, 1);
    e->s_tables = calloc((size_t)max_seqs * (size_t)e->max_blocks,
                         sizeof(int32_t));
    free(kvmem);
    kvmem = calloc((size_t)n_blocks * (size_t)bs, sizeof *kvmem);
    return e;
}

static void fake_engine_free(cinfer_engine *e)
{
    cinfer_kv_cache_destroy(e->kv);
    free(e->waiting);
    free(e->running);
    free(e->pred_slots);
    free(e->sched);
    free(e->s_tokens);
    free(e->s_pos);
    free(e->s_row_seq);
    free(e->s_slots);
    free(e->s_out_rows);
    free(e->s_gen);
    free(e->s_tables);
    free(e);
    free(kvmem);
    kvmem = NULL;
}

static eng_request *fake_request(cinfer_engine *e, const int32_t *prompt,
                                 int n_prompt, int max_gen, int n_samples,
                                 int priority, uint64_t arrival)
{
    eng_request *r = calloc(1, sizeof *r);
    r->id = arrival;
    r->arrival = arrival;
    r->priority = priority;
    r->n_prompt = n_prompt;
    r->max_tokens = max_gen;
    r->n_samples = n_samples;
    r->n_live = n_samples;
    r->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    r->seqs = calloc((size_t)n_samples, sizeof *r->seqs);
    for (int k = 0; k < n_samples; k++) {
        eng_seq *s = &r->seqs[k];
        s->req = r;
        s->index = k;
        s->cap = n_prompt + max_gen;
        if (s->cap > e->ctx_cap)
            s->cap = e->ctx_cap;
        s->tokens = malloc(sizeof(int32_t) * (size_t)s->cap + 4);
        memcpy(s->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
        s->n_tokens = n_prompt;
        s->blocks = malloc(sizeof(int32_t) * (size_t)e->max_blocks);
        s->hashes = malloc(sizeof(uint64_t) * (size_t)e->max_blocks);
        s->step_out = -1;
        CHECK_OK(sched_waiting_insert(e, s));
    }
    return r;
}

static void fake_request_free(eng_request *r)
{
    for (int k = 0; k < r->n_samples; k++) {
        free(r->seqs[k].tokens);
        free(r->seqs[k].blocks);
        free(r->seqs[k].hashes);
    }
    free(r->seqs);
    free(r->prompt);
    free(r);
}

static void finish(cinfer_engine *e, eng_seq *s)
{
    if (s->state == SEQ_RUNNING)
        sched_running_remove(e, s);
    else if (s->state == SEQ_WAITING)
        sched_waiting_remove(e, s);
    sched_release_blocks(e, s);
    s->state = SEQ_FINISHED;
    s->req->n_live--;
}

/* ---------------------------------------------------------------------- */
/* the fake forward pass                                                  */
/* ---------------------------------------------------------------------- */

static int fake_forward(cinfer_engine *e, const cinfer_step *st)
{
    int bad = 0;
    int32_t bs = st->block_size;
    /* K/V stores first, as the model does */
    for (int32_t r = 0; r < st->n_rows; r++) {
        int32_t slot = st->slots[r];
        int32_t b = slot / bs;
        if (cinfer_kv_cache_refcount(e->kv, b) != 1) {
            fprintf(stderr, "row %d writes shared block %d (ref %d)\n", r, b,
                    cinfer_kv_cache_refcount(e->kv, b));
            bad = 1;
        }
        kvmem[slot].tok = st->tokens[r];
        kvmem[slot].pos = st->positions[r];
        kvmem[slot].valid = 1;
    }
    /* what each row's attention reads */
    for (int32_t r = 0; r < st->n_rows && !bad; r++) {
        const eng_seq *s = e->sched[st->row_seq[r]];
        const int32_t *tab =
            st->block_tables + (size_t)st->row_seq[r] * (size_t)st->max_blocks;
        if (st->tokens[r] != s->tokens[st->positions[r]])
            bad = 1;
        for (int32_t p = 0; p <= st->positions[r] && !bad; p++) {
            int32_t slot = tab[p / bs] * bs + p % bs;
            if (!kvmem[slot].valid || kvmem[slot].pos != p ||
                kvmem[slot].tok != s->tokens[p]) {
                fprintf(stderr, "row %d (pos %d) reads a wrong slot for "
                        "position %d\n", r, st->positions[r], p);
                bad = 1;
            }
        }
    }
    for (int32_t j = 1; j < st->n_out; j++)
        bad |= st->out_rows[j] <= st->out_rows[j - 1];
    return !bad;
}

/* Deterministic "sampled" token: a function of the sequence so far, the
 * same however the sequence was scheduled. Mostly one of five tokens
 * chosen by the last two (so outputs fall into loops that n-gram drafts
 * predict), now and then one of a thousand chosen by the whole history
 * (so drafts are also rejected). */
static int32_t next_token(const eng_seq *s)
{
    uint64_t h = 1469598103934665603ull + (uint64_t)s->index;
    for (int32_t i = 0; i < s->n_tokens; i++)
        h = (h ^ (uint64_t)s->tokens[i]) * 1099511628211ull;
    if (h % 7 == 0 || s->n_tokens < 2)
        return (int32_t)(h % 1000);
    uint64_t g = ((uint64_t)s->tokens[s->n_tokens - 1] * 31 +
                  (uint64_t)s->tokens[s->n_tokens - 2]) *
                 0x9e3779b97f4a7c15ull;
    return 100 + (int32_t)((g >> 40) % 5);
}

/* Takes one "sampled" token; 1 if s finished. */
static int take(cinfer_engine *e, eng_seq *s)
{
    s->tokens[s->n_tokens] = next_token(s);
    s->n_tokens++;
    s->n_generated++;
    if (s->n_generated >= s->req->max_tokens || s->n_tokens >= s->cap) {
        finish(e, s);
        return 1;
    }
    return 0;
}

/* The engine's verification (engine.c take_drafts) over next_token. */
static void take_drafts(cinfer_engine *e, eng_seq *s)
{
    int32_t drafts[CINFER_ENGINE_SPEC_MAX_K];
    const int32_t d = s->n_draft, base = s->n_tokens;
    memcpy(drafts, s->tokens + base, sizeof *drafts * (size_t)d);
    s->n_draft = 0;
    e->st.spec_drafted += (uint64_t)d;
    for (int32_t i = 0; i <= d; i++) {
        if (take(e, s))
            return;
        if (i == d || s->tokens[base + i] != drafts[i])
            break;
        e->st.spec_accepted++;
    }
    sched_spec_rollback(e, s);
}

/* Every reference to a block is held by a running sequence's table, and
 * waiting sequences hold nothing. */
static int refs_consistent(cinfer_engine *e, eng_request **reqs, int n_req,
                           int n_blocks)
{
    int *cnt = calloc((size_t)n_blocks, sizeof *cnt);
    int ok = 1;
    for (int i = 0; i < n_req; i++) {
        if (!reqs[i])
            continue;
        for (int k = 0; k < reqs[i]->n_samples; k++) {
            const eng_seq *s = &reqs[i]->seqs[k];
            if (s->state != SEQ_RUNNING) {
                ok &= s->n_blocks == 0;
                continue;
            }
            ok &= s->n_blocks >= (s->n_computed + e->block_size - 1) /
                                     e->block_size;
            for (int32_t b = 0; b < s->n_blocks; b++)
                cnt[s->blocks[b]]++;
        }
    }
    for (int b = 0; b < n_blocks; b++)
        ok &= cnt[b] == cinfer_kv_cache_refcount(e->kv, b);
    ok &= cinfer_kv_cache_check(e->kv);
    free(cnt);
    return ok;
}

/* One engine iteration: schedule, fake forward, commit, take tokens.
 * Returns the rows run (0 = nothing to do); *ok is cleared on a failed
 * check. */
static int iterate(cinfer_engine *e, int *ok)
{
    int rows = sched_schedule(e, 0);
    if (rows == 0)
        return 0;
    if (rows > e->max_rows || e->n_running > e->max_seqs)
        *ok = 0;
    cinfer_step st;
    sched_build_step(e, &st);
    if (st.n_rows != rows || !fake_forward(e, &st))
        *ok = 0;
    sched_commit(e);
    int n = e->n_sched;
    for (int k = 0; k < n; k++) {
        eng_seq *s = e->sched[k];
        if (s->step_out < 0)
            continue;
        if (s->n_draft)
            take_drafts(e, s);
        else
            take(e, s);
    }
    e->n_sched = 0;
    return rows;
}

/* ---------------------------------------------------------------------- */
/* scenarios                                                              */
/* ---------------------------------------------------------------------- */

static void fill(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

static void test_decodes_first_and_budget(void)
{
    cinfer_engine *e = fake_engine(64, 4, 8, 8, 0, 256);
    int32_t p[64];
    int ok = 1;
    fill(p, 64, 100);
    eng_request *a = fake_request(e, p, 3, 10, 1, 0, 1);
    eng_request *b = fake_request(e, p, 5, 10, 1, 0, 2);
    /* step 1: a (3 rows) + b (5 rows) = the budget of 8 */
    CHECK_EQ_INT(iterate(e, &ok), 8);
    CHECK_EQ_INT(e->n_running, 2);
    eng_request *c = fake_request(e, p, 40, 10, 1, 0, 3);
    /* step 2: two decodes first, then 6 rows of c's prompt */
    CHECK_EQ_INT(sched_schedule(e, 0), 8);
    CHECK_EQ_INT(e->n_sched, 3);
    CHECK(e->sched[0] == &a->seqs[0] && e->sched[0]->step_rows == 1);
    CHECK(e->sched[1] == &b->seqs[0] && e->sched[1]->step_rows == 1);
    CHECK(e->sched[2] == &c->seqs[0] && e->sched[2]->step_rows == 6);
    cinfer_step st;
    sched_build_step(e, &st);
    CHECK_EQ_INT(st.n_out, 2); /* c's chunk has no output row */
    CHECK_EQ_INT(st.out_rows[0], 0);
    CHECK_EQ_INT(st.out_rows[1], 1);
    CHECK(fake_forward(e, &st));
    /* run to the end */
    e->n_sched = 0;
    for (int i = 0; i < e->n_running; i++)
        e->running[i]->step_rows = 0;
    while (iterate(e, &ok))
        ;
    CHECK(ok);
    CHECK_EQ_INT(a->seqs[0].n_generated, 10);
    CHECK_EQ_INT(c->seqs[0].n_generated, 10);
    cinfer_kv_cache_stats ks;
    cinfer_kv_cache_get_stats(e->kv, &ks);
    CHECK_EQ_INT(ks.n_used, 0);
    fake_request_free(a);
    fake_request_free(b);
    fake_request_free(c);
    fake_engine_free(e);
}

/* The prefill floor: decodes of a large running set leave 2 rows of an
 * 8-row budget; with min_prefill 4 a newcomer's prompt gets 4. */
static void test_prefill_floor(void)
{
    int32_t p[64];
    fill(p, 64, 100);
    for (int floor = 0; floor <= 4; floor += 4) {
        cinfer_engine *e = fake_engine(64, 4, 8, 8, 0, 64);
        e->min_prefill = floor;
        e->max_rows = 8 + floor;
        eng_request *r[7];
        int ok = 1;
        for (int i = 0; i < 6; i++)
            r[i] = fake_request(e, p + i, 1, 20, 1, 0, (uint64_t)i + 1);
        CHECK_EQ_INT(iterate(e, &ok), 6); /* six 1-token prompts */
        r[6] = fake_request(e, p, 20, 4, 1, 0, 7);
        int rows = iterate(e, &ok);
        CHECK(ok);
        CHECK_EQ_INT(rows, 6 + (floor ? 4 : 2));
        CHECK_EQ_INT(r[6]->seqs[0].n_computed, floor ? 4 : 2);
        while (iterate(e, &ok))
            ;
        CHECK(ok);
        for (int i = 0; i < 7; i++) {
            CHECK_EQ_INT(r[i]->seqs[0].state, SEQ_FINISHED);
            fake_request_free(r[i]);
        }
        fake_engine_free(e);
    }
}

/* A step with no decode row takes max_prefill rows: a 40-token prompt
 * alone goes in chunks of 16, 16 and 8 where the budget is 8; once it
 * decodes, a newcomer's prompt gets what the 8-row budget leaves. */
static void test_idle_prefill(void)
{
    int32_t p[40];
    fill(p, 40, 100);
    cinfer_engine *e = fake_engine(64, 4, 8, 8, 0, 64);
    e->max_prefill = 16;
    e->max_rows = 16;
    int ok = 1;
    eng_request *a = fake_request(e, p, 40, 6, 1, 0, 1);
    CHECK_EQ_INT(iterate(e, &ok), 16);
    CHECK_EQ_INT(iterate(e, &ok), 16);
    CHECK_EQ_INT(iterate(e, &ok), 8);
    CHECK_EQ_INT(a->seqs[0].n_computed, 40);
    CHECK_EQ_INT(a->seqs[0].n_generated, 1);
    eng_request *b = fake_request(e, p, 30, 2, 1, 0, 2);
    CHECK_EQ_INT(iterate(e, &ok), 8); /* a's decode + 7 of b's prompt */
    CHECK_EQ_INT(b->seqs[0].n_computed, 7);
    while (iterate(e, &ok))
        ;
    CHECK(ok);
    CHECK_EQ_INT(a->seqs[0].state, SEQ_FINISHED);
    CHECK_EQ_INT(b->seqs[0].state, SEQ_FINISHED);
    CHECK_EQ_INT(a->seqs[0].n_generated, 6);
    fake_request_free(a);
    fake_request_free(b);
    fake_engine_free(e);
}

/* The step-time model: a line through varied step sizes, a proportional
 * guess from one size, nothing from nothing. */
static void test_step_model_fits_line(void)
{
    cinfer_engine *e = fake_engine(16, 4, 8, 64, 0, 64);
    int64_t step, row;
    sched_predict_step(e, 4, &step, &row);
    CHECK(step == 0 && row == 0);
    /* one size only: 8 rows take 9 ms */
    for (int i = 0; i < 20; i++)
        sched_observe_step(e, 8, 9000000);
    sched_predict_step(e, 4, &step, &row);
    CHECK(llabs(step - (int64_t)(4500000 * 1.15)) <= 2);
    /* 1 ms + 1 ms per row, sizes 1..8 */
    for (int i = 0; i < 400; i++)
        sched_observe_step(e, 1 + i % 8, 1000000 + (int64_t)(1 + i % 8) * 1000000);
    sched_predict_step(e, 4, &step, &row);
    CHECK(llabs(step - (int64_t)(5000000 * 1.15)) <= 2000);
    CHECK(llabs(row - (int64_t)(1000000 * 1.15)) <= 2000);
    /* a size beyond those seen extrapolates the line */
    sched_predict_step(e, 20, &step, &row);
    CHECK(llabs(step - (int64_t)(21000000 * 1.15)) <= 20000);
    fake_engine_free(e);
}

/* Admission keeps deadlines: a newcomer waits while its prefill and the
 * larger batch would make a running request miss its deadline, or make it
 * miss its own; a running request that misses anyway holds nobody back;
 * without deadlines nothing waits. Step model: 1 ms + 1 ms per row (times
 * the margin, 1.15). */
static void test_deadline_holds_admission(void)
{
    const int64_t ms = 1000000;
    int32_t p[8];
    fill(p, 8, 100);
    for (int sc = 0; sc < 5; sc++) {
        cinfer_engine *e = fake_engine(64, 4, 8, 64, 0, 64);
        for (int i = 0; i < 64; i++)
            sched_observe_step(e, 1 + i % 8, ms + (int64_t)(1 + i % 8) * ms);
        /* a: running, 10 tokens to go */
        eng_request *a = fake_request(e, p, 4, 11, 1, 0, 1);
        int ok = 1;
        CHECK_EQ_INT(iterate(e, &ok), 4); /* a's prefill, first token */
        CHECK_EQ_INT(e->n_running, 1);
        /* b: 4 prompt tokens, 10 to generate. Alone, a needs 10 steps of
         * 2.3 ms = 23 ms; with b: 4 x 1.15 ms of prefill + 10 x 3.45 ms
         * = 39.1 ms, and so does b. */
        eng_request *b = fake_request(e, p, 4, 10, 1, 0, 2);
        int64_t now = 1000 * ms;
        int admit = 1;
        switch (sc) {
        case 0: /* no deadlines */
            break;
        case 1: /* a can make 30 ms alone but not with b */
            a->deadline_ns = now + 30 * ms;
            admit = 0;
            break;
        case 2: /* a makes 45 ms either way */
            a->deadline_ns = now + 45 * ms;
            break;
        case 3: /* a misses 20 ms anyway: b is not held back */
            a->deadline_ns = now + 20 * ms;
            break;
        case 4: /* b itself cannot make 35 ms with a running */
            b->deadline_ns = now + 35 * ms;
            admit = 0;
            break;
        }
        sched_schedule(e, now);
        CHECK_EQ_INT(e->n_running, admit ? 2 : 1);
        CHECK_EQ_INT(b->seqs[0].state, admit ? SEQ_RUNNING : SEQ_WAITING);
        /* once a is gone, b runs whatever its deadline */
        e->n_sched = 0;
        for (int i = 0; i < e->n_running; i++)
            e->running[i]->step_rows = 0;
        finish(e, &a->seqs[0]);
        sched_schedule(e, now);
        CHECK_EQ_INT(b->seqs[0].state, SEQ_RUNNING);
        e->n_sched = 0;
        finish(e, &b->seqs[0]);
        fake_request_free(a);
        fake_request_free(b);
        fake_engine_free(e);
    }
}

/* When a newcomer would start: the running slots free up as their
 * sequences finish, the waiting ones take them in order. */
static void test_predicts_start(void)
{
    const int64_t ms = 1000000;
    int32_t p[8];
    fill(p, 8, 100);
    cinfer_engine *e = fake_engine(64, 4, 2, 64, 0, 64);
    int64_t start, step, row;
    CHECK_EQ_INT(sched_predict_start(e, 0, &start, &step, &row), 0);
    for (int i = 0; i < 64; i++)
        sched_observe_step(e, 1 + i % 8, ms + (int64_t)(1 + i % 8) * ms);
    /* nothing running: starts at once */
    CHECK_EQ_INT(sched_predict_start(e, 0, &start, &step, &row), 1);
    CHECK(start == 0);
    eng_request *a = fake_request(e, p, 4, 11, 1, 0, 1);
    eng_request *b = fake_request(e, p, 4, 6, 1, 0, 2);
    int ok = 1;
    CHECK_EQ_INT(iterate(e, &ok), 8); /* both prefilled, one token each */
    eng_request *c = fake_request(e, p, 4, 10, 1, 0, 3);
    /* 2 slots at 3.45 ms a step: a frees at 34.5 ms, b at 17.25 ms; c
     * takes b's until 17.25 + 4.6 + 34.5 ms; a newcomer gets a's */
    CHECK_EQ_INT(sched_predict_start(e, 0, &start, &step, &row), 1);
    CHECK(llabs(start - 34500000) < 1000);
    CHECK(llabs(step - 4600000) < 1000); /* a batch of 3 */
    CHECK(llabs(row - 1150000) < 1000);
    finish(e, &a->seqs[0]);
    finish(e, &b->seqs[0]);
    finish(e, &c->seqs[0]);
    fake_request_free(a);
    fake_request_free(b);
    fake_request_free(c);
    fake_engine_free(e);

    /* A free slot that a running request's deadline keeps a newcomer out
     * of: d (10 tokens to go) makes 30 ms at 2.3 ms a step alone, not at
     * 3.45 with one more; a newcomer starts when d ends, at 23 ms. */
    e = fake_engine(64, 4, 4, 64, 0, 64);
    for (int i = 0; i < 64; i++)
        sched_observe_step(e, 1 + i % 8, ms + (int64_t)(1 + i % 8) * ms);
    eng_request *d = fake_request(e, p, 4, 11, 1, 0, 1);
    CHECK_EQ_INT(iterate(e, &ok), 4);
    CHECK_EQ_INT(sched_predict_start(e, 0, &start, &step, &row), 1);
    CHECK(start == 0); /* no deadline: room */
    d->deadline_ns = 30 * ms;
    CHECK_EQ_INT(sched_predict_start(e, 0, &start, &step, &row), 1);
    CHECK(llabs(start - 23000000) < 1000);
    finish(e, &d->seqs[0]);
    fake_request_free(d);
    fake_engine_free(e);
}

static void test_preempts_newest(void)
{
    /* 6 blocks of 4: a (arrival 1) and b (arrival 2) of 8-token prompts
     * take 2 blocks each (+1 at the first decode), then run out */
    cinfer_engine *e = fake_engine(6, 4, 4, 64, 0, 64);
    int32_t p[16];
    fill(p, 16, 7);
    int ok = 1;
    eng_request *a = fake_request(e, p, 8, 12, 1, 0, 1);
    eng_request *b = fake_request(e, p + 1, 8, 12, 1, 0, 2);
    CHECK_EQ_INT(iterate(e, &ok), 16);
    CHECK_EQ_INT(e->n_running, 2);
    uint64_t pre = e->st.preemptions;
    /* decodes until the blocks run out: b (newest) goes back to waiting
     * with its generated tokens, a keeps running */
    while (e->st.preemptions == pre && iterate(e, &ok))
        ;
    CHECK_EQ_INT(e->st.preemptions, pre + 1);
    CHECK_EQ_INT(b->seqs[0].state, SEQ_WAITING);
    CHECK_EQ_INT(b->seqs[0].n_blocks, 0);
    CHECK(b->seqs[0].n_generated > 0);
    CHECK_EQ_INT(a->seqs[0].state, SEQ_RUNNING);
    CHECK(e->waiting[0] == &b->seqs[0]);
    while (iterate(e, &ok))
        ;
    CHECK(ok);
    CHECK_EQ_INT(a->seqs[0].n_generated, 12);
    CHECK_EQ_INT(b->seqs[0].n_generated, 12);
    fake_request_free(a);
    fake_request_free(b);
    fake_engine_free(e);

    /* by priority first: the later, higher priority request stays */
    e = fake_engine(6, 4, 4, 64, 0, 64);
    eng_request *lo = fake_request(e, p, 8, 12, 1, 0, 1);
    eng_request *hi = fake_request(e, p + 1, 8, 12, 1, 3, 2);
    CHECK_EQ_INT(iterate(e, &ok), 16);
    while (e->st.preemptions == 0 && iterate(e, &ok))
        ;
    CHECK_EQ_INT(lo->seqs[0].state, SEQ_WAITING);
    CHECK_EQ_INT(hi->seqs[0].state, SEQ_RUNNING);
    while (iterate(e, &ok))
        ;
    CHECK(ok);
    fake_request_free(lo);
    fake_request_free(hi);
    fake_engine_free(e);
}

static void test_prefix_reuse(void)
{
    cinfer_engine *e = fake_engine(32, 4, 4, 64, 1, 128);
    int32_t p[32];
    fill(p, 32, 50);
    int ok = 1;
    eng_request *a = fake_request(e, p, 18, 2, 1, 0, 1);
    while (iterate(e, &ok))
        ;
    CHECK_EQ_INT(a->seqs[0].cached_tokens, 0);
    /* same first 16 tokens, different after */
    int32_t q[32];
    memcpy(q, p, sizeof q);
    q[16] = 999;
    eng_request *b = fake_request(e, q, 20, 2, 1, 0, 2);
    sched_schedule(e, 0);
    CHECK_EQ_INT(b->seqs[0].cached_tokens, 16);
    CHECK_EQ_INT(b->seqs[0].step_rows, 4);
    cinfer_step st;
    sched_build_step(e, &st);
    CHECK(fake_forward(e, &st));
    sched_commit(e);
    e->n_sched = 0;
    finish(e, &b->seqs[0]);
    /* a prompt that is exactly 4 cached blocks: 3 reused, 4 computed */
    eng_request *c = fake_request(e, p, 16, 2, 1, 0, 3);
    sched_schedule(e, 0);
    CHECK_EQ_INT(c->seqs[0].cached_tokens, 12);
    CHECK_EQ_INT(c->seqs[0].step_rows, 4);
    sched_build_step(e, &st);
    CHECK(fake_forward(e, &st));
    sched_commit(e);
    e->n_sched = 0;
    finish(e, &c->seqs[0]);
    CHECK(ok);
    fake_request_free(a);
    fake_request_free(b);
    fake_request_free(c);
    fake_engine_free(e);
}

static void test_samples_share_prompt(void)
{
    cinfer_engine *e = fake_engine(32, 4, 8, 64, 0, 128);
    int32_t p[32];
    fill(p, 32, 3);
    int ok = 1;
    eng_request *r = fake_request(e, p, 10, 6, 3, 0, 1);
    /* step 1: only sample 0 prefills; the others wait for its blocks */
    CHECK_EQ_INT(iterate(e, &ok), 10);
    CHECK_EQ_INT(e->n_running, 1);
    /* step 2: sample 0 decodes, 1 and 2 share 2 blocks, compute 2 tokens */
    CHECK_EQ_INT(iterate(e, &ok), 1 + 2 + 2);
    CHECK_EQ_INT(r->seqs[1].cached_tokens, 8);
    CHECK_EQ_INT(cinfer_kv_cache_refcount(e->kv, r->seqs[0].blocks[0]), 3);
    CHECK_EQ_INT(cinfer_kv_cache_refcount(e->kv, r->seqs[0].blocks[2]), 1);
    CHECK(r->seqs[1].blocks[2] != r->seqs[0].blocks[2]);
    while (iterate(e, &ok))
        ;
    CHECK(ok);
    for (int k = 0; k < 3; k++)
        CHECK_EQ_INT(r->seqs[k].n_generated, 6);
    CHECK_EQ_INT(r->n_live, 0);
    fake_request_free(r);
    fake_engine_free(e);
}

/* Random workloads, checked after every step; every request completes and
 * its tokens equal those of a run with a big cache and budget. */
static void simulate(int n_blocks, int bs, int max_seqs, int budget,
                     int prefix, uint64_t seed, int n_req, int32_t **out,
                     int *n_out)
{
    cinfer_engine *e = fake_engine(n_blocks, bs, max_seqs, budget, prefix, 96);
    eng_request **reqs = calloc((size_t)n_req, sizeof *reqs);
    uint64_t rng = seed;
    int ok = 1, submitted = 0, steps = 0;
    int32_t prompt[96];
    uint64_t prng = 555; /* the workload is independent of the geometry */
    while (submitted < n_req || e->n_running || e->n_waiting) {
        /* a few arrivals per step */
        int arrivals = (int)(harness_rand(&rng) % 3);
        for (int a = 0; a < arrivals && submitted < n_req; a++) {
            int n = 1 + (int)(harness_rand(&prng) % 40);
            /* shared prefixes are common */
            int shared = (int)(harness_rand(&prng) % 3) * 8;
            for (int i = 0; i < n; i++)
                prompt[i] = i < shared ? (int32_t)i
                                       : (int32_t)(harness_rand(&prng) % 500);
            int gen = 1 + (int)(harness_rand(&prng) % 20);
            int ns = harness_rand(&prng) % 6 == 0 ? 2 : 1;
            int prio = (int)(harness_rand(&prng) % 2);
            reqs[submitted] = fake_request(e, prompt, n, gen, ns, prio,
                                           (uint64_t)submitted + 1);
            submitted++;
        }
        iterate(e, &ok);
        steps++;
        if (!refs_consistent(e, reqs, submitted, n_blocks)) {
            fprintf(stderr, "inconsistent references at step %d\n", steps);
            ok = 0;
        }
        if (!ok || steps > 200000)
            break;
    }
    CHECK(ok);
    CHECK(steps <= 200000);
    *n_out = 0;
    for (int i = 0; i < submitted; i++) {
        for (int k = 0; k < reqs[i]->n_samples; k++) {
            const eng_seq *s = &reqs[i]->seqs[k];
            CHECK_EQ_INT(s->state, SEQ_FINISHED);
            for (int32_t t = reqs[i]->n_prompt; t < s->n_tokens; t++)
                (*out)[(*n_out)++] = s->tokens[t];
            (*out)[(*n_out)++] = -1;
        }
        fake_request_free(reqs[i]);
    }
    cinfer_kv_cache_stats ks;
    cinfer_kv_cache_get_stats(e->kv, &ks);
    CHECK_EQ_INT(ks.n_used, 0);
    fprintf(stderr, "  %4d blocks of %d, %2d seqs, budget %3d, prefix %d, "
            "k %d: %5d steps, %4llu preemptions, %5llu cached tokens, "
            "%llu of %llu drafts taken\n",
            n_blocks, bs, max_seqs, budget, prefix, e->spec_k, steps,
            (unsigned long long)e->st.preemptions,
            (unsigned long long)e->st.cached_tokens,
            (unsigned long long)e->st.spec_accepted,
            (unsigned long long)e->st.spec_drafted);
    if (e->spec_k)
        CHECK(e->st.spec_accepted > 0 &&
              e->st.spec_accepted < e->st.spec_drafted);
    if (n_blocks < 40)
        CHECK(e->st.preemptions > 0);
    free(reqs);
    fake_engine_free(e);
}

static void test_random_simulation(void)
{
    enum { NREQ = 400 };
    int32_t *ref = malloc(sizeof(int32_t) * NREQ * 200);
    int32_t *got = malloc(sizeof(int32_t) * NREQ * 200);
    int n_ref = 0, n_got = 0;
    simulate(4096, 4, 64, 512, 0, 1, NREQ, &ref, &n_ref);
    struct {
        int n_blocks, bs, max_seqs, budget, prefix;
    } cfg[] = {
        {30, 4, 16, 64, 0}, {30, 4, 16, 64, 1}, {25, 4, 6, 7, 1},
        {12, 8, 4, 16, 0},  {200, 4, 32, 128, 1},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        simulate(cfg[c].n_blocks, cfg[c].bs, cfg[c].max_seqs, cfg[c].budget,
                 cfg[c].prefix, 10 + c, NREQ, &got, &n_got);
        CHECK_EQ_INT(n_got, n_ref);
        CHECK(memcmp(got, ref, sizeof(int32_t) * (size_t)n_ref) == 0);
    }
    free(ref);
    free(got);
}

/* The same workloads with drafts: every row reads exactly its sequence's
 * tokens (the K/V of rejected drafts is never read, and blocks registered
 * in the prefix cache hold verified tokens only), references stay
 * consistent, and the tokens equal the run without drafts. spec_max_seqs
 * 64: drafts also while many run, where the budget and free blocks run
 * short. */
static void test_random_simulation_drafts(void)
{
    enum { NREQ = 400 };
    int32_t *ref = malloc(sizeof(int32_t) * NREQ * 200);
    int32_t *got = malloc(sizeof(int32_t) * NREQ * 200);
    int n_ref = 0, n_got = 0;
    simulate(4096, 4, 64, 512, 0, 1, NREQ, &ref, &n_ref);
    struct {
        int n_blocks, bs, max_seqs, budget, prefix, k, spec_seqs;
    } cfg[] = {
        {4096, 4, 64, 512, 1, 4, 64}, {30, 4, 16, 64, 0, 4, 64},
        {30, 4, 16, 64, 1, 8, 64},    {25, 4, 6, 7, 1, 3, 4},
        {12, 8, 4, 16, 0, 8, 4},      {200, 4, 32, 128, 1, 6, 8},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sim_spec_k = cfg[c].k;
        sim_spec_max_seqs = cfg[c].spec_seqs;
        simulate(cfg[c].n_blocks, cfg[c].bs, cfg[c].max_seqs, cfg[c].budget,
                 cfg[c].prefix, 20 + c, NREQ, &got, &n_got);
        CHECK_EQ_INT(n_got, n_ref);
        CHECK(memcmp(got, ref, sizeof(int32_t) * (size_t)n_ref) == 0);
    }
    sim_spec_k = 0;
    sim_spec_max_seqs = 4;
    free(ref);
    free(got);
}

int main(void)
{
    RUN(test_decodes_first_and_budget);
    RUN(test_prefill_floor);
    RUN(test_idle_prefill);
    RUN(test_step_model_fits_line);
    RUN(test_deadline_holds_admission);
    RUN(test_predicts_start);
    RUN(test_preempts_newest);
    RUN(test_prefix_reuse);
    RUN(test_samples_share_prompt);
    RUN(test_random_simulation);
    RUN(test_random_simulation_drafts);
    return harness_done();
}
