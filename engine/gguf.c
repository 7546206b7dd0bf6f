/*
 * gguf.c - GGUF v2/v3 reader (over mmap, a copy in huge pages, or a caller's
 * buffer) and v3 writer.
 *
 * A GGUF file is: magic "GGUF", u32 version, u64 tensor count, u64 key/value
 * count, the key/values, the tensor infos (name, dims, type, offset), padding
 * to the alignment, then the data section. Everything is little-endian.
 *
 * The reader makes one pass over the header and trusts nothing it reads:
 * every length and count is compared with the bytes left in the file before
 * it is used, and the arrays that hold parsed entries grow only as entries
 * are actually read, so a file that claims 2^60 keys costs nothing but an
 * error. Strings are not copied, except keys and tensor names, which are
 * copied NUL-terminated into one arena. String arrays get a table of element
 * positions at parse time, so element i is O(1). Numeric arrays that sit
 * misaligned in the file are copied to an aligned buffer, so callers can
 * index them as C arrays. Key and tensor-name lookups go through hash tables
 * built after the parse; the same insertion finds duplicates.
 *
 * Choices the specification leaves open:
 *   - general.alignment must be UINT32, non-zero and a power of two.
 *   - Tensor types are those cinfer_dtype_valid() accepts, Q8_1 and I32
 *     included: which types a model may use for weights is the model's call.
 *   - Tensor data must be aligned and inside the file; tensors may share or
 *     overlap bytes (the spec does not forbid it and they are read-only).
 *   - Bool values must be 0 or 1; keys and tensor names must be non-empty
 *     and free of NUL bytes; arrays nest at most 8 deep.
 *
 * The writer keeps each key's encoded value and each tensor's data in memory
 * and serializes them in insertion order to a file or a buffer.
 */
#include "gguf.h"

#include "common/huge_pages.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_ARRAY_DEPTH 8
#define GGUF_MAX_DIMS 4
/* Smallest encodings, used to bound counts by the bytes left: a key/value
 * is at least a length, a 1-byte key, a type and a 1-byte value; a tensor
 * info at least a length, a 1-byte name, n_dims, one dim, type, offset. */
#define GGUF_MIN_KV_BYTES (8 + 1 + 4 + 1)
#define GGUF_MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)
/* Longest key or tensor name quoted in an error message. */
#define NAME_QUOTE_MAX 96

/* ====================================================================== */
/* shared helpers                                                          */
/* ====================================================================== */

static const char *type_name(uint32_t t)
{
    static const char *const names[] = {
        "UINT8", "INT8",    "UINT16", "INT16", "UINT32", "INT32",  "FLOAT32",
        "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64", "FLOAT64",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case CINFER_GGUF_UINT8:
    case CINFER_GGUF_INT8:
    case CINFER_GGUF_BOOL:
        return 1;
    case CINFER_GGUF_UINT16:
    case CINFER_GGUF_INT16:
        return 2;
    case CINFER_GGUF_UINT32:
    case CINFER_GGUF_INT32:
    case CINFER_GGUF_FLOAT32:
        return 4;
    case CINFER_GGUF_UINT64:
    case CINFER_GGUF_INT64:
    case CINFER_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static int is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

static uint16_t le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

/* FNV-1a over a byte string. */
static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ====================================================================== */
/* reader                                                                  */
/* ====================================================================== */

typedef struct {
    char *key;           /* NUL-terminated, in the names arena */
    const char *raw;     /* key bytes in the file (during the parse) */
    uint64_t key_len;
    uint64_t file_offset; /* where the key/value starts, for messages */
    cinfer_gguf_type type;
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num;               /* scalar value, widened */
    cinfer_gguf_str str; /* STRING value */
    cinfer_gguf_arr arr; /* ARRAY value */
    void *owned;         /* string-element table or aligned copy */
} kv_entry;

typedef struct {
    cinfer_gguf_tensor t;
    const char *raw;      /* name bytes in the file (during the parse) */
    uint64_t name_len;
} tensor_entry;

struct cinfer_gguf {
    const uint8_t *base;
    size_t size;
    void *map; /* the mapping or buffer when the reader opened a file,
                  else NULL */
    size_t map_size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* start of the data section in the file */

    kv_entry *kv;
    uint64_t n_kv, cap_kv;
    tensor_entry *tensors;
    uint64_t n_tensors, cap_tensors;
    char *names; /* arena for keys and tensor names */

    uint64_t *kv_slots; /* open addressing: index + 1, 0 = empty */
    uint64_t kv_mask;
    uint64_t *tensor_slots;
    uint64_t tensor_mask;
};

/* Parse position in the file. */
typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
} cursor;

static size_t left(const cursor *c) { return c->size - c->pos; }

/* Quoted-name helpers for messages: at most NAME_QUOTE_MAX bytes. */
static int qlen(uint64_t n) { return n > NAME_QUOTE_MAX ? NAME_QUOTE_MAX : (int)n; }

static cinfer_status truncated(const cursor *c, const char *what, size_t need)
{
    return cinfer_set_error(CINFER_E_FORMAT,
                            "gguf: file ends while reading %s at offset %zu "
                            "(needs %zu bytes, %zu left, file size %zu)",
                            what, c->pos, need, left(c), c->size);
}

static int take(cursor *c, size_t n, const uint8_t **out)
{
    *out = NULL;
    if (left(c) < n)
        return 0;
    *out = c->base + c->pos;
    c->pos += n;
    return 1;
}

static int take_u32(cursor *c, uint32_t *v)
{
    const uint8_t *p;
    if (!take(c, 4, &p))
        return 0;
    *v = le32(p);
    return 1;
}

static int take_u64(cursor *c, uint64_t *v)
{
    const uint8_t *p;
    if (!take(c, 8, &p))
        return 0;
    *v = le64(p);
    return 1;
}

/* Context of the key being parsed, for messages. */
typedef struct {
    uint64_t index;
    const char *key;
    uint64_t key_len;
} kv_ctx;

#define KV_FMT "gguf: key #%llu '%.*s'"
#define KV_ARGS(k) (unsigned long long)(k)->index, qlen((k)->key_len), (k)->key

/* Reads a string (u64 length + bytes) that is a value, not a name. */
static cinfer_status read_value_str(cursor *c, const kv_ctx *k,
                                    const char *what, cinfer_gguf_str *out)
{
    uint64_t len;
    const uint8_t *p;
    if (!take_u64(c, &len))
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": file ends in the length of %s at "
                                "offset %zu (file size %zu)",
                                KV_ARGS(k), what, c->pos, c->size);
    if (len > left(c))
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": %s length %llu exceeds file (%zu "
                                "bytes left at offset %zu)",
                                KV_ARGS(k), what, (unsigned long long)len,
                                left(c), c->pos);
    take(c, (size_t)len, &p);
    out->ptr = (const char *)p;
    out->len = len;
    return CINFER_OK;
}

