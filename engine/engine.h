/*
 * engine.h - the engine library's public header.
 *
 * The engine turns token ids into next-token choices: it loads a model from
 * GGUF (model.h), tokenizes and detokenizes text (tokenizer.h), runs the
 * forward pass over a backend (kernels/backend.h) and samples (sampler.h).
 * Servers and tools include this header only; it never includes gRPC or
 * protobuf headers, and the layers below know nothing of it.
 *
 *     cinfer_model *m;
 *     cinfer_model_params mp = cinfer_model_default_params();  // default model
 *     if (cinfer_model_create(&mp, &m) != CINFER_OK) ...cinfer_last_error()
 *     const cinfer_tokenizer *tk = cinfer_model_tokenizer(m);
 *     ... cinfer_tokenizer_encode(tk, ...); cinfer_model_eval_single(...);
 *     ... cinfer_sampler_sample(...); cinfer_detok_push(...);
 *     cinfer_model_destroy(m);
 */
#ifndef CINFER_ENGINE_H
#define CINFER_ENGINE_H

#include "../common/status.h"
#include "../kernels/backend.h"
#include "gguf.h"
#include "grammar.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* The serving engine: one engine thread, continuous batching             */
/* ---------------------------------------------------------------------- */
/*
 * cinfer_engine owns the engine thread. Requests are submitted from any
 * thread; the engine thread admits them, batches them, samples, and reports
 * each request's progress through its callback. The callback runs on the
 * engine thread: it must not block (copy what it needs, hand it to another
 * thread, return).
 *
 *     cinfer_engine_params ep = cinfer_engine_default_params();
 *     ep.model = m;
 *     cinfer_engine *e;
 *     cinfer_engine_create(&ep, &e);
 *     cinfer_request_params rp = cinfer_request_default_params();
 *     rp.prompt = ids; rp.n_prompt = n; rp.max_tokens = 64;
 *     rp.on_event = my_sink; rp.user = my_call;
 *     uint64_t id;
 *     cinfer_engine_submit(e, &rp, &id);   // events follow on the engine thread
 *     ...
 *     cinfer_engine_cancel(e, id);          // optional; a FINISH event follows
 *     cinfer_engine_destroy(e);             // cancels what is left, joins
 */

typedef struct cinfer_engine cinfer_engine;

