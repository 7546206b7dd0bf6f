/*
 * log.c - JSON-lines logging on stderr (see log.h).
 *
 * Lines are assembled in a fixed buffer and written with one write(2): POSIX
 * makes writes to a pipe of up to PIPE_BUF bytes atomic, and for regular
 * files and terminals one write per line is what keeps lines whole in
 * practice. Nothing here allocates, so logging works when memory is short.
 */
#include "server/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = CINFER_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void cinfer_log_set_level(cinfer_log_level lvl)
{
    atomic_store(&g_level, (int)lvl);
}

int cinfer_log_level_parse(const char *name)
{
    if (!name)
        return -1;
    if (strcasecmp(name, "debug") == 0)
        return CINFER_LOG_DEBUG;
    if (strcasecmp(name, "info") == 0)
        return CINFER_LOG_INFO;
    if (strcasecmp(name, "warn") == 0 || strcasecmp(name, "warning") == 0)
        return CINFER_LOG_WARN;
    if (strcasecmp(name, "error") == 0)
        return CINFER_LOG_ERROR;
    if (strcasecmp(name, "off") == 0 || strcasecmp(name, "none") == 0)
        return CINFER_LOG_OFF;
    return -1;
}

/* Room kept free at the end of the buffer for the closing "}\n". */
#define LOG_RESERVE 4

/* Appends raw bytes, all or nothing; returns 0 (and marks the line
 * truncated) when they do not fit. */
static int put_raw(cinfer_log_line *l, const char *s, size_t n)
{
    if (n > sizeof l->buf - LOG_RESERVE - l->n) {
        l->truncated = 1;
        return 0;
    }
    memcpy(l->buf + l->n, s, n);
    l->n += n;
    return 1;
}

/* Appends a JSON string literal. Control characters are escaped; bytes
 * >= 0x80 are copied (the caller's text is UTF-8, or close enough for a
 * log). A literal that does not fit is cut at a character boundary of the
 * escaped form and still closed. */
static int put_json_string(cinfer_log_line *l, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    /* Keep room for the closing quote. */
    size_t limit = sizeof l->buf - LOG_RESERVE - 1;
    if (l->n + 1 >= limit) {
        l->truncated = 1;
        return 0;
    }
    l->buf[l->n++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t k = 0;
        if (c == '"' || c == '\\') {
            esc[k++] = '\\';
            esc[k++] = (char)c;
        } else if (c == '\n') {
            esc[k++] = '\\';
            esc[k++] = 'n';
        } else if (c == '\t') {
            esc[k++] = '\\';
            esc[k++] = 't';
        } else if (c == '\r') {
            esc[k++] = '\\';
            esc[k++] = 'r';
        } else if (c < 0x20 || c == 0x7f) {
            esc[k++] = '\\';
            esc[k++] = 'u';
            esc[k++] = '0';
            esc[k++] = '0';
            esc[k++] = hex[c >> 4];
            esc[k++] = hex[c & 15];
        } else {
            esc[k++] = (char)c;
        }
        if (l->n + k + 1 > limit) {
            l->truncated = 1;
            break;
        }
        memcpy(l->buf + l->n, esc, k);
        l->n += k;
    }
    /* limit leaves one byte for this quote. */
    l->buf[l->n++] = '"';
    return 1;
}

/* Appends `,"key":` and returns the length before it, so a value that does
 * not fit can roll the whole field back (the line stays valid JSON). */
static size_t put_key(cinfer_log_line *l, const char *key, int *ok)
{
    size_t mark = l->n;
    *ok = put_raw(l, ",", 1) && put_json_string(l, key, strlen(key)) &&
          put_raw(l, ":", 1);
    return mark;
}

int cinfer_log_begin(cinfer_log_line *l, cinfer_log_level lvl,
                     const char *msg, const char *request_id)
{
    if ((int)lvl < atomic_load(&g_level) || lvl >= CINFER_LOG_OFF)
        return 0;
    l->n = 0;
    l->truncated = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char head[64];
    int k = snprintf(head, sizeof head,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    put_raw(l, head, (size_t)k);
    /* Everything after the head rolls back field by field on overflow. */
    cinfer_log_str(l, "level", level_names[lvl]);
    cinfer_log_str(l, "msg", msg);
    if (request_id && request_id[0])
        cinfer_log_str(l, "request_id", request_id);
    return 1;
}

void cinfer_log_strn(cinfer_log_line *l, const char *key, const char *val,
                     size_t len)
{
    int ok;
    size_t mark = put_key(l, key, &ok);
    if (!ok || !put_json_string(l, val ? val : "", val ? len : 0))
        l->n = mark;
}

void cinfer_log_str(cinfer_log_line *l, const char *key, const char *val)
{
    cinfer_log_strn(l, key, val, val ? strlen(val) : 0);
}

void cinfer_log_int(cinfer_log_line *l, const char *key, int64_t val)
{
    char num[32];
    int k = snprintf(num, sizeof num, "%lld", (long long)val);
    int ok;
    size_t mark = put_key(l, key, &ok);
    if (!ok || !put_raw(l, num, (size_t)k))
        l->n = mark;
}

void cinfer_log_double(cinfer_log_line *l, const char *key, double val)
{
    char num[48];
    int k;
    if (val != val || val > 1e300 || val < -1e300)
        k = snprintf(num, sizeof num, "null"); /* JSON has no NaN/inf */
    else
        k = snprintf(num, sizeof num, "%.3f", val);
    int ok;
    size_t mark = put_key(l, key, &ok);
    if (!ok || !put_raw(l, num, (size_t)k))
        l->n = mark;
}

void cinfer_log_end(cinfer_log_line *l)
{
    if (l->truncated) {
        static const char t[] = ",\"truncated\":true";
        put_raw(l, t, sizeof t - 1);
    }
    l->buf[l->n++] = '}';
    l->buf[l->n++] = '\n';
    size_t off = 0;
    while (off < l->n) {
        ssize_t w = write(2, l->buf + off, l->n - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
}

void cinfer_log(cinfer_log_level lvl, const char *msg, const char *request_id)
{
    cinfer_log_line l;
    if (cinfer_log_begin(&l, lvl, msg, request_id))
        cinfer_log_end(&l);
}

/* ---------------------------------------------------------------------- */
/* Rate limits                                                            */
/* ---------------------------------------------------------------------- */

void cinfer_log_limit_init(cinfer_log_limit *r, double per_s, uint64_t burst)
{
    cinfer_tb_params p = {per_s, burst};
    memset(r, 0, sizeof *r);
    if (cinfer_tb_init(&r->tb, &p) != CINFER_OK) {
        /* A bad rate: one line a second. */
        cinfer_tb_params one = {1.0, 1};
        cinfer_tb_init(&r->tb, &one);
    }
}

int cinfer_log_limit_take(cinfer_log_limit *r, int64_t now_ns,
                          uint64_t *suppressed)
{
    *suppressed = 0;
    if (!cinfer_tb_take(&r->tb, 1, now_ns, NULL)) {
        r->dropped++;
        return 0;
    }
    *suppressed = r->dropped;
    r->dropped = 0;
    return 1;
}
