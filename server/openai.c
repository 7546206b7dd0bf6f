/*
 * openai.c - the OpenAI-compatible API's request bodies (openai.h).
 */
#include "server/openai.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bounds what a body may nest: jansson parses recursively. */
#define MAX_DEPTH 32

static cinfer_status bad(const char *field, const char *what)
{
    return cinfer_set_error(CINFER_E_INVALID_ARG, "%s %s", field, what);
}

/* A number field; null = unset. */
static cinfer_status get_float(json_t *o, const char *k, int *has, float *v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return CINFER_OK;
    if (!json_is_number(x))
        return bad(k, "must be a number");
    double d = json_number_value(x);
    if (!isfinite(d) || fabs(d) > 1e30)
        return bad(k, "must be a finite number");
    *has = 1;
    *v = (float)d;
    return CINFER_OK;
}

/* An integer field in [lo, hi]; null = unset. A real with an integral
 * value is taken. */
static cinfer_status get_int(json_t *o, const char *k, long long lo,
                             long long hi, int *has, long long *v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return CINFER_OK;
    long long n;
    if (json_is_integer(x)) {
        n = json_integer_value(x);
    } else if (json_is_real(x) && json_real_value(x) == floor(json_real_value(x)) &&
               fabs(json_real_value(x)) < 9e15) {
        n = (long long)json_real_value(x);
    } else {
        return bad(k, "must be an integer");
    }
    if (n < lo || n > hi)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be in [%lld, %lld], got %lld", k, lo,
                                hi, n);
    *has = 1;
    *v = n;
    return CINFER_OK;
}

static cinfer_status get_bool(json_t *o, const char *k, int *v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return CINFER_OK;
    if (!json_is_boolean(x))
        return bad(k, "must be a boolean");
    *v = json_is_true(x);
    return CINFER_OK;
}

static cinfer_status get_str(json_t *o, const char *k, const char **v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return CINFER_OK;
    if (!json_is_string(x))
        return bad(k, "must be a string");
    if (strlen(json_string_value(x)) != json_string_length(x))
        return bad(k, "must not contain NUL characters");
    *v = json_string_value(x);
    return CINFER_OK;
}

/* An array of ints in [0, INT32_MAX], malloc'd. */
static cinfer_status int_array(json_t *a, const char *k, int32_t **out,
                               size_t *n)
{
    size_t len = json_array_size(a);
    int32_t *v = malloc((len ? len : 1) * sizeof *v);
    if (!v)
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > INT32_MAX) {
            free(v);
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s[%zu] must be a token id (an integer "
                                    ">= 0)",
                                    k, i);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *out = v;
    *n = len;
    return CINFER_OK;
}

/* Standard base64 (RFC 4648 section 4; the padding may be left out) of
 * src[0..n) into dst (room for n / 4 * 3 + 3 bytes), *out the bytes
 * written; 0 at a character outside the alphabet, else 1. */
