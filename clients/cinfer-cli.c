/*
 * cinfer-cli - command-line client of cinfer-server, on gRPC's core C API.
 *
 *   cinfer-cli [--server HOST:PORT] [--json] [--timeout S] COMMAND [options]
 *
 *   generate   --prompt TEXT (or standard input), --chat, --system TEXT,
 *              --message ROLE:TEXT, --tokens 1,2,3; sampling flags
 *              (--max-tokens, --temperature, --top-k, --top-p, ...).
 *              Prints the text as it streams, then a newline.
 *   tokenize   --prompt TEXT (or standard input) [--pieces] [--no-special]
 *   detokenize IDS (comma or space separated) [--skip-special]
 *   info       the model, the backend and the engine's counters
 *   health     [--service NAME]: SERVING / NOT_SERVING
 *
 * --json prints every response message as one line of proto3 JSON.
 * Exit status: 0 when the call succeeded; the gRPC status code (1-16) when
 * it failed (its message goes to stderr); 20 when health is not SERVING;
 * 64 for usage errors.
 *
 * The client is deliberately small: one channel, one pluck completion
 * queue, one call at a time, each batch waited for by its tag.
 */
#include <errno.h>
#include <getopt.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer/v1/cinfer.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "pb_json.h"

#define EXIT_NOT_SERVING 20
#define EXIT_USAGE 64

/* ---------------------------------------------------------------------- */
/* Calls                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    grpc_channel *ch;
    grpc_completion_queue *cq;
    double timeout_s;   /* 0 = no deadline */
} client;

/* Called per response message; returns 0 to stop reading. */
typedef int (*on_message_fn)(void *user, const uint8_t *data, size_t len);

static void wait_tag(client *cl, void *tag)
{
    grpc_completion_queue_pluck(cl->cq, tag,
                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
}

static int read_bb(grpc_byte_buffer *bb, uint8_t **out, size_t *len)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return 0;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    *out = malloc(n ? n : 1);
    if (!*out) {
        grpc_slice_unref(s);
        return 0;
    }
    memcpy(*out, GRPC_SLICE_START_PTR(s), n);
    *len = n;
    grpc_slice_unref(s);
    return 1;
}

/* Runs one call: sends `req`, hands every response to cb, returns the
 * status; *details gets the status message (malloc'd, "" if none). */
static grpc_status_code call_method(client *cl, const char *method,
                                    const ProtobufCMessage *req,
                                    on_message_fn cb, void *user,
                                    char **details)
{
    gpr_timespec deadline =
        cl->timeout_s > 0
            ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                           gpr_time_from_millis((int64_t)(cl->timeout_s * 1000),
                                                GPR_TIMESPAN))
            : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice path = grpc_slice_from_static_string(method);
    grpc_call *call = grpc_channel_create_call(
        cl->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cl->cq, path, NULL, deadline,
        NULL);
    grpc_slice_unref(path);

    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        *details = strdup("out of memory");
        grpc_call_unref(call);
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    protobuf_c_message_pack(req, buf);
    grpc_slice s = grpc_slice_new(buf, n, free);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);

    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice status_details = grpc_empty_slice();

    int tag_send, tag_status, tag_recv;
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    grpc_call_start_batch(call, ops, 4, &tag_send, NULL);

    grpc_op st_op;
    memset(&st_op, 0, sizeof st_op);
    st_op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st_op.data.recv_status_on_client.trailing_metadata = &trailing_md;
    st_op.data.recv_status_on_client.status = &status;
    st_op.data.recv_status_on_client.status_details = &status_details;
    grpc_call_start_batch(call, &st_op, 1, &tag_status, NULL);

    wait_tag(cl, &tag_send);
    for (;;) {
        grpc_byte_buffer *msg = NULL;
        grpc_op r;
        memset(&r, 0, sizeof r);
        r.op = GRPC_OP_RECV_MESSAGE;
        r.data.recv_message.recv_message = &msg;
        if (grpc_call_start_batch(call, &r, 1, &tag_recv, NULL) !=
            GRPC_CALL_OK)
            break;
        wait_tag(cl, &tag_recv);
        if (!msg)
            break;
        uint8_t *data;
        size_t len;
        int ok = read_bb(msg, &data, &len);
        grpc_byte_buffer_destroy(msg);
        int more = ok && cb(user, data, len);
        if (ok)
            free(data);
        if (!more) {
            grpc_call_cancel(call, NULL);
            break;
        }
    }
    wait_tag(cl, &tag_status);

    size_t dl = GRPC_SLICE_LENGTH(status_details);
    *details = malloc(dl + 1);
    if (*details) {
        memcpy(*details, GRPC_SLICE_START_PTR(status_details), dl);
        (*details)[dl] = '\0';
    }
    grpc_slice_unref(status_details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_byte_buffer_destroy(send);
    grpc_call_unref(call);
    return status;
}

