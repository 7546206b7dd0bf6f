/*
 * test_gguf.c - GGUF reader and writer.
 *
 * Round trips through the writer (every metadata type, arrays, alignments,
 * tensor types), the default model's header, and corrupt files built byte
 * by byte: every prefix of a valid file, huge counts and lengths, bad
 * offsets, types, dims, magic, versions and names. Corrupt inputs are
 * copied into exactly-sized heap buffers so ASan sees any over-read; each
 * must fail with the right status and a message naming the problem.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "harness.h"

/* ====================================================================== */
/* helpers                                                                 */
/* ====================================================================== */

/* Opens an in-memory file from an exactly-sized heap copy; frees the copy
 * with the reader (via *copy_out) so over-reads trip ASan. */
static cinfer_status open_copy(const void *data, size_t size, cinfer_gguf **g,
                               void **copy_out)
{
    void *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    cinfer_gguf_params p = cinfer_gguf_default_params();
    p.data = copy;
    p.size = size;
    cinfer_clear_error();
    cinfer_status st = cinfer_gguf_create(&p, g);
    if (st != CINFER_OK) {
        free(copy);
        copy = NULL;
    }
    *copy_out = copy;
    return st;
}

/* Expects `data` to fail to open with `want` and a message containing
 * `word`. */
#define EXPECT_FAIL(data, size, want, word)                                    \
    do {                                                                       \
        cinfer_gguf *g_ = NULL;                                                \
        void *c_ = NULL;                                                       \
        cinfer_status st_ = open_copy((data), (size), &g_, &c_);               \
        CHECK_EQ_INT(st_, (want));                                             \
        CHECK(g_ == NULL);                                                     \
        if (!strstr(cinfer_last_error(), (word))) {                            \
            fprintf(stderr, "%s:%d: message lacks '%s': %s\n", __FILE__,       \
                    __LINE__, (word), cinfer_last_error());                    \
            harness_failed_checks++;                                           \
        }                                                                      \
        cinfer_gguf_destroy(g_);                                               \
        free(c_);                                                              \
    } while (0)

/* Raw byte builder for hand-made files. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void put(bytes *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n)
            nc *= 2;
        b->p = realloc(b->p, nc);
        b->cap = nc;
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(bytes *b, uint8_t v) { put(b, &v, 1); }

static void put_u32(bytes *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                    (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void put_u64(bytes *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(bytes *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void put_header(bytes *b, uint32_t version, uint64_t n_tensors,
                       uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

static void put_kv_u32(bytes *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u32(b, CINFER_GGUF_UINT32);
    put_u32(b, v);
}

/* Tensor info with up to 4 dims. */
static void put_tensor(bytes *b, const char *name, uint32_t n_dims,
                       const uint64_t *ne, uint32_t type, uint64_t offset)
{
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        put_u64(b, ne[i]);
    put_u32(b, type);
    put_u64(b, offset);
}

static void pad_to(bytes *b, size_t a)
{
    while (b->n % a)
        put_u8(b, 0);
}

static void put_zeros(bytes *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_u8(b, 0);
}

/* A writer file in memory. */
static void write_mem(cinfer_gguf_writer *w, void **buf, size_t *size)
{
    *buf = NULL;
    *size = 0;
    CHECK_OK(cinfer_gguf_writer_write_mem(w, buf, size));
}

static int str_eq(cinfer_gguf_str s, const char *want)
{
    return s.len == strlen(want) && (s.len == 0 || memcmp(s.ptr, want, s.len) == 0);
}

/* ====================================================================== */
/* round trips                                                             */
/* ====================================================================== */

