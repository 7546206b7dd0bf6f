/*
 * detok.c - incremental output text with stop strings (see detok.h).
 *
 * The stream keeps a window: the bytes it has withheld so far, to which each
 * push appends the new token's text (whole UTF-8 characters from the
 * tokenizer's cinfer_detok). Then:
 *
 *   1. Stop search: for each end position inside the new bytes, in order,
 *      every stop string that ends there is compared. The first end position
 *      with a match wins (longest string on a tie); the text before the
 *      match is emitted and the stream stops. A match can start in withheld
 *      bytes but never in emitted ones, because step 2 withholds every
 *      suffix that is a proper prefix of some stop string.
 *   2. Withholding: the longest suffix of the window that is a proper prefix
 *      of a stop string stays; the cut moves back to a character boundary.
 *
 * The window never holds more than (longest stop string - 1) bytes between
 * pushes, so a push costs O(new bytes * stop strings * their length).
 */
#include "detok.h"

#include <stdlib.h>
#include <string.h>

struct cinfer_textstream {
    const cinfer_tokenizer *tk;
    cinfer_detok d;
    char **stop;
    size_t *stop_len;
    size_t n_stop;
    size_t max_stop;

    char *win; /* withheld bytes, then the new ones */
    size_t win_len, win_cap;
    char *out; /* what a call hands back */
    size_t out_cap;
    char *piece; /* scratch for the detokenizer's output */
    size_t piece_cap;

    int stopped;
    int finished;
    int stop_index;
};

cinfer_textstream_params cinfer_textstream_default_params(void)
{
    cinfer_textstream_params p;
    memset(&p, 0, sizeof p);
    return p;
}

void cinfer_textstream_destroy(cinfer_textstream *ts)
{
    if (!ts)
        return;
    if (ts->stop) {
        for (size_t i = 0; i < ts->n_stop; i++)
            free(ts->stop[i]);
    }
    free(ts->stop);
    free(ts->stop_len);
    free(ts->win);
    free(ts->out);
    free(ts->piece);
    free(ts);
}

static int grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb)
        return 0;
    *buf = nb;
    *cap = c;
    return 1;
}

cinfer_status cinfer_textstream_create(const cinfer_textstream_params *p,
                                       cinfer_textstream **out)
{
    *out = NULL;
    if (!p)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "textstream: params is NULL");
    if (p->n_stop && !p->stop)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "textstream: stop is NULL with n_stop %zu",
                                p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "stop[%zu] is empty", i);
    }
    cinfer_textstream *ts = calloc(1, sizeof *ts);
    if (!ts)
        goto fail_nomem;
    ts->tk = p->tokenizer;
    ts->stop_index = -1;
    cinfer_detok_init(&ts->d);
    ts->d.at_start = 0; /* generated text continues the prompt */
    ts->d.special = p->special ? 1 : 0;
    if (p->n_stop) {
        ts->stop = calloc(p->n_stop, sizeof *ts->stop);
        ts->stop_len = calloc(p->n_stop, sizeof *ts->stop_len);
        if (!ts->stop || !ts->stop_len)
            goto fail_nomem;
        ts->n_stop = p->n_stop;
        for (size_t i = 0; i < p->n_stop; i++) {
            size_t n = strlen(p->stop[i]);
            ts->stop[i] = malloc(n + 1);
            if (!ts->stop[i])
                goto fail_nomem;
            memcpy(ts->stop[i], p->stop[i], n + 1);
            ts->stop_len[i] = n;
            if (n > ts->max_stop)
                ts->max_stop = n;
        }
    }
    /* Room for the largest window a token push can make, so the engine's
     * pushes never allocate; push_bytes grows the buffers on demand. */
    size_t piece = ts->tk ? cinfer_detok_out_max(ts->tk) : 64;
    size_t win = ts->max_stop + piece + 8;
    if (!grow(&ts->piece, &ts->piece_cap, piece + 8) ||
        !grow(&ts->win, &ts->win_cap, win) ||
        !grow(&ts->out, &ts->out_cap, win))
        goto fail_nomem;
    *out = ts;
    return CINFER_OK;

fail_nomem:
    cinfer_textstream_destroy(ts);
    return cinfer_set_error(CINFER_E_NOMEM, "textstream: out of memory");
}

int cinfer_textstream_stopped(const cinfer_textstream *ts)
{
    return ts->stopped;
}

int cinfer_textstream_stop_index(const cinfer_textstream *ts)
{
    return ts->stop_index;
}

/* Emits win[0..n) into out and keeps win[n..) as the new window. */
static void emit(cinfer_textstream *ts, size_t n, const char **text,
                 size_t *len)
{
    memcpy(ts->out, ts->win, n);
    memmove(ts->win, ts->win + n, ts->win_len - n);
    ts->win_len -= n;
    *text = ts->out;
    *len = n;
}

/* Length of the longest suffix of win that is a proper prefix of a stop
 * string. */
static size_t withheld(const cinfer_textstream *ts)
{
    size_t k = ts->max_stop ? ts->max_stop - 1 : 0;
    if (k > ts->win_len)
        k = ts->win_len;
    for (; k > 0; k--) {
        const char *suf = ts->win + ts->win_len - k;
        for (size_t i = 0; i < ts->n_stop; i++) {
            if (ts->stop_len[i] > k && memcmp(suf, ts->stop[i], k) == 0)
                return k;
        }
    }
    return 0;
}

/* Appends new text (whole characters) to the window and emits what is
 * final. The buffers have room (checked by the callers). */
