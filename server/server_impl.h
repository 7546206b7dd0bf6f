/*
 * server_impl.h - internals shared by the server's files: the server
 * struct, the per-call state machine, and the helpers every RPC uses to
 * receive and reply.
 *
 * The call state machine. Every incoming call is one heap srv_call; its
 * address, with the operation in the low two bits, is the completion-queue
 * tag of each batch it starts:
 *
 *   OP_STEP   the call's sequential batches: accept (request_call), receive
 *             a message, send a reply message, send the status
 *   OP_CLOSE  RECV_CLOSE_ON_SERVER, posted as soon as the call is accepted;
 *             it completes when the call ends, with cancelled=1 when the
 *             client went away or the deadline passed
 *   OP_SEND   stream messages started outside the STEP sequence (Generate
 *             chunks from the engine thread, Health.Watch updates)
 *
 *   ACCEPTING --ok--> RECEIVING --message--> (method) --> FINISHING --> DONE
 *                          ^                     |
 *                          +----- SENDING <------+   (reflection's ping-pong)
 *   Generate:  RECEIVING --> STREAMING (sink sends OP_SEND batches, the last
 *              one carries the status) --> DONE
 *
 * Lifetime: `refs` counts the batches in flight plus the engine's hold on a
 * Generate call (from submit until its FINISH event). A completion handler
 * keeps its batch's reference until it returns. call_unref frees the call
 * through call_free, the one function that frees a srv_call.
 *
 * Locks: srv->mu guards the server's counters and lists; c->mu guards the
 * per-method state that the engine thread or the main thread touch (the
 * Generate sink and its admission ticket, a Watch's send state). Order:
 * srv->mu before c->mu before the admission object's own lock. No engine
 * function is called with srv->mu or c->mu held (the engine thread frees
 * calls, which takes srv->mu).
 */
#ifndef CINFER_SERVER_IMPL_H
#define CINFER_SERVER_IMPL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/grammar_cache.h"
#include "server/chat.h"
#include "server/orca.h"
#include "server/reflection_index.h"
#include "server/request.h"
#include "server/response_cache.h"
#include "server/server.h"
#include "server/api_keys.h"
#include "server/conn_limit.h"
#include "server/tls.h"
#include "server/trace.h"
#include "server/validate.h"

typedef enum {
    SERVER_LOADING = 0, /* no model yet: Inference calls UNAVAILABLE */
    SERVER_SERVING,
    SERVER_DRAINING,    /* SIGTERM: new Inference calls UNAVAILABLE */
    SERVER_STOPPING,    /* destroy: engine requests cancelled */
} server_state;

typedef enum {
    RPC_UNKNOWN = 0,
    RPC_GENERATE,
    RPC_TOKENIZE,
    RPC_DETOKENIZE,
    RPC_MODEL_INFO,
    RPC_HEALTH_CHECK,
    RPC_HEALTH_WATCH,
    RPC_REFLECTION,     /* v1 and v1alpha: same messages on the wire */
    RPC_ORCA_STREAM,    /* xds.service.orca.v3 out-of-band load reports */
} rpc_kind;

typedef enum {
    CALL_ACCEPTING = 0,
    CALL_RECEIVING,
    CALL_SENDING,
    CALL_STREAMING,
    CALL_FINISHING,
    CALL_DONE,
} call_state;

enum { OP_STEP = 0, OP_CLOSE = 1, OP_SEND = 2 };
#define CALL_OP_MASK ((uintptr_t)3)

typedef struct srv_worker srv_worker;
typedef struct srv_call srv_call;
typedef struct srv_pool srv_pool;
typedef struct srv_emitter srv_emitter;
typedef struct cinfer_watchdog cinfer_watchdog;
typedef struct cinfer_service_times cinfer_service_times;

struct srv_worker {
    cinfer_server *srv;
    grpc_completion_queue *cq;
    pthread_t thread;
    int started;
};