static const char *status_name(grpc_status_code c)
{
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
        "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
        "DATA_LOSS", "UNAUTHENTICATED"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : "?";
}

static int report(grpc_status_code st, char *details)
{
    if (st != GRPC_STATUS_OK)
        fprintf(stderr, "cinfer-cli: %s: %s\n", status_name(st),
                details ? details : "");
    free(details);
    return st == GRPC_STATUS_OK ? 0 : (int)st;
}

/* ---------------------------------------------------------------------- */
/* Options                                                                */
/* ---------------------------------------------------------------------- */

typedef struct {
    const char *server;
    int json;
    double timeout_s;
    const char *prompt;
    int chat;
    const char *system;
    const char **messages;   /* "role:content" */
    size_t n_messages;
    const char *tokens;
    const char *request_id;
    /* sampling; has_* = given on the command line */
    int has_max_tokens, has_min_tokens, has_temperature, has_top_k, has_top_p,
        has_min_p, has_rep, has_pres, has_freq, has_seed, has_logprobs,
        has_time_limit, has_no_special;
    long max_tokens, min_tokens, top_k, logprobs, priority, time_limit_ms;
    double temperature, top_p, min_p, rep, pres, freq;
    unsigned long long seed;
    int ignore_eos;
    const char **stops;
    size_t n_stops;
    int32_t stop_ids[64];
    size_t n_stop_ids;
    int pieces;
    int no_special;
    int skip_special;
    int verbose;
    const char *service;
} options;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: cinfer-cli [--server HOST:PORT] [--json] [--timeout S] COMMAND [options]\n"
        "\n"
        "commands:\n"
        "  generate     stream a completion (text printed as it arrives)\n"
        "  tokenize     text to token ids\n"
        "  detokenize   token ids (arguments) to text\n"
        "  info         model, backend and engine counters\n"
        "  health       serving status\n"
        "\n"
        "global options:\n"
        "  --server HOST:PORT       server (default $CINFER_SERVER or 127.0.0.1:50051)\n"
        "  --json                   print each response message as JSON\n"
        "  --timeout S              call deadline in seconds (default none)\n"
        "  -v, --verbose            generate: usage and timings on stderr\n"
        "\n"
        "generate / tokenize input:\n"
        "  -p, --prompt TEXT        the prompt (default: standard input)\n"
        "  --chat                   send the prompt as a user message (chat template)\n"
        "  --system TEXT            chat: a system message first\n"
        "  --message ROLE:TEXT      chat: a message (repeatable; implies --chat)\n"
        "  --tokens IDS             generate: prompt token ids, e.g. 1,2,3\n"
        "  --pieces                 tokenize: also print each token's text\n"
        "  --no-special             tokenize: no BOS/EOS added\n"
        "  --skip-special           detokenize: leave special tokens out\n"
        "\n"
        "generate options (unset = the server's default):\n"
        "  -n, --max-tokens N       tokens to generate\n"
        "  --min-tokens N           no end-of-generation before N tokens\n"
        "  --temperature T          0 = greedy\n"
        "  --top-k K  --top-p P  --min-p P\n"
        "  --repetition-penalty R  --presence-penalty X  --frequency-penalty X\n"
        "  --seed S                 sampling seed\n"
        "  --stop STR               stop string (repeatable)\n"
        "  --stop-token-id ID       stop token (repeatable)\n"
        "  --ignore-eos             keep going past end-of-generation\n"
        "  --logprobs N             report logprobs with N alternatives (0-20)\n"
        "  --priority N             scheduling priority (-100..100)\n"
        "  --time-limit-ms MS       generation time limit\n"
        "  --request-id ID          request id for the server's logs\n"
        "\n"
        "health options:\n"
        "  --service NAME           service to check (default: the server)\n"
        "\n"
        "exit status: 0 ok; 1-16 the gRPC status code of a failed call;\n"
        "20 health not SERVING; 64 usage error\n");
}

