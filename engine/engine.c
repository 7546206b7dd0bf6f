/*
 * engine.c - the serving engine: request queue, engine thread, sampling,
 * stop conditions and events (the public API of engine.h).
 *
 * Submitters (any thread) validate and build a request, then append it to
 * the `incoming` list under the mutex and signal the engine thread. The
 * engine thread loops:
 *
 *   1. take the incoming requests and the cancel list (under the mutex);
 *   2. finish cancelled requests and those whose deadline passed;
 *   3. schedule one step (scheduler.c) and run the model on it;
 *   4. sample every sequence whose last row came out, check EOS, stop ids,
 *      stop strings, max_tokens and the context end, and emit events; a
 *      sequence that carried drafts (speculative decoding, scheduler.c)
 *      samples its rows in order and takes the drafts the samples agree
 *      with, then drops the K/V of the rest;
 *   5. publish the stats snapshot.
 *
 * It sleeps on the condition variable only when nothing is queued or
 * running. Events are delivered on the engine thread with no lock held.
 *
 * Determinism: a request's tokens depend only on its own inputs. The CPU
 * kernels are batch-invariant (a row's result does not depend on the other
 * rows of the step), every sample has its own seeded sampler, and a
 * preempted sequence keeps its sampler and text state and recomputes its
 * K/V bit for bit, so batching, chunking and preemption change timing only.
 * Speculation too: a draft row computes what that position's decode row
 * would, and the sampler's draws are keyed by (seed, position).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/thread_priority.h"
#include "engine_impl.h"

#define MAX_SAMPLES 256

const char *cinfer_finish_reason_name(cinfer_finish_reason r)
{
    switch (r) {
    case CINFER_FINISH_NONE: return "NONE";
    case CINFER_FINISH_LENGTH: return "LENGTH";
    case CINFER_FINISH_EOS: return "EOS";
    case CINFER_FINISH_STOP_SEQUENCE: return "STOP_SEQUENCE";
    case CINFER_FINISH_STOP_TOKEN: return "STOP_TOKEN";
    case CINFER_FINISH_CANCELLED: return "CANCELLED";
    case CINFER_FINISH_TIME_LIMIT: return "TIME_LIMIT";
    case CINFER_FINISH_ERROR: return "ERROR";
    }
    return "UNKNOWN";
}

cinfer_engine_params cinfer_engine_default_params(void)
{
    cinfer_engine_params p;
    memset(&p, 0, sizeof p);
    return p;
}

cinfer_request_params cinfer_request_default_params(void)
{
    cinfer_request_params p;
    memset(&p, 0, sizeof p);
    p.sampling = cinfer_sampler_default_params();
    p.max_tokens = 16;
    p.n_samples = 1;
    return p;
}

static int64_t now(const cinfer_engine *e)
{
    if (e->now_ns)
        return e->now_ns(e->now_user);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------------- */
/* requests                                                               */
/* ---------------------------------------------------------------------- */

static void request_free(eng_request *r)
{
    if (!r)
        return;
    if (r->seqs) {
        for (int k = 0; k < r->n_samples; k++) {
            eng_seq *s = &r->seqs[k];
            free(s->tokens);
            free(s->blocks);
            free(s->hashes);
            free(s->sblocks);
            cinfer_sampler_destroy(s->sampler);
            cinfer_textstream_destroy(s->text);
            cinfer_grammar_state_destroy(s->grammar);
            free(s->allowed);
        }
    }
    free(r->seqs);
    free(r->prompt);
    free(r->embeds);
    free(r->stop_ids);
    free(r);
}

/* The prompt embeddings of p: their count, their values, the model. */
static cinfer_status validate_embeds(const cinfer_engine *e,
                                     const cinfer_request_params *p)
{
    if (!p->n_prompt_embeds)
        return CINFER_OK;
    if (!p->prompt_embeds)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "prompt_embeds is NULL with n_prompt_embeds "
                                "%zu",
                                p->n_prompt_embeds);
    if (!cinfer_model_input_embeds(e->model))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "prompt embeddings are not taken by a model "
                                "whose ranks span several processes");
    size_t n = p->n_prompt_embeds * (size_t)e->info->n_embd;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p->prompt_embeds[i]))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "prompt_embeds[%zu] is not finite", i);
    return CINFER_OK;
}

static cinfer_status validate(const cinfer_engine *e,
                              const cinfer_request_params *p)
{
    const size_t cap = (size_t)e->ctx_cap;
    if ((p->n_prompt && !p->prompt) || p->n_prompt + p->n_prompt_embeds < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "prompt is empty (n_prompt + n_prompt_embeds "
                                "must be >= 1)");
    if (p->n_prompt > cap && !p->n_prompt_embeds)
        return cinfer_set_error(CINFER_E_RANGE,
                                "prompt has %zu tokens; the context holds %d",
                                p->n_prompt, e->ctx_cap);
    if (p->n_prompt > cap || p->n_prompt_embeds > cap ||
        p->n_prompt + p->n_prompt_embeds > cap)
        return cinfer_set_error(CINFER_E_RANGE,
                                "prompt has %zu tokens and %zu embedding "
                                "rows; the context holds %d",
                                p->n_prompt, p->n_prompt_embeds, e->ctx_cap);
    cinfer_status st = validate_embeds(e, p);
    if (st != CINFER_OK)
        return st;
    for (size_t i = 0; i < p->n_prompt; i++) {
        if (p->prompt[i] < 0 || p->prompt[i] >= e->n_vocab)
            return cinfer_set_error(CINFER_E_RANGE,
                                    "prompt[%zu] = %d is outside the "
                                    "vocabulary (0..%d)",
                                    i, p->prompt[i], e->n_vocab - 1);
    }
    if (p->max_tokens < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "max_tokens must be >= 1 (got %d)",
                                p->max_tokens);
    if (p->min_tokens < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "min_tokens must be >= 0 (got %d)",
                                p->min_tokens);
    if (p->n_samples < 0 || p->n_samples > MAX_SAMPLES)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "n_samples must be in 0..%d (got %d)",
                                MAX_SAMPLES, p->n_samples);
    if (p->n_stop && !p->stop)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stop is NULL with n_stop %zu", p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "stop[%zu] is empty", i);
    }
    if (p->n_stop_ids && !p->stop_ids)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stop_ids is NULL with n_stop_ids %zu",
                                p->n_stop_ids);
    for (size_t i = 0; i < p->n_stop_ids; i++) {
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= e->n_vocab)
            return cinfer_set_error(CINFER_E_RANGE,
                                    "stop_ids[%zu] = %d is outside the "
                                    "vocabulary (0..%d)",
                                    i, p->stop_ids[i], e->n_vocab - 1);
    }
    if (!p->on_event)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "on_event is NULL");
    return CINFER_OK;
}

/* Builds a request with its samples (samplers and text streams included);
 * nothing is shared with the engine yet. */
