/*
 * tokenize.c - cinfer.v1.Inference/Tokenize and /Detokenize (unary).
 *
 * Both run on a request thread (pool.c), off the completion-queue
 * threads: the tokenizer is immutable and thread-safe, and the work grows
 * with the request size (bounded by the receive limit) and, for
 * Detokenize, by the context length.
 */
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"
#include "server/wire.h"

cinfer_status cinfer_server_encode_input(const cinfer_server *s,
                                         int input_case, const char *text,
                                         const Cinfer__V1__Chat *chat,
                                         int add_special, int32_t **ids,
                                         size_t *n)
{
    if (input_case == 0)
        return cinfer_request_encode_text(s->tk, text, add_special, ids, n);
    return cinfer_chat_encode(&s->chat, s->tk, chat, ids, n);
}

static cinfer_status tokenize(srv_call *c, const uint8_t *req, size_t len,
                              grpc_byte_buffer **out)
{
    cinfer_server *s = c->srv;
    cinfer_call_set_request_id(c, NULL);
    Cinfer__V1__TokenizeRequest *r = NULL;
    cinfer_status ust =
        cinfer_wire_unpack(&cinfer__v1__tokenize_request__descriptor, req, len,
                           (ProtobufCMessage **)&r);
    if (ust != CINFER_OK)
        return ust;
    int32_t *ids = NULL;
    size_t n = 0;
    ProtobufCBinaryData *pieces = NULL;
    cinfer_request_limits lim = s->limits;
    cinfer_status st = cinfer_validate_tokenize(r, &lim);
    if (st != CINFER_OK)
        goto out;
    if (r->input_case == CINFER__V1__TOKENIZE_REQUEST__INPUT_TEXT) {
        int add_special = CINFER_PB_HAS(r, add_special_tokens)
                              ? r->add_special_tokens
                              : 1;
        st = cinfer_server_encode_input(s, 0, r->text, NULL, add_special,
                                        &ids, &n);
    } else {
        st = cinfer_server_encode_input(s, 1, NULL, r->chat, 1, &ids, &n);
    }
    if (st != CINFER_OK)
        goto out;

    Cinfer__V1__TokenizeResponse resp = CINFER__V1__TOKENIZE_RESPONSE__INIT;
    resp.n_token_ids = n;
    resp.token_ids = ids;
    if (r->return_pieces && n) {
        pieces = calloc(n, sizeof *pieces);
        if (!pieces) {
            st = cinfer_set_error(CINFER_E_NOMEM, "tokenize: no memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            const char *b;
            size_t bl;
            st = cinfer_tokenizer_token_piece_special(s->tk, ids[i], &b, &bl);
            if (st != CINFER_OK)
                goto out;
            pieces[i].data = (uint8_t *)b;
            pieces[i].len = bl;
        }
        resp.n_pieces = n;
        resp.pieces = pieces;
    }
    *out = cinfer_bb_pack(&resp.base);
    if (!*out)
        st = cinfer_set_error(CINFER_E_NOMEM, "tokenize: no memory");
out:
    free(pieces);
    free(ids);
    cinfer__v1__tokenize_request__free_unpacked(r, NULL);
    return st;
}

static cinfer_status detokenize(srv_call *c, const uint8_t *req, size_t len,
                                grpc_byte_buffer **out)
{
    cinfer_server *s = c->srv;
    cinfer_call_set_request_id(c, NULL);
    Cinfer__V1__DetokenizeRequest *r = NULL;
    cinfer_status ust =
        cinfer_wire_unpack(&cinfer__v1__detokenize_request__descriptor, req, len,
                           (ProtobufCMessage **)&r);
    if (ust != CINFER_OK)
        return ust;
    char *raw = NULL, *text = NULL;
    cinfer_request_limits lim = s->limits;
    cinfer_status st = cinfer_validate_detokenize(r, &lim);
    if (st != CINFER_OK)
        goto out;
    const int32_t *ids = r->token_ids;
    size_t n_ids = r->n_token_ids;
    /* skip_special drops control tokens; otherwise they show as text. */
    int special = !r->skip_special_tokens;
    size_t cap = n_ids * 16 + 16, got = 0;
    raw = malloc(cap);
    if (!raw) {
        st = cinfer_set_error(CINFER_E_NOMEM, "detokenize: no memory");
        goto out;
    }
    st = cinfer_tokenizer_decode(s->tk, ids, n_ids, special, raw, cap, &got);
    if (st == CINFER_E_RANGE && got > cap) {
        char *r2 = realloc(raw, got);
        if (!r2) {
            st = cinfer_set_error(CINFER_E_NOMEM, "detokenize: no memory");
            goto out;
        }
        raw = r2;
        cap = got;
        st = cinfer_tokenizer_decode(s->tk, ids, n_ids, special, raw, cap,
                                     &got);
    }
    if (st != CINFER_OK)
        goto out;
    text = malloc(got * 3 + 1);
    if (!text) {
        st = cinfer_set_error(CINFER_E_NOMEM, "detokenize: no memory");
        goto out;
    }
    size_t tl = cinfer_utf8_sanitize(raw, got, text);
    text[tl] = '\0';
    Cinfer__V1__DetokenizeResponse resp = CINFER__V1__DETOKENIZE_RESPONSE__INIT;
    resp.text = text;
    *out = cinfer_bb_pack(&resp.base);
    if (!*out)
        st = cinfer_set_error(CINFER_E_NOMEM, "detokenize: no memory");
out:
    free(raw);
    free(text);
    cinfer__v1__detokenize_request__free_unpacked(r, NULL);
    return st;
}

static void tokenize_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_call_unary(c, msg, tokenize);
}

static void detokenize_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_call_unary(c, msg, detokenize);
}

const rpc_method cinfer_rpc_tokenize = {
    .path = "/cinfer.v1.Inference/Tokenize",
    .kind = RPC_TOKENIZE,
    .needs_model = 1,
    .off_cq = 1,
    .on_message = tokenize_on_message,
};

const rpc_method cinfer_rpc_detokenize = {
    .path = "/cinfer.v1.Inference/Detokenize",
    .kind = RPC_DETOKENIZE,
    .needs_model = 1,
    .off_cq = 1,
    .on_message = detokenize_on_message,
};
