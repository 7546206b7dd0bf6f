/*
 * sampler.h - next-token choice for one request: penalties, top-k, top-p,
 * min-p, temperature, seeded counter-based draws, and logprobs.
 *
 * The model behind it is vLLM's SamplingParams, with llama.cpp's sampler
 * chain as the second reference. One sampler belongs to one request; the
 * engine hands it one row of logits (float[n_vocab]) per step and tells it
 * which token the sequence actually took with cinfer_sampler_accept().
 *
 * Order of application (vLLM's; each stage sees the previous one's output):
 *
 *   1. logit_bias: logit[t] += bias (a bias of -INFINITY bans t); a mask
 *      set for this step (cinfer_sampler_set_allowed) bans what it does not
 *      allow;
 *   2. min_tokens: while fewer than min_tokens tokens were accepted, the
 *      eog_tokens get -INFINITY;
 *   3. penalties, over the token counts kept by accept (see below):
 *      repetition: logit > 0 ? logit / r : logit * r  (r = repetition_penalty),
 *      then, if count > 0, logit -= frequency_penalty * count, and
 *      logit -= presence_penalty;
 *   4. temperature < 1e-5 (vLLM's epsilon; 0 included): greedy, the argmax
 *      of the row with ties to the lowest id; stages 5-9 are skipped;
 *   5. top_k: keep the k largest logits (ties to the lower id);
 *   6. temperature: p ~ exp(logit / temperature), renormalized over the kept
 *      (a token under e^-87 times the top token's weight counts as 0);
 *   7. top_p: keep the smallest most-likely prefix whose mass reaches top_p
 *      (sorted by logit, ties to the lower id);
 *   8. min_p: keep tokens with p >= min_p * p_max;
 *   9. draw one token from what is kept, with the sampler's own
 *      counter-based random stream (see Reproducibility).
 *
 * top_k commutes with temperature, so 5-6 matches vLLM v0 and HF transformers
 * (temperature, top_k, top_p, min_p). llama.cpp's default chain instead runs
 * top_k, top_p, min_p at temperature 1 and divides by the temperature last;
 * top_p results differ between the two when temperature != 1.
 *
 * Penalty history (vLLM's semantics by default): repetition_penalty applies
 * to every token that occurred in the prompt or the output; presence and
 * frequency penalties count output tokens only. penalty_prompt changes how
 * prompt tokens count; penalty_last_n > 0 restricts every penalty to the
 * last n accepted tokens (prompt and output, in order), as llama.cpp's
 * penalty_last_n. The counts live in a hash table updated in O(1) by each
 * accept; a step applies them in O(distinct tokens), never by scanning the
 * history.
 *
 * Cost: a few linear passes over the row. top_k selects by radix select on
 * the float bits (no sort of the vocabulary); top_p sorts only the tokens
 * above a cut found by a log-probability histogram; min_p alone sorts
 * nothing. With no penalties the sampler allocates O(n_vocab / 1024) bytes;
 * scratch for kept candidates grows on demand.
 *
 * Reproducibility: draws are counter-based. The u in [0, 1) behind a
 * non-greedy sample is a pure function of (seed, output position, draw
 * index): the position is the number of tokens accepted so far, the draw
 * index counts the draws at that position since the last accept (the
 * engine makes exactly one per position, so its draws are keyed by (seed,
 * position) alone). The function is two rounds of splitmix64's finalizer
 * over the key mix64(seed + golden) and the counter (position << 32 |
 * draw), 53 bits kept. A greedy sample draws nothing. So the token at
 * position p depends on the seed, the logits row and the accepted history
 * only, never on how many draws other positions took: speculative decoding
 * (engine.h, spec_ngram_k) can verify several positions in one step and
 * sample each one exactly as one-by-one decoding does. (Before this, each
 * sampler advanced one xoshiro256** stream per draw; the same seed now
 * draws other tokens than it did then.) The weights come from the
 * sampler's own exp in plain IEEE single precision (no libm, no fused
 * multiply-add), and every sum runs in a fixed order, so the same seed and
 * the same sequence of logits rows and accepts give the same tokens on
 * every run, machine and libm. The CUDA backend's draw
 * (kernels/cuda/sample.cu, cinfer_backend_choose) repeats the whole-row
 * and top_k plans (temperature, top_k, min_p) with these bits: a change
 * to the selection, the weights, the sums or the walk here is a change
 * there (test_backend_ops compares them).
 *
 * Logprobs follow vLLM's default (raw logprobs): the log-softmax of the row
 * as the model produced it, before bias, masks, penalties and temperature.
 *
 *     int32_t eog[] = {2};
 *     cinfer_sampler_params sp = cinfer_sampler_default_params();
 *     sp.n_vocab = 49152;
 *     sp.temperature = 0.7f; sp.top_p = 0.9f; sp.seed = 42;
 *     sp.min_tokens = 4; sp.eog_tokens = eog; sp.n_eog_tokens = 1;
 *     cinfer_sampler *s;
 *     if (cinfer_sampler_create(&sp, &s) != CINFER_OK) ...cinfer_last_error()
 *     cinfer_sampler_accept_prompt(s, prompt, n_prompt);
 *     for (;;) {
 *         ... model writes logits[n_vocab] ...
 *         int32_t tok;
 *         cinfer_logprobs lp;
 *         cinfer_sampler_sample(s, logits, &tok, &lp);
 *         cinfer_sampler_accept(s, tok);
 *     }
 *     cinfer_sampler_destroy(s);
 *
 * Thread safety: one sampler per request, used by one thread at a time.
 * Different samplers may be used from different threads at once (no shared
 * state). cinfer_sampler_argmax is pure.
 */