static cinfer_status request_build(cinfer_engine *e,
                                   const cinfer_request_params *p,
                                   eng_request **out)
{
    cinfer_status st;
    int32_t *eog = NULL;
    *out = NULL;
    eng_request *r = calloc(1, sizeof *r);
    if (!r)
        goto fail_nomem;
    r->priority = p->priority;
    r->deadline_ns = p->deadline_ns;
    r->n_embeds = (int32_t)p->n_prompt_embeds;
    r->n_prompt = r->n_embeds + (int32_t)p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->min_tokens = p->min_tokens > p->sampling.min_tokens
                        ? p->min_tokens
                        : p->sampling.min_tokens;
    r->ignore_eos = p->ignore_eos ? 1 : 0;
    r->logprobs = p->logprobs ? 1 : 0;
    r->n_top = p->logprobs ? p->sampling.n_logprobs : 0;
    r->n_samples = p->n_samples ? p->n_samples : 1;
    r->on_event = p->on_event;
    r->user = p->user;
    r->prompt = malloc(sizeof *r->prompt * (size_t)r->n_prompt);
    if (!r->prompt)
        goto fail_nomem;
    /* an embedding row's position holds token 0: valid wherever a step
     * checks ids, and never read for its embedding (cinfer_step.row_embd) */
    memset(r->prompt, 0, sizeof *r->prompt * (size_t)r->n_embeds);
    if (p->n_prompt)
        memcpy(r->prompt + r->n_embeds, p->prompt,
               sizeof *r->prompt * p->n_prompt);
    if (r->n_embeds) {
        size_t n = (size_t)r->n_embeds * (size_t)e->info->n_embd;
        r->embeds = malloc(sizeof *r->embeds * n);
        if (!r->embeds)
            goto fail_nomem;
        memcpy(r->embeds, p->prompt_embeds, sizeof *r->embeds * n);
    }
    if (p->n_stop_ids) {
        r->stop_ids = malloc(sizeof *r->stop_ids * p->n_stop_ids);
        if (!r->stop_ids)
            goto fail_nomem;
        memcpy(r->stop_ids, p->stop_ids, sizeof *r->stop_ids * p->n_stop_ids);
        r->n_stop_ids = p->n_stop_ids;
    }

    /* Tokens masked while min_tokens is not reached: what would end the
     * sample (EOS unless ignored, and the stop ids). */
    size_t n_eog = (r->ignore_eos ? 0 : e->n_eog) + r->n_stop_ids;
    if (n_eog) {
        eog = malloc(sizeof *eog * n_eog);
        if (!eog)
            goto fail_nomem;
        size_t k = 0;
        if (!r->ignore_eos)
            for (size_t i = 0; i < e->n_eog; i++)
                eog[k++] = e->eog[i];
        for (size_t i = 0; i < r->n_stop_ids; i++)
            eog[k++] = r->stop_ids[i];
    }
    cinfer_sampler_params sp = p->sampling;
    sp.n_vocab = e->n_vocab;
    sp.min_tokens = r->min_tokens;
    sp.eog_tokens = eog;
    sp.n_eog_tokens = (int32_t)n_eog;

    /* Prompt plus output fit the context; a prompt that fills it still
     * gets the one token its last row predicts. */
    int32_t cap = r->n_prompt + r->max_tokens;
    if (r->max_tokens > e->ctx_cap || cap > e->ctx_cap)
        cap = e->ctx_cap;
    if (cap <= r->n_prompt)
        cap = r->n_prompt + 1;
    r->seqs = calloc((size_t)r->n_samples, sizeof *r->seqs);
    if (!r->seqs)
        goto fail_nomem;
    for (int k = 0; k < r->n_samples; k++) {
        eng_seq *s = &r->seqs[k];
        s->req = r;
        s->index = k;
        s->cap = cap;
        s->step_out = -1;
        s->tokens = malloc(sizeof *s->tokens * (size_t)cap);
        s->blocks = malloc(sizeof *s->blocks * (size_t)e->max_blocks);
        if (e->prefix_cache)
            s->hashes = malloc(sizeof *s->hashes * (size_t)e->max_blocks);
        if (e->skv)
            s->sblocks = malloc(sizeof *s->sblocks * (size_t)e->max_blocks);
        if (!s->tokens || !s->blocks || (e->prefix_cache && !s->hashes) ||
            (e->skv && !s->sblocks))
            goto fail_nomem;
        memcpy(s->tokens, r->prompt, sizeof *s->tokens * (size_t)r->n_prompt);
        s->n_tokens = r->n_prompt;
        sp.seed = p->sampling.seed + (uint64_t)k;
        if ((st = cinfer_sampler_create(&sp, &s->sampler)) != CINFER_OK)
            goto fail;
        if ((st = cinfer_sampler_accept_prompt(
                 s->sampler, r->prompt + r->n_embeds,
                 r->n_prompt - r->n_embeds)) != CINFER_OK)
            goto fail;
        cinfer_textstream_params tp = cinfer_textstream_default_params();
        tp.tokenizer = e->tk;
        tp.stop = p->stop;
        tp.n_stop = p->n_stop;
        if ((st = cinfer_textstream_create(&tp, &s->text)) != CINFER_OK)
            goto fail;
        if (p->grammar) {
            if ((st = cinfer_grammar_state_create(p->grammar, &s->grammar)) !=
                CINFER_OK)
                goto fail;
            s->allowed = malloc((size_t)e->info->n_vocab);
            if (!s->allowed)
                goto fail_nomem;
        }
    }
    free(eog);
    *out = r;
    return CINFER_OK;

fail_nomem:
    st = cinfer_set_error(CINFER_E_NOMEM, "engine: out of memory");
fail:
    free(eog);
    request_free(r);
    return st;
}

/* ---------------------------------------------------------------------- */
/* events and finishing                                                   */
/* ---------------------------------------------------------------------- */

static void emit_text(eng_seq *s, const int32_t *ids, size_t n_ids,
                      const char *text, size_t len, const float *lp,
                      const cinfer_token_logprob *top, int n_top)
{
    eng_request *r = s->req;
    cinfer_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = CINFER_EVENT_TOKENS;
    ev.request_id = r->id;
    ev.sample_index = s->index;
    ev.ids = ids;
    ev.n_ids = n_ids;
    ev.text = text;
    ev.text_len = len;
    ev.logprobs = lp;
    ev.top = top;
    ev.n_top = top ? n_top : 0;
    ev.message = "";
    ev.queue_ns = s->admitted ? s->first_sched_ns - r->submit_ns : 0;
    r->on_event(r->user, &ev);
}

static void publish(cinfer_engine *e);

static void live_remove(cinfer_engine *e, eng_request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        e->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->next = r->prev = NULL;
}

/* Ends one sample: frees its blocks, takes it off its queue, releases the
 * withheld text (unless a stop string cut it), sends FINISH, and frees the
 * request after its last sample. */
