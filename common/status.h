/*
 * status.h - the project's one status enum and its thread-local error text.
 *
 * Every fallible function returns cinfer_status: 0 is OK, errors are
 * negative. A function that fails also records a human-readable message with
 * cinfer_set_error(); the caller reads it with cinfer_last_error() (valid
 * until the next failing call on the same thread), the way dlerror() works.
 * The enum and cinfer_status_str() come from one X-macro list.
 *
 *     cinfer_gguf *g;
 *     if (cinfer_gguf_create(&p, &g) != CINFER_OK)
 *         fprintf(stderr, "load failed: %s\n", cinfer_last_error());
 */
#ifndef CINFER_STATUS_H
#define CINFER_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, description) */
#define CINFER_STATUS_LIST(X)                                              \
    X(CINFER_OK, 0, "ok")                                                  \
    X(CINFER_E_INVALID_ARG, -1, "invalid argument")                        \
    X(CINFER_E_NOMEM, -2, "out of memory")                                 \
    X(CINFER_E_IO, -3, "i/o error")                                        \
    X(CINFER_E_FORMAT, -4, "malformed file")                               \
    X(CINFER_E_UNSUPPORTED, -5, "unsupported")                             \
    X(CINFER_E_NOT_FOUND, -6, "not found")                                 \
    X(CINFER_E_RANGE, -7, "out of range")                                  \
    X(CINFER_E_DEVICE, -8, "device error")                                 \
    X(CINFER_E_TIMEOUT, -9, "timed out")                                   \
    X(CINFER_E_CANCELLED, -10, "cancelled")                                \
    X(CINFER_E_EXHAUSTED, -11, "resource exhausted")                       \
    X(CINFER_E_UNAVAILABLE, -12, "unavailable")                            \
    X(CINFER_E_INTERNAL, -13, "internal error")                         \
    X(CINFER_E_UNAUTHENTICATED, -14, "unauthenticated")                 \
    X(CINFER_E_PERMISSION, -15, "permission denied")

typedef enum {
#define CINFER_STATUS_ENUM_(name, value, desc) name = value,
    CINFER_STATUS_LIST(CINFER_STATUS_ENUM_)
#undef CINFER_STATUS_ENUM_
} cinfer_status;

/* Name of a status ("CINFER_E_FORMAT") and its description. Thread-safe. */
const char *cinfer_status_name(cinfer_status s);
const char *cinfer_status_str(cinfer_status s);

/* Records the calling thread's error message (printf format) and returns
 * `s`, so a failure reads `return cinfer_set_error(CINFER_E_FORMAT, ...)`. */
cinfer_status cinfer_set_error(cinfer_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The calling thread's last error message ("" if none). The pointer is valid
 * until the thread's next cinfer_set_error(). */
const char *cinfer_last_error(void);

/* Clears the calling thread's error message. */
void cinfer_clear_error(void);

/* Internal-invariant check: prints expression, file and line, then aborts.
 * Only for bugs; bad input returns a status. */
#define CINFER_ASSERT(cond)                                                    \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* CINFER_STATUS_H */