typedef struct {
    cinfer_model *model;      /* borrowed; must outlive the engine */
    int max_seqs;             /* sequences running at once; 0 = 64;
                                 at most max_batched_tokens */
    int max_batched_tokens;   /* rows per step (decodes + prefill chunks);
                                 0 = 512; must not exceed the model's
                                 max_batch_rows */
    int min_prefill_tokens;   /* prefill rows a step may carry beyond
                                 max_batched_tokens when the decodes of a
                                 large running set leave fewer (so that
                                 newcomers' prompts are not starved); the
                                 model's max_batch_rows must hold max_seqs +
                                 this; 0 = prefill only within the budget */
    int max_prefill_tokens;   /* rows a step may take when it carries no
                                 decode row (prompts alone: an idle engine's
                                 long prompt goes through in fewer, larger
                                 chunks); 0 or less than max_batched_tokens
                                 = max_batched_tokens; at most the model's
                                 max_batch_rows */
    int max_queued;           /* waiting requests before submit refuses
                                 with CINFER_E_EXHAUSTED; 0 = unbounded */
    int prefix_cache;         /* 1 = reuse KV blocks of shared prefixes */
    int admit_past_deadlines; /* 1 = admit waiting requests whatever the
                                 deadlines (engine_impl.h: the step-time
                                 model); 0 = hold one back while it would
                                 make itself or a running request miss */
    int64_t max_queue_wait_ns; /* with the hold on: a request with a
                                  deadline that would wait longer than this
                                  for its turn is refused at submit
                                  (CINFER_E_UNAVAILABLE); 0 = no bound */
    int64_t max_ttft_ns;      /* with the hold on: a request with a deadline
                                 whose first token would come later than
                                 this (its wait for a turn, then its
                                 prompt's steps beside the running batch)
                                 is refused at submit (CINFER_E_UNAVAILABLE)
                                 unless it would take as long on an idle
                                 engine; 0 = no bound */
    int thread_prio;          /* the cinfer_thread_prio of the engine
                                 thread, which runs the model's steps
                                 (common/thread_priority.h); 0 = unchanged */
    /* Clock in ns (monotonic) for deadlines and timings; NULL = CLOCK_MONOTONIC. */
    int64_t (*now_ns)(void *user);
    void *now_user;
    /* Prompt-lookup (n-gram) speculative decoding, which changes the
     * speed only: a running sequence whose most recent tokens (an n-gram
     * of spec_ngram_max down to spec_ngram_min tokens) occurred before in
     * its prompt or output drafts the tokens that followed there; a step
     * computes its last token and the drafts as rows of one forward
     * (every row's bits are those of a one-by-one decode), each position
     * is sampled exactly as plain decoding would sample it (sampler.h:
     * draws keyed by seed and position), and drafts are taken while they
     * agree with the samples. Greedy and seeded outputs, stop conditions,
     * logprobs, penalties and grammars are those of decoding without it,
     * on a batch-invariant backend (the CPU; CUDA with batch_invariant),
     * where batching itself changes no bits either. Drafts use only the
     * rows a step's budget leaves after decodes, prefills and admissions,
     * free KV blocks, and only while few sequences run. It pays where a
     * step of a few rows costs little more than a step of one (decode
     * bound by reading the weights, as on a GPU). */
    int spec_ngram_k;         /* draft tokens per sequence and step, in
                                 0..CINFER_ENGINE_SPEC_MAX_K; 0 = off */
    int spec_ngram_min;       /* shortest n-gram matched, >= 1; 0 = 2 */
    int spec_ngram_max;       /* longest n-gram matched, >= spec_ngram_min;
                                 0 = max(4, spec_ngram_min) */
    int spec_max_seqs;        /* speculate only while at most this many
                                 sequences run; 0 = 4 */
} cinfer_engine_params;

/* Most draft tokens per sequence and step (cinfer_engine_params). */
#define CINFER_ENGINE_SPEC_MAX_K 32

cinfer_engine_params cinfer_engine_default_params(void);

typedef enum {
    CINFER_FINISH_NONE = 0,      /* still running */
    CINFER_FINISH_LENGTH,        /* max_tokens reached or context full */
    CINFER_FINISH_EOS,           /* the model's end-of-generation token */
    CINFER_FINISH_STOP_SEQUENCE, /* a stop string matched */
    CINFER_FINISH_STOP_TOKEN,    /* a stop token id was sampled */
    CINFER_FINISH_CANCELLED,     /* cinfer_engine_cancel or engine shutdown */
    CINFER_FINISH_TIME_LIMIT,    /* the deadline passed */
    CINFER_FINISH_ERROR,         /* engine fault (see event status) */
} cinfer_finish_reason;

const char *cinfer_finish_reason_name(cinfer_finish_reason r);

typedef struct {
    int32_t id;
    float logprob;
} cinfer_token_logprob;

typedef enum {
    CINFER_EVENT_TOKENS = 1, /* new tokens (and text) for one sample */
    CINFER_EVENT_FINISH = 2, /* the sample is done; last event for it */
} cinfer_event_kind;

typedef struct {
    cinfer_event_kind kind;
    uint64_t request_id;
    int sample_index;              /* 0..n-1 when n > 1 samples */
    /* TOKENS: (n_ids is 0 only for text released when a request is
     * cancelled or times out: text that was withheld as a possible start
     * of a stop string) */
    const int32_t *ids;            /* new token ids */
    size_t n_ids;
    const char *text;              /* their text delta: whole UTF-8 chars,
                                      stop strings withheld/removed */
    size_t text_len;
    const float *logprobs;         /* [n_ids] chosen tokens' logprobs, or NULL */
    const cinfer_token_logprob *top; /* [n_ids * n_top] or NULL */
    int n_top;
    /* FINISH: */
    cinfer_finish_reason finish;
    cinfer_status status;          /* CINFER_OK unless finish == ERROR */
    const char *message;           /* error text for ERROR, else "" */
    int32_t prompt_tokens;
    int32_t completion_tokens;
    int32_t cached_tokens;         /* prompt tokens served by the prefix cache */
    int64_t queue_ns;              /* submit -> first scheduled (TOKENS
                                      too, once the sample was scheduled;
                                      else 0) */
    int64_t ttft_ns;               /* submit -> first token */
    int64_t total_ns;              /* submit -> finish */
} cinfer_engine_event;

