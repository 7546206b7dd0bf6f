/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader (and writer).
 *
 * Opens the input as an in-memory GGUF file (libFuzzer's buffer is exactly
 * the input's size, so ASan catches any read past it), then walks every
 * accessor: each key through the getter of its type, every string-array
 * element, every numeric-array byte, every tensor's first and last data
 * byte and its lookup by name. A file that opens is then written back with
 * the writer (what the writer can express) and reopened, which must
 * succeed with the same counts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"

static volatile unsigned sink;

static size_t elem_size(cinfer_gguf_type t)
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

static void touch(const void *p, size_t n)
{
    const uint8_t *b = p;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++)
        s += b[i];
    sink += s;
}

static void walk(const cinfer_gguf *g)
{
    sink += cinfer_gguf_version(g) + cinfer_gguf_alignment(g);
    uint64_t n_kv = cinfer_gguf_n_kv(g);
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *key = cinfer_gguf_kv_key(g, i);
        if (!key || cinfer_gguf_find_key(g, key) != (int64_t)i)
            abort();
        cinfer_gguf_type t = cinfer_gguf_kv_type(g, i);
        uint32_t u;
        int64_t v;
        float f;
        int b;
        cinfer_gguf_str s;
        cinfer_gguf_arr a;
        /* Every getter on every key: type mismatches must fail cleanly. */
        if (cinfer_gguf_get_u32(g, key, &u) == CINFER_OK)
            sink += u;
        if (cinfer_gguf_get_i64(g, key, &v) == CINFER_OK)
            sink += (unsigned)v;
        if (cinfer_gguf_get_f32(g, key, &f) == CINFER_OK)
            sink += f > 0.0f;
        if (cinfer_gguf_get_bool(g, key, &b) == CINFER_OK)
            sink += (unsigned)b;
        if (cinfer_gguf_get_str(g, key, &s) == CINFER_OK) {
            if (t != CINFER_GGUF_STRING)
                abort();
            touch(s.ptr, s.len);
        }
        if (cinfer_gguf_get_arr(g, key, &a) == CINFER_OK) {
            if (t != CINFER_GGUF_ARRAY)
                abort();
            if (a.type == CINFER_GGUF_STRING) {
                for (uint64_t k = 0; k < a.n; k++) {
                    cinfer_gguf_str e = cinfer_gguf_arr_str(&a, k);
                    touch(e.ptr, e.len);
                }
                cinfer_gguf_str past = cinfer_gguf_arr_str(&a, a.n);
                if (past.ptr)
                    abort();
            } else if (a.type != CINFER_GGUF_ARRAY) {
                size_t es = elem_size(a.type);
                if (a.n && (!a.data || (uintptr_t)a.data % es != 0))
                    abort();
                touch(a.data, (size_t)a.n * es);
            }
        }
    }
    if (cinfer_gguf_kv_key(g, n_kv) != NULL)
        abort();
    uint64_t n_t = cinfer_gguf_n_tensors(g);
    for (uint64_t i = 0; i < n_t; i++) {
        const cinfer_gguf_tensor *t = cinfer_gguf_tensor_at(g, i);
        if (!t || cinfer_gguf_find_tensor(g, t->name) != t)
            abort();
        if (t->n_dims < 1 || t->n_dims > 4)
            abort();
        size_t rows = 1;
        for (int d = 1; d < 4; d++)
            rows *= (size_t)t->ne[d];
        if (cinfer_dtype_row_bytes(t->dtype, t->ne[0]) * rows != t->n_bytes)
            abort();
        if (t->n_bytes) {
            const uint8_t *d = t->data;
            sink += d[0] + d[t->n_bytes - 1];
        }
    }
    if (cinfer_gguf_tensor_at(g, n_t) != NULL)
        abort();
}

/* Copies what the writer can express; returns the number of keys copied
 * (nested arrays are not), or -1 if the writer refused something it
 * should accept. */