struct srv_call {
    cinfer_server *srv;
    srv_worker *w;
    const struct rpc_method *method; /* NULL until accepted / if unknown */
    call_state state;
    atomic_int refs;
    pthread_mutex_t mu;

    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array request_md;
    grpc_byte_buffer *recv_buf;  /* RECV_MESSAGE target */
    grpc_byte_buffer *step_buf;  /* message of the STEP batch in flight */
    grpc_byte_buffer *send_buf;  /* message of the SEND batch in flight */
    grpc_slice status_details;   /* of the one status batch */
    int has_status_details;
    grpc_metadata trailers[3 + CINFER_TRACE_MD]; /* of the status batch:
                                    a rejection's two, the load report, the
                                    trace echo of a Trailers-Only response
                                    (keys and values owned) */
    size_t n_trailers;
    int close_cancelled;         /* RECV_CLOSE_ON_SERVER result */
    int closed;                  /* RECV_CLOSE_ON_SERVER completed (mu) */
    atomic_int core_ended;       /* gRPC core ended the call (the client
                                    cancelled, the deadline passed): no
                                    status of ours may follow */
    int counted;                 /* its outcome is in the metrics (once) */
    cinfer_api_keys *key_set;    /* the key set it was let in with (a
                                    reference), NULL = none */
    int key_index;               /* its key in key_set */
    int recv_listed;             /* on srv->recv_list, waiting for its
                                    first message (srv->mu) */
    int64_t recv_deadline_ns;    /* when that wait ends it */
    atomic_int recv_expired;     /* ended for it (DEADLINE_EXCEEDED) */
    srv_call *rnext, *rprev;     /* srv->recv_list links (srv->mu) */
    srv_call *pool_next;         /* request-thread queue link (pool.c) */
    grpc_byte_buffer *pool_msg;  /* the message it carries there */
    srv_call *emit_next;         /* emission-thread queue link (emit.c) */
    int initial_md_sent;
    int accepted;                /* counted in calls_open */
    int listed;                  /* on srv->generate_list / watch_list */
    srv_call *next, *prev;

    char request_id[CINFER_MAX_REQUEST_ID_BYTES + 1];
    cinfer_trace trace;          /* the call's traceparent (trace.h) */
    grpc_metadata initial_md[CINFER_TRACE_MD]; /* the trace echo in the
                                    initial metadata (values owned) */
    size_t n_initial_md;
    int64_t start_ns;            /* CLOCK_MONOTONIC at accept */
    void *rpc;                   /* the method's state; its free hook
                                    releases it */
};

/* A method: how its calls are driven. Hooks run on the call's worker
 * thread unless noted. */
typedef struct rpc_method {
    const char *path;          /* "/cinfer.v1.Inference/Generate" */
    rpc_kind kind;
    int needs_model;           /* UNAVAILABLE while loading or draining */
    int off_cq;                /* on_message runs on a request thread
                                  (decoding, tokenizing: work that grows
                                  with the request), not on the
                                  completion-queue thread */
    /* A request message arrived; msg NULL = the client half-closed with no
     * (more) messages. The hook owns msg. */
    void (*on_message)(srv_call *c, grpc_byte_buffer *msg);
    /* A STEP message send (without status) completed. Optional. */
    void (*on_sent)(srv_call *c, int ok);
    /* An OP_SEND batch completed. Optional. */
    void (*on_send)(srv_call *c, int ok);
    /* RECV_CLOSE_ON_SERVER completed (c->close_cancelled says how).
     * Optional. */
    void (*on_close)(srv_call *c);
    /* Releases c->rpc; runs on whichever thread drops the last reference.
     * Optional. */
    void (*free_rpc)(srv_call *c);
} rpc_method;

struct cinfer_server {
    cinfer_server_params params;
    char *listen;
    grpc_server *grpc;
    srv_worker *workers;
    int n_workers;
    int port;
    atomic_int state;            /* server_state */
    atomic_uint next_worker;

    /* Set once by attach, before state becomes SERVING. */
    cinfer_model *model;
    cinfer_engine *engine;
    const cinfer_tokenizer *tk;
    cinfer_request_limits limits;
    cinfer_grammar_cache *grammars; /* every request's compiled grammar */
    cinfer_rcache *rcache;       /* answers of deterministic requests
                                    (response_cache.h); NULL = off */
    cinfer_chat_template chat;

    cinfer_refl_index *refl;
    cinfer_tls *tls;             /* NULL = plaintext (tls.h) */
    srv_pool *pool;              /* request threads; NULL = none (pool.c) */
    srv_emitter *emitter;        /* the Generate streams' sends; NULL = on
                                    the engine's thread (emit.c) */
    pthread_mutex_t keys_mu;
    cinfer_api_keys *keys;       /* current key set (keys_mu); NULL = no
                                    keys asked (api_keys.h) */

