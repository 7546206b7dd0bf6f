/*
 * grammar_regex.c - a regular expression as a grammar (grammar.h): the
 * output must match the whole pattern, as Python's re.fullmatch.
 *
 * The pattern is translated to GBNF and compiled: literals, `.` (any
 * character but newline), classes with ranges, negation and the \d \w \s
 * shorthands (\D \W \S too, outside classes), groups (capturing or
 * `(?:`), alternation, and the quantifiers * + ? {m} {m,} {m,n}, lazy ones
 * (`*?`) included since they match the same strings; `^` at the start and
 * `$` at the end are what fullmatch means anyway. What a context-free
 * grammar cannot express or this subset leaves out (backreferences,
 * lookaround, possessive quantifiers, anchors inside, flags, named or
 * conditional groups) is refused with CINFER_E_INVALID_ARG naming the
 * construct and its offset.
 */
#include "grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *re;
    size_t n, i;
    char *out;
    size_t len, cap;
    cinfer_status st;
    char err[200];
    int depth;
    int json; /* the output is the inside of a JSON string (see
                 cinfer_grammar_regex_to_gbnf) */
} rx;

/* What a JSON string cannot hold unescaped, as GBNF class members. */
#define JSON_EXCLUDED "\"\\\\\\x00-\\x1F"


#define RX_MAX_DEPTH 200

static int rx_fail(rx *r, cinfer_status st, const char *fmt, ...)
{
    if (r->st != CINFER_OK)
        return 0;
    r->st = st;
    va_list ap;
    va_start(ap, fmt);
    char what[150];
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(r->err, sizeof r->err, "regex: at offset %zu: %s", r->i, what);
    return 0;
}

static int put(rx *r, const char *s, size_t k)
{
    if (r->len + k + 1 > r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 256;
        while (cap < r->len + k + 1)
            cap *= 2;
        if (cap > 4 * (size_t)CINFER_GRAMMAR_MAX_SOURCE)
            return rx_fail(r, CINFER_E_RANGE, "the pattern is too large");
        char *o = realloc(r->out, cap);
        if (!o)
            return rx_fail(r, CINFER_E_NOMEM, "out of memory");
        r->out = o;
        r->cap = cap;
    }
    memcpy(r->out + r->len, s, k);
    r->len += k;
    r->out[r->len] = '\0';
    return 1;
}

static int puts_(rx *r, const char *s) { return put(r, s, strlen(s)); }

/* A code point as a GBNF escape (valid in literals and classes alike). */
static int put_cp(rx *r, uint32_t cp)
{
    char b[16];
    if (cp >= 0x20 && cp < 0x7f && !strchr("\"\\[]-^", (int)cp)) {
        b[0] = (char)cp;
        return put(r, b, 1);
    }
    if (cp <= 0xffff)
        snprintf(b, sizeof b, "\\u%04X", (unsigned)cp);
    else
        snprintf(b, sizeof b, "\\U%08X", (unsigned)cp);
    return puts_(r, b);
}

/* A literal code point. Inside a JSON string the characters JSON escapes
 * are written as their escapes (the string's value is still cp). */
static int put_lit(rx *r, uint32_t cp)
{
    if (!r->json || (cp >= 0x20 && cp != '"' && cp != '\\'))
        return puts_(r, "\"") && put_cp(r, cp) && puts_(r, "\"");
    char esc[8];
    switch (cp) {
    case '"': snprintf(esc, sizeof esc, "\\\""); break;
    case '\\': snprintf(esc, sizeof esc, "\\\\"); break;
    case '\n': snprintf(esc, sizeof esc, "\\n"); break;
    case '\t': snprintf(esc, sizeof esc, "\\t"); break;
    case '\r': snprintf(esc, sizeof esc, "\\r"); break;
    case '\b': snprintf(esc, sizeof esc, "\\b"); break;
    case '\f': snprintf(esc, sizeof esc, "\\f"); break;
    default: snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp); break;
    }
    if (!puts_(r, "\""))
        return 0;
    for (const char *e = esc; *e; e++) {
        int ok = *e == '\\' ? puts_(r, "\\\\")
                 : *e == '"' ? puts_(r, "\\\"")
                             : put(r, e, 1);
        if (!ok)
            return 0;
    }
    return puts_(r, "\"");
}

/* The class member lo-hi. Inside a JSON string a positive class keeps
 * only the characters a string holds unescaped; *kept counts the pieces
 * written. */