static int base64_decode(const char *src, size_t n, uint8_t *dst,
                         size_t *out_n)
{
    static const char alpha[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int8_t val[256];
    memset(val, -1, sizeof val);
    for (int i = 0; i < 64; i++)
        val[(unsigned char)alpha[i]] = (int8_t)i;
    while (n && src[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return 0;
    size_t out = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = val[(unsigned char)src[i]];
        if (v < 0)
            return 0;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            dst[out++] = (uint8_t)(acc >> bits);
        }
    }
    *out_n = out;
    return 1;
}

/* prompt_embeds (completions only): the base64 of little-endian float32
 * values, row-major [rows, the model's embedding width]. vLLM takes a
 * torch.save'd tensor there (a zip archive holding a pickle, or in the
 * legacy format a pickle starting with torch's magic number), which this
 * server does not read: refused by name. */
static cinfer_status decode_embeds(json_t *o, cinfer_openai_req *r)
{
    json_t *x = json_object_get(o, "prompt_embeds");
    if (!x || json_is_null(x))
        return CINFER_OK;
    if (r->chat)
        return bad("prompt_embeds", "is taken by /v1/completions only");
    if (!json_is_string(x))
        return bad("prompt_embeds",
                   "must be a string: the base64 of little-endian float32 "
                   "values, row-major [rows, embedding width]");
    size_t n = json_string_length(x);
    uint8_t *b = malloc(n / 4 * 3 + 4);
    if (!b)
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    size_t got = 0;
    cinfer_status st = CINFER_OK;
    if (!base64_decode(json_string_value(x), n, b, &got))
        st = bad("prompt_embeds", "is not base64 (RFC 4648's standard "
                                  "alphabet)");
    else if (got >= 4 && (memcmp(b, "PK\x03\x04", 4) == 0 ||
                          memcmp(b, "\x80\x02\x8a\x0a", 4) == 0))
        st = bad("prompt_embeds",
                 "looks like a torch.save'd tensor (a zip archive or a "
                 "pickle), which this server does not read: send the base64 "
                 "of the raw little-endian float32 values, row-major");
    else if (got % 4)
        st = cinfer_set_error(CINFER_E_INVALID_ARG,
                              "prompt_embeds: %zu bytes are not whole float32 "
                              "values (4 bytes each)",
                              got);
    if (st != CINFER_OK) {
        free(b);
        return st;
    }
    size_t nv = got / 4;
    float *v = malloc((nv ? nv : 1) * sizeof *v);
    if (!v) {
        free(b);
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    }
    for (size_t i = 0; i < nv; i++) { /* little-endian on any host */
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 |
                     (uint32_t)b[4 * i + 3] << 24;
        memcpy(&v[i], &u, sizeof u);
    }
    free(b);
    r->embeds = v;
    r->d.has_embeds = 1;
    r->d.embeds = v;
    r->d.n_embeds_values = nv;
    r->d.embeds_width = -1; /* the model's */
    return CINFER_OK;
}

static cinfer_status decode_prompt(json_t *o, cinfer_openai_req *r)
{
    json_t *p = json_object_get(o, "prompt");
    if (r->d.has_embeds &&
        (!p || json_is_null(p) ||
         (json_is_string(p) && json_string_length(p) == 0)))
        return CINFER_OK; /* the embeddings are the whole prompt */
    if (!p || json_is_null(p))
        return bad("prompt", "is required");
    if (json_is_string(p)) {
        r->d.input = CINFER_INPUT_TEXT;
        return get_str(o, "prompt", &r->d.text);
    }
    if (!json_is_array(p))
        return bad("prompt", "must be a string, an array of token ids, or "
                             "an array of one of them");
    if (json_array_size(p) == 1 && (json_is_string(json_array_get(p, 0)) ||
                                    json_is_array(json_array_get(p, 0)))) {
        p = json_array_get(p, 0);
        if (json_is_string(p)) {
            r->d.input = CINFER_INPUT_TEXT;
            r->d.text = json_string_value(p);
            if (strlen(r->d.text) != json_string_length(p))
                return bad("prompt", "must not contain NUL characters");
            return CINFER_OK;
        }
    }
    if (json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0)))
        return bad("prompt", "must hold one prompt per request");
    r->d.input = CINFER_INPUT_IDS;
    cinfer_status st = int_array(p, "prompt", &r->ids, &r->d.n_ids);
    if (st == CINFER_OK)
        r->d.ids = r->ids;
    return st;
}

/* A message's content: a string, or text parts joined. */
static cinfer_status message_text(cinfer_openai_req *r, json_t *c, size_t i,
                                  char **out)
{
    if (!c || json_is_null(c)) {
        *out = "";
        return CINFER_OK;
    }
    if (json_is_string(c)) {
        if (strlen(json_string_value(c)) != json_string_length(c))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "messages[%zu].content must not contain "
                                    "NUL characters",
                                    i);
        *out = (char *)json_string_value(c);
        return CINFER_OK;
    }
    if (!json_is_array(c))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "messages[%zu].content must be a string or "
                                "an array of text parts",
                                i);
    size_t total = 1;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(type) ||
            strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text) ||
            strlen(json_string_value(text)) != json_string_length(text))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "messages[%zu].content[%zu] must be "
                                    "{\"type\": \"text\", \"text\": ...}",
                                    i, k);
        total += json_string_length(text);
    }
    char *buf = malloc(total);
    char **owned = realloc(r->owned, (r->n_owned + 1) * sizeof *owned);
    if (!buf || !owned) {
        free(buf);
        if (owned)
            r->owned = owned;
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    }
    r->owned = owned;
    r->owned[r->n_owned++] = buf;
    size_t o = 0;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *text = json_object_get(json_array_get(c, k), "text");
        memcpy(buf + o, json_string_value(text), json_string_length(text));
        o += json_string_length(text);
    }
    buf[o] = '\0';
    *out = buf;
    return CINFER_OK;
}