/* Parses an array body (element type, count, elements) at depth `depth`
 * (1 = the key's own array). Fills `arr` and, for the outermost array,
 * `owned` with the table or copy it allocates. Nested arrays are walked and
 * skipped. */
static cinfer_status read_array(cursor *c, const kv_ctx *k, int depth,
                                cinfer_gguf_arr *arr, void **owned)
{
    uint32_t et;
    uint64_t n;
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": arrays nested more than %d deep at "
                                "offset %zu",
                                KV_ARGS(k), GGUF_MAX_ARRAY_DEPTH, c->pos);
    if (!take_u32(c, &et) || !take_u64(c, &n))
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": file ends in an array header at "
                                "offset %zu (file size %zu)",
                                KV_ARGS(k), c->pos, c->size);
    if (et > CINFER_GGUF_FLOAT64)
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": unknown array element type %u at "
                                "offset %zu",
                                KV_ARGS(k), et, c->pos - 12);
    arr->type = (cinfer_gguf_type)et;
    arr->n = n;
    arr->data = NULL;
    arr->priv_ = NULL;

    if (et == CINFER_GGUF_STRING) {
        /* Each element takes at least its 8-byte length. */
        if (n > left(c) / 8)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    KV_FMT ": string array of %llu elements "
                                    "exceeds file (%zu bytes left at offset "
                                    "%zu)",
                                    KV_ARGS(k), (unsigned long long)n,
                                    left(c), c->pos);
        const uint8_t **elems = NULL;
        if (depth == 1 && n > 0) {
            elems = malloc((size_t)n * sizeof *elems);
            if (!elems)
                return cinfer_set_error(CINFER_E_NOMEM,
                                        KV_FMT ": no memory for %llu string "
                                        "positions",
                                        KV_ARGS(k), (unsigned long long)n);
        }
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *lp;
            uint64_t len;
            if (!take(c, 8, &lp)) {
                free(elems);
                return cinfer_set_error(CINFER_E_FORMAT,
                                        KV_FMT ": file ends in string array "
                                        "element %llu at offset %zu (file "
                                        "size %zu)",
                                        KV_ARGS(k), (unsigned long long)i,
                                        c->pos, c->size);
            }
            len = le64(lp);
            if (len > left(c)) {
                free(elems);
                return cinfer_set_error(CINFER_E_FORMAT,
                                        KV_FMT ": string array element %llu "
                                        "length %llu exceeds file (%zu bytes "
                                        "left at offset %zu)",
                                        KV_ARGS(k), (unsigned long long)i,
                                        (unsigned long long)len, left(c),
                                        c->pos);
            }
            c->pos += (size_t)len;
            if (elems)
                elems[i] = lp;
        }
        arr->priv_ = elems;
        *owned = elems;
        return CINFER_OK;
    }

    if (et == CINFER_GGUF_ARRAY) {
        /* Each nested array takes at least its 12-byte header. */
        if (n > left(c) / 12)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    KV_FMT ": array of %llu arrays exceeds "
                                    "file (%zu bytes left at offset %zu)",
                                    KV_ARGS(k), (unsigned long long)n,
                                    left(c), c->pos);
        for (uint64_t i = 0; i < n; i++) {
            cinfer_gguf_arr inner;
            void *inner_owned = NULL;
            cinfer_status st = read_array(c, k, depth + 1, &inner,
                                          &inner_owned);
            free(inner_owned);
            if (st != CINFER_OK)
                return st;
        }
        return CINFER_OK;
    }

    size_t es = scalar_size(et);
    if (n > left(c) / es)
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": %s array of %llu elements exceeds "
                                "file (%zu bytes left at offset %zu)",
                                KV_ARGS(k), type_name(et),
                                (unsigned long long)n, left(c), c->pos);
    const uint8_t *p = NULL;
    take(c, (size_t)n * es, &p);
    if (et == CINFER_GGUF_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (p[i] > 1)
                return cinfer_set_error(CINFER_E_FORMAT,
                                        KV_FMT ": bool array element %llu is "
                                        "%u (must be 0 or 1)",
                                        KV_ARGS(k), (unsigned long long)i,
                                        p[i]);
    }
    arr->data = p;
    if (depth == 1 && n > 0 && ((uintptr_t)p % es) != 0) {
        void *copy = malloc((size_t)n * es);
        if (!copy)
            return cinfer_set_error(CINFER_E_NOMEM,
                                    KV_FMT ": no memory for a %llu-byte copy",
                                    KV_ARGS(k),
                                    (unsigned long long)(n * es));
        memcpy(copy, p, (size_t)n * es);
        arr->data = copy;
        *owned = copy;
    }
    return CINFER_OK;
}

/* Reads a key or tensor name: non-empty, no NUL, inside the file. */
static cinfer_status read_name(cursor *c, const char *what, uint64_t index,
                               const char **ptr, uint64_t *len)
{
    uint64_t n;
    const uint8_t *p;
    if (!take_u64(c, &n))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: %s #%llu: file ends in the name length "
                                "at offset %zu (file size %zu)",
                                what, (unsigned long long)index, c->pos,
                                c->size);
    if (n > left(c))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: %s #%llu: name length %llu exceeds file "
                                "(%zu bytes left at offset %zu)",
                                what, (unsigned long long)index,
                                (unsigned long long)n, left(c), c->pos);
    if (n == 0)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: %s #%llu at offset %zu has an empty name",
                                what, (unsigned long long)index, c->pos - 8);
    take(c, (size_t)n, &p);
    if (memchr(p, 0, (size_t)n))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: %s #%llu name '%.*s' contains a NUL "
                                "byte (offset %zu)",
                                what, (unsigned long long)index, qlen(n),
                                (const char *)p, c->pos - (size_t)n);
    *ptr = (const char *)p;
    *len = n;
    return CINFER_OK;
}

