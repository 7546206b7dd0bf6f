/*
 * reflection.c - grpc.reflection.v1 and v1alpha ServerReflectionInfo, the
 * bidirectional stream grpcurl and other tools use to learn the services.
 *
 * A ping-pong on the STEP operation: receive a request, send its answer
 * (reflection_index.c builds it from the descriptor set embedded at build
 * time), receive the next; when the client half-closes, send OK. One
 * request is answered at a time, which is all the protocol needs.
 */
#include <stdlib.h>

#include "server/server_impl.h"

static void refl_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    if (!c->request_id[0])
        cinfer_call_set_request_id(c, NULL);
    if (!msg) {
        cinfer_call_send_status(c, OP_STEP, NULL, CINFER_OK, NULL);
        return;
    }
    uint8_t *req, *resp = NULL;
    size_t len, resp_len = 0;
    cinfer_status rst = cinfer_call_read(c, msg, &req, &len);
    grpc_byte_buffer_destroy(msg);
    if (rst != CINFER_OK) {
        cinfer_call_send_status(c, OP_STEP, NULL, rst, cinfer_last_error());
        return;
    }
    cinfer_status st =
        cinfer_refl_answer(c->srv->refl, req, len, &resp, &resp_len);
    free(req);
    if (st != CINFER_OK) {
        cinfer_call_send_status(c, OP_STEP, NULL, st, cinfer_last_error());
        return;
    }
    cinfer_call_send_message(c, OP_STEP, cinfer_bb_wrap(resp, resp_len));
}

static void refl_on_sent(srv_call *c, int ok)
{
    if (ok)
        cinfer_call_recv(c);
}

const rpc_method cinfer_rpc_reflection_v1 = {
    .path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    .kind = RPC_REFLECTION,
    .on_message = refl_on_message,
    .on_sent = refl_on_sent,
};

const rpc_method cinfer_rpc_reflection_v1alpha = {
    .path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    .kind = RPC_REFLECTION,
    .on_message = refl_on_message,
    .on_sent = refl_on_sent,
};
