/*
 * faulty_server.c - cinfer-server-faulty: the real server (cinfer_server_main)
 * over a backend that injects device faults, for the integration tests of
 * the circuit breaker and of health (run.py, cases "breaker" and
 * "device_lost").
 *
 * The backend wraps the CPU backend: every slot of the ops table
 * (kernels/backend_impl.h) forwards to it through the public calls, except that matmul fails with CINFER_E_DEVICE on chosen steps, the
 * way a CUDA kernel that faults returns through the check macro. What fails
 * is read from a control file named by the environment variable
 * CINFER_FAULT_FILE (the tests rewrite it while the server runs), at most
 * every CONTROL_POLL_MS:
 *
 *     fail=F      fraction of forward steps whose first matmul fails, 0..1,
 *                 spread evenly (0.5 = every second step); default 0
 *     hang_ms=T   each step's first matmul sleeps T ms first (a stuck
 *                 device, for the health watchdog); default 0
 *     sticky=1    an injected fault is sticky, as an illegal address or an
 *                 uncorrectable ECC error is on a GPU: from then on the
 *                 healthy slot returns 0 and every matmul fails, whatever
 *                 the file says later; default 0
 *
 * A missing or unreadable file means no faults. This is a test program
 * only: the production server has no fault switch.
 *
 *     CINFER_FAULT_FILE=/tmp/f cinfer-server-faulty --model tiny.gguf ...
 *     echo fail=1 > /tmp/f
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend_impl.h"
#include "server/server.h"

#define CONTROL_POLL_MS 20

typedef struct {
    cinfer_backend base; /* first: the wrapper is a cinfer_backend */
    cinfer_backend *inner;
    const char *control_path;
    int64_t next_poll_ns;
    double fail_fraction;
    int64_t hang_ms;
    int sticky;           /* the next injected fault loses the device */
    int lost;             /* a sticky fault happened: never cleared */
    uint64_t steps;       /* set_step calls */
    int step_armed;       /* the step's first matmul is still to come */
} faulty_backend;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Re-reads the control file when CONTROL_POLL_MS have passed. */
static void poll_control(faulty_backend *f)
{
    int64_t now = now_ns();
    if (!f->control_path || now < f->next_poll_ns)
        return;
    f->next_poll_ns = now + (int64_t)CONTROL_POLL_MS * 1000000;
    double fail = 0;
    long long hang = 0;
    int sticky = 0;
    FILE *fp = fopen(f->control_path, "r");
    if (fp) {
        char word[64];
        while (fscanf(fp, "%63s", word) == 1) {
            double d;
            long long v;
            if (sscanf(word, "fail=%lf", &d) == 1)
                fail = d < 0 ? 0 : d > 1 ? 1 : d;
            else if (sscanf(word, "hang_ms=%lld", &v) == 1)
                hang = v < 0 ? 0 : v;
            else if (sscanf(word, "sticky=%lld", &v) == 1)
                sticky = v != 0;
        }
        fclose(fp);
    }
    f->fail_fraction = fail;
    f->hang_ms = hang;
    f->sticky = sticky;
}

/* ---- the ops: forward, with the fault in matmul ------------------------ */

#define INNER(be) (((faulty_backend *)(be))->inner)

static void f_destroy(cinfer_backend *be)
{
    faulty_backend *f = (faulty_backend *)be;
    cinfer_backend_destroy(f->inner);
    free(f);
}

static cinfer_status f_tensor_create(cinfer_backend *be,
                                     const cinfer_tensor_desc *desc,
                                     size_t nbytes, cinfer_tensor **out)
{
    return cinfer_backend_tensor_create(INNER(be), desc, out);
}

static cinfer_status f_tensor_create_weight(cinfer_backend *be,
                                            const cinfer_tensor_desc *desc,
                                            size_t nbytes, const void *data,
                                            cinfer_tensor **out)
{
    return cinfer_backend_tensor_create_weight(INNER(be), desc, data, out);
}

static void f_tensor_destroy(cinfer_backend *be, cinfer_tensor *t)
{
    cinfer_backend_tensor_destroy(INNER(be), t);
}

static int f_weight_borrows(cinfer_backend *be, const cinfer_tensor *t)
{
    return cinfer_backend_weight_borrows(INNER(be), t);
}

static cinfer_status f_upload(cinfer_backend *be, cinfer_tensor *t,
                              size_t offset, const void *src, size_t n)
{
    return cinfer_backend_upload(INNER(be), t, offset, src, n);
}

static cinfer_status f_download(cinfer_backend *be, const cinfer_tensor *t,
                                size_t offset, void *dst, size_t n)
{
    return cinfer_backend_download(INNER(be), t, offset, dst, n);
}

static cinfer_status f_fill_zero(cinfer_backend *be, cinfer_tensor *t)
{
    return cinfer_backend_fill_zero(INNER(be), t);
}

static cinfer_status f_synchronize(cinfer_backend *be)
{
    return cinfer_backend_synchronize(INNER(be));
}

static int f_healthy(cinfer_backend *be)
{
    return !((faulty_backend *)be)->lost;
}

static cinfer_status f_set_step(cinfer_backend *be)
{
    faulty_backend *f = (faulty_backend *)be;
    poll_control(f);
    f->steps++;
    f->step_armed = 1;
    return cinfer_backend_set_step(f->inner, &be->step);
}

static cinfer_status f_embed(cinfer_backend *be, const cinfer_tensor *table,
                             cinfer_tensor *out)
{
    return cinfer_backend_embed(INNER(be), table, out);
}