enum {
    O_SERVER = 256, O_JSON, O_TIMEOUT, O_CHAT, O_SYSTEM, O_MESSAGE, O_TOKENS,
    O_MIN_TOKENS, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REP, O_PRES, O_FREQ,
    O_SEED, O_STOP, O_STOP_ID, O_IGNORE_EOS, O_LOGPROBS, O_PRIORITY,
    O_TIME_LIMIT, O_REQUEST_ID, O_PIECES, O_NO_SPECIAL, O_SKIP_SPECIAL,
    O_SERVICE,
};

static int num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

static int inum(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end)
        return 0;
    *out = v;
    return 1;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = strlen(s) / 2 + 2;
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids)
        return 0;
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < INT32_MIN || v > INT32_MAX ||
            *n == cap) {
            free(*ids);
            *ids = NULL;
            return 0;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 1;
}

static char *read_stdin(void)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, stdin);
        if (k == 0)
            break;
        n += k;
    }
    buf[n] = '\0';
    return buf;
}

/* ---------------------------------------------------------------------- */
/* Commands                                                               */
/* ---------------------------------------------------------------------- */

typedef struct {
    const options *o;
    int got_final;
    Cinfer__V1__FinishReason finish;
    int bad;
} gen_ctx;

static int on_generate(void *user, const uint8_t *data, size_t len)
{
    gen_ctx *g = user;
    Cinfer__V1__GenerateResponse *r =
        cinfer__v1__generate_response__unpack(NULL, len, data);
    if (!r) {
        fprintf(stderr, "cinfer-cli: a response does not decode\n");
        g->bad = 1;
        return 0;
    }
    if (g->o->json) {
        pb_json_print(stdout, &r->base);
        fputc('\n', stdout);
    } else if (r->kind_case == CINFER__V1__GENERATE_RESPONSE__KIND_CHUNK) {
        fputs(r->chunk->text, stdout);
    }
    if (r->kind_case == CINFER__V1__GENERATE_RESPONSE__KIND_FINAL) {
        g->got_final = 1;
        g->finish = r->final->finish_reason;
        if (!g->o->json)
            fputc('\n', stdout);
        fflush(stdout);
        if (g->o->verbose && r->final->usage && r->final->timings) {
            const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
                &cinfer__v1__finish_reason__descriptor,
                (int)r->final->finish_reason);
            fprintf(stderr,
                    "[%s | prompt %d, completion %d, cached %d tokens | "
                    "queue %.1f ms, ttft %.1f ms, total %.1f ms]\n",
                    ev ? ev->name : "?", (int)r->final->usage->prompt_tokens,
                    (int)r->final->usage->completion_tokens,
                    (int)r->final->usage->cached_tokens,
                    r->final->timings->queue_ms,
                    r->final->timings->time_to_first_token_ms,
                    r->final->timings->total_ms);
        }
    }
    fflush(stdout);
    cinfer__v1__generate_response__free_unpacked(r, NULL);
    return 1;
}

/* Builds the chat input from --system, --message and --prompt. */
static int build_chat(const options *o, const char *prompt, Cinfer__V1__Chat *chat,
                      Cinfer__V1__ChatMessage **msgs, Cinfer__V1__ChatMessage *store,
                      char **owned)
{
    size_t n = 0;
    if (o->system) {
        cinfer__v1__chat_message__init(&store[n]);
        store[n].role = "system";
        store[n].content = (char *)o->system;
        msgs[n] = &store[n];
        n++;
    }
    for (size_t i = 0; i < o->n_messages; i++) {
        const char *colon = strchr(o->messages[i], ':');
        if (!colon) {
            fprintf(stderr, "cinfer-cli: --message wants ROLE:TEXT, got '%s'\n",
                    o->messages[i]);
            return 0;
        }
        size_t rl = (size_t)(colon - o->messages[i]);
        owned[i] = malloc(rl + 1);
        if (!owned[i])
            return 0;
        memcpy(owned[i], o->messages[i], rl);
        owned[i][rl] = '\0';
        cinfer__v1__chat_message__init(&store[n]);
        store[n].role = owned[i];
        store[n].content = (char *)colon + 1;
        msgs[n] = &store[n];
        n++;
    }
    if (prompt) {
        cinfer__v1__chat_message__init(&store[n]);
        store[n].role = "user";
        store[n].content = (char *)prompt;
        msgs[n] = &store[n];
        n++;
    }
    chat->n_messages = n;
    chat->messages = msgs;
    return 1;
}

