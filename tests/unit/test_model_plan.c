/*
 * test_model_plan.c - memory planning at model start (engine/model.h) on a
 * backend with a budget, without a GPU.
 *
 * The backend here is the CPU backend behind an ops table of its own that
 * counts the bytes of every tensor and refuses one past a budget with
 * CINFER_E_NOMEM, reports them through the memory slot, and reserves a
 * fixed scratch, the way the CUDA backend plans device memory. Checked:
 * the KV cache takes what weights, activations and scratch leave, capped
 * at max_seqs full sequences; a model with no room for one full-context
 * sequence, one whose weights alone exceed the budget, and an explicit KV
 * size that does not fit are refused with the sizes in MiB; the sizes are
 * recorded in cinfer_model_info; on the plain CPU backend there is no
 * budget and no scratch. Only model creation runs, so only the slots it
 * calls are filled.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/tinymodel.h"
#include "harness.h"
#include "kernels/backend_impl.h"

#define SCRATCH_BYTES ((size_t)3 << 20)

typedef struct {
    cinfer_backend base; /* first: the wrapper is a cinfer_backend */
    cinfer_backend *inner;
    size_t budget, used;
    int scratch_reserved;
} budget_backend;

static budget_backend *bb(cinfer_backend *be) { return (budget_backend *)be; }

/* What the tensor was created with (set_rows may shrink its desc). */
static size_t tensor_bytes(const cinfer_tensor *t) { return t->cap_bytes; }

static cinfer_status take(budget_backend *b, size_t n)
{
    if (n > b->budget || b->used > b->budget - n)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "test budget: %zu bytes past %zu of %zu", n,
                                b->used, b->budget);
    b->used += n;
    return CINFER_OK;
}

static void b_destroy(cinfer_backend *be)
{
    cinfer_backend_destroy(bb(be)->inner);
    free(be);
}

static cinfer_status b_tensor_create(cinfer_backend *be,
                                     const cinfer_tensor_desc *desc,
                                     size_t nbytes, cinfer_tensor **out)
{
    cinfer_status st = take(bb(be), nbytes);
    if (st != CINFER_OK)
        return st;
    st = cinfer_backend_tensor_create(bb(be)->inner, desc, out);
    if (st != CINFER_OK)
        bb(be)->used -= nbytes;
    return st;
}

static cinfer_status b_tensor_create_weight(cinfer_backend *be,
                                            const cinfer_tensor_desc *desc,
                                            size_t nbytes, const void *data,
                                            cinfer_tensor **out)
{
    cinfer_status st = take(bb(be), nbytes);
    if (st != CINFER_OK)
        return st;
    st = cinfer_backend_tensor_create_weight(bb(be)->inner, desc, data, out);
    if (st != CINFER_OK)
        bb(be)->used -= nbytes;
    return st;
}

static void b_tensor_destroy(cinfer_backend *be, cinfer_tensor *t)
{
    bb(be)->used -= tensor_bytes(t);
    cinfer_backend_tensor_destroy(bb(be)->inner, t);
}

static int b_weight_borrows(cinfer_backend *be, const cinfer_tensor *t)
{
    return cinfer_backend_weight_borrows(bb(be)->inner, t);
}

static cinfer_status b_fill_zero(cinfer_backend *be, cinfer_tensor *t)
{
    return cinfer_backend_fill_zero(bb(be)->inner, t);
}

static cinfer_status b_synchronize(cinfer_backend *be)
{
    return cinfer_backend_synchronize(bb(be)->inner);
}

static cinfer_status b_memory(cinfer_backend *be, size_t *used,
                              size_t *budget)
{
    *used = bb(be)->used;
    *budget = bb(be)->budget;
    return CINFER_OK;
}

static cinfer_status b_reserve_scratch(cinfer_backend *be,
                                       const cinfer_backend_scratch_plan *p)
{
    (void)p;
    if (bb(be)->scratch_reserved)
        return CINFER_OK;
    cinfer_status st = take(bb(be), SCRATCH_BYTES);
    if (st == CINFER_OK)
        bb(be)->scratch_reserved = 1;
    return st;
}

