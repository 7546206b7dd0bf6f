/*
 * log.h - JSON-lines logging on stderr.
 *
 * One line per event, one JSON object per line, written with a single
 * write(2) so lines from different threads never interleave:
 *
 *   {"ts":"2025-01-02T03:04:05.678Z","level":"info","msg":"request done",
 *    "request_id":"c-42","finish":"LENGTH","completion_tokens":16}
 *
 * A line is built on the stack and emitted by log_end; values are escaped
 * as JSON strings. Lines below the configured level cost one comparison.
 *
 *     cinfer_log_line l;
 *     if (cinfer_log_begin(&l, CINFER_LOG_INFO, "request done", rid)) {
 *         cinfer_log_str(&l, "finish", "LENGTH");
 *         cinfer_log_int(&l, "completion_tokens", 16);
 *         cinfer_log_end(&l);
 *     }
 *
 * Thread safety: every function may be called from any thread; the level
 * is read atomically.
 */
#ifndef CINFER_SERVER_LOG_H
#define CINFER_SERVER_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "resilience/resilience.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CINFER_LOG_DEBUG = 0,
    CINFER_LOG_INFO = 1,
    CINFER_LOG_WARN = 2,
    CINFER_LOG_ERROR = 3,
    CINFER_LOG_OFF = 4,
} cinfer_log_level;

/* Sets the lowest level written (default INFO). */
void cinfer_log_set_level(cinfer_log_level lvl);
/* "debug", "info", "warn" (or "warning"), "error", "off" -> level; -1 if
 * the name is unknown. */
int cinfer_log_level_parse(const char *name);

/* A line under construction. Long values are truncated (the line stays
 * valid JSON). */
typedef struct {
    char buf[2048];
    size_t n;
    int truncated;
} cinfer_log_line;

/* Starts a line; returns 0 (and the line must not be used) when `lvl` is
 * below the configured level. request_id may be NULL or "". */
int cinfer_log_begin(cinfer_log_line *l, cinfer_log_level lvl,
                     const char *msg, const char *request_id);
void cinfer_log_str(cinfer_log_line *l, const char *key, const char *val);
void cinfer_log_strn(cinfer_log_line *l, const char *key, const char *val,
                     size_t len);
void cinfer_log_int(cinfer_log_line *l, const char *key, int64_t val);
void cinfer_log_double(cinfer_log_line *l, const char *key, double val);
/* Closes the object and writes the line to stderr. */
void cinfer_log_end(cinfer_log_line *l);

/* One-call form for lines with no extra fields. */
void cinfer_log(cinfer_log_level lvl, const char *msg, const char *request_id);

/* A bound on how often one source writes lines (a library that logs each
 * failed accept, say, under a flood): a token bucket of `burst` lines
 * refilled at per_s a second; lines beyond it are dropped and counted, and
 * the next line let through reports the count. A value type, the time
 * passed in; the caller serialises the calls. */
typedef struct {
    cinfer_tb tb;
    uint64_t dropped;
} cinfer_log_limit;

/* per_s > 0, burst >= 1. */
void cinfer_log_limit_init(cinfer_log_limit *r, double per_s, uint64_t burst);

/* 1: write the line, and *suppressed is how many were dropped since the
 * last one written (then reset); 0: drop it. */
int cinfer_log_limit_take(cinfer_log_limit *r, int64_t now_ns,
                          uint64_t *suppressed);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_LOG_H */