static void test_roundtrip_metadata(void)
{
    cinfer_gguf_writer *w;
    CHECK_OK(cinfer_gguf_writer_create(NULL, &w));
    CHECK_OK(cinfer_gguf_writer_set_u32(w, "a.u32", 4000000000u));
    CHECK_OK(cinfer_gguf_writer_set_i32(w, "a.i32", -123456));
    CHECK_OK(cinfer_gguf_writer_set_u64(w, "a.u64", 0xfedcba9876543210ull));
    CHECK_OK(cinfer_gguf_writer_set_f32(w, "a.f32", 3.25f));
    CHECK_OK(cinfer_gguf_writer_set_bool(w, "a.true", 7));
    CHECK_OK(cinfer_gguf_writer_set_bool(w, "a.false", 0));
    CHECK_OK(cinfer_gguf_writer_set_str(w, "a.str", "héllo wörld"));
    CHECK_OK(cinfer_gguf_writer_set_str(w, "a.empty", ""));
    CHECK_OK(cinfer_gguf_writer_set_u32(w, "a.replaced", 1));
    CHECK_OK(cinfer_gguf_writer_set_str(w, "a.replaced", "second"));

    uint8_t u8[3] = {0, 200, 255};
    int8_t i8[3] = {-128, 0, 127};
    uint16_t u16[2] = {0, 65535};
    int16_t i16[2] = {-32768, 32767};
    uint32_t u32[3] = {1, 2, 0xffffffffu};
    int32_t i32[2] = {-5, 5};
    float f32[3] = {1.5f, -2.25f, 1e-30f};
    uint8_t b8[4] = {1, 0, 1, 1};
    uint64_t u64[2] = {0, UINT64_MAX};
    int64_t i64[2] = {INT64_MIN, INT64_MAX};
    double f64[2] = {1e300, -0.125};
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.u8", CINFER_GGUF_UINT8, u8, 3));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.i8", CINFER_GGUF_INT8, i8, 3));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.u16", CINFER_GGUF_UINT16, u16, 2));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.i16", CINFER_GGUF_INT16, i16, 2));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.u32", CINFER_GGUF_UINT32, u32, 3));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.i32", CINFER_GGUF_INT32, i32, 2));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.f32", CINFER_GGUF_FLOAT32, f32, 3));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.bool", CINFER_GGUF_BOOL, b8, 4));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.u64", CINFER_GGUF_UINT64, u64, 2));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.i64", CINFER_GGUF_INT64, i64, 2));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.f64", CINFER_GGUF_FLOAT64, f64, 2));
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "arr.empty", CINFER_GGUF_FLOAT32, NULL, 0));
    const char *strs[4] = {"alpha", "", "gamma delta", "\xe2\x96\x81x"};
    CHECK_OK(cinfer_gguf_writer_set_arr_str(w, "arr.str", strs, 4));
    CHECK_OK(cinfer_gguf_writer_set_arr_str(w, "arr.str_empty", NULL, 0));
    /* Bad setter calls change nothing. */
    CHECK_EQ_INT(cinfer_gguf_writer_set_u32(w, "", 1), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_gguf_writer_set_str(w, "x", NULL), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_gguf_writer_set_arr(w, "x", CINFER_GGUF_STRING, strs, 1),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_gguf_writer_set_arr(w, "x", CINFER_GGUF_UINT8, NULL, 2),
                 CINFER_E_INVALID_ARG);

    void *buf;
    size_t size;
    write_mem(w, &buf, &size);
    cinfer_gguf_writer_destroy(w);
    CHECK_EQ_INT(size % 32, 0);

    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(buf, size, &g, &copy));
    free(buf);
    if (!g)
        return;
    CHECK_EQ_INT(cinfer_gguf_version(g), 3);
    CHECK_EQ_INT(cinfer_gguf_alignment(g), 32);
    CHECK_EQ_INT(cinfer_gguf_n_tensors(g), 0);
    CHECK_EQ_INT(cinfer_gguf_n_kv(g), 23);
    CHECK_EQ_STR(cinfer_gguf_kv_key(g, 0), "a.u32");
    CHECK_EQ_STR(cinfer_gguf_kv_key(g, 8), "a.replaced");
    CHECK_EQ_INT(cinfer_gguf_kv_type(g, 8), CINFER_GGUF_STRING);
    CHECK(cinfer_gguf_kv_key(g, 23) == NULL);
    CHECK_EQ_INT(cinfer_gguf_find_key(g, "arr.f64"), 19);
    CHECK_EQ_INT(cinfer_gguf_find_key(g, "arr.f6"), -1);
    CHECK_EQ_INT(cinfer_gguf_find_key(g, "nope"), -1);

    uint32_t u;
    int64_t i;
    float f;
    int bv;
    cinfer_gguf_str s;
    cinfer_gguf_arr a;
    CHECK_OK(cinfer_gguf_get_u32(g, "a.u32", &u));
    CHECK_EQ_INT(u, 4000000000u);
    CHECK_OK(cinfer_gguf_get_i64(g, "a.u32", &i));
    CHECK_EQ_INT(i, 4000000000ll);
    CHECK_OK(cinfer_gguf_get_i64(g, "a.i32", &i));
    CHECK_EQ_INT(i, -123456);
    CHECK_EQ_INT(cinfer_gguf_get_u32(g, "a.i32", &u), CINFER_E_FORMAT);
    CHECK(strstr(cinfer_last_error(), "does not fit"));
    CHECK_EQ_INT(cinfer_gguf_get_u32(g, "a.u64", &u), CINFER_E_FORMAT);
    CHECK_EQ_INT(cinfer_gguf_get_i64(g, "a.u64", &i), CINFER_E_FORMAT);
    CHECK_OK(cinfer_gguf_get_f32(g, "a.f32", &f));
    CHECK_EQ_INT(f == 3.25f, 1);
    CHECK_EQ_INT(cinfer_gguf_get_f32(g, "a.u32", &f), CINFER_E_FORMAT);
    CHECK(strstr(cinfer_last_error(), "a.u32"));
    CHECK_OK(cinfer_gguf_get_bool(g, "a.true", &bv));
    CHECK_EQ_INT(bv, 1);
    CHECK_OK(cinfer_gguf_get_bool(g, "a.false", &bv));
    CHECK_EQ_INT(bv, 0);
    CHECK_EQ_INT(cinfer_gguf_get_bool(g, "a.u32", &bv), CINFER_E_FORMAT);
    CHECK_OK(cinfer_gguf_get_str(g, "a.str", &s));
    CHECK(str_eq(s, "héllo wörld"));
    CHECK_OK(cinfer_gguf_get_str(g, "a.empty", &s));
    CHECK_EQ_INT(s.len, 0);
    CHECK_OK(cinfer_gguf_get_str(g, "a.replaced", &s));
    CHECK(str_eq(s, "second"));
    CHECK_EQ_INT(cinfer_gguf_get_str(g, "a.u32", &s), CINFER_E_FORMAT);
    CHECK_EQ_INT(cinfer_gguf_get_u32(g, "missing.key", &u), CINFER_E_NOT_FOUND);
    CHECK(strstr(cinfer_last_error(), "missing.key"));
    CHECK_EQ_INT(cinfer_gguf_get_arr(g, "a.str", &a), CINFER_E_FORMAT);

    CHECK_OK(cinfer_gguf_get_arr(g, "arr.u8", &a));
    CHECK_EQ_INT(a.type, CINFER_GGUF_UINT8);
    CHECK_EQ_INT(a.n, 3);
    CHECK(a.data && memcmp(a.data, u8, 3) == 0);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.i8", &a));
    CHECK(a.n == 3 && a.data && memcmp(a.data, i8, 3) == 0);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.u16", &a));
    CHECK(a.n == 2 && ((const uint16_t *)a.data)[1] == 65535);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.i16", &a));
    CHECK(a.n == 2 && ((const int16_t *)a.data)[0] == -32768);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.u32", &a));
    CHECK(a.n == 3 && ((const uint32_t *)a.data)[2] == 0xffffffffu);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.i32", &a));
    CHECK(a.type == CINFER_GGUF_INT32 && ((const int32_t *)a.data)[0] == -5);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.f32", &a));
    CHECK(a.type == CINFER_GGUF_FLOAT32 && a.n == 3);
    CHECK(((uintptr_t)a.data % 4) == 0);
    CHECK(memcmp(a.data, f32, sizeof f32) == 0);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.bool", &a));
    CHECK(a.type == CINFER_GGUF_BOOL && a.n == 4 && memcmp(a.data, b8, 4) == 0);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.u64", &a));
    CHECK(((uintptr_t)a.data % 8) == 0);
    CHECK(a.n == 2 && ((const uint64_t *)a.data)[1] == UINT64_MAX);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.i64", &a));
    CHECK(((const int64_t *)a.data)[0] == INT64_MIN);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.f64", &a));
    CHECK(((const double *)a.data)[0] == 1e300);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.empty", &a));
    CHECK(a.type == CINFER_GGUF_FLOAT32 && a.n == 0);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.str", &a));
    CHECK(a.type == CINFER_GGUF_STRING && a.n == 4 && a.data == NULL);
    for (int k = 0; k < 4; k++)
        CHECK(str_eq(cinfer_gguf_arr_str(&a, (uint64_t)k), strs[k]));
    s = cinfer_gguf_arr_str(&a, 4);
    CHECK(s.ptr == NULL && s.len == 0);
    CHECK_OK(cinfer_gguf_get_arr(g, "arr.str_empty", &a));
    CHECK(a.type == CINFER_GGUF_STRING && a.n == 0);
    s = cinfer_gguf_arr_str(&a, 0);
    CHECK(s.ptr == NULL);
    cinfer_gguf_destroy(g);
    free(copy);
}