static cinfer_status decode_messages(json_t *o, cinfer_openai_req *r)
{
    json_t *m = json_object_get(o, "messages");
    if (!m || json_is_null(m))
        return bad("messages", "is required");
    if (!json_is_array(m))
        return bad("messages", "must be an array");
    size_t n = json_array_size(m);
    if (n > CINFER_MAX_CHAT_MESSAGES)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "messages has %zu entries, at most %d", n,
                                CINFER_MAX_CHAT_MESSAGES);
    r->msgs = calloc(n ? n : 1, sizeof *r->msgs);
    r->msgp = calloc(n ? n : 1, sizeof *r->msgp);
    if (!r->msgs || !r->msgp)
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(m, i);
        if (!json_is_object(e))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "messages[%zu] must be an object", i);
        json_t *role = json_object_get(e, "role");
        if (!json_is_string(role))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "messages[%zu].role must be a string", i);
        const char *rs = json_string_value(role);
        /* The template knows these roles; OpenAI's "developer" is a
         * system message. */
        if (strcmp(rs, "developer") == 0)
            rs = "system";
        if (strcmp(rs, "system") != 0 && strcmp(rs, "user") != 0 &&
            strcmp(rs, "assistant") != 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "messages[%zu].role must be system, "
                                    "user or assistant",
                                    i);
        char *text = NULL;
        cinfer_status st =
            message_text(r, json_object_get(e, "content"), i, &text);
        if (st != CINFER_OK)
            return st;
        cinfer__v1__chat_message__init(&r->msgs[i]);
        r->msgs[i].role = (char *)rs;
        r->msgs[i].content = text;
        r->msgp[i] = &r->msgs[i];
    }
    cinfer__v1__chat__init(&r->chat_msg);
    r->chat_msg.n_messages = n;
    r->chat_msg.messages = r->msgp;
    r->d.input = CINFER_INPUT_CHAT;
    r->d.chat = &r->chat_msg;
    return CINFER_OK;
}

static cinfer_status decode_stop(json_t *o, cinfer_openai_req *r)
{
    json_t *s = json_object_get(o, "stop");
    if (!s || json_is_null(s))
        return CINFER_OK;
    if (json_is_string(s)) {
        r->stop[0] = json_string_value(s);
        r->d.n_stop = 1;
    } else if (json_is_array(s)) {
        if (json_array_size(s) > CINFER_MAX_STOP_STRINGS)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "stop has %zu strings, at most %d",
                                    json_array_size(s),
                                    CINFER_MAX_STOP_STRINGS);
        for (size_t i = 0; i < json_array_size(s); i++) {
            json_t *x = json_array_get(s, i);
            if (!json_is_string(x) ||
                strlen(json_string_value(x)) != json_string_length(x))
                return cinfer_set_error(CINFER_E_INVALID_ARG,
                                        "stop[%zu] must be a string", i);
            r->stop[i] = json_string_value(x);
        }
        r->d.n_stop = json_array_size(s);
    } else {
        return bad("stop", "must be a string or an array of strings");
    }
    r->d.stop = r->stop;
    return CINFER_OK;
}

static cinfer_status decode_logprobs(json_t *o, cinfer_openai_req *r)
{
    int has = 0;
    long long v = 0;
    cinfer_status st;
    if (r->chat) {
        st = get_bool(o, "logprobs", &r->logprobs);
        if (st == CINFER_OK)
            st = get_int(o, "top_logprobs", 0, CINFER_MAX_LOGPROBS, &has, &v);
        if (st != CINFER_OK)
            return st;
        if (has && !r->logprobs && v > 0)
            return bad("top_logprobs", "needs logprobs: true");
        r->top_logprobs = (int)v;
    } else {
        /* The legacy API: logprobs is the number of alternatives. */
        st = get_int(o, "logprobs", 0, 5, &has, &v);
        if (st != CINFER_OK)
            return st;
        r->logprobs = has;
        r->top_logprobs = (int)v;
    }
    if (r->logprobs) {
        r->d.has_logprobs = 1;
        r->d.logprobs = r->top_logprobs;
    }
    return CINFER_OK;
}