    /* Resilience (fixed at create). */
    cinfer_admission *adm;       /* NULL = admission off */
    cinfer_metrics *metrics;     /* borrowed; NULL = none */
    cinfer_orca *orca;           /* ORCA load reports (orca.c) */
    struct cinfer_http *http;    /* the OpenAI-compatible front end
                                    (http.c); NULL = off */

    /* Each owned by the file that defines it. */
    cinfer_conn_limit *conns;    /* connection caps and the descriptor
                                    reserve (conn_limit.h) */
    cinfer_watchdog *wd;         /* the timer thread and the health it
                                    watches (watchdog.c) */
    cinfer_service_times *svc;   /* the idle service-time bound (admit.c) */
    int health_reported;         /* last health notified (the watchdog's
                                    thread, in health_hook) */

    pthread_mutex_t mu;
    pthread_cond_t cv;           /* counters below changed */
    int calls_live;              /* srv_call structs allocated */
    int calls_open;              /* accepted calls not yet freed */
    int generate_open;           /* Generate calls admitted, not freed */
    uint64_t calls_total;
    srv_call *generate_list;
    srv_call *watch_list;
    srv_call *recv_list;         /* calls waiting for their first message
                                    (conn.receive_timeout_ms) */
    int shutdown_done;
    char shutdown_tag;           /* its address tags the shutdown event */
    atomic_ullong next_request_seq;
};

/* ---- helpers (server.c) ------------------------------------------------ */

int64_t cinfer_server_now_ns(void);

void cinfer_call_ref(srv_call *c);
void cinfer_call_unref(srv_call *c);

/* A tag for one of the call's operations. */
static inline void *cinfer_call_tag(srv_call *c, int op)
{
    return (void *)((uintptr_t)c | (uintptr_t)op);
}

/* Posts RECV_MESSAGE (OP_STEP); state RECEIVING. */
void cinfer_call_recv(srv_call *c);
/* Sends a message (with the initial metadata the first time) without
 * status, on `op` (OP_STEP: state SENDING, on_sent follows; OP_SEND:
 * on_send follows). Takes ownership of msg. Returns 0 if the batch could
 * not start (the call is gone). */
int cinfer_call_send_message(srv_call *c, int op, grpc_byte_buffer *msg);
/* Sends {initial metadata if not yet sent, msg if not NULL, status} on
 * `op`; the gRPC code comes from cinfer_server_grpc_status(st) and
 * `details` is the status message. Takes ownership of msg. Returns 0 if
 * the batch could not start. On OP_STEP the state becomes FINISHING. */
int cinfer_call_send_status(srv_call *c, int op, grpc_byte_buffer *msg,
                            cinfer_status st, const char *details);

/* Copies a received message into one malloc'd buffer (*out, *len; free
 * it). Returns 0 on allocation failure. A compressed buffer is copied as
 * it is (see cinfer_call_read). */
int cinfer_bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len);

/* A call's request message as one malloc'd buffer: a compressed one (gRPC
 * core's decompression is off) inflated within max_receive_message_bytes
 * (wire.h). Errors, with the message set: CINFER_E_EXHAUSTED (inflates
 * past the limit), CINFER_E_INVALID_ARG (does not inflate),
 * CINFER_E_UNSUPPORTED (an encoding the server does not know),
 * CINFER_E_NOMEM. */
cinfer_status cinfer_call_read(srv_call *c, grpc_byte_buffer *bb,
                               uint8_t **out, size_t *len);
/* Wraps a malloc'd buffer (taking ownership) as a byte buffer. */
grpc_byte_buffer *cinfer_bb_wrap(uint8_t *data, size_t len);
/* Packs a protobuf-c message into a byte buffer; NULL when out of
 * memory. */
grpc_byte_buffer *cinfer_bb_pack(const ProtobufCMessage *m);

/* What a rejection adds to its status: the pushback (trailer
 * grpc-retry-pushback-ms and a google.rpc.RetryInfo in the
 * grpc-status-details-bin google.rpc.Status), and for rate limits a
 * google.rpc.QuotaFailure. */
typedef struct {
    cinfer_reject reason;       /* counted in the rejection metrics unless
                                   CINFER_REJECT_NONE (e.g. "loading") */
    int64_t retry_after_ms;     /* >= 0 */
    const char *quota_subject;  /* QuotaFailure subject; NULL = none */
    const char *quota_desc;     /* its description */
} cinfer_pushback;