/* Scalar types the writer has no setter for, and conversions. */
static void test_scalar_types_raw(void)
{
    bytes b = {0};
    put_header(&b, 3, 0, 9);
    put_str(&b, "u8");
    put_u32(&b, CINFER_GGUF_UINT8);
    put_u8(&b, 250);
    put_str(&b, "i8");
    put_u32(&b, CINFER_GGUF_INT8);
    put_u8(&b, 0x80);
    put_str(&b, "u16");
    put_u32(&b, CINFER_GGUF_UINT16);
    put_u8(&b, 0x34);
    put_u8(&b, 0x12);
    put_str(&b, "i16");
    put_u32(&b, CINFER_GGUF_INT16);
    put_u8(&b, 0xff);
    put_u8(&b, 0xff);
    put_str(&b, "i64");
    put_u32(&b, CINFER_GGUF_INT64);
    put_u64(&b, (uint64_t)-5);
    put_str(&b, "f64");
    put_u32(&b, CINFER_GGUF_FLOAT64);
    double d = 0.5;
    put(&b, &d, 8);
    put_str(&b, "f64big");
    put_u32(&b, CINFER_GGUF_FLOAT64);
    d = 1e300;
    put(&b, &d, 8);
    put_str(&b, "u64small");
    put_u32(&b, CINFER_GGUF_UINT64);
    put_u64(&b, 77);
    put_str(&b, "i64big");
    put_u32(&b, CINFER_GGUF_INT64);
    put_u64(&b, (uint64_t)1 << 40);

    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(b.p, b.n, &g, &copy));
    if (g) {
        uint32_t u;
        int64_t i;
        float f;
        CHECK_OK(cinfer_gguf_get_u32(g, "u8", &u));
        CHECK_EQ_INT(u, 250);
        CHECK_OK(cinfer_gguf_get_i64(g, "i8", &i));
        CHECK_EQ_INT(i, -128);
        CHECK_EQ_INT(cinfer_gguf_get_u32(g, "i8", &u), CINFER_E_FORMAT);
        CHECK_OK(cinfer_gguf_get_u32(g, "u16", &u));
        CHECK_EQ_INT(u, 0x1234);
        CHECK_OK(cinfer_gguf_get_i64(g, "i16", &i));
        CHECK_EQ_INT(i, -1);
        CHECK_OK(cinfer_gguf_get_i64(g, "i64", &i));
        CHECK_EQ_INT(i, -5);
        CHECK_OK(cinfer_gguf_get_f32(g, "f64", &f));
        CHECK(f == 0.5f);
        CHECK_EQ_INT(cinfer_gguf_get_f32(g, "f64big", &f), CINFER_E_FORMAT);
        CHECK_OK(cinfer_gguf_get_u32(g, "u64small", &u));
        CHECK_EQ_INT(u, 77);
        CHECK_EQ_INT(cinfer_gguf_get_u32(g, "i64big", &u), CINFER_E_FORMAT);
        CHECK_OK(cinfer_gguf_get_i64(g, "i64big", &i));
        CHECK_EQ_INT(i, (int64_t)1 << 40);
        CHECK_EQ_INT(cinfer_gguf_kv_type(g, 5), CINFER_GGUF_FLOAT64);
        cinfer_gguf_destroy(g);
        free(copy);
    }
    free(b.p);
}

static const cinfer_dtype all_dtypes[] = {
    CINFER_DTYPE_F32,  CINFER_DTYPE_F16,  CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_1,
    CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q8_1, CINFER_DTYPE_I32,  CINFER_DTYPE_BF16,
};
#define N_DTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

static void test_tensor_dtypes(void)
{
    static const size_t block_bytes[] = {4, 2, 18, 20, 34, 36, 4, 2};
    static const int block_elems[] = {1, 1, 32, 32, 32, 32, 1, 1};
    cinfer_gguf_writer *w;
    CHECK_OK(cinfer_gguf_writer_create(NULL, &w));
    uint64_t seed = 7;
    void *datas[N_DTYPES * 3];
    size_t sizes[N_DTYPES * 3];
    const int64_t shapes[3][4] = {{64, 3, 1, 1}, {96, 1, 1, 1}, {32, 2, 3, 2}};
    const uint32_t dims[3] = {2, 1, 4};
    for (size_t t = 0; t < N_DTYPES; t++) {
        CHECK_EQ_INT(cinfer_dtype_block_bytes(all_dtypes[t]), block_bytes[t]);
        for (int s = 0; s < 3; s++) {
            int64_t n = shapes[s][0] * shapes[s][1] * shapes[s][2] * shapes[s][3];
            size_t nb = (size_t)(n / block_elems[t]) * block_bytes[t];
            uint8_t *d = malloc(nb);
            for (size_t k = 0; k < nb; k++)
                d[k] = (uint8_t)harness_rand(&seed);
            char name[64];
            snprintf(name, sizeof name, "t.%s.%d", cinfer_dtype_name(all_dtypes[t]), s);
            CHECK_OK(cinfer_gguf_writer_add_tensor(w, name, all_dtypes[t], dims[s],
                                                   shapes[s], d, nb));
            datas[t * 3 + (size_t)s] = d;
            sizes[t * 3 + (size_t)s] = nb;
        }
    }
    /* Refusals. */
    int64_t ne[4] = {64, 2, 1, 1};
    uint8_t junk[4096] = {0};
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "bad.size", CINFER_DTYPE_F32, 2, ne, junk, 100),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "bad.size"));
    int64_t ne33[1] = {33};
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "bad.block", CINFER_DTYPE_Q4_0, 1, ne33, junk, 18),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "multiple"));
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "bad.dims0", CINFER_DTYPE_F32, 0, ne, junk, 4),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "bad.dims5", CINFER_DTYPE_F32, 5, ne, junk, 4),
                 CINFER_E_INVALID_ARG);
    int64_t ne0[2] = {0, 3};
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "bad.zero", CINFER_DTYPE_F32, 2, ne0, junk, 0),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "bad.type", (cinfer_dtype)16, 1, ne, junk, 256),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, "t.F32.0", CINFER_DTYPE_F32, 2, ne, junk, 512),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "duplicate"));
    char longname[80];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    CHECK_EQ_INT(cinfer_gguf_writer_add_tensor(w, longname, CINFER_DTYPE_F32, 2, ne, junk, 512),
                 CINFER_E_INVALID_ARG);

    void *buf;
    size_t size;
    write_mem(w, &buf, &size);
    cinfer_gguf_writer_destroy(w);
    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(buf, size, &g, &copy));
    free(buf);
    if (g) {
        CHECK_EQ_INT(cinfer_gguf_n_tensors(g), N_DTYPES * 3);
        for (size_t t = 0; t < N_DTYPES; t++) {
            for (int s = 0; s < 3; s++) {
                char name[64];
                snprintf(name, sizeof name, "t.%s.%d", cinfer_dtype_name(all_dtypes[t]), s);
                const cinfer_gguf_tensor *x = cinfer_gguf_find_tensor(g, name);
                CHECK(x != NULL);
                if (!x)
                    continue;
                CHECK(x == cinfer_gguf_tensor_at(g, t * 3 + (size_t)s));
                CHECK_EQ_STR(x->name, name);
                CHECK_EQ_INT(x->dtype, all_dtypes[t]);
                CHECK_EQ_INT(x->n_dims, dims[s]);
                for (int d = 0; d < 4; d++)
                    CHECK_EQ_INT(x->ne[d], (uint32_t)d < dims[s] ? shapes[s][d] : 1);
                CHECK_EQ_INT(x->n_bytes, sizes[t * 3 + (size_t)s]);
                CHECK_EQ_INT(x->offset % 32, 0);
                CHECK_EQ_INT(((const uint8_t *)x->data - (const uint8_t *)copy) % 32, 0);
                CHECK(memcmp(x->data, datas[t * 3 + (size_t)s], x->n_bytes) == 0);
            }
        }
        CHECK(cinfer_gguf_find_tensor(g, "t.F32") == NULL);
        CHECK(cinfer_gguf_tensor_at(g, N_DTYPES * 3) == NULL);
        cinfer_gguf_destroy(g);
        free(copy);
    }
    for (size_t k = 0; k < N_DTYPES * 3; k++)
        free(datas[k]);
}