static int cmd_generate(client *cl, const options *o)
{
    Cinfer__V1__GenerateRequest req = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__SamplingParams sp = CINFER__V1__SAMPLING_PARAMS__INIT;
    Cinfer__V1__StoppingCriteria sc = CINFER__V1__STOPPING_CRITERIA__INIT;
    Cinfer__V1__TokenIds tids = CINFER__V1__TOKEN_IDS__INIT;
    Cinfer__V1__Chat chat = CINFER__V1__CHAT__INIT;
    size_t nm = o->n_messages + 2;
    Cinfer__V1__ChatMessage **msgs = calloc(nm, sizeof *msgs);
    Cinfer__V1__ChatMessage *store = calloc(nm, sizeof *store);
    char **owned = calloc(o->n_messages + 1, sizeof *owned);
    int32_t *ids = NULL;
    char *stdin_text = NULL;
    int rc = EXIT_USAGE;
    if (!msgs || !store || !owned)
        goto out;

    const char *prompt = o->prompt;
    int chat_mode = o->chat || o->n_messages > 0 || o->system;
    if (o->tokens) {
        size_t n;
        if (!parse_ids(o->tokens, &ids, &n)) {
            fprintf(stderr, "cinfer-cli: --tokens wants ids like 1,2,3\n");
            goto out;
        }
        tids.n_ids = n;
        tids.ids = ids;
        req.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
        req.token_ids = &tids;
    } else {
        if (!prompt && !(chat_mode && o->n_messages > 0)) {
            stdin_text = read_stdin();
            if (!stdin_text)
                goto out;
            prompt = stdin_text;
        }
        if (chat_mode) {
            if (!build_chat(o, prompt, &chat, msgs, store, owned))
                goto out;
            req.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_CHAT;
            req.chat = &chat;
        } else {
            req.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
            req.text = (char *)prompt;
        }
    }
    if (o->request_id)
        req.request_id = (char *)o->request_id;

#define SET_OPT(msg, field, upper, value)                                      \
    do {                                                                       \
        (msg).opt_##field##_case = upper;                                      \
        (msg).field = (value);                                                 \
    } while (0)
    if (o->has_temperature)
        SET_OPT(sp, temperature, CINFER__V1__SAMPLING_PARAMS__OPT_TEMPERATURE_TEMPERATURE, (float)o->temperature);
    if (o->has_top_k)
        SET_OPT(sp, top_k, CINFER__V1__SAMPLING_PARAMS__OPT_TOP_K_TOP_K, (int32_t)o->top_k);
    if (o->has_top_p)
        SET_OPT(sp, top_p, CINFER__V1__SAMPLING_PARAMS__OPT_TOP_P_TOP_P, (float)o->top_p);
    if (o->has_min_p)
        SET_OPT(sp, min_p, CINFER__V1__SAMPLING_PARAMS__OPT_MIN_P_MIN_P, (float)o->min_p);
    if (o->has_rep)
        SET_OPT(sp, repetition_penalty, CINFER__V1__SAMPLING_PARAMS__OPT_REPETITION_PENALTY_REPETITION_PENALTY, (float)o->rep);
    if (o->has_pres)
        SET_OPT(sp, presence_penalty, CINFER__V1__SAMPLING_PARAMS__OPT_PRESENCE_PENALTY_PRESENCE_PENALTY, (float)o->pres);
    if (o->has_freq)
        SET_OPT(sp, frequency_penalty, CINFER__V1__SAMPLING_PARAMS__OPT_FREQUENCY_PENALTY_FREQUENCY_PENALTY, (float)o->freq);
    if (o->has_seed)
        SET_OPT(sp, seed, CINFER__V1__SAMPLING_PARAMS__OPT_SEED_SEED, (uint64_t)o->seed);
    if (o->has_max_tokens)
        SET_OPT(sc, max_tokens, CINFER__V1__STOPPING_CRITERIA__OPT_MAX_TOKENS_MAX_TOKENS, (int32_t)o->max_tokens);
    if (o->has_min_tokens)
        SET_OPT(sc, min_tokens, CINFER__V1__STOPPING_CRITERIA__OPT_MIN_TOKENS_MIN_TOKENS, (int32_t)o->min_tokens);
    if (o->ignore_eos)
        SET_OPT(sc, ignore_eos, CINFER__V1__STOPPING_CRITERIA__OPT_IGNORE_EOS_IGNORE_EOS, 1);
    if (o->has_time_limit)
        SET_OPT(sc, time_limit_ms, CINFER__V1__STOPPING_CRITERIA__OPT_TIME_LIMIT_MS_TIME_LIMIT_MS, (uint32_t)o->time_limit_ms);
    if (o->has_logprobs)
        SET_OPT(req, logprobs, CINFER__V1__GENERATE_REQUEST__OPT_LOGPROBS_LOGPROBS, (int32_t)o->logprobs);
#undef SET_OPT
    sc.n_stop = o->n_stops;
    sc.stop = (char **)o->stops;
    sc.n_stop_token_ids = o->n_stop_ids;
    sc.stop_token_ids = (int32_t *)o->stop_ids;
    req.sampling = &sp;
    req.stopping = &sc;
    req.priority = (int32_t)o->priority;

    gen_ctx g = {o, 0, 0, 0};
    char *details = NULL;
    grpc_status_code st = call_method(cl, "/cinfer.v1.Inference/Generate",
                                      &req.base, on_generate, &g, &details);
    if (st == GRPC_STATUS_OK && (!g.got_final || g.bad)) {
        fprintf(stderr, "cinfer-cli: the stream ended without a final "
                        "message\n");
        free(details);
        rc = (int)GRPC_STATUS_INTERNAL;
        goto out;
    }
    if (st != GRPC_STATUS_OK && !o->json)
        fputc('\n', stdout); /* end the partial line */
    rc = report(st, details);
out:
    if (owned)
        for (size_t i = 0; i < o->n_messages; i++)
            free(owned[i]);
    free(owned);
    free(msgs);
    free(store);
    free(ids);
    free(stdin_text);
    return rc;
}