/* cinfer_call_send_status, plus the rejection's trailers when pb is not
 * NULL. Sent before any message, SEND_INITIAL_METADATA and
 * SEND_STATUS_FROM_SERVER go in one batch: a Trailers-Only response. */
int cinfer_call_send_status_ex(srv_call *c, int op, grpc_byte_buffer *msg,
                               cinfer_status st, const char *details,
                               const cinfer_pushback *pb);

/* Serializes a google.rpc.Status {code, message, details: RetryInfo,
 * QuotaFailure if pb names a subject} (rejection.c). Returns 0 when out of
 * memory. */
int cinfer_rpc_status_pack(int grpc_code, const char *message,
                           const cinfer_pushback *pb, grpc_slice *out);

/* Counts, once, a call that gRPC core ended without a status of ours:
 * under CANCELLED, or DEADLINE_EXCEEDED when its deadline passed. */
void cinfer_call_count_ended(srv_call *c);

/* 1 when the call can no longer carry a status of ours: the core ended it
 * (RECV_CLOSE_ON_SERVER came back cancelled) or its deadline passed (the
 * core ends it with DEADLINE_EXCEEDED itself). */
int cinfer_call_ended_by_core(srv_call *c);

/* The name of the call's API key, or NULL. */
const char *cinfer_call_key_name(const srv_call *c);

/* Logs a rejected or failed call (info level for client errors, warn for
 * server faults). */
void cinfer_call_log_status(srv_call *c, cinfer_status st,
                            const char *details);

/* The method's short name ("Generate"), for metrics; "unknown" when the
 * call has no method. */
const char *cinfer_call_method_name(const srv_call *c);

/* Assigns c->request_id: the client's id if given, else "req-<n>". */
void cinfer_call_set_request_id(srv_call *c, const char *client_id);

/* ---- request threads (pool.c) ------------------------------------------
 * The work of a request that grows with its size (copying and decoding a
 * 4 MB message, tokenizing it, admitting and submitting it) runs on a few
 * threads of its own at a lower priority (nice +10; small requests have a
 * thread of normal priority of their own), so that the
 * completion-queue threads stay free for health checks, reflection,
 * rejections and the streams' sends whatever the requests are. */

/* Starts n threads for every request and one more for small ones;
 * queue_max calls may wait for one. */
cinfer_status cinfer_pool_create(int n_threads, int queue_max,
                                 srv_pool **out);
/* Queues c->method->on_message(c, msg) for a request thread, with a
 * reference on the call that the thread drops. Returns 0 when the queue
 * is full (nothing taken). */
int cinfer_pool_push(srv_pool *p, srv_call *c, grpc_byte_buffer *msg);
/* Runs what is queued, then joins the threads. NULL is fine. */
void cinfer_pool_destroy(srv_pool *p);

/* ---- the emission thread (emit.c) ---------------------------------------
 * With server params emit_thread, a Generate stream's sends (its next
 * Chunk, its status) leave the engine's thread: on_event queues the call
 * and one thread packs and sends, while the engine goes on to its next
 * step. */
cinfer_status cinfer_emitter_create(srv_emitter **out);
/* Queues cinfer_generate_emit(c), with a reference on the call that the
 * thread drops. Returns 0 when stopping (nothing taken). */
int cinfer_emitter_post(srv_emitter *e, srv_call *c);
/* Runs what is queued, then joins the thread. NULL is fine. */
void cinfer_emitter_destroy(srv_emitter *e);
/* The emission thread's work for one call (generate.c). */
void cinfer_generate_emit(srv_call *c);

/* ---- methods (one file each) ------------------------------------------- */

extern const rpc_method cinfer_rpc_generate;       /* generate.c */
extern const rpc_method cinfer_rpc_tokenize;       /* tokenize.c */
extern const rpc_method cinfer_rpc_detokenize;     /* tokenize.c */
extern const rpc_method cinfer_rpc_model_info;     /* model_info.c */
extern const rpc_method cinfer_rpc_health_check;   /* health.c */
extern const rpc_method cinfer_rpc_health_watch;   /* health.c */
extern const rpc_method cinfer_rpc_reflection_v1;  /* reflection.c */
extern const rpc_method cinfer_rpc_reflection_v1alpha;

