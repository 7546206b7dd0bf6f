/*
 * test_server_wire.c - request bytes and deadlines off the wire
 * (server/wire.c): NUL bytes and ill-formed UTF-8 in string fields refused
 * with the field named, singular message fields that occur twice merged as
 * protobuf merges them (oneof resets included), malformed encodings
 * refused, and grpc-timeout deadlines past int64 nanoseconds taken as none.
 *
 * Encodings are packed from the generated structs and then edited or
 * concatenated (a protobuf encoding followed by another is the encoding of
 * their merge), as a hostile or merely unusual client sends them.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <stdlib.h>
#include <zlib.h>

#include "cinfer/v1/cinfer.pb-c.h"
#include "server/wire.h"

typedef struct {
    uint8_t b[4096];
    size_t n;
} enc;

static void pack_into(enc *e, const Cinfer__V1__GenerateRequest *r)
{
    size_t n = protobuf_c_message_get_packed_size(&r->base);
    CHECK(e->n + n <= sizeof e->b);
    protobuf_c_message_pack(&r->base, e->b + e->n);
    e->n += n;
}

/* Replaces the first byte `from` of the encoding by `to`. */
static void poke(enc *e, uint8_t from, uint8_t to)
{
    uint8_t *p = memchr(e->b, from, e->n);
    CHECK(p != NULL);
    if (p)
        *p = to;
}

static Cinfer__V1__GenerateRequest *unpack(const enc *e, cinfer_status *st)
{
    ProtobufCMessage *m = NULL;
    *st = cinfer_wire_unpack(&cinfer__v1__generate_request__descriptor, e->b,
                             e->n, &m);
    return (Cinfer__V1__GenerateRequest *)m;
}

#define EXPECT_REFUSED(e, words)                                               \
    do {                                                                       \
        cinfer_status st_;                                                     \
        Cinfer__V1__GenerateRequest *r_ = unpack(&(e), &st_);                  \
        CHECK_EQ_INT(st_, CINFER_E_INVALID_ARG);                               \
        CHECK(r_ == NULL);                                                     \
        if (!strstr(cinfer_last_error(), words)) {                             \
            fprintf(stderr, "%s:%d: \"%s\" does not say \"%s\"\n", __FILE__,   \
                    __LINE__, cinfer_last_error(), words);                     \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

static void test_nul_bytes(void)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = "Hel#lo world";
    enc e = {.n = 0};
    pack_into(&e, &r);
    cinfer_status st;
    Cinfer__V1__GenerateRequest *ok = unpack(&e, &st);
    CHECK_OK(st);
    if (ok)
        CHECK_EQ_STR(ok->text, "Hel#lo world");
    if (ok)
        protobuf_c_message_free_unpacked(&ok->base, NULL);
    poke(&e, '#', 0);
    EXPECT_REFUSED(e, "text holds a NUL byte at offset 3");

    /* Nested and repeated: the path and the index. */
    Cinfer__V1__ChatMessage m0 = CINFER__V1__CHAT_MESSAGE__INIT;
    Cinfer__V1__ChatMessage m1 = CINFER__V1__CHAT_MESSAGE__INIT;
    Cinfer__V1__ChatMessage *mp[2] = {&m0, &m1};
    Cinfer__V1__Chat chat = CINFER__V1__CHAT__INIT;
    m0.role = "user";
    m0.content = "hi";
    m1.role = "assistant";
    m1.content = "a#b";
    chat.n_messages = 2;
    chat.messages = mp;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_CHAT;
    r.chat = &chat;
    e.n = 0;
    pack_into(&e, &r);
    poke(&e, '#', 0);
    EXPECT_REFUSED(e, "chat.messages[1].content holds a NUL byte at offset 1");

    Cinfer__V1__StoppingCriteria sc = CINFER__V1__STOPPING_CRITERIA__INIT;
    char *stops[2] = {"end", "a#b"};
    sc.n_stop = 2;
    sc.stop = stops;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = "x";
    r.stopping = &sc;
    e.n = 0;
    pack_into(&e, &r);
    poke(&e, '#', 0);
    EXPECT_REFUSED(e, "stopping.stop[1] holds a NUL byte");

    r.stopping = NULL;
    r.request_id = "id#1";
    e.n = 0;
    pack_into(&e, &r);
    poke(&e, '#', 0);
    EXPECT_REFUSED(e, "request_id holds a NUL byte");
}

static void test_utf8(void)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = "caf\xc3\xa9 #";
    enc e = {.n = 0};
    pack_into(&e, &r);
    cinfer_status st;
    Cinfer__V1__GenerateRequest *ok = unpack(&e, &st);
    CHECK_OK(st);
    if (ok)
        protobuf_c_message_free_unpacked(&ok->base, NULL);
    poke(&e, '#', 0xff);
    EXPECT_REFUSED(e, "text is not valid UTF-8 (at offset 6)");
    /* A surrogate, encoded. */
    r.text = "\xed\xa0\x80";
    e.n = 0;
    pack_into(&e, &r);
    EXPECT_REFUSED(e, "text is not valid UTF-8 (at offset 0)");
}