typedef struct {
    const options *o;
    int status;        /* health: the status received */
} unary_ctx;

static int on_tokenize(void *user, const uint8_t *data, size_t len)
{
    unary_ctx *u = user;
    Cinfer__V1__TokenizeResponse *r =
        cinfer__v1__tokenize_response__unpack(NULL, len, data);
    if (!r)
        return 0;
    if (u->o->json) {
        pb_json_print(stdout, &r->base);
        fputc('\n', stdout);
    } else {
        for (size_t i = 0; i < r->n_token_ids; i++) {
            if (u->o->pieces && i < r->n_pieces) {
                printf("%d\t", (int)r->token_ids[i]);
                pb_json_string(stdout, (const char *)r->pieces[i].data,
                               r->pieces[i].len);
                fputc('\n', stdout);
            } else {
                printf(i ? " %d" : "%d", (int)r->token_ids[i]);
            }
        }
        if (!u->o->pieces)
            fputc('\n', stdout);
    }
    cinfer__v1__tokenize_response__free_unpacked(r, NULL);
    return 1;
}

static int cmd_tokenize(client *cl, const options *o)
{
    Cinfer__V1__TokenizeRequest req = CINFER__V1__TOKENIZE_REQUEST__INIT;
    Cinfer__V1__Chat chat = CINFER__V1__CHAT__INIT;
    size_t nm = o->n_messages + 2;
    Cinfer__V1__ChatMessage **msgs = calloc(nm, sizeof *msgs);
    Cinfer__V1__ChatMessage *store = calloc(nm, sizeof *store);
    char **owned = calloc(o->n_messages + 1, sizeof *owned);
    char *stdin_text = NULL;
    int rc = EXIT_USAGE;
    if (!msgs || !store || !owned)
        goto out;
    const char *prompt = o->prompt;
    int chat_mode = o->chat || o->n_messages > 0 || o->system;
    if (!prompt && !(chat_mode && o->n_messages > 0)) {
        stdin_text = read_stdin();
        if (!stdin_text)
            goto out;
        prompt = stdin_text;
    }
    if (chat_mode) {
        if (!build_chat(o, prompt, &chat, msgs, store, owned))
            goto out;
        req.input_case = CINFER__V1__TOKENIZE_REQUEST__INPUT_CHAT;
        req.chat = &chat;
    } else {
        req.input_case = CINFER__V1__TOKENIZE_REQUEST__INPUT_TEXT;
        req.text = (char *)prompt;
    }
    if (o->no_special) {
        req.opt_add_special_tokens_case =
            CINFER__V1__TOKENIZE_REQUEST__OPT_ADD_SPECIAL_TOKENS_ADD_SPECIAL_TOKENS;
        req.add_special_tokens = 0;
    }
    req.return_pieces = o->pieces;
    unary_ctx u = {o, 0};
    char *details = NULL;
    grpc_status_code st = call_method(cl, "/cinfer.v1.Inference/Tokenize",
                                      &req.base, on_tokenize, &u, &details);
    rc = report(st, details);
out:
    if (owned)
        for (size_t i = 0; i < o->n_messages; i++)
            free(owned[i]);
    free(owned);
    free(msgs);
    free(store);
    free(stdin_text);
    return rc;
}