static void finish_seq(cinfer_engine *e, eng_seq *s, cinfer_finish_reason why,
                       cinfer_status status, const char *message,
                       int64_t t_ns)
{
    eng_request *r = s->req;
    if (s->state == SEQ_RUNNING)
        sched_running_remove(e, s);
    else if (s->state == SEQ_WAITING)
        sched_waiting_remove(e, s);
    sched_release_blocks(e, s);
    s->state = SEQ_FINISHED;

    if (why != CINFER_FINISH_STOP_SEQUENCE && why != CINFER_FINISH_ERROR) {
        const char *text;
        size_t len;
        if (cinfer_textstream_finish(s->text, &text, &len) == CINFER_OK &&
            len)
            emit_text(s, NULL, 0, text, len, NULL, NULL, 0);
    }

    int last = --r->n_live == 0;
    if (last) {
        e->st.requests_finished++;
        if (r->cancelled)
            e->st.requests_cancelled++;
    }
    /* Stats first: whoever reacts to the FINISH event sees them. */
    publish(e);

    cinfer_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = CINFER_EVENT_FINISH;
    ev.request_id = r->id;
    ev.sample_index = s->index;
    ev.finish = why;
    ev.status = status;
    ev.message = message ? message : "";
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = s->n_generated;
    ev.cached_tokens = s->cached_tokens;
    ev.queue_ns = (s->admitted ? s->first_sched_ns : t_ns) - r->submit_ns;
    ev.ttft_ns = s->n_generated ? s->first_token_ns - r->submit_ns : 0;
    ev.total_ns = t_ns - r->submit_ns;
    r->on_event(r->user, &ev);

    if (last) {
        live_remove(e, r);
        request_free(r);
    }
}

/* Finishes every unfinished sample of r (r is freed with the last one). */
static void finish_request(cinfer_engine *e, eng_request *r,
                           cinfer_finish_reason why, cinfer_status status,
                           const char *message, int64_t t_ns)
{
    int n = r->n_samples;
    for (int k = 0; k < n; k++) {
        if (r->seqs[k].state == SEQ_FINISHED)
            continue;
        int last = r->n_live == 1;
        finish_seq(e, &r->seqs[k], why, status, message, t_ns);
        if (last)
            return;
    }
}

static int is_stop_id(const eng_request *r, int32_t tok)
{
    for (size_t i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok)
            return 1;
    return 0;
}

/* The engine's token bytes for grammar masks, made once. */
static cinfer_status grammar_vocab(cinfer_engine *e)
{
    if (e->gvocab)
        return CINFER_OK;
    int32_t V = e->info->n_vocab;
    uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
    int32_t *eog = malloc((size_t)V * sizeof *eog);
    size_t used = 0, cap = (size_t)V * 8 + 64;
    char *bytes = malloc(cap);
    cinfer_status st = CINFER_OK;
    int32_t n_eog = 0;
    if (!off || !eog || !bytes)
        st = cinfer_set_error(CINFER_E_NOMEM, "engine: out of memory");
    for (int32_t t = 0; st == CINFER_OK && t < V; t++) {
        const char *b;
        size_t l;
        if ((st = cinfer_tokenizer_token_piece(e->tk, t, &b, &l)) != CINFER_OK)
            break;
        if (cinfer_tokenizer_is_eog(e->tk, t)) {
            eog[n_eog++] = t;
            l = 0; /* ends the output; never part of its text */
        }
        if (used + l > cap) {
            char *nb = realloc(bytes, 2 * (used + l));
            if (!nb) {
                st = cinfer_set_error(CINFER_E_NOMEM, "engine: out of memory");
                break;
            }
            bytes = nb;
            cap = 2 * (used + l);
        }
        memcpy(bytes + used, b, l);
        off[t] = (uint32_t)used;
        used += l;
    }
    if (st == CINFER_OK) {
        off[V] = (uint32_t)used;
        st = cinfer_grammar_vocab_create(bytes, off, V, &e->gvocab);
    }
    free(bytes);
    free(off);
    if (st != CINFER_OK) {
        free(eog);
        return st;
    }
    e->eog_ids = eog;
    e->n_eog_ids = n_eog;
    return CINFER_OK;
}

/* The grammar's mask for s's next token, handed to its sampler: what the
 * grammar allows, and the end-of-generation tokens where the output is
 * complete and min_tokens is reached (before it the sampler bans them). 0,
 * or the number of tokens allowed. */
static int64_t grammar_mask(cinfer_engine *e, eng_seq *s, cinfer_status *st)
{
    *st = grammar_vocab(e);
    if (*st != CINFER_OK)
        return 0;
    int64_t n = cinfer_grammar_mask(s->grammar, e->gvocab, s->allowed);
    if (n < 0) {
        *st = CINFER_E_RANGE;
        return 0;
    }
    if (cinfer_grammar_complete(s->grammar) &&
        s->n_generated >= s->req->min_tokens)
        for (int32_t i = 0; i < e->n_eog_ids; i++) {
            n += !s->allowed[e->eog_ids[i]];
            s->allowed[e->eog_ids[i]] = 1;
        }
    cinfer_sampler_set_allowed(s->sampler, s->allowed);
    return n;
}

/* Samples the next token of s from its logits row (or, row NULL, takes
 * the code of the token the backend chose, run_step) and decides whether the
 * sample ends. Returns 1 if it ended (s may be freed then), else 0. */