static void test_alignment(void)
{
    const uint32_t aligns[] = {32, 64, 4096};
    for (size_t k = 0; k < 3; k++) {
        cinfer_gguf_writer_params wp = cinfer_gguf_writer_default_params();
        wp.alignment = aligns[k];
        cinfer_gguf_writer *w;
        CHECK_OK(cinfer_gguf_writer_create(&wp, &w));
        CHECK_OK(cinfer_gguf_writer_set_str(w, "general.architecture", "llama"));
        float a[5] = {1, 2, 3, 4, 5}, b[7] = {6, 7, 8, 9, 10, 11, 12};
        int64_t na[1] = {5}, nb[1] = {7};
        CHECK_OK(cinfer_gguf_writer_add_tensor(w, "a", CINFER_DTYPE_F32, 1, na, a, sizeof a));
        CHECK_OK(cinfer_gguf_writer_add_tensor(w, "b", CINFER_DTYPE_F32, 1, nb, b, sizeof b));
        void *buf;
        size_t size;
        write_mem(w, &buf, &size);
        cinfer_gguf_writer_destroy(w);
        CHECK_EQ_INT(size % aligns[k], 0);
        cinfer_gguf *g;
        void *copy;
        CHECK_OK(open_copy(buf, size, &g, &copy));
        free(buf);
        if (!g)
            continue;
        CHECK_EQ_INT(cinfer_gguf_alignment(g), aligns[k]);
        uint32_t u = 0;
        cinfer_status st = cinfer_gguf_get_u32(g, "general.alignment", &u);
        if (aligns[k] == 32) {
            CHECK_EQ_INT(st, CINFER_E_NOT_FOUND);
        } else {
            CHECK_OK(st);
            CHECK_EQ_INT(u, aligns[k]);
        }
        const cinfer_gguf_tensor *ta = cinfer_gguf_find_tensor(g, "a");
        const cinfer_gguf_tensor *tb = cinfer_gguf_find_tensor(g, "b");
        CHECK(ta && tb);
        if (ta && tb) {
            CHECK_EQ_INT(ta->offset, 0);
            CHECK_EQ_INT(tb->offset, aligns[k]);
            CHECK_EQ_INT(((const uint8_t *)tb->data - (const uint8_t *)copy) % aligns[k], 0);
            CHECK(memcmp(tb->data, b, sizeof b) == 0);
        }
        cinfer_gguf_destroy(g);
        free(copy);
    }
    cinfer_gguf_writer_params wp = cinfer_gguf_writer_default_params();
    cinfer_gguf_writer *w = NULL;
    wp.alignment = 48;
    CHECK_EQ_INT(cinfer_gguf_writer_create(&wp, &w), CINFER_E_INVALID_ARG);
    CHECK(w == NULL);
    CHECK(strstr(cinfer_last_error(), "power of two"));

    /* Reader: a non-power-of-two, zero, and wrongly typed alignment. */
    const uint32_t bad[] = {48, 0, 3};
    for (int k = 0; k < 3; k++) {
        bytes b = {0};
        put_header(&b, 3, 0, 1);
        put_kv_u32(&b, "general.alignment", bad[k]);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "power of two");
        free(b.p);
    }
    bytes b = {0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, CINFER_GGUF_UINT64);
    put_u64(&b, 64);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "UINT32");
    free(b.p);

    /* A tensor offset must follow general.alignment, not the default. */
    b = (bytes){0};
    uint64_t ne[1] = {8};
    put_header(&b, 3, 1, 1);
    put_kv_u32(&b, "general.alignment", 64);
    put_tensor(&b, "t", 1, ne, CINFER_DTYPE_F32, 32);
    pad_to(&b, 64);
    put_zeros(&b, 128);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "alignment 64");
    free(b.p);
}

static void test_file_io(void)
{
    char path[] = "/tmp/cinfer_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    cinfer_gguf_writer *w;
    CHECK_OK(cinfer_gguf_writer_create(NULL, &w));
    CHECK_OK(cinfer_gguf_writer_set_str(w, "general.name", "file test"));
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)i;
    int64_t ne[2] = {32, 1};
    CHECK_OK(cinfer_gguf_writer_add_tensor(w, "x", CINFER_DTYPE_F32, 2, ne, x, sizeof x));
    CHECK_OK(cinfer_gguf_writer_write_file(w, path));
    void *buf;
    size_t size;
    write_mem(w, &buf, &size);
    CHECK_EQ_INT(cinfer_gguf_writer_write_file(w, "/nonexistent-dir/x.gguf"), CINFER_E_IO);
    CHECK(strstr(cinfer_last_error(), "/nonexistent-dir/x.gguf"));
    cinfer_gguf_writer_destroy(w);

    /* The file equals the buffer. */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        uint8_t *fb = malloc(size + 1);
        size_t got = fread(fb, 1, size + 1, f);
        fclose(f);
        CHECK_EQ_INT(got, size);
        CHECK(got == size && memcmp(fb, buf, size) == 0);
        free(fb);
    }
    free(buf);

    cinfer_gguf_params p = cinfer_gguf_default_params();
    p.path = path;
    cinfer_gguf *g = NULL;
    CHECK_OK(cinfer_gguf_create(&p, &g));
    if (g) {
        const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(g, "x");
        CHECK(t && t->n_bytes == sizeof x && memcmp(t->data, x, sizeof x) == 0);
        CHECK_EQ_INT(((uintptr_t)t->data) % 32, 0); /* mapping is page aligned */
        cinfer_gguf_destroy(g);
    }
    /* Read into memory instead: the same contents. */
    p.in_memory = 1;
    CHECK_OK(cinfer_gguf_create(&p, &g));
    if (g) {
        const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(g, "x");
        CHECK(t && t->n_bytes == sizeof x && memcmp(t->data, x, sizeof x) == 0);
        cinfer_gguf_str name;
        CHECK_OK(cinfer_gguf_get_str(g, "general.name", &name));
        CHECK(name.len == 9 && memcmp(name.ptr, "file test", 9) == 0);
        CHECK_EQ_INT(((uintptr_t)t->data) % 32, 0);
        cinfer_gguf_destroy(g);
    }
    /* A file cut short reads as the same error in either mode. */
    CHECK_EQ_INT(truncate(path, (off_t)size - 8), 0);
    p.in_memory = 0;
    CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_FORMAT);
    char mapped_err[512];
    snprintf(mapped_err, sizeof mapped_err, "%s", cinfer_last_error());
    p.in_memory = 1;
    CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_FORMAT);
    CHECK(strcmp(mapped_err, cinfer_last_error()) == 0);
    p.in_memory = 0;

    /* Empty file, missing file, directory, NULL arguments. */
    f = fopen(path, "wb");
    if (f)
        fclose(f);
    CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_FORMAT);
    CHECK(strstr(cinfer_last_error(), "empty"));
    unlink(path);
    CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_IO);
    CHECK(strstr(cinfer_last_error(), path));
    p.path = "/tmp";
    CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_IO);
    CHECK_EQ_INT(cinfer_gguf_create(NULL, &g), CINFER_E_INVALID_ARG);
    p = cinfer_gguf_default_params();
    p.size = 10;
    CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_INVALID_ARG);
    cinfer_gguf_destroy(NULL);
    cinfer_gguf_writer_destroy(NULL);

    /* A corrupt file on disk names its path. */
    char path2[] = "/tmp/cinfer_test_gguf_XXXXXX";
    fd = mkstemp(path2);
    if (fd >= 0) {
        CHECK_EQ_INT(write(fd, "GGUF\x01\0\0\0", 8), 8);
        close(fd);
        p = cinfer_gguf_default_params();
        p.path = path2;
        CHECK_EQ_INT(cinfer_gguf_create(&p, &g), CINFER_E_UNSUPPORTED);
        CHECK(strstr(cinfer_last_error(), path2));
        CHECK(strstr(cinfer_last_error(), "version 1"));
        unlink(path2);
    }
}

/* ====================================================================== */
/* the default model                                                       */
/* ====================================================================== */