static int on_detokenize(void *user, const uint8_t *data, size_t len)
{
    unary_ctx *u = user;
    Cinfer__V1__DetokenizeResponse *r =
        cinfer__v1__detokenize_response__unpack(NULL, len, data);
    if (!r)
        return 0;
    if (u->o->json)
        pb_json_print(stdout, &r->base);
    else
        fputs(r->text, stdout);
    fputc('\n', stdout);
    cinfer__v1__detokenize_response__free_unpacked(r, NULL);
    return 1;
}

static int cmd_detokenize(client *cl, const options *o, int argc,
                          char **argv)
{
    size_t total = 1;
    for (int i = 0; i < argc; i++)
        total += strlen(argv[i]) + 1;
    char *joined = malloc(total);
    if (!joined)
        return EXIT_USAGE;
    joined[0] = '\0';
    for (int i = 0; i < argc; i++) {
        strcat(joined, argv[i]);
        strcat(joined, " ");
    }
    int32_t *ids;
    size_t n;
    int ok = parse_ids(joined, &ids, &n);
    free(joined);
    if (!ok) {
        fprintf(stderr, "cinfer-cli: detokenize wants token ids\n");
        return EXIT_USAGE;
    }
    Cinfer__V1__DetokenizeRequest req = CINFER__V1__DETOKENIZE_REQUEST__INIT;
    req.n_token_ids = n;
    req.token_ids = ids;
    req.skip_special_tokens = o->skip_special;
    unary_ctx u = {o, 0};
    char *details = NULL;
    grpc_status_code st = call_method(cl, "/cinfer.v1.Inference/Detokenize",
                                      &req.base, on_detokenize, &u, &details);
    free(ids);
    return report(st, details);
}

static int on_info(void *user, const uint8_t *data, size_t len)
{
    unary_ctx *u = user;
    Cinfer__V1__GetModelInfoResponse *r =
        cinfer__v1__get_model_info_response__unpack(NULL, len, data);
    if (!r)
        return 0;
    if (u->o->json) {
        pb_json_print(stdout, &r->base);
        fputc('\n', stdout);
    } else {
        printf("model:            %s (%s, %lld parameters, %s)\n", r->name,
               r->architecture, (long long)r->parameters, r->quantization);
        printf("context:          %d tokens (trained %d)\n",
               (int)r->context_length, (int)r->trained_context_length);
        printf("vocabulary:       %d\n", (int)r->vocab_size);
        printf("shape:            %d layers, %d embedding, %d heads, %d kv "
               "heads\n",
               (int)r->layers, (int)r->embedding_length, (int)r->heads,
               (int)r->kv_heads);
        printf("chat template:    %s\n",
               r->has_chat_template
                   ? (r->chat_template_format[0] ? r->chat_template_format
                                                 : "present, unsupported")
                   : "none");
        if (r->backend) {
            printf("backend:          %s", r->backend->name);
            for (size_t i = 0; i < r->backend->n_devices; i++)
                printf("%s%s", i ? ", " : " (", r->backend->devices[i]);
            printf("%s\n", r->backend->n_devices ? ")" : "");
            const Cinfer__V1__Backend *b = r->backend;
            const double mib = 1024.0 * 1024.0;
            printf("memory:           weights %.1f MiB, activations %.1f MiB, "
                   "scratch %.1f MiB, KV cache %.1f MiB",
                   (double)b->weights_bytes / mib,
                   (double)b->activation_bytes / mib,
                   (double)b->scratch_bytes / mib,
                   (double)b->kv_cache_bytes / mib);
            if (b->memory_budget_bytes)
                printf("; budget %.1f MiB\n",
                       (double)b->memory_budget_bytes / mib);
            else
                printf("; no budget\n");
            if (b->device_lost)
                printf("device:           lost (sticky fault; health is "
                       "NOT_SERVING)\n");
        }
        printf("server:           %s\n", r->server_version);
        if (r->stats) {
            const Cinfer__V1__EngineStats *s = r->stats;
            printf("engine:           %d running, %d waiting; KV blocks %d "
                   "used, %d free, %d cached of %d\n",
                   (int)s->running, (int)s->waiting, (int)s->kv_blocks_used,
                   (int)s->kv_blocks_free, (int)s->kv_blocks_cached,
                   (int)s->kv_blocks_total);
            printf("requests:         %llu finished, %llu cancelled, %llu "
                   "preemptions\n",
                   (unsigned long long)s->requests_finished,
                   (unsigned long long)s->requests_cancelled,
                   (unsigned long long)s->preemptions);
            printf("tokens:           %llu prompt, %llu cached, %llu "
                   "generated in %llu steps\n",
                   (unsigned long long)s->prompt_tokens,
                   (unsigned long long)s->cached_tokens,
                   (unsigned long long)s->generated_tokens,
                   (unsigned long long)s->steps);
        }
    }
    cinfer__v1__get_model_info_response__free_unpacked(r, NULL);
    return 1;
}

