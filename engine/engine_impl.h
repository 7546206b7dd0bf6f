/*
 * engine_impl.h - the serving engine's internals, shared by engine.c (the
 * public API, the engine thread, sampling and events) and scheduler.c
 * (queues, admission, preemption, building a step).
 *
 * Ownership: a request is created by cinfer_engine_submit and handed to the
 * engine thread through the `incoming` list; from then on only the engine
 * thread touches it, and frees it when its last sample finishes. Each
 * sample is one sequence (eng_seq) with its own tokens, block table,
 * sampler and text stream; the samples of one request share the prompt's
 * KV blocks.
 *
 * Locking: `mu` guards the fields marked (mu): the incoming list, the
 * cancel list, the stop/pause flags and the published stats. Everything
 * else belongs to the engine thread. Events are delivered with `mu`
 * released, so a callback may submit, cancel and read stats.
 */
#ifndef CINFER_ENGINE_IMPL_H
#define CINFER_ENGINE_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "detok.h"
#include "engine.h"
#include "kv_cache.h"

typedef struct eng_request eng_request;
typedef struct eng_seq eng_seq;

typedef enum {
    SEQ_NEW = 0,     /* built by submit, not queued yet */
    SEQ_WAITING,     /* in the waiting queue, holds no blocks */
    SEQ_RUNNING,     /* in the running set, holds its blocks */
    SEQ_FINISHED,    /* done; its FINISH event went out */
} eng_seq_state;

struct eng_seq {
    eng_request *req;
    int index; /* sample index */
    eng_seq_state state;

    int32_t *tokens;    /* [cap] prompt, then the generated tokens */
    int32_t n_tokens;
    int32_t cap;        /* n_prompt + max_tokens, at most the context */
    int32_t n_computed; /* tokens whose K/V is in this seq's blocks */
    int32_t n_generated;

    int32_t *blocks;    /* [max_blocks] block table */
    int32_t n_blocks;
    uint64_t *hashes;   /* [max_blocks] prefix keys of the first n_hashed
                           blocks (prefix cache only) */
    int32_t n_hashed;
    int32_t *sblocks;   /* [max_blocks] the window pool's block table
                           (skv only), as long as blocks: entries
                           [s_first, n_blocks) are held, those before
                           were released (the pool's null block) */
    int32_t s_first;

    cinfer_sampler *sampler;
    cinfer_textstream *text;
    cinfer_grammar_state *grammar; /* the request's grammar, or NULL */
    uint8_t *allowed;              /* [n_vocab] this step's grammar mask */

    int32_t cached_tokens; /* prompt tokens reused at first admission */
    int admitted;          /* admitted at least once */
    int64_t first_sched_ns;
    int64_t first_token_ns;

    int32_t spec_len;   /* most drafts for the next step: the drafts
                           taken + 1 after a rejection, twice the drafts
                           (up to spec_ngram_k) when all were taken;
                           0 = spec_ngram_k */

    /* this step */
    int32_t n_draft;    /* draft tokens after the last one, in
                           tokens[n_tokens .. n_tokens + n_draft) and among
                           the step_rows (speculative decoding) */
    int32_t step_rows;  /* rows scheduled */
    int32_t step_out;   /* index of its first logits row (of 1 + n_draft),
                           or -1 */
    int step_prefill;   /* 1 if the rows count as prefill */
};

struct eng_request {
    uint64_t id;
    uint64_t arrival; /* submit order, breaks priority ties */
    int priority;
    int64_t deadline_ns;
    int64_t submit_ns;

    int32_t *prompt;
    int32_t n_prompt;  /* positions: the embedding rows, then the tokens */
    float *embeds;     /* [n_embeds, n_embd] prompt embeddings, or NULL;
                          prompt[0..n_embeds) hold token 0 in their place */
    int32_t n_embeds;
    int32_t max_tokens;
    int32_t min_tokens;
    int ignore_eos;
    int32_t *stop_ids;
    size_t n_stop_ids;
    int logprobs;
    int n_top;

    int n_samples;
    int n_live;       /* samples not finished yet */
    int cancelled;    /* cancel was processed */
    eng_seq *seqs;    /* [n_samples] */

    void (*on_event)(void *user, const cinfer_engine_event *ev);
    void *user;

    eng_request *next; /* incoming list (mu), then the live list */
    eng_request *prev; /* live list */
};