static cinfer_status decode_sampling(json_t *o, cinfer_openai_req *r)
{
    cinfer_gen_desc *d = &r->d;
    cinfer_status st = CINFER_OK;
    int has = 0;
    long long v = 0;
#define F(name)                                                                \
    if (st == CINFER_OK)                                                       \
    st = get_float(o, #name, &d->has_##name, &d->name)
    F(temperature);
    F(top_p);
    F(min_p);
    F(repetition_penalty);
    F(presence_penalty);
    F(frequency_penalty);
#undef F
    if (st != CINFER_OK)
        return st;
    /* vLLM: top_k -1 (or 0) is off. */
    st = get_int(o, "top_k", -1, INT32_MAX, &has, &v);
    if (st != CINFER_OK)
        return st;
    if (has) {
        d->has_top_k = 1;
        d->top_k = v < 0 ? 0 : (int32_t)v;
    }
    has = 0;
    st = get_int(o, "seed", INT64_MIN, INT64_MAX, &has, &v);
    if (st != CINFER_OK)
        return st;
    if (has) {
        d->has_seed = 1;
        d->seed = (uint64_t)v;
    }
    return CINFER_OK;
}

static cinfer_status decode_stopping(json_t *o, cinfer_openai_req *r)
{
    cinfer_gen_desc *d = &r->d;
    int has = 0;
    long long v = 0;
    cinfer_status st = get_int(o, "max_tokens", 1, INT32_MAX, &has, &v);
    if (st == CINFER_OK && !has)
        st = get_int(o, "max_completion_tokens", 1, INT32_MAX, &has, &v);
    if (st != CINFER_OK)
        return st;
    d->has_max_tokens = has;
    d->max_tokens = (int32_t)v;
    has = 0;
    st = get_int(o, "min_tokens", 0, INT32_MAX, &has, &v);
    if (st != CINFER_OK)
        return st;
    d->has_min_tokens = has;
    d->min_tokens = (int32_t)v;
    st = get_bool(o, "ignore_eos", &d->ignore_eos);
    if (st == CINFER_OK)
        st = decode_stop(o, r);
    if (st != CINFER_OK)
        return st;
    json_t *ids = json_object_get(o, "stop_token_ids");
    if (ids && !json_is_null(ids)) {
        if (!json_is_array(ids))
            return bad("stop_token_ids", "must be an array of token ids");
        st = int_array(ids, "stop_token_ids", &r->stop_ids, &d->n_stop_ids);
        if (st != CINFER_OK)
            return st;
        d->stop_ids = r->stop_ids;
    }
    return CINFER_OK;
}

/* response_format: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}};
 * the schema is written out as text (kept in r->owned) for the grammar
 * cache to key. strict is accepted either way: the output always keeps
 * to the schema. */
static cinfer_status decode_response_format(json_t *o, cinfer_openai_req *r)
{
    json_t *rf = json_object_get(o, "response_format");
    if (!rf || json_is_null(rf))
        return CINFER_OK;
    if (!json_is_object(rf))
        return bad("response_format", "must be an object");
    json_t *t = json_object_get(rf, "type");
    if (!json_is_string(t))
        return bad("response_format.type",
                   "must be \"text\", \"json_object\" or \"json_schema\"");
    const char *type = json_string_value(t);
    if (strcmp(type, "text") == 0)
        return CINFER_OK;
    if (strcmp(type, "json_object") == 0) {
        r->d.json_object = 1;
        return CINFER_OK;
    }
    if (strcmp(type, "json_schema") != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "response_format.type must be \"text\", "
                                "\"json_object\" or \"json_schema\", got "
                                "\"%.64s\"",
                                type);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return bad("response_format.json_schema",
                   "must be an object with a schema");
    json_t *name = json_object_get(js, "name");
    if (name && !json_is_null(name) && !json_is_string(name))
        return bad("response_format.json_schema.name", "must be a string");
    json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return bad("response_format.json_schema.strict", "must be a boolean");
    json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema))
        return bad("response_format.json_schema.schema", "is required");
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return bad("response_format.json_schema.schema",
                   "must be an object");
    char *text = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                        JSON_ENCODE_ANY);
    char **owned = realloc(r->owned, (r->n_owned + 1) * sizeof *owned);
    if (!text || !owned) {
        free(text);
        if (owned)
            r->owned = owned;
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    }
    r->owned = owned;
    r->owned[r->n_owned++] = text;
    r->d.json_schema = text;
    return CINFER_OK;
}