static const struct cinfer_backend_ops budget_ops = {
    .destroy = b_destroy,
    .tensor_create = b_tensor_create,
    .tensor_create_weight = b_tensor_create_weight,
    .tensor_destroy = b_tensor_destroy,
    .weight_borrows = b_weight_borrows,
    .fill_zero = b_fill_zero,
    .synchronize = b_synchronize,
    .memory = b_memory,
    .reserve_scratch = b_reserve_scratch,
};

static cinfer_backend *budget_create(size_t budget)
{
    cinfer_backend_cpu_params cp = cinfer_backend_cpu_default_params();
    cp.n_threads = 1;
    cinfer_backend *inner = NULL;
    if (cinfer_backend_cpu_create(&cp, &inner) != CINFER_OK)
        return NULL;
    budget_backend *b = calloc(1, sizeof *b);
    if (!b) {
        cinfer_backend_destroy(inner);
        return NULL;
    }
    b->base.ops = &budget_ops;
    b->base.name = "budget";
    snprintf(b->base.device_desc, sizeof b->base.device_desc, "test budget");
    b->inner = inner;
    b->budget = budget;
    return &b->base;
}

/* ---------------------------------------------------------------------- */

static char model_path[256];

enum { N_CTX = 64, BLOCK = 4, BLOCKS_PER_SEQ = N_CTX / BLOCK, MAX_SEQS = 8 };

/* A model on a budget backend; *st gets the status, *be the backend
 * (destroyed by the caller after the model). */
static cinfer_model *plan(size_t budget, int from_budget, int n_kv_blocks,
                          cinfer_backend **be, cinfer_status *st)
{
    *be = budget_create(budget);
    CHECK(*be != NULL);
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = model_path;
    mp.backend = *be;
    mp.n_ctx = N_CTX;
    mp.block_size = BLOCK;
    mp.max_seqs = MAX_SEQS;
    mp.max_batch_rows = 32;
    mp.kv_from_budget = from_budget;
    mp.n_kv_blocks = n_kv_blocks;
    cinfer_model *m = NULL;
    *st = cinfer_model_create(&mp, &m);
    return m;
}

/* Bytes weights + activations + scratch take, and one KV block's. */
static size_t base_bytes, block_bytes;

static void test_roomy_budget_caps_at_max_seqs(void)
{
    cinfer_backend *be;
    cinfer_status st;
    size_t budget = (size_t)1 << 30;
    cinfer_model *m = plan(budget, 1, 0, &be, &st);
    CHECK_OK(st);
    if (m) {
        const cinfer_model_info *I = cinfer_model_get_info(m);
        CHECK_EQ_INT(I->n_kv_blocks, BLOCKS_PER_SEQ * MAX_SEQS);
        CHECK_EQ_INT(I->budget_bytes, budget);
        CHECK_EQ_INT(I->scratch_bytes, SCRATCH_BYTES);
        CHECK(I->weights_held_bytes > 0);
        CHECK(I->activation_bytes > 0);
        CHECK(I->kv_bytes > 0);
        size_t used = 0, b = 0;
        CHECK_OK(cinfer_backend_memory(be, &used, &b));
        CHECK_EQ_INT(used, I->weights_held_bytes + I->activation_bytes +
                               I->scratch_bytes + I->kv_bytes);
        base_bytes = used - I->kv_bytes;
        block_bytes = I->kv_bytes / (uint64_t)I->n_kv_blocks;
    }
    cinfer_model_destroy(m);
    if (be) {
        size_t used = 1, b = 0;
        cinfer_backend_memory(be, &used, &b);
        /* only the scratch stays: it belongs to the backend */
        CHECK_EQ_INT(used, SCRATCH_BYTES);
    }
    cinfer_backend_destroy(be);
}