static int take_token(cinfer_engine *e, eng_seq *s, float *row, int32_t code,
                      const cinfer_row_logprobs *rl, int64_t t_ns)
{
    eng_request *r = s->req;
    cinfer_logprobs lp;
    int32_t tok = -1;
    cinfer_status st = CINFER_OK;
    if (row && s->grammar && grammar_mask(e, s, &st) == 0) {
        if (st == CINFER_OK) {
            finish_seq(e, s, CINFER_FINISH_ERROR, CINFER_E_UNSUPPORTED,
                       "grammar: no token of the vocabulary can continue "
                       "the output",
                       t_ns);
            return 1;
        }
        snprintf(e->errbuf, sizeof e->errbuf, "%s", cinfer_last_error());
        finish_seq(e, s, CINFER_FINISH_ERROR, st, e->errbuf, t_ns);
        return 1;
    }
    if (row)
        st = cinfer_sampler_sample(s->sampler, row, &tok,
                                   r->logprobs ? &lp : NULL);
    else
        st = cinfer_sampler_take_code(s->sampler, code, &tok);
    if (st == CINFER_OK && !row && r->logprobs)
        st = cinfer_sampler_take_logprobs(s->sampler, rl, tok, &lp);
    if (st == CINFER_OK)
        st = cinfer_sampler_accept(s->sampler, tok);
    if (st == CINFER_OK && s->grammar && !cinfer_tokenizer_is_eog(e->tk, tok)) {
        const char *b;
        size_t l;
        st = cinfer_tokenizer_token_piece(e->tk, tok, &b, &l);
        if (st == CINFER_OK)
            st = cinfer_grammar_accept(s->grammar, b, l);
    }
    if (st != CINFER_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "%s", cinfer_last_error());
        finish_seq(e, s, CINFER_FINISH_ERROR, st, e->errbuf, t_ns);
        return 1;
    }
    CINFER_ASSERT(s->n_tokens < s->cap);
    s->tokens[s->n_tokens++] = tok;
    s->n_generated++;
    e->st.generated_tokens++;
    if (s->n_generated == 1)
        s->first_token_ns = t_ns;

    cinfer_finish_reason why = CINFER_FINISH_NONE;
    int eligible = s->n_generated >= r->min_tokens;
    int last = s->n_generated >= r->max_tokens || s->n_tokens >= s->cap;
    const char *text = "";
    size_t len = 0;
    /* with a grammar, end-of-generation is allowed only where the output
     * is complete, and then it ends it whatever ignore_eos says */
    if (eligible && (!r->ignore_eos || s->grammar) &&
        cinfer_tokenizer_is_eog(e->tk, tok))
        why = CINFER_FINISH_EOS;
    else if (eligible && is_stop_id(r, tok))
        why = CINFER_FINISH_STOP_TOKEN;
    if (why != CINFER_FINISH_NONE) {
        /* the ending token adds no text; withheld text comes out with it */
        if (cinfer_textstream_finish(s->text, &text, &len) != CINFER_OK)
            len = 0;
    } else {
        int stopped = 0;
        st = cinfer_textstream_push(s->text, tok, eligible, last, &text, &len,
                                    &stopped);
        if (st != CINFER_OK) {
            snprintf(e->errbuf, sizeof e->errbuf, "%s", cinfer_last_error());
            finish_seq(e, s, CINFER_FINISH_ERROR, st, e->errbuf, t_ns);
            return 1;
        }
        if (stopped)
            why = CINFER_FINISH_STOP_SEQUENCE;
        else if (last)
            why = CINFER_FINISH_LENGTH;
    }

    float logprob = 0.0f;
    cinfer_token_logprob top[CINFER_SAMPLER_MAX_LOGPROBS];
    int n_top = 0;
    if (r->logprobs) {
        logprob = lp.logprob;
        n_top = lp.n_top < r->n_top ? lp.n_top : r->n_top;
        for (int i = 0; i < n_top; i++) {
            top[i].id = lp.top_tokens[i];
            top[i].logprob = lp.top_logprobs[i];
        }
    }
    emit_text(s, &tok, 1, text, len, r->logprobs ? &logprob : NULL,
              n_top ? top : NULL, n_top);
    if (why == CINFER_FINISH_NONE)
        return 0;
    finish_seq(e, s, why, CINFER_OK, "", t_ns);
    return 1;
}

/* Verifies the drafts of s: row i of its logits (from `rows`) follows the
 * last token and drafts 0..i-1, so it is sampled exactly as one-by-one
 * decoding would sample that position once they were taken (the sampler
 * and the grammar state have advanced over them, and the draw is keyed by
 * the position). Drafts are taken while they equal the samples; the first
 * sample that differs, or the one after the last draft, is the next token.
 * Stop conditions apply token by token, as without drafts. */
static void take_drafts(cinfer_engine *e, eng_seq *s, float *rows,
                        int64_t t_ns)
{
    int32_t drafts[CINFER_ENGINE_SPEC_MAX_K];
    const int32_t d = s->n_draft, base = s->n_tokens;
    memcpy(drafts, s->tokens + base, sizeof *drafts * (size_t)d);
    s->n_draft = 0;
    e->st.spec_drafted += (uint64_t)d;
    e->st.spec_steps++;
    int32_t taken = 0;
    for (int32_t i = 0; i <= d; i++) {
        if (take_token(e, s, rows + (size_t)i * (size_t)e->n_vocab, 0, NULL,
                       t_ns))
            return; /* finished: its blocks are gone with it */
        if (i == d || s->tokens[base + i] != drafts[i])
            break;
        e->st.spec_accepted++;
        taken++;
    }
    /* Rows of rejected drafts are compute spent for nothing: after a
     * rejection draft only as far as this step's drafts agreed (plus one),
     * after a full acceptance twice as far. */
    s->spec_len = taken < d ? taken + 1 : 2 * d;
    sched_spec_rollback(e, s);
}


/* ---------------------------------------------------------------------- */
/* the engine thread                                                      */
/* ---------------------------------------------------------------------- */

static void publish(cinfer_engine *e)
{
    cinfer_kv_cache_stats ks;
    cinfer_kv_cache_get_stats(e->kv, &ks);
    int64_t start, step, row, at = now(e);
    int ready = sched_predict_start(e, at, &start, &step, &row);
    int64_t prefill = 0;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->n_tokens - e->running[i]->n_computed > 1)
            prefill += e->running[i]->n_tokens - e->running[i]->n_computed;
    for (int i = 0; i < e->n_waiting; i++)
        prefill += e->waiting[i]->n_tokens - e->waiting[i]->n_computed;
    pthread_mutex_lock(&e->mu);
    e->pred_prefill_rows = prefill;
    e->pred_ready = ready;
    e->pred_at_ns = at;
    e->pred_start_ns = start;
    e->pred_step_ns = step;
    e->pred_row_ns = row;
    e->pub = e->st;
    e->pub.running = e->n_running;
    e->pub.waiting = e->n_waiting;
    e->pub.kv_blocks_total = ks.n_blocks;
    e->pub.kv_blocks_used = ks.n_used;
    e->pub.kv_blocks_cached = ks.n_cached;
    if (e->skv) {
        cinfer_kv_cache_get_stats(e->skv, &ks);
        e->pub.kv_swa_blocks_total = ks.n_blocks;
        e->pub.kv_swa_blocks_used = ks.n_used;
        e->pub.kv_swa_blocks_cached = ks.n_cached;
    }
    pthread_mutex_unlock(&e->mu);
}