static int put_member(rx *r, uint32_t lo, uint32_t hi, int negated,
                      int *kept)
{
    static const uint32_t ok[3][2] = {
        {0x20, 0x21}, {0x23, 0x5b}, {0x5d, 0x10ffff}};
    for (int k = 0; k < (r->json && !negated ? 3 : 1); k++) {
        uint32_t a = lo, b = hi;
        if (r->json && !negated) {
            a = lo > ok[k][0] ? lo : ok[k][0];
            b = hi < ok[k][1] ? hi : ok[k][1];
            if (a > b)
                continue;
        }
        if (!put_cp(r, a) || (b != a && (!puts_(r, "-") || !put_cp(r, b))))
            return 0;
        (*kept)++;
    }
    return 1;
}

static int peek(const rx *r) { return r->i < r->n ? (unsigned char)r->re[r->i] : -1; }

/* One UTF-8 character of the pattern. */
static int next_cp(rx *r, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)r->re + r->i;
    size_t left = r->n - r->i;
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                         : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left)
        return rx_fail(r, CINFER_E_INVALID_ARG, "not valid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f
                                                             : c & 0x07;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80)
            return rx_fail(r, CINFER_E_INVALID_ARG, "not valid UTF-8");
        v = (v << 6) | (s[k] & 0x3f);
    }
    r->i += (size_t)len;
    *cp = v;
    return 1;
}

static int hex_digits(rx *r, int n, uint32_t *cp)
{
    uint32_t v = 0;
    for (int k = 0; k < n; k++) {
        int c = peek(r);
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0)
            return rx_fail(r, CINFER_E_INVALID_ARG, "bad \\x or \\u escape");
        v = v * 16 + (uint32_t)h;
        r->i++;
    }
    *cp = v;
    return 1;
}

/* The shorthand classes' members, as GBNF class contents. */
static const char *shorthand(int c)
{
    switch (c) {
    case 'd': case 'D': return "0-9";
    case 'w': case 'W': return "a-zA-Z0-9_";
    case 's': case 'S': return " \\t\\n\\r\\u000B\\u000C";
    default: return NULL;
    }
}

/* An escape after the backslash: a literal code point (*cp), or a
 * shorthand (*cls = 'd', 'D', ...). */
static int parse_escape(rx *r, uint32_t *cp, int *cls)
{
    *cls = 0;
    int c = peek(r);
    if (c < 0)
        return rx_fail(r, CINFER_E_INVALID_ARG, "a trailing backslash");
    r->i++;
    switch (c) {
    case 'n': *cp = '\n'; return 1;
    case 't': *cp = '\t'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case '0': *cp = 0; return 1;
    case 'x': return hex_digits(r, 2, cp);
    case 'u': return hex_digits(r, 4, cp);
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        *cls = c;
        return 1;
    case 'b': case 'B': case 'A': case 'Z': case 'z': case 'G':
        r->i--;
        return rx_fail(r, CINFER_E_INVALID_ARG,
                       "the anchor \\%c is not supported", c);
    default:
        if (c >= '1' && c <= '9') {
            r->i--;
            return rx_fail(r, CINFER_E_INVALID_ARG,
                           "backreferences are not supported");
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            r->i--;
            return rx_fail(r, CINFER_E_INVALID_ARG,
                           "the escape \\%c is not supported", c);
        }
        *cp = (uint32_t)c; /* an escaped punctuation mark: itself */
        return 1;
    }
}