static int64_t rewrite(const cinfer_gguf *g, void **buf, size_t *size)
{
    cinfer_gguf_writer_params wp = cinfer_gguf_writer_default_params();
    wp.alignment = cinfer_gguf_alignment(g);
    cinfer_gguf_writer *w;
    if (cinfer_gguf_writer_create(&wp, &w) != CINFER_OK)
        return -1;
    int64_t copied = 0;
    int ok = 1;
    for (uint64_t i = 0; i < cinfer_gguf_n_kv(g) && ok; i++) {
        const char *key = cinfer_gguf_kv_key(g, i);
        cinfer_gguf_type t = cinfer_gguf_kv_type(g, i);
        cinfer_status st = CINFER_OK;
        if (t == CINFER_GGUF_STRING) {
            cinfer_gguf_str s;
            cinfer_gguf_get_str(g, key, &s);
            char *c = malloc(s.len + 1);
            memcpy(c, s.ptr, s.len);
            c[s.len] = '\0';
            st = cinfer_gguf_writer_set_str(w, key, c);
            free(c);
        } else if (t == CINFER_GGUF_ARRAY) {
            cinfer_gguf_arr a;
            cinfer_gguf_get_arr(g, key, &a);
            if (a.type == CINFER_GGUF_ARRAY)
                continue;
            if (a.type == CINFER_GGUF_STRING) {
                char **v = malloc((a.n ? a.n : 1) * sizeof *v);
                for (uint64_t k = 0; k < a.n; k++) {
                    cinfer_gguf_str e = cinfer_gguf_arr_str(&a, k);
                    v[k] = malloc(e.len + 1);
                    memcpy(v[k], e.ptr, e.len);
                    v[k][e.len] = '\0';
                }
                st = cinfer_gguf_writer_set_arr_str(w, key, (const char *const *)v, a.n);
                for (uint64_t k = 0; k < a.n; k++)
                    free(v[k]);
                free(v);
            } else {
                st = cinfer_gguf_writer_set_arr(w, key, a.type, a.data, a.n);
            }
        } else if (t == CINFER_GGUF_UINT32) {
            uint32_t u;
            cinfer_gguf_get_u32(g, key, &u);
            st = cinfer_gguf_writer_set_u32(w, key, u);
        } else if (t == CINFER_GGUF_BOOL) {
            int b;
            cinfer_gguf_get_bool(g, key, &b);
            st = cinfer_gguf_writer_set_bool(w, key, b);
        } else if (t == CINFER_GGUF_FLOAT32) {
            float f;
            cinfer_gguf_get_f32(g, key, &f);
            st = cinfer_gguf_writer_set_f32(w, key, f);
        } else {
            /* Other scalars as u64/i32 keep the key count. */
            int64_t v;
            if (cinfer_gguf_get_i64(g, key, &v) == CINFER_OK)
                st = cinfer_gguf_writer_set_u64(w, key, (uint64_t)v);
            else
                st = cinfer_gguf_writer_set_u64(w, key, 0);
        }
        ok = st == CINFER_OK;
        copied++;
    }
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(g) && ok; i++) {
        const cinfer_gguf_tensor *t = cinfer_gguf_tensor_at(g, i);
        if (strlen(t->name) > 63)
            continue; /* the writer keeps GGML's name limit */
        ok = cinfer_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne,
                                           t->data, t->n_bytes) == CINFER_OK;
    }
    if (ok)
        ok = cinfer_gguf_writer_write_mem(w, buf, size) == CINFER_OK;
    cinfer_gguf_writer_destroy(w);
    return ok ? copied : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cinfer_gguf_params p = cinfer_gguf_default_params();
    p.data = data;
    p.size = size;
    cinfer_gguf *g = NULL;
    cinfer_status st = cinfer_gguf_create(&p, &g);
    if (st != CINFER_OK) {
        if (g || cinfer_last_error()[0] == '\0')
            abort();
        return 0;
    }
    walk(g);

    /* Tensors' total data is bounded by the input; keep rewrites small. */
    uint64_t total = 0;
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(g); i++)
        total += cinfer_gguf_tensor_at(g, i)->n_bytes;
    if (total <= ((uint64_t)1 << 24)) {
        void *buf = NULL;
        size_t n = 0;
        int64_t copied = rewrite(g, &buf, &n);
        if (copied < 0)
            abort();
        cinfer_gguf_params p2 = cinfer_gguf_default_params();
        p2.data = buf;
        p2.size = n;
        cinfer_gguf *g2 = NULL;
        if (cinfer_gguf_create(&p2, &g2) != CINFER_OK)
            abort();
        uint64_t want_kv = (uint64_t)copied;
        if (cinfer_gguf_alignment(g) != 32 &&
            cinfer_gguf_find_key(g, "general.alignment") < 0)
            abort();
        if (cinfer_gguf_n_kv(g2) != want_kv)
            abort();
        walk(g2);
        cinfer_gguf_destroy(g2);
        free(buf);
    }
    cinfer_gguf_destroy(g);
    return 0;
}