static eng_request *find_live(cinfer_engine *e, uint64_t id)
{
    for (eng_request *r = e->live; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* Moves newly submitted requests into the waiting queue. The queue's array
 * is kept large enough for every unfinished sample, so that preemption
 * never needs memory. */
static void take_incoming(cinfer_engine *e, eng_request *list, int64_t t_ns)
{
    while (list) {
        eng_request *r = list;
        list = r->next;
        r->next = e->live;
        r->prev = NULL;
        if (e->live)
            e->live->prev = r;
        e->live = r;
        int need = e->n_waiting + e->n_running + r->n_samples;
        if (need > e->cap_waiting) {
            int cap = e->cap_waiting ? e->cap_waiting : 64;
            while (cap < need)
                cap *= 2;
            eng_seq **nw = realloc(e->waiting, sizeof *nw * (size_t)cap);
            if (!nw) {
                finish_request(e, r, CINFER_FINISH_ERROR, CINFER_E_NOMEM,
                               "engine: out of memory", t_ns);
                continue;
            }
            e->waiting = nw;
            e->cap_waiting = cap;
        }
        for (int k = 0; k < r->n_samples; k++) {
            cinfer_status st = sched_waiting_insert(e, &r->seqs[k]);
            CINFER_ASSERT(st == CINFER_OK);
        }
    }
}

static void drop_expired(cinfer_engine *e, int64_t t_ns)
{
    eng_request *r = e->live;
    while (r) {
        eng_request *next = r->next;
        if (r->deadline_ns && t_ns >= r->deadline_ns)
            finish_request(e, r, CINFER_FINISH_TIME_LIMIT, CINFER_OK, "", t_ns);
        r = next;
    }
}

/* The samplers' stages 1-3 for the step's rows into e->edits (grown to
 * `bound` entries). 0 if there is no room: the logits come back then. */
static int step_edits(cinfer_engine *e, int64_t bound)
{
    e->n_edits = 0;
    if (bound > CINFER_EDIT_MAX)
        return 0;
    if (bound > e->edits_cap) {
        int64_t cap = bound + bound / 2;
        void *p = realloc(e->edits, sizeof(cinfer_logit_edit) * (size_t)cap);
        if (!p)
            return 0;
        e->edits = p;
        e->edits_cap = cap;
    }
    for (int k = 0; k < e->n_sched; k++) {
        const eng_seq *s = e->sched[k];
        if (s->step_out < 0)
            continue;
        int64_t n = cinfer_sampler_edits(s->sampler, s->step_out,
                                         e->edits + e->n_edits);
        CINFER_ASSERT(n >= 0); /* backend_choice, checked by the caller */
        e->n_edits += n;
    }
    return 1;
}

/* Whether the backend chooses the step's tokens where the logits are, so
 * that only they come back: every row that gives a token is plain greedy,
 * or (where the backend draws too) a draw (top_k at most
 * CINFER_CHOOSE_MAX_K), and (where the backend edits rows) its logit_bias,
 * min_tokens mask and penalties applied there (engine/sampler.h,
 * cinfer_sampler_backend_choice), with logprobs where the backend finds
 * them; no drafts or grammar. 0: no, the logits come back; 1: every row greedy; 2: with
 * draws, filled in e->draws (their draw index advanced). Edits, if any,
 * are in e->edits; e->with_logprobs says whether e->n_top asks for
 * logprobs. */
static int step_choice(cinfer_engine *e, int32_t n_out)
{
    e->n_edits = 0;
    e->with_logprobs = 0;
    int have = cinfer_model_choices(e->model);
    if (have == 0)
        return 0;
    int sampled = 0;
    int64_t bound = 0;
    for (int k = 0; k < e->n_sched; k++) {
        const eng_seq *s = e->sched[k];
        if (s->step_out < 0)
            continue;
        if (s->n_draft || s->grammar)
            return 0;
        if (s->req->logprobs) {
            if (have < 4)
                return 0;
            e->with_logprobs = 1;
        }
        if (cinfer_sampler_plain_greedy(s->sampler))
            continue;
        int c = cinfer_sampler_backend_choice(s->sampler);
        if (have >= 3 && c != 0)
            bound += cinfer_sampler_edits_bound(s->sampler);
        else if (have < 2 || c != 2 ||
                 cinfer_sampler_edits_bound(s->sampler) != 0)
            return 0;
        if (c == 1)
            continue;
        const cinfer_sampler_params *p = cinfer_sampler_get_params(s->sampler);
        if (p->top_k > CINFER_CHOOSE_MAX_K && p->top_k < p->n_vocab)
            return 0; /* a top_k set too large for the backend */
        sampled = 1;
    }
    if (bound > 0 && !step_edits(e, bound))
        return 0;
    if (e->with_logprobs) {
        for (int32_t j = 0; j < n_out; j++)
            e->n_top[j] = -1;
        for (int k = 0; k < e->n_sched; k++) {
            const eng_seq *s = e->sched[k];
            if (s->step_out >= 0 && s->req->logprobs)
                e->n_top[s->step_out] =
                    cinfer_sampler_get_params(s->sampler)->n_logprobs;
        }
    }
    if (!sampled)
        return 1;
    for (int32_t j = 0; j < n_out; j++)
        e->draws[j] = (cinfer_draw){0.0f, 0.0f, 0.0, 0, 1.0f};
    for (int k = 0; k < e->n_sched; k++) {
        eng_seq *s = e->sched[k];
        if (s->step_out < 0 || cinfer_sampler_backend_choice(s->sampler) != 2)
            continue;
        cinfer_draw *d = &e->draws[s->step_out];
        cinfer_status st = cinfer_sampler_draw_params(s->sampler, d);
        CINFER_ASSERT(st == CINFER_OK); /* a draw, checked above */
    }
    return 2;
}

static void run_step(cinfer_engine *e)
{
    int64_t t0 = now(e);
    int rows = sched_schedule(e, t0);
    if (rows == 0)
        return;
    cinfer_step step;
    sched_build_step(e, &step);
    const int choice = step_choice(e, step.n_out);
    cinfer_status st =
        choice ? cinfer_model_forward_choose(
                     e->model, &step,
                     &(cinfer_choice){
                         .draws = choice == 2 ? e->draws : NULL,
                         .edits = e->edits,
                         .n_edits = e->n_edits,
                         .n_top = e->with_logprobs ? e->n_top : NULL,
                         .logprobs = e->row_lp},
                     e->codes)
               : cinfer_model_forward(e->model, &step, e->logits);
    int64_t t1 = now(e);
    sched_observe_step(e, rows, t1 - t0);
    e->st.steps++;
    e->st.greedy_steps += choice == 1;
    e->st.drawn_steps += choice == 2;
    e->st.edited_steps += choice && e->n_edits > 0;
    e->st.logprob_steps += choice && e->with_logprobs;
    e->st.last_step_ns = t1;
    cinfer_backend_graph_stats gs;
    cinfer_model_graph_stats(e->model, &gs);
    e->st.graph_steps = (uint64_t)(gs.captured + gs.replayed);
    e->st.graph_recorded = (uint64_t)gs.captured;
    if (st != CINFER_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "%s", cinfer_last_error());
        /* Asked here, on the thread that owns the backend, so that the
         * server's health reads a published flag rather than the device. */
        if (!cinfer_model_healthy(e->model))
            e->st.device_lost = 1;
        /* The step's sequences fail; the rest carry on. */
        while (e->n_sched > 0) {
            eng_seq *s = e->sched[--e->n_sched];
            finish_seq(e, s, CINFER_FINISH_ERROR, st, e->errbuf, t1);
        }
        return;
    }
    sched_commit(e);
    /* take_token may finish (and free) a sequence: copy the list first. */
    int n = e->n_sched;
    for (int k = 0; k < n; k++) {
        eng_seq *s = e->sched[k];
        if (s->step_out >= 0 && choice) {
            take_token(e, s, NULL, e->codes[s->step_out],
                       &e->row_lp[s->step_out], t1);
        } else if (s->step_out >= 0) {
            float *row = e->logits + (size_t)s->step_out * (size_t)e->n_vocab;
            if (s->n_draft)
                take_drafts(e, s, row, t1);
            else
                take_token(e, s, row, 0, NULL, t1);
        }
    }
    e->n_sched = 0;
}

static void *engine_main(void *arg)
{
    cinfer_engine *e = arg;
    cinfer_thread_set_priority((cinfer_thread_prio)e->thread_prio);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->in_head && !e->n_cancels &&
               (e->paused || (!e->n_running && !e->n_waiting)))
            pthread_cond_wait(&e->cv, &e->mu);
        eng_request *in = e->in_head;
        e->in_head = e->in_tail = NULL;
        /* They count as waiting from here on (until the next publish), so
         * that get_stats and submit's max_queued check never miss them
         * while this round's step runs. */
        e->pub.waiting += e->n_incoming;
        e->pred_prefill_rows += e->incoming_rows;
        e->n_incoming = 0;
        e->incoming_rows = 0;
        /* swap the cancel list with the thread's buffer */
        uint64_t *c = e->cancels;
        size_t n_c = e->n_cancels, cap_c = e->cap_cancels;
        e->cancels = e->cancel_buf;
        e->cap_cancels = e->cap_cancel_buf;
        e->n_cancels = 0;
        e->cancel_buf = c;
        e->cap_cancel_buf = cap_c;
        int stop = e->stop, paused = e->paused;
        pthread_mutex_unlock(&e->mu);

        int64_t t = now(e);
        take_incoming(e, in, t);
        for (size_t i = 0; i < n_c; i++) {
            eng_request *r = find_live(e, e->cancel_buf[i]);
            if (r) {
                r->cancelled = 1;
                finish_request(e, r, CINFER_FINISH_CANCELLED, CINFER_OK, "", t);
            }
        }
        if (stop) {
            while (e->live) {
                e->live->cancelled = 1;
                finish_request(e, e->live, CINFER_FINISH_CANCELLED, CINFER_OK,
                               "", t);
            }
            publish(e);
            break;
        }
        drop_expired(e, t);
        if (!paused && (e->n_running || e->n_waiting))
            run_step(e);
        publish(e);
    }
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* public API                                                             */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_engine_create(const cinfer_engine_params *p,
                                   cinfer_engine **out)
{
    cinfer_status st;
    *out = NULL;
    if (!p || !p->model)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "engine: params or params.model is NULL");
    if (p->max_seqs < 0 || p->max_batched_tokens < 0 || p->max_queued < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "engine: max_seqs, max_batched_tokens and "
                                "max_queued must be >= 0");
    if (p->spec_ngram_k < 0 || p->spec_ngram_k > CINFER_ENGINE_SPEC_MAX_K)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "engine: spec_ngram_k must be in 0..%d "
                                "(got %d)",
                                CINFER_ENGINE_SPEC_MAX_K, p->spec_ngram_k);
    if (p->spec_ngram_min < 0 || p->spec_ngram_max < 0 ||
        p->spec_max_seqs < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "engine: spec_ngram_min, spec_ngram_max and "
                                "spec_max_seqs must be >= 0");
    if (p->spec_ngram_max && p->spec_ngram_max < p->spec_ngram_min)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "engine: spec_ngram_max (%d) is below "
                                "spec_ngram_min (%d)",
                                p->spec_ngram_max, p->spec_ngram_min);
    cinfer_engine *e = calloc(1, sizeof *e);
    if (!e)
        return cinfer_set_error(CINFER_E_NOMEM, "engine: out of memory");
    e->model = p->model;
    e->info = cinfer_model_get_info(p->model);
    e->tk = cinfer_model_tokenizer(p->model);
    e->max_seqs = p->max_seqs ? p->max_seqs : 64;
    e->hold_for_deadlines = !p->admit_past_deadlines;
    e->max_queue_wait_ns = p->max_queue_wait_ns > 0 ? p->max_queue_wait_ns : 0;
    e->max_ttft_ns = p->max_ttft_ns > 0 ? p->max_ttft_ns : 0;
    e->thread_prio = p->thread_prio;
    e->max_batched = p->max_batched_tokens ? p->max_batched_tokens : 512;
    /* A step can not carry more rows than the model's buffers hold. */
    if (e->max_batched > e->info->max_batch_rows)
        e->max_batched = e->info->max_batch_rows;
    /* Every running sequence must fit one decode row in a step; more would
     * sit on their blocks without progressing. */
    if (e->max_seqs > e->max_batched)
        e->max_seqs = e->max_batched;
    e->min_prefill = p->min_prefill_tokens > 0 ? p->min_prefill_tokens : 0;
    if (e->min_prefill > e->info->max_batch_rows - e->max_seqs)
        e->min_prefill = e->info->max_batch_rows - e->max_seqs;
    e->max_prefill = p->max_prefill_tokens > e->max_batched ? p->max_prefill_tokens
                                                             : e->max_batched;
    if (e->max_prefill > e->info->max_batch_rows)
        e->max_prefill = e->info->max_batch_rows;
    e->max_rows = e->max_seqs + e->min_prefill > e->max_batched
                      ? e->max_seqs + e->min_prefill
                      : e->max_batched;
    if (e->max_rows < e->max_prefill)
        e->max_rows = e->max_prefill;
    e->max_queued = p->max_queued;
    e->prefix_cache = p->prefix_cache ? 1 : 0;
    e->now_ns = p->now_ns;
    e->now_user = p->now_user;
    e->spec_k = p->spec_ngram_k;
    e->spec_nmin = p->spec_ngram_min                            ? p->spec_ngram_min
                   : p->spec_ngram_max && p->spec_ngram_max < 2 ? p->spec_ngram_max
                                                                : 2;
    e->spec_nmax = p->spec_ngram_max ? p->spec_ngram_max
                   : e->spec_nmin > 4 ? e->spec_nmin
                                      : 4;
    e->spec_max_seqs = p->spec_max_seqs ? p->spec_max_seqs : 4;
    e->block_size = e->info->block_size;
    e->n_vocab = e->info->n_vocab;
    int64_t kv_tokens = (int64_t)e->info->n_kv_blocks * e->block_size;
    e->ctx_cap = e->info->n_ctx < kv_tokens ? e->info->n_ctx
                                            : (int32_t)kv_tokens;
    e->max_blocks = (e->ctx_cap + e->block_size - 1) / e->block_size;
    cinfer_tokenizer_eog_ids(e->tk, &e->eog, &e->n_eog);
    if (e->max_seqs > 65536 || e->max_batched > (1 << 20) ||
        e->ctx_cap < 1) {
        st = cinfer_set_error(CINFER_E_INVALID_ARG,
                              "engine: max_seqs (%d) or max_batched_tokens "
                              "(%d) too large, or the model has no KV cache",
                              e->max_seqs, e->max_batched);
        goto fail;
    }

    cinfer_kv_cache_params kp = cinfer_kv_cache_default_params();
    kp.n_blocks = e->info->n_kv_blocks;
    kp.block_size = e->block_size;
    kp.prefix_cache = e->prefix_cache;
    if ((st = cinfer_kv_cache_create(&kp, &e->kv)) != CINFER_OK)
        goto fail;
    if (e->info->n_swa_blocks > 0) {
        kp.n_blocks = e->info->n_swa_blocks;
        if ((st = cinfer_kv_cache_create(&kp, &e->skv)) != CINFER_OK)
            goto fail;
        e->swa_window = e->info->swa_window;
        e->swa_null = e->info->n_swa_blocks;
    }

    size_t rows = (size_t)e->max_rows, seqs = (size_t)e->max_seqs;
    e->max_out = e->max_seqs < e->max_batched ? e->max_seqs : e->max_batched;
    if (e->spec_k) {
        /* while speculating, each running sequence has 1 + k logits rows */
        int spec = e->spec_max_seqs < e->max_seqs ? e->spec_max_seqs
                                                  : e->max_seqs;
        int64_t out = (int64_t)spec * (e->spec_k + 1);
        if (out > e->max_rows)
            out = e->max_rows;
        if (out > e->max_out)
            e->max_out = (int)out;
    }
    e->running = malloc(sizeof *e->running * seqs);
    e->pred_slots = malloc(sizeof *e->pred_slots * seqs);
    e->sched = malloc(sizeof *e->sched * seqs);
    e->s_tokens = malloc(sizeof(int32_t) * rows);
    e->s_pos = malloc(sizeof(int32_t) * rows);
    e->s_row_seq = malloc(sizeof(int32_t) * rows);
    e->s_slots = malloc(sizeof(int32_t) * rows);
    e->s_out_rows = malloc(sizeof(int32_t) * rows);
    e->s_gen = malloc(rows);
    e->s_embd = malloc(sizeof *e->s_embd * rows);
    e->s_tables = malloc(sizeof(int32_t) * seqs * (size_t)e->max_blocks);
    if (e->skv) {
        e->s_swa_slots = malloc(sizeof(int32_t) * rows);
        e->s_swa_tables = malloc(sizeof(int32_t) * seqs *
                                 (size_t)e->max_blocks);
    }
    e->logits = malloc(sizeof(float) * (size_t)e->max_out * (size_t)e->n_vocab);
    e->codes = malloc(sizeof(int32_t) * (size_t)e->max_out);
    e->draws = malloc(sizeof(cinfer_draw) * (size_t)e->max_out);
    e->n_top = malloc(sizeof(int32_t) * (size_t)e->max_out);
    e->row_lp = malloc(sizeof(cinfer_row_logprobs) * (size_t)e->max_out);
    if (!e->codes || !e->draws || !e->n_top || !e->row_lp || !e->running || !e->pred_slots ||
        !e->sched || !e->s_tokens || !e->s_pos || !e->s_row_seq ||
        !e->s_slots || !e->s_out_rows || !e->s_gen || !e->s_embd ||
        !e->s_tables ||
        (e->skv && (!e->s_swa_slots || !e->s_swa_tables)) ||
        !e->logits) {
        st = cinfer_set_error(CINFER_E_NOMEM, "engine: out of memory");
        goto fail;
    }
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        st = cinfer_set_error(CINFER_E_INTERNAL, "engine: mutex init failed");
        goto fail;
    }
    if (pthread_cond_init(&e->cv, NULL) != 0) {
        pthread_mutex_destroy(&e->mu);
        st = cinfer_set_error(CINFER_E_INTERNAL, "engine: condvar init failed");
        goto fail;
    }
    e->pub.kv_blocks_total = e->info->n_kv_blocks;
    e->pub.kv_swa_blocks_total = e->skv ? e->info->n_swa_blocks : 0;
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        st = cinfer_set_error(CINFER_E_INTERNAL,
                              "engine: cannot start the engine thread");
        goto fail;
    }
    e->thread_started = 1;
    *out = e;
    return CINFER_OK;