static cinfer_status decode_rest(json_t *o, cinfer_openai_req *r)
{
    int has = 0;
    long long v = 0;
    cinfer_status st = get_int(o, "n", 1, CINFER_MAX_SAMPLES, &has, &v);
    if (st != CINFER_OK)
        return st;
    r->d.has_n = has;
    r->d.n = (int32_t)v;
    has = 0;
    st = get_int(o, "priority", -CINFER_MAX_PRIORITY, CINFER_MAX_PRIORITY,
                 &has, &v);
    if (st != CINFER_OK)
        return st;
    r->d.priority = (int32_t)v;
    st = get_str(o, "model", &r->model);
    if (st == CINFER_OK)
        st = get_str(o, "user", &r->user);
    if (st == CINFER_OK)
        st = get_bool(o, "stream", &r->stream);
    if (st == CINFER_OK)
        st = get_str(o, "grammar", &r->d.grammar);
    if (st == CINFER_OK)
        st = get_str(o, "regex", &r->d.regex);
    if (st == CINFER_OK)
        st = decode_response_format(o, r);
    if (st != CINFER_OK)
        return st;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return bad("stream_options", "must be an object");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu)) {
            if (!json_is_boolean(iu))
                return bad("stream_options.include_usage",
                           "must be a boolean");
            r->include_usage = json_is_true(iu);
        }
    }
    return CINFER_OK;
}

/* The deepest nesting of arrays and objects in the first len bytes, not
 * counting what is inside strings. */
static int depth_of(const char *s, size_t len)
{
    int d = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++d > max)
                max = d;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    return max;
}

cinfer_status cinfer_openai_decode(const char *body, size_t len, int chat,
                                   cinfer_openai_req *r)
{
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->d = cinfer_gen_desc_init();
    if (len > CINFER_OPENAI_MAX_BODY)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "the body is %zu bytes, at most %d", len,
                                CINFER_OPENAI_MAX_BODY);
    if (depth_of(body, len) > MAX_DEPTH)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "the body nests deeper than %d levels",
                                MAX_DEPTH);
    json_error_t err;
    r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
    if (!r->root)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "the body is not valid JSON: %s (line %d, "
                                "column %d)",
                                err.text, err.line, err.column);
    cinfer_status st = CINFER_OK;
    if (!json_is_object(r->root))
        st = cinfer_set_error(CINFER_E_INVALID_ARG,
                              "the body must be a JSON object");
    if (st == CINFER_OK)
        st = decode_embeds(r->root, r);
    if (st == CINFER_OK)
        st = chat ? decode_messages(r->root, r) : decode_prompt(r->root, r);
    if (st == CINFER_OK)
        st = decode_sampling(r->root, r);
    if (st == CINFER_OK)
        st = decode_stopping(r->root, r);
    if (st == CINFER_OK)
        st = decode_logprobs(r->root, r);
    if (st == CINFER_OK)
        st = decode_rest(r->root, r);
    if (st != CINFER_OK)
        cinfer_openai_req_cleanup(r);
    return st;
}

void cinfer_openai_req_cleanup(cinfer_openai_req *r)
{
    if (r->root)
        json_decref(r->root);
    free(r->ids);
    free(r->embeds);
    free(r->stop_ids);
    free(r->msgs);
    free(r->msgp);
    for (size_t i = 0; i < r->n_owned; i++)
        free(r->owned[i]);
    free(r->owned);
    int chat = r->chat;
    memset(r, 0, sizeof *r);
    r->chat = chat;
}

void cinfer_openai_error_param(const char *message, char *out, size_t n)
{
    size_t i = 0;
    if (n == 0)
        return;
    while (message[i] && message[i] != ' ' && message[i] != ':' &&
           message[i] != '[' && i + 1 < n) {
        out[i] = message[i];
        i++;
    }
    out[i] = '\0';
    /* A message that does not start with a field ("the body ...",
     * "input must be set") names none. */
    if (strcmp(out, "the") == 0 || strcmp(out, "input") == 0 ||
        strcmp(out, "an") == 0)
        out[0] = '\0';
}

char *cinfer_openai_error_json(const char *message, const char *type,
                               const char *param, const char *code)
{
    /* A message may quote the client's bytes (the JSON parser's does):
     * JSON strings are UTF-8, so ill-formed bytes become U+FFFD. */
    size_t len = strlen(message);
    char *clean = malloc(3 * len + 1);
    if (!clean)
        return NULL;
    clean[cinfer_utf8_sanitize(message, len, clean)] = '\0';
    json_t *e = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message",
                          clean, "type", type, "param",
                          param && *param &&
                                  cinfer_utf8_valid(param, strlen(param))
                              ? json_string(param)
                              : json_null(),
                          "code", code ? json_string(code) : json_null());
    free(clean);
    if (!e)
        return NULL;
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}