static cinfer_status read_kv(cursor *c, uint64_t index, kv_entry *e)
{
    cinfer_status st;
    uint32_t t;
    memset(e, 0, sizeof *e);
    e->file_offset = c->pos;
    st = read_name(c, "key", index, &e->raw, &e->key_len);
    if (st != CINFER_OK)
        return st;
    kv_ctx k = {index, e->raw, e->key_len};
    if (!take_u32(c, &t))
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": file ends in the value type at "
                                "offset %zu (file size %zu)",
                                KV_ARGS(&k), c->pos, c->size);
    if (t > CINFER_GGUF_FLOAT64)
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": unknown value type %u at offset %zu",
                                KV_ARGS(&k), t, c->pos - 4);
    e->type = (cinfer_gguf_type)t;
    if (t == CINFER_GGUF_STRING)
        return read_value_str(c, &k, "string value", &e->str);
    if (t == CINFER_GGUF_ARRAY)
        return read_array(c, &k, 1, &e->arr, &e->owned);

    size_t sz = scalar_size(t);
    const uint8_t *p;
    if (!take(c, sz, &p))
        return cinfer_set_error(CINFER_E_FORMAT,
                                KV_FMT ": file ends in the %s value at offset "
                                "%zu (file size %zu)",
                                KV_ARGS(&k), type_name(t), c->pos, c->size);
    switch (t) {
    case CINFER_GGUF_UINT8: e->num.u = p[0]; break;
    case CINFER_GGUF_INT8: e->num.i = (int8_t)p[0]; break;
    case CINFER_GGUF_UINT16: e->num.u = le16(p); break;
    case CINFER_GGUF_INT16: e->num.i = (int16_t)le16(p); break;
    case CINFER_GGUF_UINT32: e->num.u = le32(p); break;
    case CINFER_GGUF_INT32: e->num.i = (int32_t)le32(p); break;
    case CINFER_GGUF_UINT64: e->num.u = le64(p); break;
    case CINFER_GGUF_INT64: e->num.i = (int64_t)le64(p); break;
    case CINFER_GGUF_FLOAT32: {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, 4);
        e->num.f = f;
        break;
    }
    case CINFER_GGUF_FLOAT64: {
        uint64_t u = le64(p);
        memcpy(&e->num.f, &u, 8);
        break;
    }
    case CINFER_GGUF_BOOL:
        if (p[0] > 1)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    KV_FMT ": bool value %u (must be 0 or 1)",
                                    KV_ARGS(&k), p[0]);
        e->num.u = p[0];
        break;
    default:
        CINFER_ASSERT(0);
    }
    return CINFER_OK;
}

#define T_FMT "gguf: tensor #%llu '%.*s'"
#define T_ARGS(i, e) (unsigned long long)(i), qlen((e)->name_len), (e)->raw

static cinfer_status read_tensor_info(cursor *c, uint64_t index,
                                      uint32_t alignment, tensor_entry *e)
{
    cinfer_status st;
    uint32_t n_dims, type;
    memset(e, 0, sizeof *e);
    st = read_name(c, "tensor", index, &e->raw, &e->name_len);
    if (st != CINFER_OK)
        return st;
    if (!take_u32(c, &n_dims))
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": file ends in n_dims at offset %zu "
                                "(file size %zu)",
                                T_ARGS(index, e), c->pos, c->size);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": n_dims %u not in 1..%d",
                                T_ARGS(index, e), n_dims, GGUF_MAX_DIMS);
    e->t.n_dims = n_dims;
    uint64_t n_elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        e->t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t v;
        if (!take_u64(c, &v))
            return cinfer_set_error(CINFER_E_FORMAT,
                                    T_FMT ": file ends in dimension %u at "
                                    "offset %zu (file size %zu)",
                                    T_ARGS(index, e), d, c->pos, c->size);
        if (v == 0 || v > (uint64_t)INT64_MAX)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    T_FMT ": dimension %u is %lld (must be "
                                    ">= 1)",
                                    T_ARGS(index, e), d, (long long)v);
        if (n_elems > (uint64_t)INT64_MAX / v)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    T_FMT ": element count overflows at "
                                    "dimension %u (%llu)",
                                    T_ARGS(index, e), d,
                                    (unsigned long long)v);
        n_elems *= v;
        e->t.ne[d] = (int64_t)v;
    }
    if (!take_u32(c, &type))
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": file ends in the type at offset %zu "
                                "(file size %zu)",
                                T_ARGS(index, e), c->pos, c->size);
    if (!cinfer_dtype_valid(type))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                T_FMT ": tensor type %u (%s) is not supported",
                                T_ARGS(index, e), type,
                                cinfer_dtype_ggml_name(type));
    e->t.dtype = (cinfer_dtype)type;
    int be = cinfer_dtype_block_elems(e->t.dtype);
    if (e->t.ne[0] % be != 0)
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": ne[0] = %lld is not a multiple of the "
                                "%s block size %d",
                                T_ARGS(index, e), (long long)e->t.ne[0],
                                cinfer_dtype_name(e->t.dtype), be);
    /* bytes = (n_elems / be) * block bytes, checked against SIZE_MAX. */
    uint64_t blocks = n_elems / (uint64_t)be;
    uint64_t bb = cinfer_dtype_block_bytes(e->t.dtype);
    if (blocks > (uint64_t)SIZE_MAX / bb)
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": data size overflows (%llu elements "
                                "of %s)",
                                T_ARGS(index, e), (unsigned long long)n_elems,
                                cinfer_dtype_name(e->t.dtype));
    e->t.n_bytes = (size_t)(blocks * bb);
    if (!take_u64(c, &e->t.offset))
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": file ends in the data offset at "
                                "offset %zu (file size %zu)",
                                T_ARGS(index, e), c->pos, c->size);
    if (e->t.offset % alignment != 0)
        return cinfer_set_error(CINFER_E_FORMAT,
                                T_FMT ": data offset %llu is not a multiple of "
                                "the alignment %u",
                                T_ARGS(index, e),
                                (unsigned long long)e->t.offset, alignment);
    return CINFER_OK;
}