fail:
    cinfer_kv_cache_destroy(e->kv);
    cinfer_kv_cache_destroy(e->skv);
    free(e->running);
    free(e->pred_slots);
    free(e->sched);
    free(e->s_tokens);
    free(e->s_pos);
    free(e->s_row_seq);
    free(e->s_slots);
    free(e->s_out_rows);
    free(e->s_gen);
    free(e->s_embd);
    free(e->s_tables);
    free(e->s_swa_slots);
    free(e->s_swa_tables);
    free(e->logits);
    free(e->codes);
    free(e->draws);
    free(e->edits);
    free(e->n_top);
    free(e->row_lp);
    free(e);
    return st;
}

void cinfer_engine_destroy(cinfer_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    /* the thread finished every request before it returned */
    CINFER_ASSERT(!e->live && !e->in_head);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    cinfer_kv_cache_destroy(e->kv);
    cinfer_kv_cache_destroy(e->skv);
    free(e->waiting);
    free(e->running);
    free(e->pred_slots);
    free(e->sched);
    free(e->cancels);
    free(e->cancel_buf);
    cinfer_grammar_vocab_destroy(e->gvocab);
    free(e->eog_ids);
    free(e->s_tokens);
    free(e->s_pos);
    free(e->s_row_seq);
    free(e->s_slots);
    free(e->s_out_rows);
    free(e->s_gen);
    free(e->s_embd);
    free(e->s_tables);
    free(e->s_swa_slots);
    free(e->s_swa_tables);
    free(e->logits);
    free(e->codes);
    free(e->draws);
    free(e->edits);
    free(e->n_top);
    free(e->row_lp);
    free(e);
}