static int cmd_info(client *cl, const options *o)
{
    Cinfer__V1__GetModelInfoRequest req =
        CINFER__V1__GET_MODEL_INFO_REQUEST__INIT;
    unary_ctx u = {o, 0};
    char *details = NULL;
    grpc_status_code st = call_method(cl, "/cinfer.v1.Inference/GetModelInfo",
                                      &req.base, on_info, &u, &details);
    return report(st, details);
}

static int on_health(void *user, const uint8_t *data, size_t len)
{
    unary_ctx *u = user;
    Grpc__Health__V1__HealthCheckResponse *r =
        grpc__health__v1__health_check_response__unpack(NULL, len, data);
    if (!r)
        return 0;
    u->status = r->status;
    if (u->o->json) {
        pb_json_print(stdout, &r->base);
        fputc('\n', stdout);
    } else {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
            &grpc__health__v1__health_check_response__serving_status__descriptor,
            r->status);
        printf("%s\n", ev ? ev->name : "?");
    }
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    return 1;
}

static int cmd_health(client *cl, const options *o)
{
    Grpc__Health__V1__HealthCheckRequest req =
        GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    if (o->service)
        req.service = (char *)o->service;
    unary_ctx u = {o, 0};
    char *details = NULL;
    grpc_status_code st = call_method(cl, "/grpc.health.v1.Health/Check",
                                      &req.base, on_health, &u, &details);
    int rc = report(st, details);
    if (rc == 0 &&
        u.status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
        rc = EXIT_NOT_SERVING;
    return rc;
}

/* ---------------------------------------------------------------------- */
/* main                                                                   */
/* ---------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    options o;
    memset(&o, 0, sizeof o);
    o.server = getenv("CINFER_SERVER");
    if (!o.server || !o.server[0])
        o.server = "127.0.0.1:50051";
    const char **messages = calloc((size_t)argc + 1, sizeof *messages);
    const char **stops = calloc((size_t)argc + 1, sizeof *stops);
    int rc = EXIT_USAGE;
    if (!messages || !stops)
        goto out; /* free(NULL) is fine */
    o.messages = messages;
    o.stops = stops;

    static const struct option longopts[] = {
        {"server", required_argument, 0, O_SERVER},
        {"json", no_argument, 0, O_JSON},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"verbose", no_argument, 0, 'v'},
        {"prompt", required_argument, 0, 'p'},
        {"chat", no_argument, 0, O_CHAT},
        {"system", required_argument, 0, O_SYSTEM},
        {"message", required_argument, 0, O_MESSAGE},
        {"tokens", required_argument, 0, O_TOKENS},
        {"max-tokens", required_argument, 0, 'n'},
        {"min-tokens", required_argument, 0, O_MIN_TOKENS},
        {"temperature", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"repetition-penalty", required_argument, 0, O_REP},
        {"presence-penalty", required_argument, 0, O_PRES},
        {"frequency-penalty", required_argument, 0, O_FREQ},
        {"seed", required_argument, 0, O_SEED},
        {"stop", required_argument, 0, O_STOP},
        {"stop-token-id", required_argument, 0, O_STOP_ID},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"logprobs", required_argument, 0, O_LOGPROBS},
        {"priority", required_argument, 0, O_PRIORITY},
        {"time-limit-ms", required_argument, 0, O_TIME_LIMIT},
        {"request-id", required_argument, 0, O_REQUEST_ID},
        {"pieces", no_argument, 0, O_PIECES},
        {"no-special", no_argument, 0, O_NO_SPECIAL},
        {"skip-special", no_argument, 0, O_SKIP_SPECIAL},
        {"service", required_argument, 0, O_SERVICE},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt, bad = 0;
    for (;;) {
        opt = getopt_long(argc, argv, "hvp:n:", longopts, NULL);
        if (opt == -1)
            break;
        long l;
        switch (opt) {
        case 'h': usage(stdout); rc = 0; goto out;
        case 'v': o.verbose = 1; break;
        case O_SERVER: o.server = optarg; break;
        case O_JSON: o.json = 1; break;
        case O_TIMEOUT: bad |= !num(optarg, &o.timeout_s) || o.timeout_s < 0; break;
        case 'p': o.prompt = optarg; break;
        case O_CHAT: o.chat = 1; break;
        case O_SYSTEM: o.system = optarg; break;
        case O_MESSAGE: messages[o.n_messages++] = optarg; break;
        case O_TOKENS: o.tokens = optarg; break;
        case 'n': bad |= !inum(optarg, &o.max_tokens); o.has_max_tokens = 1; break;
        case O_MIN_TOKENS: bad |= !inum(optarg, &o.min_tokens); o.has_min_tokens = 1; break;
        case O_TEMP: bad |= !num(optarg, &o.temperature); o.has_temperature = 1; break;
        case O_TOPK: bad |= !inum(optarg, &o.top_k); o.has_top_k = 1; break;
        case O_TOPP: bad |= !num(optarg, &o.top_p); o.has_top_p = 1; break;
        case O_MINP: bad |= !num(optarg, &o.min_p); o.has_min_p = 1; break;
        case O_REP: bad |= !num(optarg, &o.rep); o.has_rep = 1; break;
        case O_PRES: bad |= !num(optarg, &o.pres); o.has_pres = 1; break;
        case O_FREQ: bad |= !num(optarg, &o.freq); o.has_freq = 1; break;
        case O_SEED: {
            char *end;
            errno = 0;
            o.seed = strtoull(optarg, &end, 10);
            bad |= errno || end == optarg || *end;
            o.has_seed = 1;
            break;
        }
        case O_STOP: stops[o.n_stops++] = optarg; break;
        case O_STOP_ID:
            if (!inum(optarg, &l) || o.n_stop_ids == 64 || l < INT32_MIN ||
                l > INT32_MAX)
                bad = 1;
            else
                o.stop_ids[o.n_stop_ids++] = (int32_t)l;
            break;
        case O_IGNORE_EOS: o.ignore_eos = 1; break;
        case O_LOGPROBS: bad |= !inum(optarg, &o.logprobs); o.has_logprobs = 1; break;
        case O_PRIORITY: bad |= !inum(optarg, &o.priority); break;
        case O_TIME_LIMIT: bad |= !inum(optarg, &o.time_limit_ms) || o.time_limit_ms < 0; o.has_time_limit = 1; break;
        case O_REQUEST_ID: o.request_id = optarg; break;
        case O_PIECES: o.pieces = 1; break;
        case O_NO_SPECIAL: o.no_special = 1; break;
        case O_SKIP_SPECIAL: o.skip_special = 1; break;
        case O_SERVICE: o.service = optarg; break;
        default: usage(stderr); rc = EXIT_USAGE; goto out;
        }
        if (bad) {
            fprintf(stderr, "cinfer-cli: bad value '%s'\n", optarg);
            rc = EXIT_USAGE;
            goto out;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        rc = EXIT_USAGE;
        goto out;
    }
    const char *cmd = argv[optind++];

    grpc_init();
    client cl;
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    cl.ch = grpc_channel_create(o.server, creds, NULL);
    grpc_channel_credentials_release(creds);
    cl.cq = grpc_completion_queue_create_for_pluck(NULL);
    cl.timeout_s = o.timeout_s;

    if (strcmp(cmd, "generate") == 0 && optind == argc)
        rc = cmd_generate(&cl, &o);
    else if (strcmp(cmd, "tokenize") == 0 && optind == argc)
        rc = cmd_tokenize(&cl, &o);
    else if (strcmp(cmd, "detokenize") == 0)
        rc = cmd_detokenize(&cl, &o, argc - optind, argv + optind);
    else if (strcmp(cmd, "info") == 0 && optind == argc)
        rc = cmd_info(&cl, &o);
    else if (strcmp(cmd, "health") == 0 && optind == argc)
        rc = cmd_health(&cl, &o);
    else {
        fprintf(stderr, "cinfer-cli: unknown command or stray argument: %s\n",
                optind < argc && strcmp(cmd, "detokenize") != 0 ? argv[optind]
                                                                  : cmd);
        rc = EXIT_USAGE;
    }

    grpc_channel_destroy(cl.ch);
    grpc_completion_queue_shutdown(cl.cq);
    while (grpc_completion_queue_pluck(cl.cq, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME),
                                       NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cl.cq);
    grpc_shutdown_blocking();
out:
    free(messages);
    free(stops);
    return rc;
}