static const char *default_model(void)
{
    const char *env = getenv("CINFER_MODEL");
    const char *p = env && *env ? env : CINFER_DEFAULT_MODEL;
    struct stat sb;
    if (!p || !*p || stat(p, &sb) != 0)
        return NULL;
    return p;
}

static int model_absent;

static void test_default_model(void)
{
    const char *path = default_model();
    if (!path) {
        harness_skip("default model absent");
        model_absent = 1;
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cinfer_gguf_params p = cinfer_gguf_default_params();
    p.path = path;
    cinfer_gguf *g = NULL;
    CHECK_OK(cinfer_gguf_create(&p, &g));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!g)
        return;
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    fprintf(stderr, "     default model parsed in %.2f ms\n", ms);
    CHECK(ms < 2000.0); /* milliseconds normally; generous for sanitizers */

    CHECK_EQ_INT(cinfer_gguf_version(g), 3);
    CHECK_EQ_INT(cinfer_gguf_alignment(g), 32);
    CHECK_EQ_INT(cinfer_gguf_n_kv(g), 33);
    CHECK_EQ_INT(cinfer_gguf_n_tensors(g), 272);
    cinfer_gguf_str s;
    CHECK_OK(cinfer_gguf_get_str(g, "general.architecture", &s));
    CHECK(str_eq(s, "llama"));
    CHECK_OK(cinfer_gguf_get_str(g, "tokenizer.ggml.model", &s));
    CHECK(str_eq(s, "gpt2"));
    CHECK_OK(cinfer_gguf_get_str(g, "tokenizer.ggml.pre", &s));
    CHECK(str_eq(s, "smollm"));
    uint32_t u;
    CHECK_OK(cinfer_gguf_get_u32(g, "llama.block_count", &u));
    CHECK_EQ_INT(u, 30);
    CHECK_OK(cinfer_gguf_get_u32(g, "llama.embedding_length", &u));
    CHECK_EQ_INT(u, 576);
    CHECK_OK(cinfer_gguf_get_u32(g, "llama.feed_forward_length", &u));
    CHECK_EQ_INT(u, 1536);
    CHECK_OK(cinfer_gguf_get_u32(g, "llama.attention.head_count", &u));
    CHECK_EQ_INT(u, 9);
    CHECK_OK(cinfer_gguf_get_u32(g, "llama.attention.head_count_kv", &u));
    CHECK_EQ_INT(u, 3);
    CHECK_OK(cinfer_gguf_get_u32(g, "llama.context_length", &u));
    CHECK_EQ_INT(u, 8192);
    CHECK_OK(cinfer_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u));
    CHECK_EQ_INT(u, 2);
    float f;
    CHECK_OK(cinfer_gguf_get_f32(g, "llama.rope.freq_base", &f));
    CHECK_NEAR(f, 100000.0, 0);
    CHECK_OK(cinfer_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
    CHECK_NEAR(f, 1e-5, 1e-9);
    int bv;
    CHECK_OK(cinfer_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv));
    CHECK_EQ_INT(bv, 0);
    cinfer_gguf_arr a;
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.tokens", &a));
    CHECK_EQ_INT(a.type, CINFER_GGUF_STRING);
    CHECK_EQ_INT(a.n, 49152);
    CHECK(str_eq(cinfer_gguf_arr_str(&a, 0), "<|endoftext|>"));
    CHECK(str_eq(cinfer_gguf_arr_str(&a, 2), "<|im_end|>"));
    uint64_t total = 0;
    for (uint64_t i = 0; i < a.n; i++)
        total += cinfer_gguf_arr_str(&a, i).len;
    CHECK(total > 49152);
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.merges", &a));
    CHECK_EQ_INT(a.n, 48900);
    CHECK(str_eq(cinfer_gguf_arr_str(&a, 0), "\xc4\xa0 t"));
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.token_type", &a));
    CHECK_EQ_INT(a.type, CINFER_GGUF_INT32);
    CHECK_EQ_INT(a.n, 49152);
    CHECK_EQ_INT(((uintptr_t)a.data) % 4, 0);
    CHECK_EQ_INT(((const int32_t *)a.data)[0], 3);
    CHECK_EQ_INT(((const int32_t *)a.data)[1000], 1);
    CHECK_OK(cinfer_gguf_get_str(g, "tokenizer.chat_template", &s));
    CHECK(s.len > 100 && memcmp(s.ptr, "{% for message", 14) == 0);

    const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK_EQ_INT(t->dtype, CINFER_DTYPE_Q8_0);
        CHECK_EQ_INT(t->n_dims, 2);
        CHECK_EQ_INT(t->ne[0], 576);
        CHECK_EQ_INT(t->ne[1], 49152);
        CHECK_EQ_INT(t->n_bytes, 576 / 32 * 34 * 49152);
    }
    CHECK(cinfer_gguf_find_tensor(g, "output.weight") == NULL);
    t = cinfer_gguf_find_tensor(g, "output_norm.weight");
    CHECK(t && t->dtype == CINFER_DTYPE_F32 && t->n_dims == 1 && t->ne[0] == 576);
    static const struct {
        const char *suffix;
        int64_t ne0, ne1;
        cinfer_dtype dt;
    } blk[] = {
        {"attn_norm.weight", 576, 1, CINFER_DTYPE_F32},
        {"attn_q.weight", 576, 576, CINFER_DTYPE_Q4_1},
        {"attn_k.weight", 576, 192, CINFER_DTYPE_Q4_1},
        {"attn_v.weight", 576, 192, CINFER_DTYPE_Q4_1},
        {"attn_output.weight", 576, 576, CINFER_DTYPE_Q4_1},
        {"ffn_norm.weight", 576, 1, CINFER_DTYPE_F32},
        {"ffn_gate.weight", 576, 1536, CINFER_DTYPE_Q4_1},
        {"ffn_up.weight", 576, 1536, CINFER_DTYPE_Q4_1},
        {"ffn_down.weight", 1536, 576, CINFER_DTYPE_Q4_1},
    };
    int found = 0;
    for (int l = 0; l < 30; l++) {
        for (size_t k = 0; k < sizeof blk / sizeof blk[0]; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, blk[k].suffix);
            t = cinfer_gguf_find_tensor(g, name);
            if (!t) {
                fprintf(stderr, "missing %s\n", name);
                harness_failed_checks++;
                continue;
            }
            found++;
            CHECK_EQ_INT(t->dtype, blk[k].dt);
            CHECK_EQ_INT(t->ne[0], blk[k].ne0);
            CHECK_EQ_INT(t->ne[1], blk[k].ne1);
            CHECK_EQ_INT(t->n_bytes, cinfer_dtype_row_bytes(t->dtype, t->ne[0]) * (size_t)t->ne[1]);
        }
    }
    CHECK_EQ_INT(found, 270);
    /* Every tensor: aligned, inside the file, names unique and findable. */
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(g); i++) {
        const cinfer_gguf_tensor *x = cinfer_gguf_tensor_at(g, i);
        CHECK(x && cinfer_gguf_find_tensor(g, x->name) == x);
        CHECK_EQ_INT(x->offset % 32, 0);
        CHECK_EQ_INT(((uintptr_t)x->data) % 32, 0);
    }
    cinfer_gguf_destroy(g);
}

/* ====================================================================== */
/* corrupt files                                                           */
/* ====================================================================== */

