/*
 * gguf.h - GGUF v2/v3 reader (over mmap) and writer.
 *
 * Reader: the file is mapped read-only and parsed once at create. Every
 * count, length, offset and size is checked against the file before use, so
 * a truncated or corrupt file fails with CINFER_E_FORMAT and a message that
 * names what is wrong (key, tensor, offset), never a crash. Metadata values
 * and tensor data point into the mapping and live as long as the handle.
 *
 *     cinfer_gguf_params p = cinfer_gguf_default_params();
 *     p.path = "model.gguf";
 *     cinfer_gguf *g;
 *     if (cinfer_gguf_create(&p, &g) != CINFER_OK) { ...cinfer_last_error() }
 *     uint32_t n_layer;
 *     cinfer_gguf_get_u32(g, "llama.block_count", &n_layer);
 *     const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(g, "output_norm.weight");
 *     cinfer_gguf_destroy(g);
 *
 * Writer: collects key/values and tensors in memory, writes a v3 file with
 * the given alignment. Used by tests and tools to make tiny models.
 *
 * Thread safety: a reader handle is immutable after create and may be read
 * from any number of threads; a writer is used by one thread.
 */
#ifndef CINFER_GGUF_H
#define CINFER_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "../kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum {
    CINFER_GGUF_UINT8 = 0,
    CINFER_GGUF_INT8 = 1,
    CINFER_GGUF_UINT16 = 2,
    CINFER_GGUF_INT16 = 3,
    CINFER_GGUF_UINT32 = 4,
    CINFER_GGUF_INT32 = 5,
    CINFER_GGUF_FLOAT32 = 6,
    CINFER_GGUF_BOOL = 7,
    CINFER_GGUF_STRING = 8,
    CINFER_GGUF_ARRAY = 9,
    CINFER_GGUF_UINT64 = 10,
    CINFER_GGUF_INT64 = 11,
    CINFER_GGUF_FLOAT64 = 12,
} cinfer_gguf_type;

/* A string inside the file: not NUL-terminated. */
typedef struct {
    const char *ptr;
    uint64_t len;
} cinfer_gguf_str;

/* An array value. For numeric and bool arrays `data` points at the packed
 * little-endian elements, aligned for the element type (the reader copies an
 * array that sits misaligned in the file), so it may be indexed as a C array;
 * for string arrays use cinfer_gguf_arr_str(). */
typedef struct {
    cinfer_gguf_type type; /* element type (never ARRAY: nested arrays are
                              parsed and skipped, their type is reported as
                              ARRAY with n elements and data NULL) */
    uint64_t n;            /* element count */
    const void *data;      /* packed elements (numeric/bool), else NULL */
    const void *priv_;     /* reader-internal (string offsets) */
} cinfer_gguf_arr;

typedef struct {
    const char *name;     /* NUL-terminated copy owned by the reader */
    uint32_t n_dims;      /* 1..4 */
    int64_t ne[4];        /* GGUF order: ne[0] is contiguous; unused = 1 */
    cinfer_dtype dtype;   /* element type (GGML id) */
    uint64_t offset;      /* from the start of the data section */
    size_t n_bytes;       /* bytes of data */
    const void *data;     /* points into the mapping */
} cinfer_gguf_tensor;

typedef struct {
    const char *path;     /* file to map; or NULL and data/size below */
    int in_memory;        /* with path: read the file into anonymous
                             memory in 2 MiB-aligned huge pages (where the
                             kernel has transparent huge pages) instead of
                             mapping it: weights streamed every step then
                             miss the TLB 512 times less often, at the cost
                             of the page cache's sharing and eviction */
    const void *data;     /* in-memory file (not copied; must outlive the
                             handle); used when path is NULL */
    size_t size;          /* bytes at data */
} cinfer_gguf_params;

cinfer_gguf_params cinfer_gguf_default_params(void);

typedef struct cinfer_gguf cinfer_gguf;

/* Opens and validates a GGUF file. Errors: CINFER_E_IO (open/map),
 * CINFER_E_FORMAT (anything malformed, with the offending key/tensor and
 * offset named), CINFER_E_UNSUPPORTED (version, tensor type),
 * CINFER_E_NOMEM. */
cinfer_status cinfer_gguf_create(const cinfer_gguf_params *p,
                                 cinfer_gguf **out);
void cinfer_gguf_destroy(cinfer_gguf *g);

uint32_t cinfer_gguf_version(const cinfer_gguf *g);
uint32_t cinfer_gguf_alignment(const cinfer_gguf *g);

/* ---- metadata ---------------------------------------------------------- */

uint64_t cinfer_gguf_n_kv(const cinfer_gguf *g);
/* Key i (NUL-terminated, owned by the reader; NULL if i >= n_kv) and its
 * type (i must be < n_kv). */
