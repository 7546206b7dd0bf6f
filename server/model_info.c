/*
 * model_info.c - cinfer.v1.Inference/GetModelInfo (unary).
 *
 * The served model's shape, the backend, the engine's live counters and the
 * server's own. The counters let clients (and the integration tests) see
 * that a cancelled or expired call released its engine request: running,
 * waiting and kv_blocks_used return to their idle values.
 */
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"

#ifndef CINFER_VERSION
#define CINFER_VERSION "0.1.0"
#endif

static cinfer_status model_info(srv_call *c, const uint8_t *req, size_t len,
                                grpc_byte_buffer **out)
{
    cinfer_server *s = c->srv;
    cinfer_call_set_request_id(c, NULL);
    Cinfer__V1__GetModelInfoRequest *r =
        cinfer__v1__get_model_info_request__unpack(NULL, len, req);
    if (!r)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "GetModelInfoRequest does not decode");
    cinfer__v1__get_model_info_request__free_unpacked(r, NULL);

    const cinfer_model_info *mi = cinfer_model_get_info(s->model);
    cinfer_backend *be = cinfer_model_backend(s->model);
    cinfer_engine_stats es;
    memset(&es, 0, sizeof es);
    cinfer_engine_get_stats(s->engine, &es);

    Cinfer__V1__GetModelInfoResponse resp =
        CINFER__V1__GET_MODEL_INFO_RESPONSE__INIT;
    Cinfer__V1__Backend backend = CINFER__V1__BACKEND__INIT;
    Cinfer__V1__EngineStats stats = CINFER__V1__ENGINE_STATS__INIT;
    Cinfer__V1__ServerStats server = CINFER__V1__SERVER_STATS__INIT;
    char *devices[1];

    resp.name = (char *)mi->name;
    resp.architecture = (char *)mi->arch;
    resp.parameters = mi->n_params;
    resp.context_length = mi->n_ctx;
    resp.trained_context_length = mi->n_ctx_train;
    resp.vocab_size = s->limits.n_vocab;
    resp.quantization = (char *)mi->quant;
    resp.has_chat_template = mi->has_chat_template != 0;
    resp.chat_template_format =
        (char *)cinfer_chat_format_name(s->chat.format);
    resp.layers = mi->n_layer;
    resp.embedding_length = mi->n_embd;
    resp.heads = mi->n_head;
    resp.kv_heads = mi->n_head_kv;
    resp.server_version = CINFER_VERSION;
    resp.max_seqs = s->params.max_seqs;
    resp.max_batched_tokens = s->params.max_batched_tokens;
    resp.kv_block_size = mi->block_size;

    backend.name = (char *)(be ? cinfer_backend_name(be) : "");
    if (be) {
        devices[0] = (char *)cinfer_backend_device_desc(be);
        backend.n_devices = 1;
        backend.devices = devices;
    }
    backend.weights_bytes = mi->weights_held_bytes;
    backend.activation_bytes = mi->activation_bytes;
    backend.scratch_bytes = mi->scratch_bytes;
    backend.kv_cache_bytes = mi->kv_bytes;
    backend.memory_budget_bytes = mi->budget_bytes;
    /* From the engine's published stats: the backend itself belongs to
     * the engine thread. */
    backend.device_lost = es.device_lost != 0;
    resp.backend = &backend;

    stats.running = es.running;
    stats.waiting = es.waiting;
    stats.kv_blocks_total = es.kv_blocks_total;
    stats.kv_blocks_used = es.kv_blocks_used;
    stats.kv_blocks_free = es.kv_blocks_total - es.kv_blocks_used;
    stats.kv_blocks_cached = es.kv_blocks_cached;
    stats.requests_finished = es.requests_finished;
    stats.requests_cancelled = es.requests_cancelled;
    stats.preemptions = es.preemptions;
    stats.prompt_tokens = es.prompt_tokens;
    stats.cached_tokens = es.cached_tokens;
    stats.generated_tokens = es.generated_tokens;
    stats.steps = es.steps;
    stats.greedy_steps = es.greedy_steps;
    stats.drawn_steps = es.drawn_steps;
    stats.edited_steps = es.edited_steps;
    stats.logprob_steps = es.logprob_steps;
    stats.graph_steps = es.graph_steps;
    stats.graph_recorded_steps = es.graph_recorded;
    resp.stats = &stats;

    pthread_mutex_lock(&s->mu);
    /* This call itself is open; leave it out. */
    server.calls_open = s->calls_open - 1;
    server.generate_open = s->generate_open;
    server.calls_total = s->calls_total;
    pthread_mutex_unlock(&s->mu);
    server.draining = atomic_load(&s->state) >= SERVER_DRAINING;
    resp.server = &server;

    *out = cinfer_bb_pack(&resp.base);
    if (!*out)
        return cinfer_set_error(CINFER_E_NOMEM, "model info: no memory");
    return CINFER_OK;
}

static void model_info_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_call_unary(c, msg, model_info);
}

const rpc_method cinfer_rpc_model_info = {
    .path = "/cinfer.v1.Inference/GetModelInfo",
    .kind = RPC_MODEL_INFO,
    .needs_model = 1,
    .on_message = model_info_on_message,
};
