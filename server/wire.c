/*
 * wire.c - request bytes and deadlines off the wire (wire.h).
 *
 * The walk reads the protobuf encoding record by record (tag, wire type,
 * value) with the message's descriptor at hand: string fields are checked,
 * message fields are walked into, everything else (unknown fields
 * included) is skipped over, so that a malformed record anywhere is found
 * here with its offset. Paths are built as the walk descends
 * ("chat.messages[2].content"); a repeated field's index counts its
 * occurrences in the enclosing message.
 */
#include "server/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "server/validate.h"

/* ---------------------------------------------------------------------- */
/* Records                                                                */
/* ---------------------------------------------------------------------- */

typedef struct {
    uint32_t num;     /* field number */
    int wt;           /* wire type */
    size_t start;     /* the record's first byte (its tag) */
    size_t end;       /* one past its last byte */
    size_t val;       /* a length-delimited value's first byte */
    size_t val_len;   /* its length */
} wire_rec;

static int read_varint(const uint8_t *b, size_t len, size_t *off,
                       uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (*off >= len)
            return 0;
        uint8_t c = b[(*off)++];
        x |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

/* Reads the record at *off. Returns 0 when it is malformed. */
static int read_rec(const uint8_t *b, size_t len, size_t *off, wire_rec *r)
{
    uint64_t tag, v;
    r->start = *off;
    if (!read_varint(b, len, off, &tag) || (tag >> 3) == 0 ||
        (tag >> 3) > 0x1fffffff)
        return 0;
    r->num = (uint32_t)(tag >> 3);
    r->wt = (int)(tag & 7);
    r->val = 0;
    r->val_len = 0;
    switch (r->wt) {
    case 0:
        if (!read_varint(b, len, off, &v))
            return 0;
        break;
    case 1:
        if (len - *off < 8)
            return 0;
        *off += 8;
        break;
    case 2:
        if (!read_varint(b, len, off, &v) || v > len - *off)
            return 0;
        r->val = *off;
        r->val_len = (size_t)v;
        *off += (size_t)v;
        break;
    case 5:
        if (len - *off < 4)
            return 0;
        *off += 4;
        break;
    default: /* groups (3, 4) and the unused 6, 7 */
        return 0;
    }
    r->end = *off;
    return 1;
}

/* The descriptor's field for a record, or NULL (unknown field). */
static const ProtobufCFieldDescriptor *
field_of(const ProtobufCMessageDescriptor *d, uint32_t num)
{
    return protobuf_c_message_descriptor_get_field(d, (unsigned)num);
}

static int is_singular_message(const ProtobufCFieldDescriptor *f)
{
    return f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
           f->label != PROTOBUF_C_LABEL_REPEATED;
}

static int same_oneof(const ProtobufCFieldDescriptor *a,
                      const ProtobufCFieldDescriptor *b)
{
    return (a->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
           (b->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
           a->quantifier_offset == b->quantifier_offset;
}

/* ---------------------------------------------------------------------- */
/* Checking                                                               */
/* ---------------------------------------------------------------------- */

typedef struct {
    const char *top;   /* the top message's short name */
    const uint8_t *base; /* the whole request, for offsets */
    char path[256];
    int dup;           /* a singular message field occurs twice */
} check_ctx;

static cinfer_status undecodable(check_ctx *cx, const uint8_t *at,
                                 const char *why)
{
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "%s does not decode: %s at byte %zu", cx->top, why,
                            (size_t)(at - cx->base));
}

static cinfer_status check_string(check_ctx *cx, const char *s, size_t n)
{
    const char *nul = memchr(s, '\0', n);
    if (nul)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s holds a NUL byte at offset %zu; string "
                                "fields must not contain NUL",
                                cx->path, (size_t)(nul - s));
    size_t ok = cinfer_utf8_valid_prefix(s, n);
    if (ok != n)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s is not valid UTF-8 (at offset %zu); "
                                "string fields must be UTF-8",
                                cx->path, ok);
    return CINFER_OK;
}