#ifndef CINFER_SAMPLER_H
#define CINFER_SAMPLER_H

#include <stdint.h>

#include "../common/status.h"
#include "../kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_sampler cinfer_sampler;

/* Most top entries cinfer_logprobs can hold (OpenAI's and vLLM's limit). */
#define CINFER_SAMPLER_MAX_LOGPROBS 20

/* Largest vocabulary a sampler takes (2^28). */
#define CINFER_SAMPLER_MAX_VOCAB (1 << 28)

/* Temperatures below this are greedy (vLLM's _SAMPLING_EPS). */
#define CINFER_SAMPLER_GREEDY_EPS 1e-5f

/* Which penalties prompt tokens (cinfer_sampler_accept_prompt) feed. */
typedef enum {
    CINFER_PENALTY_PROMPT_REPETITION = 0, /* repetition only (vLLM) */
    CINFER_PENALTY_PROMPT_NONE = 1,       /* none: prompt ignored */
    CINFER_PENALTY_PROMPT_ALL = 2,        /* all three, as if generated
                                             (llama.cpp when it is fed the
                                             prompt) */
} cinfer_penalty_prompt;

typedef struct {
    int32_t token; /* vocabulary id, in [0, n_vocab) */
    float bias;    /* added to the logit; -INFINITY bans the token */
} cinfer_logit_bias;

typedef struct {
    int32_t n_vocab;          /* logits row length, in [1, 2^28];
                                 required (0 = unset, rejected) */
    float temperature;        /* softmax temperature, >= 0; below 1e-5
                                 (0 included) = greedy argmax; default 1 */
    int32_t top_k;            /* keep the k most likely tokens, >= 0;
                                 0 = off (so is k >= n_vocab) */
    float top_p;              /* keep the smallest most-likely set holding
                                 this much probability, in (0, 1]; 1 = off */
    float min_p;              /* drop tokens below min_p times the top
                                 token's probability, in [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; logits of seen tokens are divided by
                                 it when > 0, else multiplied; 1 = off */
    float presence_penalty;   /* in [-2, 2]; subtracted once from the logit
                                 of each counted token; 0 = off */
    float frequency_penalty;  /* in [-2, 2]; subtracted per occurrence of a
                                 counted token; 0 = off */
    int32_t penalty_last_n;   /* tokens, >= 0: penalties see only the last n
                                 accepted (prompt + output); 0 = all (vLLM) */
    cinfer_penalty_prompt penalty_prompt; /* what prompt tokens count for;
                                 0 = repetition only (vLLM) */
    uint64_t seed;            /* the draws' key; every value (0 too) is a seed:
                                 the caller draws one when a request has
                                 none */
    int32_t n_logprobs;       /* top entries reported in cinfer_logprobs, in
                                 [0, 20]; 0 = only the chosen token's */
    int32_t min_tokens;       /* tokens, >= 0: until this many were accepted
                                 the eog_tokens are masked; 0 = off */
    const int32_t *eog_tokens; /* ids masked under min_tokens (EOS, stop
                                 ids); copied at create; NULL = none */
    int32_t n_eog_tokens;     /* entries in eog_tokens, >= 0 */
    const cinfer_logit_bias *logit_bias; /* copied at create; NULL = none;
                                 a token may appear more than once (the
                                 biases add up) */
    int32_t n_logit_bias;     /* entries in logit_bias, >= 0 */
} cinfer_sampler_params;

/* Defaults: temperature 1, every filter and penalty off, vLLM penalty
 * semantics, seed 0, n_vocab 0 (the caller must set it). */
cinfer_sampler_params cinfer_sampler_default_params(void);

/* Log-probabilities under the raw distribution (log-softmax of the row as
 * given, before any processing). A value type the caller owns. */