static void test_merge(void)
{
    /* Two `stopping` fields: merged, as protobuf does (protobuf-c 1.4
     * alone refuses this). */
    Cinfer__V1__GenerateRequest a = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__GenerateRequest b = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__StoppingCriteria sa = CINFER__V1__STOPPING_CRITERIA__INIT;
    Cinfer__V1__StoppingCriteria sb = CINFER__V1__STOPPING_CRITERIA__INIT;
    Cinfer__V1__SamplingParams pa = CINFER__V1__SAMPLING_PARAMS__INIT;
    Cinfer__V1__SamplingParams pb = CINFER__V1__SAMPLING_PARAMS__INIT;
    a.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    a.text = "hello";
    sa.opt_max_tokens_case = CINFER__V1__STOPPING_CRITERIA__OPT_MAX_TOKENS_MAX_TOKENS;
    sa.max_tokens = 5;
    char *stop_a[1] = {"x"}, *stop_b[1] = {"y"};
    sa.n_stop = 1;
    sa.stop = stop_a;
    sb.n_stop = 1;
    sb.stop = stop_b;
    sb.opt_ignore_eos_case = CINFER__V1__STOPPING_CRITERIA__OPT_IGNORE_EOS_IGNORE_EOS;
    sb.ignore_eos = 1;
    pa.opt_temperature_case = CINFER__V1__SAMPLING_PARAMS__OPT_TEMPERATURE_TEMPERATURE;
    pa.temperature = 0.5f;
    pb.opt_top_k_case = CINFER__V1__SAMPLING_PARAMS__OPT_TOP_K_TOP_K;
    pb.top_k = 7;
    a.stopping = &sa;
    a.sampling = &pa;
    b.stopping = &sb;
    b.sampling = &pb;
    enc e = {.n = 0};
    pack_into(&e, &a);
    pack_into(&e, &b);
    cinfer_status st;
    Cinfer__V1__GenerateRequest *r = unpack(&e, &st);
    CHECK_OK(st);
    CHECK(r != NULL);
    if (r) {
        CHECK_EQ_STR(r->text, "hello");
        CHECK(r->stopping != NULL && r->sampling != NULL);
        if (r->stopping) {
            CHECK_EQ_INT(r->stopping->max_tokens, 5);
            CHECK_EQ_INT(r->stopping->ignore_eos, 1);
            CHECK_EQ_INT(r->stopping->n_stop, 2);
            if (r->stopping->n_stop == 2) {
                CHECK_EQ_STR(r->stopping->stop[0], "x");
                CHECK_EQ_STR(r->stopping->stop[1], "y");
            }
        }
        if (r->sampling) {
            CHECK_NEAR(r->sampling->temperature, 0.5, 0);
            CHECK_EQ_INT(r->sampling->top_k, 7);
            CHECK(r->sampling->opt_temperature_case != 0);
        }
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
}

static enc chat_enc(const char *content)
{
    static Cinfer__V1__ChatMessage m;
    static Cinfer__V1__ChatMessage *mp[1];
    static Cinfer__V1__Chat chat;
    m = (Cinfer__V1__ChatMessage)CINFER__V1__CHAT_MESSAGE__INIT;
    chat = (Cinfer__V1__Chat)CINFER__V1__CHAT__INIT;
    m.role = "user";
    m.content = (char *)content;
    mp[0] = &m;
    chat.n_messages = 1;
    chat.messages = mp;
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_CHAT;
    r.chat = &chat;
    enc e = {.n = 0};
    pack_into(&e, &r);
    return e;
}

static enc text_enc(const char *text)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = (char *)text;
    enc e = {.n = 0};
    pack_into(&e, &r);
    return e;
}