typedef struct {
    const int32_t *prompt;        /* prompt token ids (copied) */
    size_t n_prompt;              /* >= 1, or >= 0 with prompt embeddings */
    /* Prompt embeddings (soft prompts): rows that come before prompt[] at
     * positions 0..n_prompt_embeds-1, each standing in for a token's row
     * of the model's embedding table (dequantized, before any scaling the
     * architecture applies: cinfer_model_forward), so the rows of real
     * tokens give those tokens' output. The prompt is then
     * n_prompt_embeds + n_prompt positions, within the context, and
     * prompt_tokens in events counts them all. The prefix cache neither
     * serves nor keeps such a request's blocks (they are not named by
     * token ids; its samples still share them); penalties see prompt[]
     * only. Refused (CINFER_E_UNSUPPORTED) where the model does not take
     * them (cinfer_model_input_embeds). */
    const float *prompt_embeds;   /* [n_prompt_embeds, n_embd] row-major,
                                     every value finite (copied); NULL =
                                     none */
    size_t n_prompt_embeds;       /* rows */
    cinfer_sampler_params sampling;
    int32_t max_tokens;           /* >= 1; capped by the context */
    int32_t min_tokens;           /* EOG/stop tokens suppressed before this */
    int ignore_eos;               /* 1 = do not stop at end-of-generation */
    const char *const *stop;      /* stop strings (copied), or NULL */
    size_t n_stop;
    const int32_t *stop_ids;      /* stop token ids (copied), or NULL */
    size_t n_stop_ids;
    int n_samples;                /* n; 0 = 1 */
    int priority;                 /* higher runs first; 0 = normal */
    int64_t deadline_ns;          /* absolute, on the engine clock; 0 = none */
    void (*on_event)(void *user, const cinfer_engine_event *ev);
    void *user;
    int logprobs;                 /* 1 = TOKENS events carry each chosen
                                     token's logprob and, in `top`, the
                                     sampling.n_logprobs most likely; 0 = no
                                     logprobs */
    const cinfer_grammar *grammar; /* the output must be a sentence of it
                                     (grammar.h): each step masks the tokens
                                     that cannot continue one, and an
                                     end-of-generation token is allowed only
                                     where the output is complete. Borrowed:
                                     it must outlive the request. If no token
                                     can continue, the sample ends with
                                     FINISH_ERROR (CINFER_E_UNSUPPORTED,
                                     "grammar: ..."). NULL = none */
} cinfer_request_params;

cinfer_request_params cinfer_request_default_params(void);

cinfer_status cinfer_engine_create(const cinfer_engine_params *p,
                                   cinfer_engine **out);
/* Cancels every request (each gets its FINISH event), stops and joins the
 * engine thread. NULL is fine. */
void cinfer_engine_destroy(cinfer_engine *e);

/* Queues a request. Validates it (CINFER_E_INVALID_ARG naming the field,
 * CINFER_E_RANGE for a prompt longer than the context or an id outside the
 * vocabulary); CINFER_E_EXHAUSTED past max_queued; CINFER_E_TIMEOUT when
 * the request has a deadline, admit_past_deadlines is 0, it would have to
 * queue, and at the current load (engine_impl.h, sched_predict_start) it
 * would finish only after its deadline; CINFER_E_UNAVAILABLE when it has
 * a deadline and would wait longer than max_queue_wait_ns for its turn or
 * get its first token later than max_ttft_ns, or the engine is shutting
 * down. On error no event is ever delivered. Thread-safe. */