typedef struct {
    float logprob;  /* the chosen token's log-probability */
    int32_t rank;   /* the chosen token's rank, 1 = most likely (ties
                       ordered by id) */
    int32_t n_top;  /* entries filled below: min(n_logprobs, n_vocab) */
    int32_t top_tokens[CINFER_SAMPLER_MAX_LOGPROBS];  /* most likely first,
                                                         ties by lower id */
    float top_logprobs[CINFER_SAMPLER_MAX_LOGPROBS];  /* their logprobs */
} cinfer_logprobs;

/* One entry of the final sampling distribution. */
typedef struct {
    int32_t token;
    float p; /* probability after every stage, renormalized; > 0 */
} cinfer_token_prob;

/* Validates every field (CINFER_E_INVALID_ARG naming it, e.g. "top_p must be
 * in (0, 1]") and creates a sampler with empty history. Copies eog_tokens and
 * logit_bias; `p` need not outlive the call. */
cinfer_status cinfer_sampler_create(const cinfer_sampler_params *p,
                                    cinfer_sampler **out);
/* NULL is fine. */
void cinfer_sampler_destroy(cinfer_sampler *s);

/* The parameters the sampler was created with (eog_tokens and logit_bias
 * point at the sampler's copies). Owned by the sampler. */
const cinfer_sampler_params *cinfer_sampler_get_params(const cinfer_sampler *s);

/* Records the prompt for the penalties, as penalty_prompt says. Call once
 * before the first sample (more calls append). Rejects ids outside
 * [0, n_vocab) with no change; CINFER_E_NOMEM leaves the history as it was. */
cinfer_status cinfer_sampler_accept_prompt(cinfer_sampler *s,
                                           const int32_t *tokens, int32_t n);

/* Records one output token: it counts for min_tokens and for every penalty.
 * O(1) amortized. sample() does not record what it returns, so the engine
 * decides what the sequence really took. */
cinfer_status cinfer_sampler_accept(cinfer_sampler *s, int32_t token);

/* Output tokens accepted since create or reset. */
int32_t cinfer_sampler_n_accepted(const cinfer_sampler *s);

/* A mask for the next sample(), candidates() or process_logits() call
 * only: tokens with allowed[t] == 0 get -INFINITY in stage 1, with
 * logit_bias (a grammar's mask, engine/grammar.h). allowed has n_vocab
 * entries and is borrowed until that call returns; logprobs stay the raw
 * row's. NULL = no mask. */
void cinfer_sampler_set_allowed(cinfer_sampler *s, const uint8_t *allowed);

/* Picks the next token from `logits` [n_vocab] (stages 1-9 above) and, if
 * `lp` is not NULL, fills it for that token. The row is used as scratch and
 * holds its original values again when the call returns. Logits must be
 * finite or -INFINITY (NaN or +INFINITY: CINFER_E_RANGE naming the index);
 * if processing leaves every token at -INFINITY (everything banned or
 * masked) the call fails with CINFER_E_RANGE. A failed call changes nothing
 * (the draw index does not advance). */
cinfer_status cinfer_sampler_sample(cinfer_sampler *s, float *logits,
                                    int32_t *token, cinfer_logprobs *lp);

/* The distribution sample() would draw from for this row, without drawing:
 * writes the kept tokens to `out` (most likely first, ties by lower id) and
 * their count to *n_out. Needs room for every kept token: if `cap` is too
 * small it fails with CINFER_E_RANGE and *n_out says how many are needed (at
 * most n_vocab). Greedy rows give one token with p = 1. The row is restored
 * as in sample(); the sampler does not change. */
cinfer_status cinfer_sampler_candidates(cinfer_sampler *s, float *logits,
                                        cinfer_token_prob *out, int32_t cap,
                                        int32_t *n_out);

/* Applies stages 1-3 (logit_bias, min_tokens masking, penalties) to the row
 * in place and leaves it so, for callers that want processed logits. */
cinfer_status cinfer_sampler_process_logits(cinfer_sampler *s, float *logits);

/* Fills `lp` for `token` from the raw row `logits` [n_vocab] (log-softmax,
 * the top n_logprobs entries, the rank): what sample() reports, usable for
 * prompt logprobs. Does not change the sampler. */
cinfer_status cinfer_sampler_logprobs(const cinfer_sampler *s,
                                      const float *logits, int32_t token,
                                      cinfer_logprobs *lp);

/* 1 if the next sample() has nothing to apply and is greedy: temperature
 * below 1e-5, no logit_bias, no mask set for it, no penalty, min_tokens
 * reached (or no eog_tokens). Its token is then the row's argmax, which a
 * backend can choose where the logits are (kernels/backend.h,
 * cinfer_backend_greedy and cinfer_backend_choose), and
 * cinfer_sampler_take_code stands in for sample(). Pure. */
int cinfer_sampler_plain_greedy(const cinfer_sampler *s);