/* The retry delay of this thread's last refusal for load. */
static _Thread_local int64_t tl_refusal_retry_ns;
static _Thread_local cinfer_engine_refusal tl_refusal_kind;

int64_t cinfer_engine_refusal_retry_ns(void) { return tl_refusal_retry_ns; }

cinfer_engine_refusal cinfer_engine_refusal_kind(void) { return tl_refusal_kind; }

/* (mu held, released here) A submit refused for load: frees the request
 * and records the refusal for cinfer_engine_refusal_*; the caller then
 * returns its error. */
static void refuse(cinfer_engine *e, eng_request *r, cinfer_engine_refusal kind,
                   int64_t retry_ns)
{
    pthread_mutex_unlock(&e->mu);
    request_free(r);
    tl_refusal_kind = kind;
    tl_refusal_retry_ns = retry_ns;
}

/* (mu, pred_ready) When the first token of a prompt of n_prompt tokens
 * would come, in ns from now, for a request whose turn for a slot comes
 * after `wait`. Prompts go through in chunks of the rows the running batch
 * leaves (at least min_prefill; max_prefill when nothing else runs), one
 * chunk a step beside the batch's decodes, in arrival order: so the first token comes after the later of
 * its turn plus its own chunks' steps and the steps that every prompt row
 * queued ahead (running prefills, waiting and incoming requests) takes
 * with its own. The batch then holds what runs now and what is queued
 * ahead (the slots that free up are taken again), up to max_seqs.
 * *idle_ns: the prompt alone on an idle engine. */