/* Slot table size for n entries: a power of two >= 2n, at least 8. */
static uint64_t slot_count(uint64_t n)
{
    uint64_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

/* Finds `name` in a slot table; returns the index or -1. `name_at(i)`
 * yields the stored name and its length. */
typedef const char *(*name_fn)(const cinfer_gguf *g, uint64_t i, uint64_t *len);

static const char *kv_name_at(const cinfer_gguf *g, uint64_t i, uint64_t *len)
{
    *len = g->kv[i].key_len;
    return g->kv[i].raw;
}

static const char *tensor_name_at(const cinfer_gguf *g, uint64_t i,
                                  uint64_t *len)
{
    *len = g->tensors[i].name_len;
    return g->tensors[i].raw;
}

static int64_t slot_find(const cinfer_gguf *g, const uint64_t *slots,
                         uint64_t mask, name_fn at, const char *name,
                         size_t len)
{
    if (!slots)
        return -1;
    uint64_t h = hash_bytes(name, len) & mask;
    for (;;) {
        uint64_t s = slots[h];
        if (s == 0)
            return -1;
        uint64_t l;
        const char *n = at(g, s - 1, &l);
        if (l == len && memcmp(n, name, len) == 0)
            return (int64_t)(s - 1);
        h = (h + 1) & mask;
    }
}

/* Builds the slot table over n entries; on a duplicate returns its two
 * indices through dup_a/dup_b and CINFER_E_FORMAT (no message set). */
static cinfer_status slot_build(cinfer_gguf *g, uint64_t n, name_fn at,
                                uint64_t **slots_out, uint64_t *mask_out,
                                uint64_t *dup_a, uint64_t *dup_b)
{
    uint64_t cap = slot_count(n);
    uint64_t *slots = calloc((size_t)cap, sizeof *slots);
    if (!slots)
        return cinfer_set_error(CINFER_E_NOMEM, "gguf: no memory for a "
                                                "%llu-slot name index",
                                (unsigned long long)cap);
    *slots_out = slots;
    *mask_out = cap - 1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        const char *name = at(g, i, &len);
        uint64_t h = hash_bytes(name, (size_t)len) & (cap - 1);
        for (;;) {
            uint64_t s = slots[h];
            if (s == 0) {
                slots[h] = i + 1;
                break;
            }
            uint64_t l;
            const char *other = at(g, s - 1, &l);
            if (l == len && memcmp(other, name, (size_t)len) == 0) {
                *dup_a = s - 1;
                *dup_b = i;
                return CINFER_E_FORMAT;
            }
            h = (h + 1) & (cap - 1);
        }
    }
    return CINFER_OK;
}

/* Grows an entry array to hold one more element. */
static int grow(void **arr, uint64_t *cap, uint64_t n, size_t elem)
{
    if (n < *cap)
        return 1;
    uint64_t nc = *cap ? *cap * 2 : 16;
    if (nc > SIZE_MAX / elem)
        return 0;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p)
        return 0;
    *arr = p;
    *cap = nc;
    return 1;
}

static cinfer_status parse(cinfer_gguf *g)
{
    cursor c = {g->base, g->size, 0};
    const uint8_t *p;
    cinfer_status st;
    uint64_t n_tensors, n_kv;

    if (!take(&c, 4, &p))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: file is %zu bytes, too short for the "
                                "magic",
                                g->size);
    if (memcmp(p, "GGUF", 4) != 0)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: bad magic %02x %02x %02x %02x "
                                "(expected 'GGUF')",
                                p[0], p[1], p[2], p[3]);
    if (!take_u32(&c, &g->version))
        return truncated(&c, "the version", 4);
    if (g->version == 1)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "gguf: version 1 is not supported (only 2 "
                                "and 3)");
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) |
                           ((v << 8) & 0xff0000u) | (v << 24);
        if (swapped == 2 || swapped == 3)
            return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                    "gguf: big-endian file (version %u "
                                    "byte-swapped) is not supported",
                                    swapped);
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "gguf: version %u is not supported (only 2 "
                                "and 3)",
                                v);
    }
    if (!take_u64(&c, &n_tensors))
        return truncated(&c, "the tensor count", 8);
    if (!take_u64(&c, &n_kv))
        return truncated(&c, "the key/value count", 8);
    if (n_kv > left(&c) / GGUF_MIN_KV_BYTES)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key/value count %llu cannot fit in the "
                                "%zu bytes left after the header (file size "
                                "%zu)",
                                (unsigned long long)n_kv, left(&c), g->size);
    if (n_tensors > left(&c) / GGUF_MIN_TENSOR_BYTES)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: tensor count %llu cannot fit in the %zu "
                                "bytes left after the header (file size %zu)",
                                (unsigned long long)n_tensors, left(&c),
                                g->size);

    /* ---- key/values ---- */
    for (uint64_t i = 0; i < n_kv; i++) {
        if (!grow((void **)&g->kv, &g->cap_kv, g->n_kv, sizeof *g->kv))
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "gguf: no memory for key/value #%llu",
                                    (unsigned long long)i);
        st = read_kv(&c, i, &g->kv[i]);
        if (st != CINFER_OK) {
            free(g->kv[i].owned);
            return st;
        }
        g->n_kv = i + 1;
    }
    uint64_t da = 0, db = 0;
    st = slot_build(g, g->n_kv, kv_name_at, &g->kv_slots, &g->kv_mask, &da,
                    &db);
    if (st == CINFER_E_FORMAT)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: duplicate key '%.*s' (#%llu at offset "
                                "%llu and #%llu at offset %llu)",
                                qlen(g->kv[db].key_len), g->kv[db].raw,
                                (unsigned long long)da,
                                (unsigned long long)g->kv[da].file_offset,
                                (unsigned long long)db,
                                (unsigned long long)g->kv[db].file_offset);
    if (st != CINFER_OK)
        return st;

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = slot_find(g, g->kv_slots, g->kv_mask, kv_name_at,
                           "general.alignment", strlen("general.alignment"));
    if (ai >= 0) {
        const kv_entry *e = &g->kv[ai];
        if (e->type != CINFER_GGUF_UINT32)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "gguf: general.alignment has type %s, "
                                    "expected UINT32",
                                    type_name(e->type));
        if (!is_power_of_two(e->num.u))
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "gguf: general.alignment %llu is not a "
                                    "power of two",
                                    (unsigned long long)e->num.u);
        g->alignment = (uint32_t)e->num.u;
    }

    /* ---- tensor infos ---- */
    if (n_tensors > left(&c) / GGUF_MIN_TENSOR_BYTES)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: tensor count %llu cannot fit in the %zu "
                                "bytes left after the key/values (offset %zu, "
                                "file size %zu)",
                                (unsigned long long)n_tensors, left(&c), c.pos,
                                g->size);
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (!grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors,
                  sizeof *g->tensors))
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "gguf: no memory for tensor #%llu",
                                    (unsigned long long)i);
        st = read_tensor_info(&c, i, g->alignment, &g->tensors[i]);
        if (st != CINFER_OK)
            return st;
        g->n_tensors = i + 1;
    }
    st = slot_build(g, g->n_tensors, tensor_name_at, &g->tensor_slots,
                    &g->tensor_mask, &da, &db);
    if (st == CINFER_E_FORMAT)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: duplicate tensor name '%.*s' (#%llu and "
                                "#%llu)",
                                qlen(g->tensors[db].name_len),
                                g->tensors[db].raw, (unsigned long long)da,
                                (unsigned long long)db);
    if (st != CINFER_OK)
        return st;

    /* ---- data section ---- */
    uint64_t pos = c.pos;
    g->data_offset = (pos + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tensor_entry *e = &g->tensors[i];
        uint64_t off = e->t.offset;
        uint64_t nb = e->t.n_bytes;
        if (g->data_offset > g->size || off > g->size - g->data_offset ||
            nb > g->size - g->data_offset - off)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "gguf: tensor '%.*s' data [offset %llu, "
                                    "%llu bytes] runs past end of file (size "
                                    "%zu, data section at %llu)",
                                    qlen(e->name_len), e->raw,
                                    (unsigned long long)off,
                                    (unsigned long long)nb, g->size,
                                    (unsigned long long)g->data_offset);
        e->t.data = g->base + g->data_offset + off;
    }

    /* ---- names arena ---- */
    size_t total = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        total += (size_t)g->kv[i].key_len + 1;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        total += (size_t)g->tensors[i].name_len + 1;
    g->names = malloc(total ? total : 1);
    if (!g->names)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf: no memory for %zu bytes of names",
                                total);
    char *q = g->names;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv_entry *e = &g->kv[i];
        memcpy(q, e->raw, (size_t)e->key_len);
        q[e->key_len] = '\0';
        e->key = q;
        q += e->key_len + 1;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tensor_entry *e = &g->tensors[i];
        memcpy(q, e->raw, (size_t)e->name_len);
        q[e->name_len] = '\0';
        e->t.name = q;
        q += e->name_len + 1;
    }
    return CINFER_OK;
}