static void test_kv_takes_what_is_left(void)
{
    CHECK(base_bytes > 0 && block_bytes > 0);
    if (!base_bytes || !block_bytes)
        return;
    int want = BLOCKS_PER_SEQ * 2 + 3;
    cinfer_backend *be;
    cinfer_status st;
    cinfer_model *m = plan(base_bytes + (size_t)want * block_bytes +
                               block_bytes / 2,
                           1, 0, &be, &st);
    CHECK_OK(st);
    if (m)
        CHECK_EQ_INT(cinfer_model_get_info(m)->n_kv_blocks, want);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
}

static void test_no_room_for_one_sequence(void)
{
    cinfer_backend *be;
    cinfer_status st;
    cinfer_model *m = plan(base_bytes + (size_t)(BLOCKS_PER_SEQ - 1) *
                                            block_bytes,
                           1, 0, &be, &st);
    CHECK(m == NULL);
    CHECK_EQ_INT(st, CINFER_E_NOMEM);
    const char *e = cinfer_last_error();
    CHECK(strstr(e, "does not fit the budget memory budget") != NULL);
    CHECK(strstr(e, "one full-context sequence") != NULL);
    CHECK(strstr(e, "weights ") && strstr(e, "activations ") &&
          strstr(e, "scratch 3.0 MiB") && strstr(e, "KV ") &&
          strstr(e, "budget "));
    fprintf(stderr, "  refusal: %s\n", e);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
}

static void test_weights_over_budget(void)
{
    cinfer_backend *be;
    cinfer_status st;
    cinfer_model *m = plan(4096, 1, 0, &be, &st);
    CHECK(m == NULL);
    CHECK_EQ_INT(st, CINFER_E_NOMEM);
    CHECK(strstr(cinfer_last_error(), "alone exceed it") != NULL);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
    /* used nothing: the precheck refused before loading */
}

static void test_explicit_kv_checked(void)
{
    cinfer_backend *be;
    cinfer_status st;
    size_t budget = base_bytes + (size_t)BLOCKS_PER_SEQ * 2 * block_bytes;
    cinfer_model *m = plan(budget, 0, BLOCKS_PER_SEQ * 3, &be, &st);
    CHECK(m == NULL);
    CHECK_EQ_INT(st, CINFER_E_NOMEM);
    CHECK(strstr(cinfer_last_error(), "asked for does not fit") != NULL);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);

    /* Asked for less than fits: honoured as given. */
    m = plan(budget, 0, BLOCKS_PER_SEQ + 1, &be, &st);
    CHECK_OK(st);
    if (m)
        CHECK_EQ_INT(cinfer_model_get_info(m)->n_kv_blocks,
                     BLOCKS_PER_SEQ + 1);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
}

static void test_cpu_has_no_budget(void)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = model_path;
    mp.n_threads = 1;
    mp.n_ctx = N_CTX;
    mp.block_size = BLOCK;
    mp.max_seqs = 2;
    mp.kv_from_budget = 1; /* no budget: n_kv_blocks' default applies */
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    if (!m)
        return;
    const cinfer_model_info *I = cinfer_model_get_info(m);
    CHECK_EQ_INT(I->budget_bytes, 0);
    CHECK_EQ_INT(I->scratch_bytes, 0);
    CHECK_EQ_INT(I->weights_held_bytes, I->weight_bytes);
    CHECK(I->activation_bytes > 0);
    CHECK_EQ_INT(I->n_kv_blocks, BLOCKS_PER_SEQ * 2);
    cinfer_model_destroy(m);
}

int main(void)
{
    snprintf(model_path, sizeof model_path,
             "/tmp/cinfer-test-plan-%d.gguf", (int)getpid());
    cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
    tp.n_ctx = 256;
    if (cinfer_tinymodel_write(&tp, model_path) != CINFER_OK) {
        fprintf(stderr, "tinymodel: %s\n", cinfer_last_error());
        return 1;
    }
    RUN(test_roomy_budget_caps_at_max_seqs);
    RUN(test_kv_takes_what_is_left);
    RUN(test_no_room_for_one_sequence);
    RUN(test_weights_over_budget);
    RUN(test_explicit_kv_checked);
    RUN(test_cpu_has_no_budget);
    remove(model_path);
    return harness_done();
}