/* Runs a unary method's body: decodes nothing itself; on_message of a
 * unary method calls this with its handler, which fills a packed reply or
 * returns an error (message via cinfer_set_error). */
typedef cinfer_status (*cinfer_unary_fn)(srv_call *c, const uint8_t *req,
                                         size_t len, grpc_byte_buffer **out);
void cinfer_call_unary(srv_call *c, grpc_byte_buffer *msg, cinfer_unary_fn fn);

/* Text (input_case 0; add_special: BOS/EOS as the vocabulary adds them,
 * special-token strings parsed, as cinfer-run does) or chat messages
 * (input_case 1, through the model's template) to token ids; *ids is
 * malloc'd (tokenize.c). */
cinfer_status cinfer_server_encode_input(const cinfer_server *s,
                                         int input_case, const char *text,
                                         const Cinfer__V1__Chat *chat,
                                         int add_special, int32_t **ids,
                                         size_t *n);

/* ---- the request path both front ends share (admit.c) ------------------
 * The one place that decides load refusals: the idle service-time bound,
 * the admission layer (token buckets, breaker, shedder) and the engine's
 * own refusals at submit all end in a cinfer_refusal with the rejection's
 * true reason, which the front end sends in its own framing. */

typedef struct {
    cinfer_status status;      /* the answer's status */
    char message[320];
    cinfer_pushback pb;        /* pb.reason NONE and has_pb 0: a plain
                                  error without pushback */
    int has_pb;
    char subject[160];         /* pb.quota_subject points here */
} cinfer_refusal;

typedef struct {
    const char *client_id;     /* the per-client bucket's key; NULL = none */
    size_t client_id_len;
    cinfer_api_keys *key_set;  /* the caller's key set, NULL = no keys */
    int key_index;
    int priority;
    int64_t tokens;            /* prompt plus max_tokens times samples */
    size_t n_prompt;
    int64_t deadline_ns;       /* hard deadline; 0 = none */
} cinfer_admit_in;

/* Admits (1, *t QUEUED) or refuses (0, *out filled). Call only when s->adm
 * is set. */
int cinfer_server_admit(cinfer_server *s, const cinfer_admit_in *in,
                        int64_t now_ns, cinfer_admission_ticket *t,
                        cinfer_refusal *out);

/* Submits to the engine: CINFER_OK with *id, else *out filled (a refusal
 * for load with its reason and pushback, or the engine's error). With the
 * response cache on (response_cache.h) and d the request's desc, a
 * deterministic request is answered from it when stored: CINFER_OK, *id
 * 0, the engine untouched and *hit the stored answer, which the caller
 * marks as cached and then hands to cinfer_server_replay once its event
 * handler may run (outside the caller's locks); else one that misses is
 * recorded on its way to the engine. d NULL = never cached. */
cinfer_status cinfer_server_submit(cinfer_server *s, const cinfer_gen_desc *d,
                                   const cinfer_request_params *rp,
                                   uint64_t *id, cinfer_rcache_entry **hit,
                                   cinfer_refusal *out);

/* Delivers a hit's events to rp's on_event on this thread, as the engine
 * would (the last is the last sample's FINISH), and releases hit. */
void cinfer_server_replay(cinfer_server *s, cinfer_rcache_entry *hit,
                          const cinfer_request_params *rp);

/* What a generation call's sink keeps for admission and metrics, across
 * its samples. Used under the sink's own lock. */
typedef struct {
    int64_t start_ns;           /* the call's arrival */
    cinfer_frontend frontend;   /* the front end: the metrics' label */
    int admitted;               /* ticket holds an admission */
    cinfer_admission_ticket ticket;
    int started;                /* the first token came (dequeued) */
    int64_t last_token_ns;
    cinfer_reject shed;         /* shed after admission */
    int64_t shed_retry_ms;
    int deadline_is_hard;       /* the engine deadline is a hard one */
    int deadline_passed;        /* the front end saw the deadline pass */
    int aborted;                /* cancelled by the server's shutdown */
    int cached;                 /* answered by the response cache: no
                                   engine work, so none of the engine's
                                   timings, token counts, breaker or
                                   watchdog outcomes */
    int n_samples;              /* FINISH events expected */
    int n_finished;
    cinfer_outcome outcome;     /* the worst of the samples' so far */
} cinfer_gen_track;