cinfer_gguf_params cinfer_gguf_default_params(void)
{
    cinfer_gguf_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* Reads the open file (size bytes) into anonymous memory in huge pages
 * (common/huge_pages.h). */
static cinfer_status read_file(cinfer_gguf *g, int fd, size_t size,
                               const char *path)
{
    size_t len = 0;
    uint8_t *buf = cinfer_huge_alloc(size, &len);
    if (!buf)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf: no memory to read '%s' (%zu bytes): %s",
                                path, size, strerror(errno));
    size_t got = 0;
    while (got < size) {
        size_t want = size - got < ((size_t)1 << 30) ? size - got
                                                      : (size_t)1 << 30;
        ssize_t r = pread(fd, buf + got, want, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int err = r < 0 ? errno : 0;
            cinfer_huge_free(buf, len);
            if (r == 0)
                return cinfer_set_error(CINFER_E_IO,
                                        "gguf: '%s' ended at byte %zu while "
                                        "reading %zu (did it change?)",
                                        path, got, size);
            return cinfer_set_error(CINFER_E_IO, "gguf: cannot read '%s': %s",
                                    path, strerror(err));
        }
        got += (size_t)r;
    }
    g->map = buf;
    g->map_size = len;
    g->base = buf;
    g->size = size;
    return CINFER_OK;
}

static cinfer_status map_file(cinfer_gguf *g, const char *path, int in_memory)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cinfer_set_error(CINFER_E_IO, "gguf: cannot open '%s': %s",
                                path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return cinfer_set_error(CINFER_E_IO, "gguf: cannot stat '%s': %s",
                                path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cinfer_set_error(CINFER_E_IO, "gguf: '%s' is not a regular file",
                                path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: '%s' is empty (0 bytes)", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return cinfer_set_error(CINFER_E_IO, "gguf: '%s' is too large to map",
                                path);
    }
    if (in_memory) {
        cinfer_status st = read_file(g, fd, (size_t)sb.st_size, path);
        close(fd);
        return st;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED)
        return cinfer_set_error(CINFER_E_IO, "gguf: cannot map '%s': %s", path,
                                strerror(err));
    g->map = m;
    g->map_size = (size_t)sb.st_size;
    g->base = m;
    g->size = (size_t)sb.st_size;
    return CINFER_OK;
}

cinfer_status cinfer_gguf_create(const cinfer_gguf_params *p,
                                 cinfer_gguf **out)
{
    cinfer_status st;
    if (!p || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf: params and out must not be NULL");
    *out = NULL;
    if (!p->path && !p->data && p->size > 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf: neither path nor data given");
    cinfer_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return cinfer_set_error(CINFER_E_NOMEM, "gguf: no memory for a reader");
    if (p->path) {
        st = map_file(g, p->path, p->in_memory);
        if (st != CINFER_OK)
            goto fail_parse;
    } else {
        g->base = p->data;
        g->size = p->size;
    }
    st = parse(g);
    if (st != CINFER_OK) {
        if (p->path) {
            /* Prefix the path: "model.gguf: gguf: ...". */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", cinfer_last_error());
            cinfer_set_error(st, "%s: %s", p->path, msg);
        }
        goto fail_parse;
    }
    *out = g;
    return CINFER_OK;

fail_parse:
    cinfer_gguf_destroy(g);
    return st;
}

void cinfer_gguf_destroy(cinfer_gguf *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; i < g->n_kv; i++)
        free(g->kv[i].owned);
    free(g->kv);
    free(g->tensors);
    free(g->names);
    free(g->kv_slots);
    free(g->tensor_slots);
    if (g->map)
        munmap(g->map, g->map_size);
    free(g);
}

uint32_t cinfer_gguf_version(const cinfer_gguf *g) { return g->version; }

uint32_t cinfer_gguf_alignment(const cinfer_gguf *g) { return g->alignment; }

/* ---- metadata ---------------------------------------------------------- */

uint64_t cinfer_gguf_n_kv(const cinfer_gguf *g) { return g->n_kv; }

const char *cinfer_gguf_kv_key(const cinfer_gguf *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].key : NULL;
}

cinfer_gguf_type cinfer_gguf_kv_type(const cinfer_gguf *g, uint64_t i)
{
    CINFER_ASSERT(i < g->n_kv);
    return g->kv[i].type;
}

int64_t cinfer_gguf_find_key(const cinfer_gguf *g, const char *key)
{
    if (!key)
        return -1;
    return slot_find(g, g->kv_slots, g->kv_mask, kv_name_at, key,
                     strlen(key));
}

/* Finds `key` or sets CINFER_E_NOT_FOUND. */
static cinfer_status lookup(const cinfer_gguf *g, const char *key,
                            const kv_entry **out)
{
    int64_t i = cinfer_gguf_find_key(g, key);
    if (i < 0)
        return cinfer_set_error(CINFER_E_NOT_FOUND, "gguf: key '%s' not found",
                                key ? key : "(null)");
    *out = &g->kv[i];
    return CINFER_OK;
}