static cinfer_status f_rms_norm(cinfer_backend *be, const cinfer_tensor *x,
                                const cinfer_tensor *w, float eps,
                                cinfer_tensor *out)
{
    return cinfer_backend_rms_norm(INNER(be), x, w, eps, out);
}

static cinfer_status f_matmul(cinfer_backend *be, int n_w,
                              const cinfer_tensor *const *w,
                              const cinfer_tensor *x,
                              cinfer_tensor *const *out)
{
    faulty_backend *f = (faulty_backend *)be;
    if (f->lost)
        return cinfer_set_error(CINFER_E_DEVICE,
                                "injected device fault: the device is lost "
                                "(an earlier sticky fault)");
    if (f->step_armed) {
        f->step_armed = 0;
        if (f->hang_ms > 0) {
            struct timespec ts = {(time_t)(f->hang_ms / 1000),
                                  (long)(f->hang_ms % 1000) * 1000000};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
        /* Step k fails when floor(k * F) moves: F of the steps, evenly. */
        double fr = f->fail_fraction;
        uint64_t k = f->steps;
        if (fr > 0 &&
            (uint64_t)((double)k * fr) != (uint64_t)((double)(k - 1) * fr)) {
            f->lost = f->sticky;
            return cinfer_set_error(CINFER_E_DEVICE,
                                    "injected %sdevice fault in matmul "
                                    "(step %llu)",
                                    f->sticky ? "sticky " : "",
                                    (unsigned long long)k);
        }
    }
    return cinfer_backend_matmul(f->inner, n_w, w, x, out);
}

static cinfer_status f_add_bias(cinfer_backend *be, cinfer_tensor *x,
                                const cinfer_tensor *b)
{
    return cinfer_backend_add_bias(INNER(be), x, b);
}

static cinfer_status f_add(cinfer_backend *be, const cinfer_tensor *a,
                           const cinfer_tensor *b, cinfer_tensor *out)
{
    return cinfer_backend_add(INNER(be), a, b, out);
}

static cinfer_status f_rope(cinfer_backend *be, cinfer_tensor *x, int n_heads,
                            int head_dim, int rot_dim,
                            const cinfer_rope_params *p)
{
    return cinfer_backend_rope_ext(INNER(be), x, n_heads, head_dim, rot_dim,
                                   p);
}

static cinfer_status f_kv_store(cinfer_backend *be, const cinfer_tensor *k,
                                const cinfer_tensor *v, cinfer_tensor *kc,
                                cinfer_tensor *vc)
{
    return cinfer_backend_kv_store(INNER(be), k, v, kc, vc);
}

static cinfer_status f_attention(cinfer_backend *be, const cinfer_tensor *q,
                                 const cinfer_tensor *kc,
                                 const cinfer_tensor *vc, int n_heads,
                                 int n_kv_heads, int head_dim, float scale,
                                 cinfer_tensor *out)
{
    return cinfer_backend_attention(INNER(be), q, kc, vc, n_heads, n_kv_heads,
                                    head_dim, scale, out);
}

static cinfer_status f_silu_mul(cinfer_backend *be, const cinfer_tensor *gate,
                                const cinfer_tensor *up, cinfer_tensor *out)
{
    return cinfer_backend_silu_mul(INNER(be), gate, up, out);
}

static cinfer_status f_gather_rows(cinfer_backend *be, const cinfer_tensor *x,
                                   cinfer_tensor *out)
{
    return cinfer_backend_gather_rows(INNER(be), x, out);
}

static const struct cinfer_backend_ops faulty_ops = {
    .destroy = f_destroy,
    .tensor_create = f_tensor_create,
    .tensor_create_weight = f_tensor_create_weight,
    .tensor_destroy = f_tensor_destroy,
    .weight_borrows = f_weight_borrows,
    .upload = f_upload,
    .download = f_download,
    .fill_zero = f_fill_zero,
    .synchronize = f_synchronize,
    .healthy = f_healthy,
    .set_step = f_set_step,
    .embed = f_embed,
    .rms_norm = f_rms_norm,
    .matmul = f_matmul,
    .add_bias = f_add_bias,
    .add = f_add,
    .rope = f_rope,
    .kv_store = f_kv_store,
    .attention = f_attention,
    .silu_mul = f_silu_mul,
    .gather_rows = f_gather_rows,
};

static cinfer_status create_faulty(void *user, int n_threads,
                                   cinfer_backend **out)
{
    cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
    bp.n_threads = n_threads;
    cinfer_backend *inner;
    cinfer_status st = cinfer_backend_cpu_create(&bp, &inner);
    if (st != CINFER_OK)
        return st;
    faulty_backend *f = calloc(1, sizeof *f);
    if (!f) {
        cinfer_backend_destroy(inner);
        return cinfer_set_error(CINFER_E_NOMEM, "faulty backend: no memory");
    }
    f->base.ops = &faulty_ops;
    f->base.name = cinfer_backend_name(inner);
    snprintf(f->base.device_desc, sizeof f->base.device_desc,
             "%.100s (fault injection)", cinfer_backend_device_desc(inner));
    f->inner = inner;
    f->control_path = user;
    *out = &f->base;
    return CINFER_OK;
}

int main(int argc, char **argv)
{
    cinfer_server_main_hooks hooks = {
        .create_backend = create_faulty,
        .user = getenv("CINFER_FAULT_FILE"),
    };
    return cinfer_server_main(argc, argv, &hooks);
}
