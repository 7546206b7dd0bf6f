/*
 * server.h - the cinfer gRPC server (gRPC core C API, protobuf-c).
 *
 * Serves cinfer.v1.Inference (Generate, Tokenize, Detokenize, GetModelInfo),
 * grpc.health.v1.Health (Check, Watch) and server reflection
 * (grpc.reflection.v1 and v1alpha) on one HTTP/2 port.
 *
 * Life of a server, as main.c drives it:
 *
 *     cinfer_server_params sp = cinfer_server_default_params();
 *     sp.listen = "127.0.0.1:50051";
 *     cinfer_server *s;
 *     cinfer_server_create(&sp, &s);       // listening; health NOT_SERVING,
 *                                          // Inference calls UNAVAILABLE
 *     ... load the model, create the engine ...
 *     cinfer_server_attach(s, model, engine);  // health SERVING
 *     ... wait for SIGTERM ...
 *     cinfer_server_drain(s, 30000);       // NOT_SERVING, new calls
 *                                          // UNAVAILABLE, streams finish
 *     cinfer_server_destroy(s);            // cancels what is left, joins
 *     cinfer_engine_destroy(engine); cinfer_model_destroy(model);
 *
 * Threads: `grpc_threads` threads each poll their own completion queue and
 * run the state machines of the calls bound to it; the engine thread feeds
 * Generate streams through a per-call sink (see generate.c). No call ever
 * blocks a completion-queue thread.
 *
 * Ownership: the model and the engine are borrowed; they must outlive
 * cinfer_server_destroy.
 *
 * Thread safety: create/attach/drain/destroy are called by one thread (the
 * main thread); cinfer_server_port may be called from any thread.
 */
#ifndef CINFER_SERVER_H
#define CINFER_SERVER_H

#include <stdint.h>

#include "common/status.h"
#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_server cinfer_server;

typedef struct {
    const char *listen;             /* "HOST:PORT" ("[::1]:PORT" for IPv6);
                                       port 0 = a free port (see
                                       cinfer_server_port); NULL =
                                       "127.0.0.1:50051" */
    int grpc_threads;               /* completion-queue threads; 0 = 2 */
    int max_receive_message_bytes;  /* largest request message; larger ones
                                       fail with RESOURCE_EXHAUSTED; 0 =
                                       4 MiB */
    int default_max_tokens;         /* max_tokens when a request leaves it
                                       unset; 0 = 256 */
    int max_seqs;                   /* reported in GetModelInfo (the
                                       engine's limit); 0 = unknown */
    int max_batched_tokens;         /* reported in GetModelInfo; 0 =
                                       unknown */
} cinfer_server_params;

cinfer_server_params cinfer_server_default_params(void);

/* Binds the address and starts the completion-queue threads. Until attach,
 * health reports NOT_SERVING and Inference calls get UNAVAILABLE ("model
 * is loading"); reflection already works. Errors: CINFER_E_INVALID_ARG (bad
 * params), CINFER_E_IO (the address cannot be bound), CINFER_E_NOMEM. */
cinfer_status cinfer_server_create(const cinfer_server_params *p,
                                   cinfer_server **out);

/* The bound port (useful with port 0). */
int cinfer_server_port(const cinfer_server *s);

/* Starts serving the model through the engine: health SERVING. Reads the
 * model's chat template. Call once. Errors: CINFER_E_INVALID_ARG (NULL
 * model or engine, or called twice). */
cinfer_status cinfer_server_attach(cinfer_server *s, cinfer_model *model,
                                   cinfer_engine *engine);

/* Graceful stop, first half: health goes NOT_SERVING (Watch streams are
 * told), new calls other than health and reflection get UNAVAILABLE, and
 * running Generate streams are waited for, at most timeout_ms (< 0 = no
 * limit). Returns the number of streams still running when it gave up
 * (they are cancelled by destroy), 0 if all finished. */
int cinfer_server_drain(cinfer_server *s, int64_t timeout_ms);

/* Stops the server: cancels the engine requests of calls still running
 * (they end with UNAVAILABLE), cancels every other call, waits until every
 * call's state is freed, joins the threads. NULL is fine. */
void cinfer_server_destroy(cinfer_server *s);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_H */