struct cinfer_engine {
    cinfer_model *model;
    const cinfer_model_info *info;
    const cinfer_tokenizer *tk;
    cinfer_grammar_vocab *gvocab; /* token bytes for grammar masks; made at
                                     the first grammar's first step (engine
                                     thread) */
    int32_t *eog_ids;             /* the end-of-generation ids, with it */
    int32_t n_eog_ids;
    int max_seqs;
    int max_batched;
    int min_prefill;  /* min_prefill_tokens */
    int max_prefill;  /* max_prefill_tokens, at least max_batched */
    int max_rows;     /* rows a step may carry: max(max_batched,
                         max_seqs + min_prefill, max_prefill), within the
                         model's */
    int max_queued;
    int prefix_cache;
    int hold_for_deadlines; /* !admit_past_deadlines */
    int64_t max_queue_wait_ns;
    int64_t max_ttft_ns;
    int thread_prio;
    int64_t (*now_ns)(void *user);
    void *now_user;
    int spec_k;        /* spec_ngram_k; 0 = off */
    int spec_nmin, spec_nmax;
    int spec_max_seqs;

    int32_t block_size;
    int32_t ctx_cap;    /* most tokens one sequence may hold */
    int32_t max_blocks; /* blocks one sequence may hold */
    int32_t n_vocab;
    const int32_t *eog; /* end-of-generation ids (tokenizer's) */
    size_t n_eog;

    cinfer_kv_cache *kv;
    /* The model's window pool (gemma3's local layers, info.n_swa_blocks):
     * its allocator and prefix cache, keyed as kv's, or NULL. A sequence
     * holds the pool's blocks that some future row's window reaches
     * (positions >= n_computed - swa_window + 1) and releases the rest;
     * a prefix is reused only as far as the window pool still holds its
     * last window. */
    cinfer_kv_cache *skv;
    int32_t swa_window;
    int32_t swa_null;   /* the pool's zeroed block, never allocated */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;

    /* (mu) */
    eng_request *in_head, *in_tail;
    int n_incoming;      /* samples in the incoming list */
    int64_t incoming_rows; /* their prompt tokens (once per request) */
    uint64_t *cancels;
    size_t n_cancels, cap_cancels;
    int stop;
    int paused;
    uint64_t next_id;
    cinfer_engine_stats pub; /* published at the end of each iteration */
    /* also published: when a request queued now would start (pred_start_ns
     * after pred_at_ns, sched_predict_start) and the step time and row
     * cost it would then see; pred_ready once the model has data */
    int pred_ready;
    int64_t pred_at_ns, pred_start_ns, pred_step_ns, pred_row_ns;
    /* and the prompt rows still to compute, running and waiting */
    int64_t pred_prefill_rows;

    /* engine thread */
    eng_request *live;   /* every request the thread holds */
    eng_seq **waiting;   /* sorted: priority desc, arrival, sample index */
    int n_waiting, cap_waiting;
    eng_seq **running;   /* same order; at most max_seqs */
    int n_running;
    eng_seq **sched;     /* this step's sequences, in row order */
    int n_sched;
    cinfer_engine_stats st; /* counters, copied into pub */
    /* step-time model (sched_observe_step): exponentially weighted sums
     * of 1, rows, ns, rows^2 and rows * ns over the recent steps */
    double tm_w, tm_x, tm_y, tm_xx, tm_xy;
    int tm_n; /* steps observed */
    int64_t *pred_slots; /* [max_seqs] sched_predict_start's heap */
    uint64_t *cancel_buf; /* the thread's copy of the cancel list */
    size_t cap_cancel_buf;

    /* step scratch */
    int32_t *s_tokens, *s_pos, *s_row_seq, *s_slots, *s_out_rows;
    const float **s_embd; /* [max_rows] cinfer_step.row_embd */
    uint8_t *s_gen; /* per row: 1 = a generated token (cinfer_step.row_gen) */
    int32_t *s_tables;   /* [max_seqs, max_blocks] */
    int32_t *s_swa_slots, *s_swa_tables; /* the same for skv */
    float *logits;       /* [max_out, n_vocab] */
    int32_t *codes;      /* [max_out]: tokens chosen on the backend
                            (run_step, step_choice) */
    cinfer_draw *draws;  /* [max_out]: what the backend draws for them */
    cinfer_logit_edit *edits; /* [edits_cap]: the samplers' stages 1-3 for
                                 them (cinfer_sampler_edits) */
    int64_t edits_cap, n_edits;
    int32_t *n_top;      /* [max_out]: the logprobs asked of the backend */
    cinfer_row_logprobs *row_lp; /* [max_out]: what it found */
    int with_logprobs;   /* this step asks the backend for logprobs */
    int max_out;
    char errbuf[256];
};

/* ---- scheduler.c --------------------------------------------------------
 * Queues and the per-step schedule. Engine thread only. */

