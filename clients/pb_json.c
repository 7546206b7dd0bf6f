/*
 * pb_json.c - protobuf-c messages as proto3 JSON (pb_json.h).
 */
#include "pb_json.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

void pb_json_string(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

static void put_name(FILE *f, const char *snake)
{
    fputc('"', f);
    int up = 0;
    for (const char *p = snake; *p; p++) {
        if (*p == '_') {
            up = 1;
            continue;
        }
        fputc(up && *p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p, f);
        up = 0;
    }
    fputs("\":", f);
}

static void put_base64(FILE *f, const uint8_t *d, size_t n)
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    fputc('"', f);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)d[i + 1] << 8;
        if (i + 2 < n)
            v |= d[i + 2];
        fputc(tab[(v >> 18) & 63], f);
        fputc(tab[(v >> 12) & 63], f);
        fputc(i + 1 < n ? tab[(v >> 6) & 63] : '=', f);
        fputc(i + 2 < n ? tab[v & 63] : '=', f);
    }
    fputc('"', f);
}

static void put_double(FILE *f, double v, int float_precision)
{
    if (isnan(v))
        fputs("\"NaN\"", f);
    else if (isinf(v))
        fputs(v > 0 ? "\"Infinity\"" : "\"-Infinity\"", f);
    else
        fprintf(f, float_precision ? "%.9g" : "%.17g", v);
}

/* Size of one element of a field in the message struct. */
static size_t elem_size(const ProtobufCFieldDescriptor *fd)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

/* Whether the value at p is the type's default (proto3 omits those). */
static int is_default(const ProtobufCFieldDescriptor *fd, const void *p)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return !s || !s[0];
    }
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)p)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE:
        return *(ProtobufCMessage *const *)p == NULL;
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const float *)p == 0.0f && !signbit(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const double *)p == 0.0 && !signbit(*(const double *)p);
    default: {
        size_t n = elem_size(fd);
        const unsigned char *b = p;
        for (size_t i = 0; i < n; i++)
            if (b[i])
                return 0;
        return 1;
    }
    }
}

static void put_value(FILE *f, const ProtobufCFieldDescriptor *fd,
                      const void *p)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        fprintf(f, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        fprintf(f, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        fprintf(f, "\"%" PRId64 "\"", *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        fprintf(f, "\"%" PRIu64 "\"", *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        put_double(f, *(const float *)p, 1);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        put_double(f, *(const double *)p, 0);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        fputs(*(const protobuf_c_boolean *)p ? "true" : "false", f);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value(fd->descriptor, v);
        if (ev)
            fprintf(f, "\"%s\"", ev->name);
        else
            fprintf(f, "%d", v);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        pb_json_string(f, s ? s : "", s ? strlen(s) : 0);
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        put_base64(f, b->data, b->len);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        if (m)
            pb_json_print(f, m);
        else
            fputs("{}", f);
        break;
    }
    }
}

void pb_json_print(FILE *f, const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    int first = 1;
    fputc('{', f);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        const void *p = base + fd->offset;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            if (n == 0)
                continue;
            const char *arr = *(char *const *)p;
            if (!first)
                fputc(',', f);
            first = 0;
            put_name(f, fd->name);
            fputc('[', f);
            for (size_t k = 0; k < n; k++) {
                if (k)
                    fputc(',', f);
                put_value(f, fd, arr + k * elem_size(fd));
            }
            fputc(']', f);
            continue;
        }
        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which = *(const uint32_t *)(base + fd->quantifier_offset);
            if (which != fd->id)
                continue;
        } else if (fd->label == PROTOBUF_C_LABEL_OPTIONAL &&
                   fd->type != PROTOBUF_C_TYPE_MESSAGE &&
                   fd->type != PROTOBUF_C_TYPE_STRING) {
            if (!*(const protobuf_c_boolean *)(base + fd->quantifier_offset))
                continue;
        } else if (is_default(fd, p)) {
            continue;
        }
        if (!first)
            fputc(',', f);
        first = 0;
        /* Our `optional` fields live in oneofs named opt_<field>; the JSON
         * name is the field's own. */
        put_name(f, fd->name);
        put_value(f, fd, p);
    }
    fputc('}', f);
}