const char *cinfer_gguf_kv_key(const cinfer_gguf *g, uint64_t i);
cinfer_gguf_type cinfer_gguf_kv_type(const cinfer_gguf *g, uint64_t i);
/* Index of `key`, or -1. */
int64_t cinfer_gguf_find_key(const cinfer_gguf *g, const char *key);

/* Typed getters. CINFER_E_NOT_FOUND if the key is absent, CINFER_E_FORMAT
 * if it has an incompatible type or the value does not fit. Integer getters
 * accept any integer type whose value fits; get_f32 accepts FLOAT32 and
 * FLOAT64; get_bool accepts BOOL. */
cinfer_status cinfer_gguf_get_u32(const cinfer_gguf *g, const char *key,
                                  uint32_t *out);
cinfer_status cinfer_gguf_get_i64(const cinfer_gguf *g, const char *key,
                                  int64_t *out);
cinfer_status cinfer_gguf_get_f32(const cinfer_gguf *g, const char *key,
                                  float *out);
cinfer_status cinfer_gguf_get_bool(const cinfer_gguf *g, const char *key,
                                   int *out);
cinfer_status cinfer_gguf_get_str(const cinfer_gguf *g, const char *key,
                                  cinfer_gguf_str *out);
cinfer_status cinfer_gguf_get_arr(const cinfer_gguf *g, const char *key,
                                  cinfer_gguf_arr *out);

/* Element i of a STRING array; {NULL, 0} if i >= a->n or the array is not
 * a string array. O(1): element positions are recorded at parse time. */
cinfer_gguf_str cinfer_gguf_arr_str(const cinfer_gguf_arr *a, uint64_t i);

/* ---- tensors ----------------------------------------------------------- */

uint64_t cinfer_gguf_n_tensors(const cinfer_gguf *g);
/* Tensor i in file order; NULL if i >= n_tensors. */
const cinfer_gguf_tensor *cinfer_gguf_tensor_at(const cinfer_gguf *g,
                                                uint64_t i);
/* NULL if absent. */
const cinfer_gguf_tensor *cinfer_gguf_find_tensor(const cinfer_gguf *g,
                                                  const char *name);

/* ---- writer ------------------------------------------------------------ */

typedef struct cinfer_gguf_writer cinfer_gguf_writer;

typedef struct {
    uint32_t alignment; /* data alignment in bytes, power of two; 0 = 32;
                           written as general.alignment when not 32 */
} cinfer_gguf_writer_params;

cinfer_gguf_writer_params cinfer_gguf_writer_default_params(void);

cinfer_status cinfer_gguf_writer_create(const cinfer_gguf_writer_params *p,
                                        cinfer_gguf_writer **out);
void cinfer_gguf_writer_destroy(cinfer_gguf_writer *w);

/* Each setter copies its arguments. Setting a key twice replaces it. */
cinfer_status cinfer_gguf_writer_set_u32(cinfer_gguf_writer *w,
                                         const char *key, uint32_t v);
cinfer_status cinfer_gguf_writer_set_i32(cinfer_gguf_writer *w,
                                         const char *key, int32_t v);
cinfer_status cinfer_gguf_writer_set_u64(cinfer_gguf_writer *w,
                                         const char *key, uint64_t v);
cinfer_status cinfer_gguf_writer_set_f32(cinfer_gguf_writer *w,
                                         const char *key, float v);
cinfer_status cinfer_gguf_writer_set_bool(cinfer_gguf_writer *w,
                                          const char *key, int v);
cinfer_status cinfer_gguf_writer_set_str(cinfer_gguf_writer *w,
                                         const char *key, const char *v);
/* Array of `n` packed elements of a numeric/bool `type`. */
cinfer_status cinfer_gguf_writer_set_arr(cinfer_gguf_writer *w,
                                         const char *key,
                                         cinfer_gguf_type type,
                                         const void *data, uint64_t n);
/* Array of `n` NUL-terminated strings. */
cinfer_status cinfer_gguf_writer_set_arr_str(cinfer_gguf_writer *w,
                                             const char *key,
                                             const char *const *v, uint64_t n);

/* Adds a tensor (data copied; n_bytes must equal the size that dtype and
 * ne imply). ne in GGUF order (ne[0] contiguous). */
cinfer_status cinfer_gguf_writer_add_tensor(cinfer_gguf_writer *w,
                                            const char *name,
                                            cinfer_dtype dtype,
                                            uint32_t n_dims,
                                            const int64_t *ne,
                                            const void *data, size_t n_bytes);

/* Serializes to a file, or to a malloc'd buffer the caller frees. */
cinfer_status cinfer_gguf_writer_write_file(const cinfer_gguf_writer *w,
                                            const char *path);
cinfer_status cinfer_gguf_writer_write_mem(const cinfer_gguf_writer *w,
                                           void **buf, size_t *size);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_GGUF_H */