static void cat(enc *e, const enc *more)
{
    CHECK(e->n + more->n <= sizeof e->b);
    memcpy(e->b + e->n, more->b, more->n);
    e->n += more->n;
}

static void test_merge_oneof(void)
{
    /* The same oneof member twice merges (its repeated messages append). */
    enc e = chat_enc("one"), two = chat_enc("two"), t = text_enc("plain");
    cat(&e, &two);
    cinfer_status st;
    Cinfer__V1__GenerateRequest *r = unpack(&e, &st);
    CHECK_OK(st);
    if (r) {
        CHECK_EQ_INT(r->input_case, CINFER__V1__GENERATE_REQUEST__INPUT_CHAT);
        CHECK_EQ_INT(r->chat->n_messages, 2);
        if (r->chat->n_messages == 2) {
            CHECK_EQ_STR(r->chat->messages[0]->content, "one");
            CHECK_EQ_STR(r->chat->messages[1]->content, "two");
        }
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    /* chat, text, chat: the text reset the oneof; only the second chat. */
    e = chat_enc("one");
    cat(&e, &t);
    cat(&e, &two);
    r = unpack(&e, &st);
    CHECK_OK(st);
    if (r) {
        CHECK_EQ_INT(r->input_case, CINFER__V1__GENERATE_REQUEST__INPUT_CHAT);
        CHECK_EQ_INT(r->chat->n_messages, 1);
        CHECK_EQ_STR(r->chat->messages[0]->content, "two");
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    /* chat, chat, text: the text wins. */
    e = chat_enc("one");
    cat(&e, &two);
    cat(&e, &t);
    r = unpack(&e, &st);
    CHECK_OK(st);
    if (r) {
        CHECK_EQ_INT(r->input_case, CINFER__V1__GENERATE_REQUEST__INPUT_TEXT);
        CHECK_EQ_STR(r->text, "plain");
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
}

static void test_malformed(void)
{
    enc e = text_enc("hello");
    e.n -= 2; /* the string runs past the end */
    EXPECT_REFUSED(e, "GenerateRequest does not decode");
    /* A group (wire type 3) and a tag of field 0. */
    enc g = {.b = {0x0b}, .n = 1};
    EXPECT_REFUSED(g, "GenerateRequest does not decode");
    enc z = {.b = {0x00, 0x01}, .n = 2};
    EXPECT_REFUSED(z, "GenerateRequest does not decode");
    /* text (a string field) sent as a varint. */
    enc v = {.b = {0x10, 0x01}, .n = 2};
    EXPECT_REFUSED(v, "not length-delimited");
    /* An unknown field is skipped over, as protobuf does. */
    enc u = text_enc("hi");
    uint8_t unknown[] = {0xf8, 0x07, 0x05}; /* field 127, varint 5 */
    memcpy(u.b + u.n, unknown, sizeof unknown);
    u.n += sizeof unknown;
    cinfer_status st;
    Cinfer__V1__GenerateRequest *r = unpack(&u, &st);
    CHECK_OK(st);
    if (r)
        protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_deadline(void)
{
    gpr_timespec now = {1700000000, 500, GPR_CLOCK_REALTIME};
    int64_t mono = 123456789;
    CHECK_EQ_INT(cinfer_wire_deadline_ns(gpr_inf_future(GPR_CLOCK_REALTIME),
                                         now, mono),
                 0);
    /* grpc-timeout: 99999999H, the largest legal value. */
    gpr_timespec far = now;
    far.tv_sec += (int64_t)99999999 * 3600;
    CHECK_EQ_INT(cinfer_wire_deadline_ns(far, now, mono), 0);
    /* 300 years: past int64 nanoseconds. */
    far = now;
    far.tv_sec += (int64_t)300 * 365 * 24 * 3600;
    CHECK_EQ_INT(cinfer_wire_deadline_ns(far, now, mono), 0);
    gpr_timespec d = now;
    d.tv_sec += 2;
    d.tv_nsec += 25;
    CHECK_EQ_INT(cinfer_wire_deadline_ns(d, now, mono),
                 mono + 2000000025);
    /* 99 years still counts. */
    d = now;
    d.tv_sec += (int64_t)99 * 365 * 24 * 3600;
    CHECK_EQ_INT(cinfer_wire_deadline_ns(d, now, mono),
                 mono + (int64_t)99 * 365 * 24 * 3600 * 1000000000);
    /* Past: at once. */
    d = now;
    d.tv_sec -= 5;
    CHECK_EQ_INT(cinfer_wire_deadline_ns(d, now, mono), mono + 1);
    CHECK_EQ_INT(cinfer_wire_deadline_ns(now, now, mono), mono + 1);
}

/* gzip (windowBits 31) or zlib (15) of src into a malloc'd buffer. */
static uint8_t *deflate_all(const uint8_t *src, size_t n, int window_bits,
                            size_t *out_n)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    CHECK_EQ_INT(deflateInit2(&z, 6, Z_DEFLATED, window_bits, 8,
                              Z_DEFAULT_STRATEGY),
                 Z_OK);
    size_t cap = deflateBound(&z, (uLong)n);
    uint8_t *out = malloc(cap);
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    CHECK_EQ_INT(deflate(&z, Z_FINISH), Z_STREAM_END);
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

static void test_inflate(void)
{
    size_t n = 100000;
    uint8_t *src = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 7 + i / 100);
    for (int wb = 15; wb <= 31; wb += 16) {
        size_t zn;
        uint8_t *z = deflate_all(src, n, wb, &zn);
        /* Split in two slices, as a message may arrive. */
        grpc_slice parts[2] = {grpc_slice_from_copied_buffer((char *)z, 10),
                               grpc_slice_from_copied_buffer(
                                   (char *)z + 10, zn - 10)};
        uint8_t *out = NULL;
        size_t on = 0;
        CHECK_OK(cinfer_wire_inflate(parts, 2, n, &out, &on));
        CHECK_EQ_INT(on, n);
        CHECK(out && memcmp(out, src, n) == 0);
        free(out);
        /* One byte less allowed: refused. */
        CHECK_EQ_INT(cinfer_wire_inflate(parts, 2, n - 1, &out, &on),
                     CINFER_E_EXHAUSTED);
        CHECK(out == NULL);
        CHECK(strstr(cinfer_last_error(), "inflates past 99999 bytes"));
        /* Truncated. */
        CHECK_EQ_INT(cinfer_wire_inflate(parts, 1, n, &out, &on),
                     CINFER_E_INVALID_ARG);
        grpc_slice_unref(parts[0]);
        grpc_slice_unref(parts[1]);
        free(z);
    }
    /* A bomb: 64 MiB of zeros in about 64 KB, refused at 1 MiB. */
    size_t big = (size_t)64 << 20;
    uint8_t *zeros = calloc(big, 1);
    size_t zn;
    uint8_t *z = deflate_all(zeros, big, 31, &zn);
    free(zeros);
    CHECK(zn < 200000);
    grpc_slice one = grpc_slice_from_copied_buffer((char *)z, zn);
    uint8_t *out = NULL;
    size_t on = 0;
    CHECK_EQ_INT(cinfer_wire_inflate(&one, 1, 1 << 20, &out, &on),
                 CINFER_E_EXHAUSTED);
    grpc_slice_unref(one);
    free(z);
    /* Not deflate at all. */
    grpc_slice junk = grpc_slice_from_static_string("not compressed");
    CHECK_EQ_INT(cinfer_wire_inflate(&junk, 1, 1000, &out, &on),
                 CINFER_E_INVALID_ARG);
    free(src);
}

int main(void)
{
    RUN(test_nul_bytes);
    RUN(test_utf8);
    RUN(test_merge);
    RUN(test_merge_oneof);
    RUN(test_malformed);
    RUN(test_deadline);
    RUN(test_inflate);
    return harness_done();
}
#endif