/* A small valid file whose last tensor ends exactly at the end, so that
 * every proper prefix is invalid. */
static void make_small(void **buf, size_t *size)
{
    cinfer_gguf_writer *w;
    CHECK_OK(cinfer_gguf_writer_create(NULL, &w));
    CHECK_OK(cinfer_gguf_writer_set_str(w, "general.architecture", "llama"));
    CHECK_OK(cinfer_gguf_writer_set_u32(w, "llama.block_count", 1));
    CHECK_OK(cinfer_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    CHECK_OK(cinfer_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1));
    const char *toks[3] = {"a", "", "ccc"};
    CHECK_OK(cinfer_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3));
    int32_t types[3] = {1, 2, 3};
    CHECK_OK(cinfer_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", CINFER_GGUF_INT32, types, 3));
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ne[2] = {8, 1};
    CHECK_OK(cinfer_gguf_writer_add_tensor(w, "x", CINFER_DTYPE_F32, 1, ne, x, sizeof x));
    uint8_t q[34 * 2] = {0};
    int64_t nq[2] = {32, 2};
    CHECK_OK(cinfer_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", CINFER_DTYPE_Q8_0, 2, nq, q, sizeof q));
    uint16_t h[16] = {0};
    int64_t nh[1] = {16};
    CHECK_OK(cinfer_gguf_writer_add_tensor(w, "last", CINFER_DTYPE_F16, 1, nh, h, sizeof h));
    write_mem(w, buf, size);
    cinfer_gguf_writer_destroy(w);
}

static void test_truncated_prefixes(void)
{
    void *buf;
    size_t size;
    make_small(&buf, &size);
    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(buf, size, &g, &copy));
    cinfer_gguf_destroy(g);
    free(copy);
    int bad = 0;
    for (size_t n = 0; n < size; n++) {
        g = NULL;
        cinfer_status st = open_copy(buf, n, &g, &copy);
        if (st != CINFER_E_FORMAT || g != NULL || cinfer_last_error()[0] == '\0') {
            if (bad++ < 5)
                fprintf(stderr, "prefix %zu of %zu: status %d, '%s'\n", n, size,
                        st, cinfer_last_error());
            cinfer_gguf_destroy(g);
            free(copy);
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* Spot checks of what the messages say. */
    EXPECT_FAIL(buf, 3, CINFER_E_FORMAT, "magic");
    EXPECT_FAIL(buf, 6, CINFER_E_FORMAT, "version");
    EXPECT_FAIL(buf, 20, CINFER_E_FORMAT, "key/value count");
    EXPECT_FAIL(buf, size - 1, CINFER_E_FORMAT, "'last' data");
    EXPECT_FAIL(buf, size - 1, CINFER_E_FORMAT, "past end of file");
    free(buf);
}

/* Flipping each header byte must never crash (statuses vary). */
static void test_byte_flips(void)
{
    void *buf;
    size_t size;
    make_small(&buf, &size);
    uint8_t *b = buf;
    size_t hdr = size - 128; /* the data is the last bytes; flip the rest */
    const uint8_t vals[] = {0x00, 0xff, 0x80, 0x7f, 0x01};
    for (size_t i = 0; i < hdr; i++) {
        uint8_t orig = b[i];
        for (size_t k = 0; k < sizeof vals; k++) {
            b[i] = vals[k];
            cinfer_gguf *g = NULL;
            void *copy;
            cinfer_status st = open_copy(b, size, &g, &copy);
            if (st == CINFER_OK) {
                /* Walk what parsed. */
                for (uint64_t j = 0; j < cinfer_gguf_n_kv(g); j++)
                    CHECK(cinfer_gguf_kv_key(g, j) != NULL);
                for (uint64_t j = 0; j < cinfer_gguf_n_tensors(g); j++)
                    CHECK(cinfer_gguf_tensor_at(g, j)->data != NULL);
                cinfer_gguf_destroy(g);
                free(copy);
            } else {
                CHECK(st == CINFER_E_FORMAT || st == CINFER_E_UNSUPPORTED);
                CHECK(cinfer_last_error()[0] != '\0');
            }
        }
        b[i] = orig;
    }
    free(buf);
}

static void test_bad_header(void)
{
    bytes b = {0};
    put(&b, "GGUX", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 0);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "magic");
    free(b.p);

    EXPECT_FAIL("", 0, CINFER_E_FORMAT, "too short");

    const uint32_t versions[] = {1, 4, 0, 0x03000000u, 0x02000000u};
    const char *words[] = {"version 1", "version 4", "version 0", "big-endian",
                           "big-endian"};
    for (int k = 0; k < 5; k++) {
        b = (bytes){0};
        put_header(&b, versions[k], 0, 0);
        EXPECT_FAIL(b.p, b.n, CINFER_E_UNSUPPORTED, words[k]);
        free(b.p);
    }

    /* Version 2 has the same layout and is read. */
    b = (bytes){0};
    put_header(&b, 2, 1, 1);
    put_kv_u32(&b, "k", 5);
    uint64_t ne[1] = {4};
    put_tensor(&b, "t", 1, ne, CINFER_DTYPE_F32, 0);
    pad_to(&b, 32);
    float v[4] = {1, 2, 3, 4};
    put(&b, v, sizeof v);
    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(b.p, b.n, &g, &copy));
    if (g) {
        CHECK_EQ_INT(cinfer_gguf_version(g), 2);
        const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(g, "t");
        CHECK(t && memcmp(t->data, v, sizeof v) == 0);
        cinfer_gguf_destroy(g);
        free(copy);
    }
    free(b.p);

    /* No tensors and no padding at the end is fine. */
    b = (bytes){0};
    put_header(&b, 3, 0, 1);
    put_kv_u32(&b, "k", 5);
    CHECK_OK(open_copy(b.p, b.n, &g, &copy));
    cinfer_gguf_destroy(g);
    free(copy);
    free(b.p);
}

static void test_huge_counts(void)
{
    const uint64_t huge[] = {UINT64_MAX, (uint64_t)1 << 63, (uint64_t)1 << 40,
                             1000};
    for (int k = 0; k < 4; k++) {
        bytes b = {0};
        put_header(&b, 3, huge[k], 0);
        put_zeros(&b, 64);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "tensor count");
        free(b.p);

        b = (bytes){0};
        put_header(&b, 3, 0, huge[k]);
        put_zeros(&b, 64);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "key/value count");
        free(b.p);

        /* Key name length. */
        b = (bytes){0};
        put_header(&b, 3, 0, 1);
        put_u64(&b, huge[k]);
        put(&b, "abc", 3);
        put_zeros(&b, 16);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "name length");
        free(b.p);

        /* String value length. */
        b = (bytes){0};
        put_header(&b, 3, 0, 1);
        put_str(&b, "general.name");
        put_u32(&b, CINFER_GGUF_STRING);
        put_u64(&b, huge[k]);
        put_zeros(&b, 16);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "string value length");
        free(b.p);

        /* Array lengths of each element kind. */
        const uint32_t et[] = {CINFER_GGUF_UINT8, CINFER_GGUF_FLOAT32,
                               CINFER_GGUF_UINT64, CINFER_GGUF_STRING,
                               CINFER_GGUF_ARRAY};
        for (int e = 0; e < 5; e++) {
            b = (bytes){0};
            put_header(&b, 3, 0, 1);
            put_str(&b, "tokenizer.ggml.tokens");
            put_u32(&b, CINFER_GGUF_ARRAY);
            put_u32(&b, et[e]);
            put_u64(&b, huge[k]);
            put_zeros(&b, 64);
            EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "exceeds file");
            free(b.p);
        }

        /* A string array element's length. */
        b = (bytes){0};
        put_header(&b, 3, 0, 1);
        put_str(&b, "tokenizer.ggml.tokens");
        put_u32(&b, CINFER_GGUF_ARRAY);
        put_u32(&b, CINFER_GGUF_STRING);
        put_u64(&b, 3);
        put_str(&b, "ok");
        put_u64(&b, huge[k]);
        put_zeros(&b, 40);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "'tokenizer.ggml.tokens': string array element 1 length");
        free(b.p);

        /* Tensor name length. */
        b = (bytes){0};
        put_header(&b, 3, 1, 0);
        put_u64(&b, huge[k]);
        put_zeros(&b, 40);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "tensor #0: name length");
        free(b.p);
    }
}

