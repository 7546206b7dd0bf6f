/*
 * backend.c - backend-independent helpers of the ops table.
 *
 * Every backend's tensor struct starts with its cinfer_tensor_desc, so the
 * descriptor of any tensor can be read without knowing the backend, and
 * every backend starts with the cinfer_backend header whose ops table knows
 * how to destroy it.
 */
#include "backend.h"

#include <string.h>

const cinfer_tensor_desc *cinfer_tensor_get_desc(const cinfer_tensor *t)
{
    return (const cinfer_tensor_desc *)(const void *)t;
}

int64_t cinfer_tensor_desc_nelems(const cinfer_tensor_desc *d)
{
    if (d->n_dims < 1 || d->n_dims > CINFER_MAX_DIMS)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < d->n_dims; i++) {
        if (d->shape[i] < 1 || n > INT64_MAX / d->shape[i])
            return 0;
        n *= d->shape[i];
    }
    return n;
}

size_t cinfer_tensor_desc_nbytes(const cinfer_tensor_desc *d)
{
    int64_t n = cinfer_tensor_desc_nelems(d);
    if (n == 0)
        return 0;
    int64_t last = d->shape[d->n_dims - 1];
    size_t row = cinfer_dtype_row_bytes(d->dtype, last);
    if (row == 0)
        return 0;
    size_t rows = (size_t)(n / last);
    if (rows > SIZE_MAX / row)
        return 0;
    return rows * row;
}

cinfer_tensor_desc cinfer_tensor_desc_make(cinfer_dtype dtype, int n_dims,
                                           const int64_t *shape)
{
    cinfer_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dtype;
    d.n_dims = n_dims;
    for (int i = 0; i < CINFER_MAX_DIMS; i++)
        d.shape[i] = (i < n_dims && shape) ? shape[i] : 1;
    return d;
}

void cinfer_backend_destroy(cinfer_backend *be)
{
    if (be)
        be->ops->destroy(be);
}