static int parse_class(rx *r)
{
    r->i++; /* [ */
    int negated = peek(r) == '^';
    if (negated)
        r->i++;
    if (!puts_(r, negated ? "[^" : "["))
        return 0;
    int first = 1, kept = 0;
    while (r->st == CINFER_OK) {
        int c = peek(r);
        if (c < 0)
            return rx_fail(r, CINFER_E_INVALID_ARG,
                           "unterminated character class");
        if (c == ']' && !first)
            break;
        first = 0;
        uint32_t lo;
        int cls = 0;
        if (c == '\\') {
            r->i++;
            if (!parse_escape(r, &lo, &cls))
                return 0;
            if (cls) {
                if (cls == 'D' || cls == 'W' || cls == 'S')
                    return rx_fail(r, CINFER_E_INVALID_ARG,
                                   "\\%c inside a class is not supported",
                                   cls);
                /* inside a JSON string \s keeps only the space */
                int only_space = cls == 's' && r->json && !negated;
                if (!puts_(r, only_space ? " " : shorthand(cls)))
                    return 0;
                kept++;
                continue;
            }
        } else if (c == '[' && r->i + 1 < r->n && r->re[r->i + 1] == ':') {
            return rx_fail(r, CINFER_E_INVALID_ARG,
                           "POSIX classes ([:alpha:]) are not supported");
        } else if (!next_cp(r, &lo)) {
            return 0;
        }
        uint32_t hi = lo;
        if (peek(r) == '-' && r->i + 1 < r->n && r->re[r->i + 1] != ']') {
            r->i++;
            if (peek(r) == '\\') {
                r->i++;
                if (!parse_escape(r, &hi, &cls))
                    return 0;
                if (cls)
                    return rx_fail(r, CINFER_E_INVALID_ARG,
                                   "a range ending in a shorthand class");
            } else if (!next_cp(r, &hi)) {
                return 0;
            }
            if (hi < lo)
                return rx_fail(r, CINFER_E_INVALID_ARG,
                               "a range runs backwards");
        }
        if (!put_member(r, lo, hi, negated, &kept))
            return 0;
    }
    r->i++; /* ] */
    if (!kept)
        return rx_fail(r, CINFER_E_INVALID_ARG,
                       r->json ? "a class of only characters a JSON string "
                                 "must escape"
                               : "an empty class");
    if (negated && r->json && !puts_(r, JSON_EXCLUDED))
        return 0;
    return puts_(r, "]");
}

static int parse_alt(rx *r);

static int parse_quant(rx *r)
{
    int c = peek(r);
    if (c == '*' || c == '+' || c == '?') {
        char q[2] = {(char)c, 0};
        r->i++;
        if (!puts_(r, q))
            return 0;
    } else if (c == '{') {
        size_t start = r->i;
        r->i++;
        long m = -1, n = -1;
        while (peek(r) >= '0' && peek(r) <= '9') {
            m = (m < 0 ? 0 : m) * 10 + (peek(r) - '0');
            if (m > CINFER_GRAMMAR_MAX_REPEAT)
                m = CINFER_GRAMMAR_MAX_REPEAT + 1;
            r->i++;
        }
        int comma = peek(r) == ',';
        if (comma) {
            r->i++;
            while (peek(r) >= '0' && peek(r) <= '9') {
                n = (n < 0 ? 0 : n) * 10 + (peek(r) - '0');
                if (n > CINFER_GRAMMAR_MAX_REPEAT)
                    n = CINFER_GRAMMAR_MAX_REPEAT + 1;
                r->i++;
            }
        }
        if (m < 0 || peek(r) != '}') {
            /* Python reads a { that starts no count as a literal */
            r->i = start;
            return 1;
        }
        r->i++;
        if (m > CINFER_GRAMMAR_MAX_REPEAT || n > CINFER_GRAMMAR_MAX_REPEAT)
            return rx_fail(r, CINFER_E_RANGE, "a count above %d",
                           CINFER_GRAMMAR_MAX_REPEAT);
        if (n >= 0 && n < m)
            return rx_fail(r, CINFER_E_INVALID_ARG, "{m,n} with n below m");
        char b[48];
        if (!comma)
            snprintf(b, sizeof b, "{%ld}", m);
        else if (n < 0)
            snprintf(b, sizeof b, "{%ld,}", m);
        else
            snprintf(b, sizeof b, "{%ld,%ld}", m, n);
        if (!puts_(r, b))
            return 0;
    } else {
        return 1;
    }
    if (peek(r) == '?') /* lazy: the same strings */
        r->i++;
    else if (peek(r) == '+')
        return rx_fail(r, CINFER_E_INVALID_ARG,
                       "possessive quantifiers are not supported");
    c = peek(r);
    if (c == '*' || c == '+' || c == '?')
        return rx_fail(r, CINFER_E_INVALID_ARG,
                       "a quantifier after a quantifier");
    return 1;
}