cinfer_status cinfer_engine_submit(cinfer_engine *e,
                                   const cinfer_request_params *p,
                                   uint64_t *request_id);

/* Asks the engine to stop a request; its FINISH (CANCELLED) event follows
 * from the engine thread, and its KV blocks are freed at the next step.
 * Unknown or finished ids are ignored. Thread-safe. */
void cinfer_engine_cancel(cinfer_engine *e, uint64_t request_id);

typedef struct {
    int running;               /* sequences in the batch */
    int waiting;               /* requests queued */
    int kv_blocks_total;
    int kv_blocks_used;
    int kv_blocks_cached;      /* free blocks holding reusable prefixes */
    /* The same for the model's window pool (gemma3's local layers,
     * whose blocks a sequence releases once they fall out of the window;
     * total 0 = no such pool). The kv_blocks_* above count the global
     * blocks. */
    int kv_swa_blocks_total;
    int kv_swa_blocks_used;
    int kv_swa_blocks_cached;
    uint64_t requests_finished;
    uint64_t requests_cancelled;
    uint64_t preemptions;
    uint64_t prompt_tokens;    /* prefilled (excluding cache hits) */
    uint64_t cached_tokens;    /* prompt tokens served from the cache */
    uint64_t generated_tokens;
    uint64_t steps;
    uint64_t greedy_steps;     /* of them, steps whose tokens the backend
                                  chose, every row plain greedy: only token
                                  ids came back (cinfer_model_forward_choose) */
    uint64_t drawn_steps;      /* and steps whose tokens the backend drew,
                                  some rows draws (engine/sampler.h) */
    uint64_t edited_steps;     /* of the greedy and drawn steps, those whose
                                  logit_bias, min_tokens mask or penalties
                                  the backend applied (CUDA) */
    uint64_t logprob_steps;    /* and those whose logprobs the backend
                                  found (CUDA) */
    uint64_t graph_steps;      /* steps that ran as one CUDA graph launch,
                                  recorded then or replayed */
    uint64_t graph_recorded;   /* of them, those recorded (the first of
                                  their row bucket and context class) */
    int64_t last_step_ns;      /* engine clock at the last step's end */
    int device_lost;           /* 1 once a step failed and the backend
                                  reported a fault it cannot recover from
                                  (cinfer_backend_healthy 0: a sticky
                                  device error); it stays 1 */
    uint64_t spec_drafted;     /* draft tokens verified (spec_ngram_k) */
    uint64_t spec_accepted;    /* of them, taken: tokens that cost no step
                                  of their own */
    uint64_t spec_steps;       /* sequence-steps that carried drafts */
} cinfer_engine_stats;

/* A consistent snapshot. Thread-safe. */
void cinfer_engine_get_stats(cinfer_engine *e, cinfer_engine_stats *out);

/* After cinfer_engine_submit refused a request on this thread for the
 * engine's load (CINFER_E_TIMEOUT or CINFER_E_UNAVAILABLE), when a request
 * like it would be taken, in ns from the refusal: its predicted wait for a
 * turn, plus for the first-token bound the time by which its first token
 * would have been late (the running batch must shrink that much). 0 when
 * the last submit on this thread was not such a refusal. */
int64_t cinfer_engine_refusal_retry_ns(void);

/* Which bound that refusal was for; NONE when the last submit on this
 * thread was not a refusal for load. */
typedef enum {
    CINFER_ENGINE_REFUSAL_NONE = 0,
    CINFER_ENGINE_REFUSAL_DEADLINE,    /* CINFER_E_TIMEOUT */
    CINFER_ENGINE_REFUSAL_QUEUE_WAIT,  /* max_queue_wait_ns */
    CINFER_ENGINE_REFUSAL_FIRST_TOKEN, /* max_ttft_ns */
} cinfer_engine_refusal;

cinfer_engine_refusal cinfer_engine_refusal_kind(void);

#ifdef __cplusplus
}
#endif

#endif /* CINFER_ENGINE_H */