static int is_unsigned(cinfer_gguf_type t)
{
    return t == CINFER_GGUF_UINT8 || t == CINFER_GGUF_UINT16 ||
           t == CINFER_GGUF_UINT32 || t == CINFER_GGUF_UINT64;
}

static int is_signed(cinfer_gguf_type t)
{
    return t == CINFER_GGUF_INT8 || t == CINFER_GGUF_INT16 ||
           t == CINFER_GGUF_INT32 || t == CINFER_GGUF_INT64;
}

cinfer_status cinfer_gguf_get_u32(const cinfer_gguf *g, const char *key,
                                  uint32_t *out)
{
    const kv_entry *e;
    cinfer_status st = lookup(g, key, &e);
    if (st != CINFER_OK)
        return st;
    if (is_unsigned(e->type)) {
        if (e->num.u > UINT32_MAX)
            goto range;
        *out = (uint32_t)e->num.u;
        return CINFER_OK;
    }
    if (is_signed(e->type)) {
        if (e->num.i < 0 || e->num.i > (int64_t)UINT32_MAX)
            goto range;
        *out = (uint32_t)e->num.i;
        return CINFER_OK;
    }
    return cinfer_set_error(CINFER_E_FORMAT,
                            "gguf: key '%s' has type %s, expected an integer",
                            key, type_name(e->type));
range:
    if (is_signed(e->type))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key '%s' value %lld does not fit in "
                                "u32",
                                key, (long long)e->num.i);
    return cinfer_set_error(CINFER_E_FORMAT,
                            "gguf: key '%s' value %llu does not fit in u32",
                            key, (unsigned long long)e->num.u);
}

cinfer_status cinfer_gguf_get_i64(const cinfer_gguf *g, const char *key,
                                  int64_t *out)
{
    const kv_entry *e;
    cinfer_status st = lookup(g, key, &e);
    if (st != CINFER_OK)
        return st;
    if (is_unsigned(e->type)) {
        if (e->num.u > (uint64_t)INT64_MAX)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "gguf: key '%s' value %llu does not fit "
                                    "in i64",
                                    key, (unsigned long long)e->num.u);
        *out = (int64_t)e->num.u;
        return CINFER_OK;
    }
    if (is_signed(e->type)) {
        *out = e->num.i;
        return CINFER_OK;
    }
    return cinfer_set_error(CINFER_E_FORMAT,
                            "gguf: key '%s' has type %s, expected an integer",
                            key, type_name(e->type));
}

cinfer_status cinfer_gguf_get_f32(const cinfer_gguf *g, const char *key,
                                  float *out)
{
    const kv_entry *e;
    cinfer_status st = lookup(g, key, &e);
    if (st != CINFER_OK)
        return st;
    if (e->type != CINFER_GGUF_FLOAT32 && e->type != CINFER_GGUF_FLOAT64)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key '%s' has type %s, expected FLOAT32 "
                                "or FLOAT64",
                                key, type_name(e->type));
    double d = e->num.f;
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key '%s' value %g does not fit in f32",
                                key, d);
    *out = (float)d;
    return CINFER_OK;
}

cinfer_status cinfer_gguf_get_bool(const cinfer_gguf *g, const char *key,
                                   int *out)
{
    const kv_entry *e;
    cinfer_status st = lookup(g, key, &e);
    if (st != CINFER_OK)
        return st;
    if (e->type != CINFER_GGUF_BOOL)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key '%s' has type %s, expected BOOL",
                                key, type_name(e->type));
    *out = (int)e->num.u;
    return CINFER_OK;
}

cinfer_status cinfer_gguf_get_str(const cinfer_gguf *g, const char *key,
                                  cinfer_gguf_str *out)
{
    const kv_entry *e;
    cinfer_status st = lookup(g, key, &e);
    if (st != CINFER_OK)
        return st;
    if (e->type != CINFER_GGUF_STRING)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key '%s' has type %s, expected STRING",
                                key, type_name(e->type));
    *out = e->str;
    return CINFER_OK;
}

cinfer_status cinfer_gguf_get_arr(const cinfer_gguf *g, const char *key,
                                  cinfer_gguf_arr *out)
{
    const kv_entry *e;
    cinfer_status st = lookup(g, key, &e);
    if (st != CINFER_OK)
        return st;
    if (e->type != CINFER_GGUF_ARRAY)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "gguf: key '%s' has type %s, expected ARRAY",
                                key, type_name(e->type));
    *out = e->arr;
    return CINFER_OK;
}

cinfer_gguf_str cinfer_gguf_arr_str(const cinfer_gguf_arr *a, uint64_t i)
{
    cinfer_gguf_str s = {NULL, 0};
    if (!a || a->type != CINFER_GGUF_STRING || i >= a->n || !a->priv_)
        return s;
    const uint8_t *lp = ((const uint8_t *const *)a->priv_)[i];
    s.len = le64(lp);
    s.ptr = (const char *)lp + 8;
    return s;
}

/* ---- tensors ----------------------------------------------------------- */

uint64_t cinfer_gguf_n_tensors(const cinfer_gguf *g) { return g->n_tensors; }

const cinfer_gguf_tensor *cinfer_gguf_tensor_at(const cinfer_gguf *g,
                                                uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i].t : NULL;
}

const cinfer_gguf_tensor *cinfer_gguf_find_tensor(const cinfer_gguf *g,
                                                  const char *name)
{
    if (!name)
        return NULL;
    int64_t i = slot_find(g, g->tensor_slots, g->tensor_mask, tensor_name_at,
                          name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i].t;
}

/* ====================================================================== */
/* writer                                                                  */
/* ====================================================================== */

typedef struct {
    char *key;
    cinfer_gguf_type type;
    uint8_t *val; /* encoded value (after the type field) */
    size_t val_len;
} wkv;

typedef struct {
    char *name;
    cinfer_dtype dtype;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    void *data;
    size_t n_bytes;
} wtensor;

struct cinfer_gguf_writer {
    uint32_t alignment;
    wkv *kv;
    uint64_t n_kv, cap_kv;
    wtensor *tensors;
    uint64_t n_tensors, cap_tensors;
};

/* Longest tensor name the writer accepts (GGML keeps names in 64 bytes). */
#define WRITER_MAX_NAME 63

cinfer_gguf_writer_params cinfer_gguf_writer_default_params(void)
{
    cinfer_gguf_writer_params p;
    memset(&p, 0, sizeof p);
    return p;
}

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Replaces or appends key `key` with an encoded value (ownership of `val`
 * passes to the writer, also on failure). */