void cinfer_gen_track_init(cinfer_gen_track *t, cinfer_frontend fe,
                           int64_t start_ns, int n_samples);
/* A TOKENS event: the first token dequeues the ticket (which may shed the
 * request: *cancel set) and is the TTFT; later ones the ITL. */
void cinfer_gen_track_tokens(cinfer_server *s, cinfer_gen_track *t,
                             const cinfer_engine_event *ev, int64_t now_ns,
                             int *cancel);
/* A FINISH event of one sample; returns 1 for the request's last. */
int cinfer_gen_track_finish(cinfer_server *s, cinfer_gen_track *t,
                            const cinfer_engine_event *ev, int64_t now_ns);
/* Gives the ticket back unused (a request refused after admission). */
void cinfer_gen_track_drop(cinfer_server *s, cinfer_gen_track *t);

/* A generation call of another front end starts holding the engine:
 * counted in generate_open (drain waits for it) when the server serves
 * (1), else 0. _end when it lets go (server.c). */
int cinfer_server_stream_begin(cinfer_server *s);
void cinfer_server_stream_end(cinfer_server *s);

/* A random sampling seed for a request that has none. */
uint64_t cinfer_server_random_seed(void);

/* Health: tells every Watch stream the serving status changed (health.c).
 * Called with srv->mu not held. */
void cinfer_health_notify(cinfer_server *s);

/* Generate: cancels the engine request of every admitted Generate call
 * (server destroy); they end with UNAVAILABLE (generate.c). */
void cinfer_generate_abort_all(cinfer_server *s);

/* Generate: re-checks every queued call against the shedder; the ones it
 * sheds are cancelled in the engine and end with the shed's status and
 * pushback (generate.c; the watchdog calls it). */
void cinfer_generate_check_queued(cinfer_server *s, int64_t now_ns);

/* 1 when health is SERVING: attached, not draining, the engine neither
 * stuck nor faulted, the port accepting connections (and not refusing
 * them for the descriptor reserve). */
int cinfer_server_healthy(const cinfer_server *s);

/* Ends the calls that waited longer than conn.receive_timeout_ms for
 * their request message, with DEADLINE_EXCEEDED (the watchdog calls it;
 * server.c). */
void cinfer_server_expire_receives(cinfer_server *s, int64_t now_ns);

/* Watchdog (watchdog.c): a timer thread, created with the server,
 * started by attach (after the hooks are added), stopped by destroy before
 * the server lets the engine go. Each tick it watches the engine (stuck,
 * device faults, a lost device, the listener) and runs the hooks. */
typedef void (*cinfer_watchdog_hook)(void *user, int64_t now_ns);
cinfer_status cinfer_watchdog_create(cinfer_server *s, cinfer_watchdog **out);
cinfer_status cinfer_watchdog_add_hook(cinfer_watchdog *w,
                                       cinfer_watchdog_hook fn, void *user);
cinfer_status cinfer_watchdog_start(cinfer_watchdog *w);
void cinfer_watchdog_stop(cinfer_watchdog *w);
/* Stops it if it runs. NULL is fine. */
void cinfer_watchdog_destroy(cinfer_watchdog *w);
/* 1 when none of stuck, faulted, device lost, listener dead holds. */
int cinfer_watchdog_healthy(const cinfer_watchdog *w);
/* Logs a change of health with what the watchdog sees. */
void cinfer_watchdog_log_health(const cinfer_watchdog *w, int healthy);

/* A generation request ended: feeds the device-fault run that health
 * watches. fault = a device error; ok = the engine produced output
 * normally. */
void cinfer_watchdog_note_outcome(cinfer_watchdog *w, int fault, int ok);

/* The idle service-time bound (admit.c): lower bounds of the service time
 * to a first token, by prompt size. */
cinfer_status cinfer_service_times_create(cinfer_service_times **out);
void cinfer_service_times_destroy(cinfer_service_times *t);

/* Records the service time to the first token of a request with `tokens`
 * uncached prompt tokens, and bounds from below the one of a new request
 * with `tokens` prompt tokens (0 = nothing known). admit.c. */
void cinfer_service_time_record(cinfer_service_times *t, int64_t tokens,
                                int64_t first_ns);
int64_t cinfer_service_time_min(cinfer_service_times *t, int64_t tokens);

#endif /* CINFER_SERVER_IMPL_H */