static void test_bad_offsets(void)
{
    uint64_t ne[2] = {8, 2};
    /* Misaligned. */
    bytes b = {0};
    put_header(&b, 3, 1, 0);
    put_tensor(&b, "blk.0.attn_q.weight", 2, ne, CINFER_DTYPE_F32, 8);
    pad_to(&b, 32);
    put_zeros(&b, 128);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "not a multiple of the alignment");
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "blk.0.attn_q.weight");
    free(b.p);

    /* Past the end: by a byte, far away, and near 2^64. */
    const uint64_t offs[] = {32, 4096, UINT64_MAX - 31};
    for (int k = 0; k < 3; k++) {
        b = (bytes){0};
        put_header(&b, 3, 1, 0);
        put_tensor(&b, "blk.0.attn_q.weight", 2, ne, CINFER_DTYPE_F32, offs[k]);
        pad_to(&b, 32);
        put_zeros(&b, 32 + 63);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT,
                    "tensor 'blk.0.attn_q.weight' data [offset");
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "64 bytes] runs past end of file");
        free(b.p);
    }

    /* Overlapping tensors are allowed (read-only views). */
    b = (bytes){0};
    put_header(&b, 3, 2, 0);
    put_tensor(&b, "a", 2, ne, CINFER_DTYPE_F32, 0);
    put_tensor(&b, "b", 1, ne, CINFER_DTYPE_F32, 32);
    pad_to(&b, 32);
    put_zeros(&b, 64);
    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(b.p, b.n, &g, &copy));
    if (g) {
        const cinfer_gguf_tensor *ta = cinfer_gguf_find_tensor(g, "a");
        const cinfer_gguf_tensor *tb = cinfer_gguf_find_tensor(g, "b");
        CHECK(ta && tb && (const uint8_t *)tb->data == (const uint8_t *)ta->data + 32);
        cinfer_gguf_destroy(g);
        free(copy);
    }
    free(b.p);
}

static void test_bad_types(void)
{
    bytes b = {0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "general.odd");
    put_u32(&b, 13);
    put_u32(&b, 0);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "unknown value type 13");
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "'general.odd'");
    free(b.p);

    b = (bytes){0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "general.odd");
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u32(&b, 0xffffffffu);
    put_u64(&b, 0);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "unknown array element type");
    free(b.p);

    /* Unknown tensor types: IQ2_XXS (16), a gap id (4), junk. */
    const uint32_t tt[] = {16, 4, 29, 31, 0x7fffffffu};
    for (int k = 0; k < 5; k++) {
        uint64_t ne[1] = {256};
        b = (bytes){0};
        put_header(&b, 3, 1, 0);
        put_tensor(&b, "w", 1, ne, tt[k], 0);
        pad_to(&b, 32);
        put_zeros(&b, 1024);
        EXPECT_FAIL(b.p, b.n, CINFER_E_UNSUPPORTED, "type");
        EXPECT_FAIL(b.p, b.n, CINFER_E_UNSUPPORTED, "'w'");
        /* a type GGML defines is refused by its name */
        EXPECT_FAIL(b.p, b.n, CINFER_E_UNSUPPORTED,
                    k == 0 ? "(IQ2_XXS)" : k == 2 ? "(IQ1_M)" : "type");
        free(b.p);
    }

    /* Bool values other than 0 and 1. */
    b = (bytes){0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "flag");
    put_u32(&b, CINFER_GGUF_BOOL);
    put_u8(&b, 2);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "bool");
    free(b.p);
    b = (bytes){0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "flags");
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u32(&b, CINFER_GGUF_BOOL);
    put_u64(&b, 3);
    put_u8(&b, 0);
    put_u8(&b, 1);
    put_u8(&b, 9);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "bool array element 2");
    free(b.p);
}

static void test_bad_dims(void)
{
    const uint64_t ne5[5] = {4, 1, 1, 1, 1};
    const uint32_t nd[] = {0, 5, 0xffffffffu};
    for (int k = 0; k < 3; k++) {
        bytes b = {0};
        put_header(&b, 3, 1, 0);
        put_tensor(&b, "t", nd[k] == 0 ? 0 : 5, ne5, CINFER_DTYPE_F32, 0);
        if (nd[k] != 0 && nd[k] != 5) {
            /* patch n_dims in place */
            size_t pos = 24 + 8 + 1;
            b.p[pos] = 0xff;
            b.p[pos + 1] = 0xff;
            b.p[pos + 2] = 0xff;
            b.p[pos + 3] = 0xff;
        }
        pad_to(&b, 32);
        put_zeros(&b, 64);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "n_dims");
        free(b.p);
    }

    /* A zero dimension, in each position. */
    for (int d = 0; d < 4; d++) {
        uint64_t ne[4] = {4, 2, 2, 2};
        ne[d] = 0;
        bytes b = {0};
        put_header(&b, 3, 1, 0);
        put_tensor(&b, "t", 4, ne, CINFER_DTYPE_F32, 0);
        pad_to(&b, 32);
        put_zeros(&b, 256);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "must be >= 1");
        free(b.p);
    }

    /* Negative (as int64) and overflowing products. */
    const uint64_t cases[][4] = {
        {(uint64_t)-1, 1, 1, 1},
        {(uint64_t)1 << 32, (uint64_t)1 << 32, 1, 1},
        {(uint64_t)1 << 20, (uint64_t)1 << 20, (uint64_t)1 << 20, 4},
        {(uint64_t)INT64_MAX, 2, 1, 1},
    };
    const char *words[] = {"must be >= 1", "overflows", "overflows", "overflows"};
    for (int k = 0; k < 4; k++) {
        bytes b = {0};
        put_header(&b, 3, 1, 0);
        put_tensor(&b, "t", 4, cases[k], CINFER_DTYPE_F32, 0);
        pad_to(&b, 32);
        put_zeros(&b, 64);
        EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, words[k]);
        free(b.p);
    }

    /* Bytes overflow although the element count fits: 2^62 F32. */
    uint64_t big[2] = {(uint64_t)1 << 31, (uint64_t)1 << 31};
    bytes b = {0};
    put_header(&b, 3, 1, 0);
    put_tensor(&b, "t", 2, big, CINFER_DTYPE_F32, 0);
    pad_to(&b, 32);
    put_zeros(&b, 64);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "data size overflows");
    free(b.p);

    /* Rows that are not whole blocks. */
    uint64_t ne[2] = {48, 2};
    b = (bytes){0};
    put_header(&b, 3, 1, 0);
    put_tensor(&b, "q", 2, ne, CINFER_DTYPE_Q4_1, 0);
    pad_to(&b, 32);
    put_zeros(&b, 256);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "not a multiple of the Q4_1 block size 32");
    free(b.p);
}