static cinfer_status check_msg(check_ctx *cx,
                               const ProtobufCMessageDescriptor *d,
                               const uint8_t *b, size_t len, int depth)
{
    if (depth > CINFER_WIRE_MAX_DEPTH)
        return undecodable(cx, b, "messages nested too deep");
    unsigned small[32];
    unsigned *seen = small;
    if (d->n_fields > 32) {
        seen = calloc(d->n_fields, sizeof *seen);
        if (!seen)
            return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    } else {
        memset(small, 0, sizeof small);
    }
    size_t plen = strlen(cx->path);
    cinfer_status st = CINFER_OK;
    size_t off = 0;
    while (off < len && st == CINFER_OK) {
        wire_rec r;
        if (!read_rec(b, len, &off, &r)) {
            st = undecodable(cx, b + r.start, "a malformed field");
            break;
        }
        const ProtobufCFieldDescriptor *f = field_of(d, r.num);
        if (!f)
            continue;
        unsigned idx = (unsigned)(f - d->fields);
        unsigned nth = seen[idx]++;
        int is_str = f->type == PROTOBUF_C_TYPE_STRING;
        int is_msg = f->type == PROTOBUF_C_TYPE_MESSAGE;
        if (!is_str && !is_msg)
            continue; /* protobuf-c judges the scalars' wire types */
        if (r.wt != 2) {
            st = undecodable(cx, b + r.start, "a string or message field "
                                              "that is not length-delimited");
            break;
        }
        if (is_msg && f->label != PROTOBUF_C_LABEL_REPEATED && nth > 0)
            cx->dup = 1;
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
            snprintf(cx->path + plen, sizeof cx->path - plen, "%s%s[%u]",
                     plen ? "." : "", f->name, nth);
        else
            snprintf(cx->path + plen, sizeof cx->path - plen, "%s%s",
                     plen ? "." : "", f->name);
        if (is_str)
            st = check_string(cx, (const char *)b + r.val, r.val_len);
        else
            st = check_msg(cx, f->descriptor, b + r.val, r.val_len,
                           depth + 1);
        cx->path[plen] = '\0';
    }
    if (seen != small)
        free(seen);
    return st;
}

cinfer_status cinfer_wire_check(const ProtobufCMessageDescriptor *d,
                                const uint8_t *buf, size_t len,
                                int *needs_merge)
{
    check_ctx cx;
    cx.top = d->short_name;
    cx.base = buf;
    cx.path[0] = '\0';
    cx.dup = 0;
    cinfer_status st = check_msg(&cx, d, buf, len, 0);
    *needs_merge = st == CINFER_OK && cx.dup;
    return st;
}

/* ---------------------------------------------------------------------- */
/* Merging                                                                */
/* ---------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n)
{
    if (w->oom)
        return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + n)
            cap *= 2;
        uint8_t *q = realloc(w->p, cap);
        if (!q) {
            w->oom = 1;
            return;
        }
        w->p = q;
        w->cap = cap;
    }
    if (n)
        memcpy(w->p + w->n, src, n);
    w->n += n;
}

static void put_varint(wbuf *w, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            b[n] |= 0x80;
        n++;
    } while (v);
    put(w, b, n);
}

static int merge_msg(const ProtobufCMessageDescriptor *d, const uint8_t *b,
                     size_t len, int depth, wbuf *out);

/* One singular message field's surviving occurrences: their payloads,
 * concatenated, merged one level down, written as one record. */
static int emit_merged(const ProtobufCFieldDescriptor *f, const uint8_t *b,
                       const wire_rec *recs, size_t n_recs, size_t from,
                       int depth, wbuf *out)
{
    wbuf cat = {0}, sub = {0};
    for (size_t i = from; i < n_recs; i++)
        if (recs[i].num == (uint32_t)f->id)
            put(&cat, b + recs[i].val, recs[i].val_len);
    int ok = !cat.oom && merge_msg(f->descriptor, cat.p, cat.n, depth + 1,
                                   &sub);
    if (ok) {
        put_varint(out, ((uint64_t)f->id << 3) | 2);
        put_varint(out, sub.n);
        put(out, sub.p, sub.n);
    }
    free(cat.p);
    free(sub.p);
    return ok && !out->oom;
}