static cinfer_status writer_put(cinfer_gguf_writer *w, const char *key,
                                cinfer_gguf_type type, uint8_t *val,
                                size_t val_len)
{
    if (!w || !key || !key[0]) {
        free(val);
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: key must be a non-empty string");
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = val_len;
            return CINFER_OK;
        }
    }
    char *k = strdup(key);
    if (!k || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
        free(k);
        free(val);
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for key '%s'", key);
    }
    wkv *e = &w->kv[w->n_kv++];
    e->key = k;
    e->type = type;
    e->val = val;
    e->val_len = val_len;
    return CINFER_OK;
}

static cinfer_status writer_put_scalar(cinfer_gguf_writer *w, const char *key,
                                       cinfer_gguf_type type, uint64_t bits)
{
    size_t n = scalar_size(type);
    uint8_t *val = malloc(n);
    if (!val)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for key '%s'",
                                key ? key : "(null)");
    put_le(val, bits, n);
    return writer_put(w, key, type, val, n);
}

cinfer_status cinfer_gguf_writer_create(const cinfer_gguf_writer_params *p,
                                        cinfer_gguf_writer **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: out must not be NULL");
    *out = NULL;
    uint32_t a = p && p->alignment ? p->alignment : GGUF_DEFAULT_ALIGNMENT;
    if (!is_power_of_two(a))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: alignment %u is not a power of "
                                "two",
                                a);
    cinfer_gguf_writer *w = calloc(1, sizeof *w);
    if (!w)
        return cinfer_set_error(CINFER_E_NOMEM, "gguf writer: no memory");
    w->alignment = a;
    if (a != GGUF_DEFAULT_ALIGNMENT) {
        cinfer_status st = cinfer_gguf_writer_set_u32(w, "general.alignment",
                                                      a);
        if (st != CINFER_OK)
            goto fail_kv;
    }
    *out = w;
    return CINFER_OK;

fail_kv:
    cinfer_gguf_writer_destroy(w);
    return CINFER_E_NOMEM; /* the only way set_u32 fails here */
}

void cinfer_gguf_writer_destroy(cinfer_gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->kv);
    free(w->tensors);
    free(w);
}

cinfer_status cinfer_gguf_writer_set_u32(cinfer_gguf_writer *w,
                                         const char *key, uint32_t v)
{
    return writer_put_scalar(w, key, CINFER_GGUF_UINT32, v);
}

cinfer_status cinfer_gguf_writer_set_i32(cinfer_gguf_writer *w,
                                         const char *key, int32_t v)
{
    return writer_put_scalar(w, key, CINFER_GGUF_INT32, (uint32_t)v);
}

cinfer_status cinfer_gguf_writer_set_u64(cinfer_gguf_writer *w,
                                         const char *key, uint64_t v)
{
    return writer_put_scalar(w, key, CINFER_GGUF_UINT64, v);
}

cinfer_status cinfer_gguf_writer_set_f32(cinfer_gguf_writer *w,
                                         const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return writer_put_scalar(w, key, CINFER_GGUF_FLOAT32, u);
}

cinfer_status cinfer_gguf_writer_set_bool(cinfer_gguf_writer *w,
                                          const char *key, int v)
{
    return writer_put_scalar(w, key, CINFER_GGUF_BOOL, v ? 1 : 0);
}

cinfer_status cinfer_gguf_writer_set_str(cinfer_gguf_writer *w,
                                         const char *key, const char *v)
{
    if (!v)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: key '%s': string is NULL",
                                key ? key : "(null)");
    size_t n = strlen(v);
    uint8_t *val = malloc(8 + n);
    if (!val)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for key '%s'",
                                key ? key : "(null)");
    put_le(val, n, 8);
    memcpy(val + 8, v, n);
    return writer_put(w, key, CINFER_GGUF_STRING, val, 8 + n);
}

cinfer_status cinfer_gguf_writer_set_arr(cinfer_gguf_writer *w,
                                         const char *key,
                                         cinfer_gguf_type type,
                                         const void *data, uint64_t n)
{
    size_t es = scalar_size(type);
    if (es == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: key '%s': array element type %s "
                                "is not numeric or bool",
                                key ? key : "(null)", type_name(type));
    if (n > 0 && !data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: key '%s': array data is NULL",
                                key ? key : "(null)");
    if (n > (SIZE_MAX - 12) / es)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: key '%s': array of %llu elements "
                                "is too large",
                                key ? key : "(null)", (unsigned long long)n);
    size_t len = 12 + (size_t)n * es;
    uint8_t *val = malloc(len);
    if (!val)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for key '%s'",
                                key ? key : "(null)");
    put_le(val, (uint32_t)type, 4);
    put_le(val + 4, n, 8);
    /* Elements are stored little-endian; encode each for portability. */
    const uint8_t *src = data;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t bits = 0;
        switch (es) {
        case 1: bits = src[i]; break;
        case 2: {
            uint16_t v;
            memcpy(&v, src + i * 2, 2);
            bits = v;
            break;
        }
        case 4: {
            uint32_t v;
            memcpy(&v, src + i * 4, 4);
            bits = v;
            break;
        }
        default:
            memcpy(&bits, src + i * 8, 8);
            break;
        }
        if (type == CINFER_GGUF_BOOL)
            bits = bits ? 1 : 0;
        put_le(val + 12 + i * es, bits, es);
    }
    return writer_put(w, key, CINFER_GGUF_ARRAY, val, len);
}

cinfer_status cinfer_gguf_writer_set_arr_str(cinfer_gguf_writer *w,
                                             const char *key,
                                             const char *const *v, uint64_t n)
{
    if (n > 0 && !v)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: key '%s': string array is NULL",
                                key ? key : "(null)");
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!v[i])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "gguf writer: key '%s': string %llu is "
                                    "NULL",
                                    key ? key : "(null)",
                                    (unsigned long long)i);
        len += 8 + strlen(v[i]);
    }
    uint8_t *val = malloc(len);
    if (!val)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for key '%s'",
                                key ? key : "(null)");
    put_le(val, CINFER_GGUF_STRING, 4);
    put_le(val + 4, n, 8);
    size_t pos = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t sl = strlen(v[i]);
        put_le(val + pos, sl, 8);
        memcpy(val + pos + 8, v[i], sl);
        pos += 8 + sl;
    }
    return writer_put(w, key, CINFER_GGUF_ARRAY, val, len);
}