static void feed(cinfer_textstream *ts, const char *bytes, size_t n,
                 int check_stop, int final, const char **text, size_t *len)
{
    size_t old = ts->win_len;
    memcpy(ts->win + old, bytes, n);
    ts->win_len += n;

    if (check_stop && ts->n_stop) {
        for (size_t e = old + 1; e <= ts->win_len; e++) {
            int best = -1;
            size_t best_len = 0;
            for (size_t i = 0; i < ts->n_stop; i++) {
                size_t l = ts->stop_len[i];
                if (l <= e && l > best_len &&
                    memcmp(ts->win + e - l, ts->stop[i], l) == 0) {
                    best = (int)i;
                    best_len = l;
                }
            }
            if (best >= 0) {
                size_t cut = e - best_len;
                while (cut > 0 && ((unsigned char)ts->win[cut] & 0xC0) == 0x80)
                    cut--; /* a stop string beginning mid-character */
                ts->stopped = 1;
                ts->stop_index = best;
                emit(ts, cut, text, len);
                ts->win_len = 0;
                return;
            }
        }
    }
    if (final) {
        ts->finished = 1;
        emit(ts, ts->win_len, text, len);
        return;
    }
    size_t cut = ts->win_len - withheld(ts);
    while (cut > 0 && cut < ts->win_len &&
           ((unsigned char)ts->win[cut] & 0xC0) == 0x80)
        cut--;
    emit(ts, cut, text, len);
}

/* Makes room for n more window bytes. */
static cinfer_status reserve(cinfer_textstream *ts, size_t n)
{
    size_t need = ts->win_len + n + 8;
    if (!grow(&ts->win, &ts->win_cap, need) ||
        !grow(&ts->out, &ts->out_cap, need))
        return cinfer_set_error(CINFER_E_NOMEM, "textstream: out of memory");
    return CINFER_OK;
}

static void nothing(const char **text, size_t *len, int *stopped, int s)
{
    *text = "";
    *len = 0;
    if (stopped)
        *stopped = s;
}

cinfer_status cinfer_textstream_push(cinfer_textstream *ts, int32_t id,
                                     int check_stop, int final,
                                     const char **text, size_t *len,
                                     int *stopped)
{
    if (!ts->tk)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "textstream: push needs a tokenizer");
    if (ts->stopped || ts->finished) {
        nothing(text, len, stopped, ts->stopped);
        return CINFER_OK;
    }
    size_t n = 0, nf = 0;
    cinfer_detok saved = ts->d;
    cinfer_status st =
        cinfer_detok_push(ts->tk, &ts->d, id, ts->piece, ts->piece_cap, &n);
    if (st == CINFER_E_RANGE && n > ts->piece_cap) {
        if (!grow(&ts->piece, &ts->piece_cap, n + 8))
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "textstream: out of memory");
        st = cinfer_detok_push(ts->tk, &ts->d, id, ts->piece, ts->piece_cap,
                               &n);
    }
    if (st != CINFER_OK)
        return st;
    if (final) {
        if (ts->piece_cap - n < 8) {
            if (!grow(&ts->piece, &ts->piece_cap, n + 8)) {
                ts->d = saved;
                return cinfer_set_error(CINFER_E_NOMEM,
                                        "textstream: out of memory");
            }
        }
        st = cinfer_detok_flush(&ts->d, ts->piece + n, ts->piece_cap - n, &nf);
        if (st != CINFER_OK) {
            ts->d = saved;
            return st;
        }
    }
    st = reserve(ts, n + nf);
    if (st != CINFER_OK) {
        ts->d = saved;
        return st;
    }
    feed(ts, ts->piece, n + nf, check_stop, final, text, len);
    if (stopped)
        *stopped = ts->stopped;
    return CINFER_OK;
}

cinfer_status cinfer_textstream_push_bytes(cinfer_textstream *ts,
                                           const char *bytes, size_t n,
                                           int check_stop, int final,
                                           const char **text, size_t *len,
                                           int *stopped)
{
    if (ts->stopped || ts->finished) {
        nothing(text, len, stopped, ts->stopped);
        return CINFER_OK;
    }
    size_t need = 3 * (n + 3) + 8, got = 0, nf = 0;
    if (!grow(&ts->piece, &ts->piece_cap, need))
        return cinfer_set_error(CINFER_E_NOMEM, "textstream: out of memory");
    cinfer_detok saved = ts->d;
    cinfer_status st = cinfer_detok_push_bytes(&ts->d, bytes, n, ts->piece,
                                               ts->piece_cap, &got);
    if (st == CINFER_OK && final)
        st = cinfer_detok_flush(&ts->d, ts->piece + got, ts->piece_cap - got,
                                &nf);
    if (st == CINFER_OK)
        st = reserve(ts, got + nf);
    if (st != CINFER_OK) {
        ts->d = saved;
        return st;
    }
    feed(ts, ts->piece, got + nf, check_stop, final, text, len);
    if (stopped)
        *stopped = ts->stopped;
    return CINFER_OK;
}

cinfer_status cinfer_textstream_finish(cinfer_textstream *ts,
                                       const char **text, size_t *len)
{
    if (ts->stopped || ts->finished) {
        nothing(text, len, NULL, 0);
        return CINFER_OK;
    }
    size_t nf = 0;
    if (!grow(&ts->piece, &ts->piece_cap, 8))
        return cinfer_set_error(CINFER_E_NOMEM, "textstream: out of memory");
    cinfer_status st = cinfer_detok_flush(&ts->d, ts->piece, ts->piece_cap,
                                          &nf);
    if (st == CINFER_OK)
        st = reserve(ts, nf);
    if (st != CINFER_OK)
        return st;
    feed(ts, ts->piece, nf, 0, 1, text, len);
    return CINFER_OK;
}