/* How a backend can make the next sample()'s choice where the logits are,
 * once cinfer_sampler_edits' entries are applied there: 1 greedy
 * (cinfer_backend_greedy, or _choose with inv_t 0), 2 a draw
 * (cinfer_backend_choose with cinfer_sampler_draw_params), 0 not at all
 * (a grammar's mask set for it, or a token biased twice in logit_bias,
 * whose biases add one after another); plain_greedy is case 1 with
 * nothing to apply. Pure. */
int cinfer_sampler_backend_choice(const cinfer_sampler *s);

/* The most entries cinfer_sampler_edits writes for the next row (0 when
 * stages 1-3 have nothing to apply), or -1 where backend_choice is 0.
 * Pure. */
int64_t cinfer_sampler_edits_bound(const cinfer_sampler *s);

/* Stages 1-3 of the next sample() (logit_bias, min_tokens' end-of-
 * generation mask, the repetition, frequency and presence penalties) as
 * kernels/backend.h's entries for one row: one entry a token, its
 * operations in sample()'s order, row `row`, so that a backend's
 * cinfer_backend_edit_logits leaves the row sample() would draw from, the
 * same bits. out: room for edits_bound entries. Returns how many it wrote,
 * or -1 (nothing written) where backend_choice is 0. Pure. */
int64_t cinfer_sampler_edits(const cinfer_sampler *s, int32_t row,
                             cinfer_logit_edit *out);

/* For a sampler whose backend_choice is 2: what the backend's draw needs
 * (backend.h's cinfer_draw): inv_t = 1 / temperature, min_w = min_p, top_k
 * (0 when off or >= n_vocab), top_p, and u, the draw's uniform in [0, 1)
 * as sample() would take it; the draw index advances as sample() advances
 * it (also when the row then turns out bad, where sample() would not have
 * drawn). CINFER_E_INVALID_ARG, and nothing changed, for any other
 * sampler. */
cinfer_status cinfer_sampler_draw_params(cinfer_sampler *s, cinfer_draw *d);

/* A token's weight as every pass of sample() takes it: e^((logit - max) *
 * inv_t) from the sampler's own exp (plain IEEE single arithmetic, no
 * libm: the same bits on every machine), 0 below min_w. logit <= max. A
 * backend that draws (kernels/cuda/sample.cu) gives these bits; the
 * tests compare. Pure. */
float cinfer_sampler_weight(float logit, float max, float inv_t, float min_w);

/* sample() for a row the backend chose from (backend_choice not 0; its
 * edits applied) from the code the backend gave for it (kernels/backend.h:
 * cinfer_backend_greedy, cinfer_backend_choose): the token, or sample()'s
 * error for that row (CINFER_E_RANGE: the NaN or +inf entry named, or
 * every logit -inf), with the same message where the sampler had nothing
 * to apply. After edits, a row with more than one NaN or +inf may name
 * another of them than sample() would (the first in the row, where
 * sample() checks the edited entries first), and an entry an edit pushed
 * past the float range is called "logits[i]", not "processed logits[i]".
 * CINFER_E_INVALID_ARG where backend_choice is 0 or the code is out of
 * range. Like sample(), it does not accept the token. */
cinfer_status cinfer_sampler_take_code(cinfer_sampler *s, int32_t code,
                                       int32_t *token);

/* What cinfer_sampler_logprobs computes its answer from, as backend.h's
 * cinfer_row_logprobs (padding zeroed): what a backend's
 * cinfer_backend_logprobs must find, for the tests to compare bit for bit.
 * Its errors. */
cinfer_status cinfer_sampler_logprob_parts(const cinfer_sampler *s,
                                           const float *logits, int32_t token,
                                           cinfer_row_logprobs *r);

/* sample()'s logprobs for `token` from the parts a backend found in the
 * raw row (kernels/backend.h, cinfer_backend_logprobs, asked for with this
 * sampler's n_logprobs): the log and the subtractions of sample()'s own
 * log-softmax, so the same bits as sample() gives for that row.
 * CINFER_E_INVALID_ARG, lp unchanged, where r cannot be such a row's
 * (n_top not min(n_logprobs, n_vocab), a sum below 1, ids out of range). */
cinfer_status cinfer_sampler_take_logprobs(const cinfer_sampler *s,
                                           const cinfer_row_logprobs *r,
                                           int32_t token, cinfer_logprobs *lp);

/* Back to the state right after create: history, accepted count and draw
 * index cleared (so the draws replay from position 0). Keeps the
 * allocations. */
void cinfer_sampler_reset(cinfer_sampler *s);

/* Index of the largest of logits[0..n), the lowest such index on ties
 * (-0.0 equals +0.0); NaN entries are never chosen. -1 if n <= 0 or every
 * entry is NaN. Pure, thread-safe. */
int32_t cinfer_sampler_argmax(const float *logits, int32_t n);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SAMPLER_H */