cinfer_status cinfer_gguf_writer_add_tensor(cinfer_gguf_writer *w,
                                            const char *name,
                                            cinfer_dtype dtype,
                                            uint32_t n_dims,
                                            const int64_t *ne,
                                            const void *data, size_t n_bytes)
{
    if (!w || !name || !name[0] || !ne)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor needs a writer, a "
                                "non-empty name and dims");
    size_t name_len = strlen(name);
    if (name_len > WRITER_MAX_NAME)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor name '%s' is %zu bytes "
                                "(at most %d)",
                                name, name_len, WRITER_MAX_NAME);
    if (!cinfer_dtype_valid((uint32_t)dtype))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor '%s': type %d is not "
                                "supported",
                                name, (int)dtype);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor '%s': n_dims %u not in "
                                "1..%d",
                                name, n_dims, GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || n_elems > (uint64_t)INT64_MAX / (uint64_t)ne[d])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "gguf writer: tensor '%s': dimension %u "
                                    "is %lld (must be >= 1, product must fit)",
                                    name, d, (long long)ne[d]);
        n_elems *= (uint64_t)ne[d];
    }
    int be = cinfer_dtype_block_elems(dtype);
    if (ne[0] % be != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor '%s': ne[0] = %lld is not "
                                "a multiple of the %s block size %d",
                                name, (long long)ne[0], cinfer_dtype_name(dtype),
                                be);
    uint64_t blocks = n_elems / (uint64_t)be;
    uint64_t bb = cinfer_dtype_block_bytes(dtype);
    if (blocks > (uint64_t)SIZE_MAX / bb || blocks * bb != n_bytes)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor '%s': %zu bytes given, "
                                "%s with %llu elements needs %llu",
                                name, n_bytes, cinfer_dtype_name(dtype),
                                (unsigned long long)n_elems,
                                (unsigned long long)(blocks * bb));
    if (n_bytes > 0 && !data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: tensor '%s': data is NULL",
                                name);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "gguf writer: duplicate tensor name '%s'",
                                    name);

    char *nm = strdup(name);
    void *copy = malloc(n_bytes ? n_bytes : 1);
    if (!nm || !copy ||
        !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors,
              sizeof *w->tensors)) {
        free(nm);
        free(copy);
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for tensor '%s' (%zu "
                                "bytes)",
                                name, n_bytes);
    }
    memcpy(copy, data, n_bytes);
    wtensor *t = &w->tensors[w->n_tensors++];
    t->name = nm;
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    t->data = copy;
    t->n_bytes = n_bytes;
    return CINFER_OK;
}

/* Output: a pre-sized buffer or a stdio stream. */
typedef struct {
    uint8_t *buf;
    FILE *f;
    size_t pos;
    int failed;
} sink;

static void emit(sink *s, const void *p, size_t n)
{
    if (n == 0 || s->failed)
        return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            s->failed = 1;
    } else {
        memcpy(s->buf + s->pos, p, n);
    }
    s->pos += n;
}

static void emit_u32(sink *s, uint32_t v)
{
    uint8_t b[4];
    put_le(b, v, 4);
    emit(s, b, 4);
}

static void emit_u64(sink *s, uint64_t v)
{
    uint8_t b[8];
    put_le(b, v, 8);
    emit(s, b, 8);
}

static void emit_zeros(sink *s, size_t n)
{
    static const uint8_t zeros[64];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        emit(s, zeros, k);
        n -= k;
    }
}

static size_t pad_to(size_t pos, uint32_t a)
{
    return (a - pos % a) % a;
}

/* Size of the file up to the end of the tensor infos. */
static size_t meta_size(const cinfer_gguf_writer *w)
{
    size_t n = 4 + 4 + 8 + 8;
    for (uint64_t i = 0; i < w->n_kv; i++)
        n += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].val_len;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        n += 8 + strlen(w->tensors[i].name) + 4 + 8 * w->tensors[i].n_dims +
             4 + 8;
    return n;
}

static void serialize(const cinfer_gguf_writer *w, sink *s)
{
    emit(s, "GGUF", 4);
    emit_u32(s, 3);
    emit_u64(s, w->n_tensors);
    emit_u64(s, w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        const wkv *e = &w->kv[i];
        size_t kl = strlen(e->key);
        emit_u64(s, kl);
        emit(s, e->key, kl);
        emit_u32(s, (uint32_t)e->type);
        emit(s, e->val, e->val_len);
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        size_t nl = strlen(t->name);
        emit_u64(s, nl);
        emit(s, t->name, nl);
        emit_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            emit_u64(s, (uint64_t)t->ne[d]);
        emit_u32(s, (uint32_t)t->dtype);
        emit_u64(s, off);
        off += t->n_bytes + pad_to(t->n_bytes, w->alignment);
    }
    emit_zeros(s, pad_to(s->pos, w->alignment));
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        emit(s, t->data, t->n_bytes);
        emit_zeros(s, pad_to(t->n_bytes, w->alignment));
    }
}

/* Total file size. */
static size_t file_size(const cinfer_gguf_writer *w)
{
    size_t n = meta_size(w);
    n += pad_to(n, w->alignment);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        n += w->tensors[i].n_bytes + pad_to(w->tensors[i].n_bytes,
                                             w->alignment);
    return n;
}

cinfer_status cinfer_gguf_writer_write_file(const cinfer_gguf_writer *w,
                                            const char *path)
{
    if (!w || !path)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: writer and path must not be "
                                "NULL");
    FILE *f = fopen(path, "wb");
    if (!f)
        return cinfer_set_error(CINFER_E_IO, "gguf writer: cannot create "
                                             "'%s': %s",
                                path, strerror(errno));
    sink s = {NULL, f, 0, 0};
    serialize(w, &s);
    int err = s.failed ? errno : 0;
    if (fclose(f) != 0 && !err)
        err = errno ? errno : EIO;
    if (s.failed || err) {
        remove(path);
        return cinfer_set_error(CINFER_E_IO, "gguf writer: cannot write "
                                             "'%s': %s",
                                path, strerror(err ? err : EIO));
    }
    return CINFER_OK;
}

cinfer_status cinfer_gguf_writer_write_mem(const cinfer_gguf_writer *w,
                                           void **buf, size_t *size)
{
    if (!w || !buf || !size)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gguf writer: writer, buf and size must not be "
                                "NULL");
    size_t n = file_size(w);
    uint8_t *b = malloc(n);
    if (!b)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "gguf writer: no memory for a %zu-byte file",
                                n);
    sink s = {b, NULL, 0, 0};
    serialize(w, &s);
    CINFER_ASSERT(s.pos == n);
    *buf = b;
    *size = n;
    return CINFER_OK;
}