static int merge_msg(const ProtobufCMessageDescriptor *d, const uint8_t *b,
                     size_t len, int depth, wbuf *out)
{
    if (depth > CINFER_WIRE_MAX_DEPTH)
        return 0;
    size_t n = 0, cap = 16;
    wire_rec *recs = malloc(cap * sizeof *recs);
    if (!recs)
        return 0;
    size_t off = 0;
    while (off < len) {
        if (n == cap) {
            wire_rec *q = realloc(recs, 2 * cap * sizeof *recs);
            if (!q) {
                free(recs);
                return 0;
            }
            recs = q;
            cap *= 2;
        }
        if (!read_rec(b, len, &off, &recs[n])) {
            free(recs);
            return 0;
        }
        n++;
    }
    /* Each singular message field is written once, at its last
     * occurrence: the occurrences since the latest record of another
     * member of its oneof (which reset it), merged. */
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        const ProtobufCFieldDescriptor *f = field_of(d, recs[i].num);
        if (!is_singular_message(f)) {
            put(out, b + recs[i].start, recs[i].end - recs[i].start);
            continue;
        }
        int last = 1;
        for (size_t k = i + 1; k < n && last; k++)
            last = recs[k].num != recs[i].num;
        if (!last)
            continue;
        size_t from = 0;
        for (size_t k = 0; k < i; k++) {
            const ProtobufCFieldDescriptor *g = field_of(d, recs[k].num);
            if (g && g != f && same_oneof(f, g))
                from = k + 1;
        }
        ok = emit_merged(f, b, recs, i + 1, from, depth, out);
    }
    free(recs);
    return ok && !out->oom;
}

cinfer_status cinfer_wire_merge(const ProtobufCMessageDescriptor *d,
                                const uint8_t *buf, size_t len, uint8_t **out,
                                size_t *out_len)
{
    wbuf w = {0};
    *out = NULL;
    *out_len = 0;
    if (!merge_msg(d, buf, len, 0, &w)) {
        free(w.p);
        if (w.oom)
            return cinfer_set_error(CINFER_E_NOMEM, "no memory");
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s does not decode",
                                d->short_name);
    }
    *out = w.p ? w.p : malloc(1);
    if (!*out)
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    *out_len = w.n;
    return CINFER_OK;
}