static int64_t first_token_ns(const cinfer_engine *e, int32_t n_prompt,
                              int64_t wait, int64_t *idle_ns)
{
    const int64_t row = e->pred_row_ns;
    /* pred_step_ns is the step of pub.running + 1 rows */
    int64_t a = e->pred_step_ns - (e->pub.running + 1) * row;
    if (a < 0)
        a = 0;
    int64_t running = (int64_t)e->pub.running + e->pub.waiting + e->n_incoming;
    if (running > e->max_seqs)
        running = e->max_seqs;
    /* alone, a prompt takes the larger chunks of a step without decodes */
    int64_t chunk = running == 0 ? e->max_prefill : e->max_batched - running;
    if (chunk < e->min_prefill)
        chunk = e->min_prefill;
    if (chunk < 1)
        chunk = 1;
    /* steps of `rows` prompt rows, each beside the batch's decodes */
    const int64_t own = (n_prompt + chunk - 1) / chunk *
                        (a + (running + (n_prompt < chunk ? n_prompt : chunk)) * row);
    const int64_t rows = e->pred_prefill_rows + e->incoming_rows + n_prompt;
    const int64_t all = (rows + chunk - 1) / chunk *
                        (a + (running + (rows < chunk ? rows : chunk)) * row);
    const int64_t idle_chunk = n_prompt < e->max_prefill ? n_prompt
                                                          : e->max_prefill;
    *idle_ns = (n_prompt + idle_chunk - 1) / idle_chunk * (a + idle_chunk * row);
    return wait + own > all ? wait + own : all;
}

cinfer_status cinfer_engine_submit(cinfer_engine *e,
                                   const cinfer_request_params *p,
                                   uint64_t *request_id)
{
    tl_refusal_retry_ns = 0;
    tl_refusal_kind = CINFER_ENGINE_REFUSAL_NONE;
    if (!e || !p)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "engine: engine or params is NULL");
    cinfer_status st = validate(e, p);
    if (st != CINFER_OK)
        return st;
    eng_request *r;
    if ((st = request_build(e, p, &r)) != CINFER_OK)
        return st;
    r->submit_ns = now(e);
    r->n_live = r->n_samples;

    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return cinfer_set_error(CINFER_E_UNAVAILABLE,
                                "engine: shutting down");
    }
    int queued = e->pub.waiting + e->n_incoming;
    if (e->max_queued && queued + r->n_samples > e->max_queued) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return cinfer_set_error(CINFER_E_EXHAUSTED,
                                "engine: %d requests queued (max_queued %d)",
                                queued, e->max_queued);
    }
    if (e->hold_for_deadlines && r->deadline_ns && e->pred_ready) {
        /* When it would finish, queued behind everything: see
         * sched_predict_start; requests not taken in yet count as long as
         * this one, shared over the running slots. */
        int64_t k = e->pub.running > 0 ? e->pub.running : 1;
        int64_t start = e->pred_at_ns + e->pred_start_ns +
                        (int64_t)e->n_incoming * r->max_tokens *
                            e->pred_step_ns / k;
        int64_t done = start + (int64_t)r->n_prompt * e->pred_row_ns +
                       (int64_t)r->max_tokens * e->pred_step_ns;
        /* Only a request that would have to queue is refused: one that can
         * start at once runs, and if its deadline comes first it ends then
         * with the output it has (max_tokens may be a loose bound). */
        const int64_t wait = start > r->submit_ns ? start - r->submit_ns : 0;
        if (start > r->submit_ns && done > r->deadline_ns) {
            double late_ms = (double)(done - r->deadline_ns) / 1e6;
            refuse(e, r, CINFER_ENGINE_REFUSAL_DEADLINE, wait);
            return cinfer_set_error(
                CINFER_E_TIMEOUT,
                "engine: the request would finish about %.0f ms after its "
                "deadline at the current load",
                late_ms);
        }
        /* A latency-bound request is not left standing in a queue. */
        if (e->max_queue_wait_ns && wait > e->max_queue_wait_ns) {
            double max_ms = (double)e->max_queue_wait_ns / 1e6;
            refuse(e, r, CINFER_ENGINE_REFUSAL_QUEUE_WAIT, wait);
            return cinfer_set_error(CINFER_E_UNAVAILABLE,
                                    "engine: overloaded: the request would "
                                    "wait about %.0f ms for its turn (at "
                                    "most %.0f)",
                                    (double)wait / 1e6, max_ms);
        }
        /* Nor is one admitted whose first token would come past the
         * bound, behind the prompts queued ahead and beside the running
         * batch: this also keeps the batch from growing until every step
         * is long. A prompt that takes longer even alone is not the load's
         * doing and runs. */
        if (e->max_ttft_ns) {
            int64_t idle;
            int64_t ttft = first_token_ns(e, r->n_prompt, wait, &idle);
            int64_t bound = idle > e->max_ttft_ns ? idle : e->max_ttft_ns;
            if (ttft > bound) {
                double max_ms = (double)e->max_ttft_ns / 1e6;
                refuse(e, r, CINFER_ENGINE_REFUSAL_FIRST_TOKEN, ttft - bound);
                return cinfer_set_error(CINFER_E_UNAVAILABLE,
                                        "engine: overloaded: the request's "
                                        "first token would come in about "
                                        "%.0f ms (at most %.0f)",
                                        (double)ttft / 1e6, max_ms);
            }
        }
    }
    r->id = ++e->next_id;
    r->arrival = r->id;
    r->next = NULL;
    if (e->in_tail)
        e->in_tail->next = r;
    else
        e->in_head = r;
    e->in_tail = r;
    e->n_incoming += r->n_samples;
    e->incoming_rows += r->n_prompt;
    uint64_t id = r->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (request_id)
        *request_id = id;
    return CINFER_OK;
}

void cinfer_engine_cancel(cinfer_engine *e, uint64_t request_id)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    if (e->n_cancels == e->cap_cancels) {
        size_t cap = e->cap_cancels ? 2 * e->cap_cancels : 16;
        uint64_t *nc = realloc(e->cancels, sizeof *nc * cap);
        if (!nc) {
            /* Out of memory: the request runs to its end instead. */
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->cancels = nc;
        e->cap_cancels = cap;
    }
    e->cancels[e->n_cancels++] = request_id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void cinfer_engine_get_stats(cinfer_engine *e, cinfer_engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->pub;
    out->waiting += e->n_incoming;
    pthread_mutex_unlock(&e->mu);
}

void cinfer_engine_pause(cinfer_engine *e, int paused)
{
    pthread_mutex_lock(&e->mu);
    e->paused = paused ? 1 : 0;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int cinfer_engine_check_kv(cinfer_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int ok = cinfer_kv_cache_check(e->kv) &&
             (!e->skv || cinfer_kv_cache_check(e->skv));
    pthread_mutex_unlock(&e->mu);
    return ok;
}