/* Orders sequences: higher priority first, then earlier arrival, then lower
 * sample index. */
int sched_before(const eng_seq *a, const eng_seq *b);

cinfer_status sched_waiting_insert(cinfer_engine *e, eng_seq *s);
void sched_waiting_remove(cinfer_engine *e, eng_seq *s);
void sched_running_remove(cinfer_engine *e, eng_seq *s);

/* Releases every block of s (last block first, so a shared prefix outlives
 * its tail in the LRU order), in both pools. */
void sched_release_blocks(cinfer_engine *e, eng_seq *s);

/* Takes s off the running set, frees its blocks, and queues it again; its
 * tokens are kept and recomputed when it is admitted again. */
void sched_preempt(cinfer_engine *e, eng_seq *s);

/* Chooses this step's rows: running decodes, running prefill chunks, then
 * admissions, within max_batched tokens and max_seqs, preempting the
 * newest running sequence when a running one needs a block and none is
 * free. Fills e->sched (with step_rows set) and returns the row count. */
int sched_schedule(cinfer_engine *e, int64_t now_ns);

/* The step-time model: step time ~ a + b * rows, fitted by least squares
 * over the recent steps (older ones weigh less). Admission uses it to keep
 * deadlines: a waiting sequence joins the running set only if, at the
 * predicted step time of the larger batch and with its own prefill added,
 * every running sequence that has a deadline can still generate all of its
 * remaining tokens (max_tokens; end-of-generation is not foreseen) before
 * it, and so can the newcomer. Without deadlines, or before
 * SCHED_MODEL_MIN_STEPS steps were seen, nothing is held back. */
#define SCHED_MODEL_MIN_STEPS 8
void sched_observe_step(cinfer_engine *e, int rows, int64_t ns);
/* a + b * rows in ns, and b alone (the marginal cost of a row); 0 when no
 * step was observed. */
void sched_predict_step(const cinfer_engine *e, int rows, int64_t *step_ns,
                        int64_t *row_ns);

/* When a sequence queued now behind every waiting one would start, in ns
 * from now: the running set's slots free up as their sequences generate
 * their remaining tokens (max_tokens) at the predicted step time, and the
 * waiting ones take them in order. 0 when a slot is free now (one the
 * running sequences' deadlines let a newcomer take). Also the
 * step time and row cost the newcomer would then see. Returns 0 while the
 * model has too few steps. Needs e->pred_slots. */
int sched_predict_start(const cinfer_engine *e, int64_t now_ns,
                        int64_t *start_ns, int64_t *step_ns, int64_t *row_ns);

/* Writes the scheduled rows into the step arrays and sets each sequence's
 * step_out. */
void sched_build_step(cinfer_engine *e, cinfer_step *step);

/* After a successful forward: advances n_computed over the rows that are
 * not drafts, registers newly full blocks in the prefix cache and
 * releases the window pool's blocks no future row reads. */
void sched_commit(cinfer_engine *e);

/* Speculative decoding: the drafts of s for this step, after the rows it
 * has (which end at its last token). Called for each scheduled sequence
 * once the schedule is otherwise complete; takes rows from *budget and
 * blocks only where they are free (no preemption, no eviction of other
 * work). Sets n_draft and grows step_rows. */
void sched_add_drafts(cinfer_engine *e, eng_seq *s, int *budget);

/* After s's drafts were verified: its tokens end with the accepted drafts
 * and one sampled token, so n_computed becomes n_tokens - 1 (the K/V of
 * rejected drafts is dropped), newly full verified blocks are registered,
 * and blocks past the one the next token needs are released. */
void sched_spec_rollback(cinfer_engine *e, eng_seq *s);

/* Prompt lookup: the tokens that followed the most recent earlier
 * occurrence of the last n tokens of t[0..n_tokens) (n from nmax down to
 * nmin), at most k of them, written to out. Where the occurrence runs
 * into the suffix itself the continuation repeats (a loop's period).
 * Returns how many were written. */
int32_t sched_ngram_draft(const int32_t *t, int32_t n_tokens, int nmin,
                          int nmax, int32_t k, int32_t *out);

/* ---- engine.c (test hooks) ---------------------------------------------- */

/* While paused the engine thread takes submissions and cancellations but
 * runs no step, so a test can queue many requests and release them into
 * one batch. Thread-safe. */
void cinfer_engine_pause(cinfer_engine *e, int paused);

/* Runs the kv_cache consistency walk on the engine thread's allocators
 * (both pools); only valid while the thread is idle (paused, or nothing
 * queued). */
int cinfer_engine_check_kv(cinfer_engine *e);

#endif /* CINFER_ENGINE_IMPL_H */