cinfer_status cinfer_wire_unpack(const ProtobufCMessageDescriptor *d,
                                 const uint8_t *buf, size_t len,
                                 ProtobufCMessage **out)
{
    *out = NULL;
    int needs_merge = 0;
    cinfer_status st = cinfer_wire_check(d, buf, len, &needs_merge);
    if (st != CINFER_OK)
        return st;
    uint8_t *merged = NULL;
    if (needs_merge) {
        size_t n;
        st = cinfer_wire_merge(d, buf, len, &merged, &n);
        if (st != CINFER_OK)
            return st;
        buf = merged;
        len = n;
    }
    *out = protobuf_c_message_unpack(d, NULL, len, buf);
    free(merged);
    if (!*out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s does not decode",
                                d->short_name);
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Compressed messages                                                    */
/* ---------------------------------------------------------------------- */

static cinfer_status too_large(size_t max_len)
{
    return cinfer_set_error(CINFER_E_EXHAUSTED,
                            "the request message inflates past %zu bytes "
                            "(--max-receive-message-bytes)",
                            max_len);
}

/* Room for output at buf[n]: the buffer doubles, up to max_len + 1 bytes
 * (one past the limit tells that the message is too large). */
static cinfer_status room(uint8_t **buf, size_t *cap, size_t n,
                          size_t max_len)
{
    if (n < *cap)
        return CINFER_OK;
    if (*cap > max_len)
        return too_large(max_len);
    size_t nc = *cap * 2 > max_len + 1 ? max_len + 1 : *cap * 2;
    uint8_t *q = realloc(*buf, nc);
    if (!q)
        return cinfer_set_error(CINFER_E_NOMEM, "inflate: no memory");
    *buf = q;
    *cap = nc;
    return CINFER_OK;
}

cinfer_status cinfer_wire_inflate(const grpc_slice *in, size_t n_in,
                                  size_t max_len, uint8_t **out,
                                  size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) /* gzip or zlib header */
        return cinfer_set_error(CINFER_E_NOMEM, "inflate: no memory");
    size_t cap = 16384, n = 0;
    if (cap > max_len + 1)
        cap = max_len + 1;
    uint8_t *buf = malloc(cap);
    cinfer_status st = CINFER_OK;
    int ended = 0;
    if (!buf)
        st = cinfer_set_error(CINFER_E_NOMEM, "inflate: no memory");
    for (size_t i = 0; i < n_in && st == CINFER_OK; i++) {
        z.next_in = (Bytef *)GRPC_SLICE_START_PTR(in[i]);
        z.avail_in = (uInt)GRPC_SLICE_LENGTH(in[i]);
        while (z.avail_in > 0 && st == CINFER_OK) {
            if (ended) {
                st = cinfer_set_error(CINFER_E_INVALID_ARG,
                                      "the compressed request message has "
                                      "bytes past its end");
                break;
            }
            st = room(&buf, &cap, n, max_len);
            if (st != CINFER_OK)
                break;
            z.next_out = buf + n;
            z.avail_out = (uInt)(cap - n);
            int r = inflate(&z, Z_NO_FLUSH);
            n = cap - z.avail_out;
            if (r == Z_STREAM_END) {
                ended = 1;
            } else if (r != Z_OK && r != Z_BUF_ERROR) {
                st = cinfer_set_error(CINFER_E_INVALID_ARG,
                                      "the compressed request message does "
                                      "not inflate (%s)",
                                      z.msg ? z.msg : "corrupt");
            }
        }
    }
    /* The stream may end with its output filling the buffer exactly. */
    while (st == CINFER_OK && !ended) {
        st = room(&buf, &cap, n, max_len);
        if (st != CINFER_OK)
            break;
        z.next_in = NULL;
        z.avail_in = 0;
        z.next_out = buf + n;
        z.avail_out = (uInt)(cap - n);
        int r = inflate(&z, Z_FINISH);
        n = cap - z.avail_out;
        if (r == Z_STREAM_END)
            ended = 1;
        else if (r != Z_BUF_ERROR || z.avail_out != 0)
            st = cinfer_set_error(CINFER_E_INVALID_ARG,
                                  "the compressed request message is "
                                  "truncated");
    }
    if (st == CINFER_OK && n > max_len)
        st = too_large(max_len);
    inflateEnd(&z);
    if (st != CINFER_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_len = n;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Deadlines                                                              */
/* ---------------------------------------------------------------------- */

int64_t cinfer_wire_deadline_ns(gpr_timespec deadline, gpr_timespec now,
                                int64_t now_mono_ns)
{
    if (gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) == 0)
        return 0;
    gpr_timespec left = gpr_time_sub(deadline, now);
    if (left.tv_sec >= CINFER_WIRE_FAR_DEADLINE_S)
        return 0;
    int64_t left_ns = 1;
    if (left.tv_sec >= 0) {
        left_ns = left.tv_sec * 1000000000 + left.tv_nsec;
        if (left_ns < 1)
            left_ns = 1;
    }
    /* now_mono_ns is CLOCK_MONOTONIC: far below INT64_MAX - 100 years;
     * saturate all the same. */
    if (now_mono_ns > INT64_MAX - left_ns)
        return 0;
    return now_mono_ns + left_ns;
}