static int parse_seq(rx *r)
{
    if (!puts_(r, "\"\"")) /* an empty sequence matches the empty string */
        return 0;
    while (r->st == CINFER_OK) {
        int c = peek(r);
        if (c < 0 || c == '|' || c == ')')
            return 1;
        if (!puts_(r, " "))
            return 0;
        if (c == '(') {
            r->i++;
            if (peek(r) == '?') {
                if (r->i + 1 < r->n && r->re[r->i + 1] == ':') {
                    r->i += 2;
                } else {
                    return rx_fail(r, CINFER_E_INVALID_ARG,
                                   "(?...) groups other than (?:...) are "
                                   "not supported");
                }
            }
            if (++r->depth > RX_MAX_DEPTH)
                return rx_fail(r, CINFER_E_RANGE,
                               "groups nest too deep");
            if (!puts_(r, "(") || !parse_alt(r))
                return 0;
            r->depth--;
            if (peek(r) != ')')
                return rx_fail(r, CINFER_E_INVALID_ARG,
                               "an unclosed group");
            r->i++;
            if (!puts_(r, ")"))
                return 0;
        } else if (c == '[') {
            if (!parse_class(r))
                return 0;
        } else if (c == '.') {
            r->i++;
            if (!puts_(r, r->json ? "[^" JSON_EXCLUDED "]" : "[^\\n]"))
                return 0;
        } else if (c == '^' || c == '$') {
            int at_start = c == '^' && r->i == 0;
            int at_end = c == '$' && r->i + 1 == r->n;
            if (!at_start && !at_end)
                return rx_fail(r, CINFER_E_INVALID_ARG,
                               "%c is supported only at the pattern's %s", c,
                               c == '^' ? "start" : "end");
            r->i++;
            if (!puts_(r, "\"\""))
                return 0;
            continue; /* nothing to quantify */
        } else if (c == '*' || c == '+' || c == '?') {
            return rx_fail(r, CINFER_E_INVALID_ARG,
                           "a quantifier with nothing before it");
        } else if (c == '\\') {
            r->i++;
            uint32_t cp;
            int cls;
            if (!parse_escape(r, &cp, &cls))
                return 0;
            if (cls) {
                int neg = cls == 'D' || cls == 'W' || cls == 'S';
                const char *m = cls == 's' && r->json ? " " : shorthand(cls);
                if (!puts_(r, neg ? "[^" : "[") || !puts_(r, m) ||
                    (neg && r->json && !puts_(r, JSON_EXCLUDED)) ||
                    !puts_(r, "]"))
                    return 0;
            } else if (!put_lit(r, cp)) {
                return 0;
            }
        } else {
            uint32_t cp;
            if (!next_cp(r, &cp) || !put_lit(r, cp))
                return 0;
        }
        if (!parse_quant(r))
            return 0;
    }
    return 0;
}

static int parse_alt(rx *r)
{
    if (!parse_seq(r))
        return 0;
    while (peek(r) == '|') {
        r->i++;
        if (!puts_(r, " | ") || !parse_seq(r))
            return 0;
    }
    return 1;
}

/* The pattern as GBNF: "( alternatives )" in *out (malloc'd). */
static cinfer_status translate(const char *re, size_t len, int json,
                               char **out)
{
    rx r;
    memset(&r, 0, sizeof r);
    r.re = re ? re : "";
    r.n = len;
    r.json = json;
    if (puts_(&r, "( ") && parse_alt(&r) && r.i < r.n)
        rx_fail(&r, CINFER_E_INVALID_ARG, "an unmatched )");
    if (r.st == CINFER_OK)
        puts_(&r, " )");
    if (r.st != CINFER_OK) {
        free(r.out);
        return cinfer_set_error(r.st, "%s", r.err);
    }
    *out = r.out;
    return CINFER_OK;
}

cinfer_status cinfer_grammar_regex_to_gbnf(const char *re, size_t len,
                                           int json_string, char **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "regex: out is NULL");
    *out = NULL;
    if (!re && len)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "regex: no pattern");
    return translate(re, len, json_string, out);
}

cinfer_status cinfer_grammar_compile_regex(const char *re, size_t len,
                                           cinfer_grammar **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "regex: out is NULL");
    *out = NULL;
    if (!re && len)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "regex: no pattern");
    char *expr = NULL;
    cinfer_status st = translate(re, len, 0, &expr);
    if (st != CINFER_OK)
        return st;
    size_t n = strlen(expr) + 16;
    char *src = malloc(n);
    if (!src) {
        free(expr);
        return cinfer_set_error(CINFER_E_NOMEM, "regex: out of memory");
    }
    snprintf(src, n, "root ::= %s\n", expr);
    free(expr);
    st = cinfer_grammar_compile(src, strlen(src), "root", out);
    if (st != CINFER_OK) {
        /* what the translation made refused: name the pattern's side */
        char msg[300];
        snprintf(msg, sizeof msg, "%s", cinfer_last_error());
        st = cinfer_set_error(st, "regex: %s", msg);
    }
    free(src);
    return st;
}