static void test_bad_names(void)
{
    /* A key with an embedded NUL. */
    bytes b = {0};
    put_header(&b, 3, 0, 1);
    put_u64(&b, 5);
    put(&b, "ab\0cd", 5);
    put_u32(&b, CINFER_GGUF_UINT8);
    put_u8(&b, 1);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "NUL");
    free(b.p);

    /* An empty key. */
    b = (bytes){0};
    put_header(&b, 3, 0, 1);
    put_u64(&b, 0);
    put_u32(&b, CINFER_GGUF_UINT8);
    put_u8(&b, 1);
    put_zeros(&b, 8);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "empty name");
    free(b.p);

    /* A tensor name with a NUL. */
    uint64_t ne[1] = {8};
    b = (bytes){0};
    put_header(&b, 3, 1, 0);
    put_u64(&b, 3);
    put(&b, "x\0y", 3);
    put_u32(&b, 1);
    put_u64(&b, ne[0]);
    put_u32(&b, CINFER_DTYPE_F32);
    put_u64(&b, 0);
    pad_to(&b, 32);
    put_zeros(&b, 32);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "tensor #0 name");
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "NUL");
    free(b.p);

    /* Duplicate keys, far apart, among many. */
    b = (bytes){0};
    put_header(&b, 3, 0, 200);
    for (int i = 0; i < 200; i++) {
        char key[32];
        snprintf(key, sizeof key, "k.%d", i == 150 ? 17 : i);
        put_kv_u32(&b, key, (uint32_t)i);
    }
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "duplicate key 'k.17' (#17");
    free(b.p);

    /* Duplicate tensor names. */
    b = (bytes){0};
    put_header(&b, 3, 3, 0);
    put_tensor(&b, "a", 1, ne, CINFER_DTYPE_F32, 0);
    put_tensor(&b, "b", 1, ne, CINFER_DTYPE_F32, 32);
    put_tensor(&b, "a", 1, ne, CINFER_DTYPE_F32, 64);
    pad_to(&b, 32);
    put_zeros(&b, 96);
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "duplicate tensor name 'a'");
    free(b.p);
}

static void test_nested_arrays(void)
{
    /* [[1, 2], [], [3]] as arrays of UINT32, then a key after it. */
    bytes b = {0};
    put_header(&b, 3, 0, 2);
    put_str(&b, "nested");
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u64(&b, 3);
    put_u32(&b, CINFER_GGUF_UINT32);
    put_u64(&b, 2);
    put_u32(&b, 1);
    put_u32(&b, 2);
    put_u32(&b, CINFER_GGUF_UINT32);
    put_u64(&b, 0);
    put_u32(&b, CINFER_GGUF_STRING);
    put_u64(&b, 1);
    put_str(&b, "inner");
    put_kv_u32(&b, "after", 9);
    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(b.p, b.n, &g, &copy));
    if (g) {
        cinfer_gguf_arr a;
        CHECK_OK(cinfer_gguf_get_arr(g, "nested", &a));
        CHECK_EQ_INT(a.type, CINFER_GGUF_ARRAY);
        CHECK_EQ_INT(a.n, 3);
        CHECK(a.data == NULL);
        CHECK(cinfer_gguf_arr_str(&a, 0).ptr == NULL);
        uint32_t u;
        CHECK_OK(cinfer_gguf_get_u32(g, "after", &u));
        CHECK_EQ_INT(u, 9);
        cinfer_gguf_destroy(g);
        free(copy);
    }
    free(b.p);

    /* Nesting 9 deep is refused; 8 deep is read. */
    for (int depth = 8; depth <= 9; depth++) {
        b = (bytes){0};
        put_header(&b, 3, 0, 1);
        put_str(&b, "deep");
        put_u32(&b, CINFER_GGUF_ARRAY);
        for (int d = 1; d < depth; d++) {
            put_u32(&b, CINFER_GGUF_ARRAY);
            put_u64(&b, 1);
        }
        put_u32(&b, CINFER_GGUF_UINT8);
        put_u64(&b, 1);
        put_u8(&b, 7);
        if (depth == 8) {
            CHECK_OK(open_copy(b.p, b.n, &g, &copy));
            cinfer_gguf_destroy(g);
            free(copy);
        } else {
            EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "nested more than 8");
        }
        free(b.p);
    }
}

/* A numeric array at an odd file offset is still aligned for its type. */
static void test_misaligned_array(void)
{
    bytes b = {0};
    put_header(&b, 3, 0, 2);
    put_str(&b, "k"); /* value starts at 24 + 9 + 4 = 37 */
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u32(&b, CINFER_GGUF_FLOAT32);
    put_u64(&b, 3);
    float v[3] = {0.5f, -1.0f, 2.0f};
    put(&b, v, sizeof v); /* elements at 49 */
    put_str(&b, "d");
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u32(&b, CINFER_GGUF_FLOAT64);
    put_u64(&b, 2);
    double dv[2] = {0.25, 1e10};
    put(&b, dv, sizeof dv);
    cinfer_gguf *g;
    void *copy;
    CHECK_OK(open_copy(b.p, b.n, &g, &copy));
    if (g) {
        cinfer_gguf_arr a;
        CHECK_OK(cinfer_gguf_get_arr(g, "k", &a));
        CHECK_EQ_INT(((uintptr_t)a.data) % 4, 0);
        const float *f = a.data;
        CHECK(a.n == 3 && f[0] == 0.5f && f[1] == -1.0f && f[2] == 2.0f);
        CHECK_OK(cinfer_gguf_get_arr(g, "d", &a));
        CHECK_EQ_INT(((uintptr_t)a.data) % 8, 0);
        CHECK(((const double *)a.data)[1] == 1e10);
        cinfer_gguf_destroy(g);
        free(copy);
    }
    free(b.p);
}

/* Arrays larger than the file claims cannot make the reader allocate: the
 * count is checked first (a malloc of 2^40 * 8 bytes would fail under
 * ASan's allocator limits and be reported). */
static void test_count_checked_before_alloc(void)
{
    bytes b = {0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, CINFER_GGUF_ARRAY);
    put_u32(&b, CINFER_GGUF_STRING);
    put_u64(&b, (uint64_t)1 << 40);
    for (int i = 0; i < 100; i++)
        put_str(&b, "tok");
    EXPECT_FAIL(b.p, b.n, CINFER_E_FORMAT, "string array of 1099511627776 elements exceeds file");
    free(b.p);
}

int main(void)
{
    RUN(test_roundtrip_metadata);
    RUN(test_scalar_types_raw);
    RUN(test_tensor_dtypes);
    RUN(test_alignment);
    RUN(test_file_io);
    RUN(test_default_model);
    RUN(test_truncated_prefixes);
    RUN(test_byte_flips);
    RUN(test_bad_header);
    RUN(test_huge_counts);
    RUN(test_bad_offsets);
    RUN(test_bad_types);
    RUN(test_bad_dims);
    RUN(test_bad_names);
    RUN(test_nested_arrays);
    RUN(test_misaligned_array);
    RUN(test_count_checked_before_alloc);
    if (model_absent)
        fprintf(stderr, "(default model absent: its test was skipped)\n");
    return harness_done();
}
