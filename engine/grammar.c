/*
 * grammar.c - GBNF compiled to flat rule elements, and a top-down matcher
 * over sets of parse stacks (grammar.h). The representation follows
 * llama.cpp's llama-grammar, whose users write these grammars: a rule is
 * its alternatives' elements back to back, each alternative ended by ALT
 * and the last by END; a character class is a CHAR (or CHAR_NOT) followed
 * by RNG_UPPER / CHAR_ALT elements; groups and repetitions become rules of
 * their own. A parse stack holds element positions, its top the next
 * element to match; a state is the set of stacks whose tops are all
 * characters (REFs expanded), and a code point moves each stack whose top
 * matches it past that element. Expansion uses a work list, not recursion,
 * so an output's nesting never grows the C stack.
 */
#define _GNU_SOURCE /* qsort_r */
#include "grammar.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E_END, E_ALT, E_REF, E_CHAR, E_CHAR_NOT, E_RNG_UPPER, E_CHAR_ALT,
       E_ANY };

typedef struct {
    uint32_t type, value;
} elem;

typedef struct {
    elem *v;
    size_t n, cap;
} elems;

struct cinfer_grammar {
    elem *e;             /* every rule's elements, flat */
    size_t n_e;
    uint32_t *alt;       /* start of every alternative, rule by rule */
    uint32_t *rule_alt;  /* [n_rules + 1]: rule r's alternatives are
                            alt[rule_alt[r] .. rule_alt[r + 1]) */
    int n_rules;
    uint32_t root;
    /* the fast mask's tables, shared by every state of the grammar (the
     * one mutable part, behind its own lock) */
    struct mask_shared *ms;
};

static struct mask_shared *mask_shared_create(void);
static void mask_shared_destroy(struct mask_shared *ms);

/* ---------------------------------------------------------------------- */
/* parsing                                                                 */
/* ---------------------------------------------------------------------- */

typedef struct {
    const char *src, *p, *end;
    cinfer_status st;
    char err[320];
    char **names;     /* [n_rules] */
    size_t *name_len;
    elems *rules;
    const char **defined_at; /* where the rule was defined; NULL = not */
    const char **used_at;    /* where it was first referenced */
    int n_rules, cap_rules;
    size_t total;
    int depth;
} parser;

#define MAX_DEPTH 256 /* nested parentheses */

static void where(const parser *ps, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *q = ps->src; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int fail_at(parser *ps, const char *at, cinfer_status st,
                   const char *what)
{
    if (ps->st != CINFER_OK)
        return 0;
    int line, col;
    where(ps, at, &line, &col);
    ps->st = st;
    snprintf(ps->err, sizeof ps->err, "grammar: line %d, column %d: %s",
             line, col, what);
    return 0;
}

static int push(parser *ps, elems *out, uint32_t type, uint32_t value)
{
    if (ps->total >= CINFER_GRAMMAR_MAX_ELEMS) {
        char m[96];
        snprintf(m, sizeof m, "the grammar compiles to more than %d elements",
                 CINFER_GRAMMAR_MAX_ELEMS);
        return fail_at(ps, ps->p, CINFER_E_RANGE, m);
    }
    if (out->n == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 16;
        elem *v = realloc(out->v, cap * sizeof *v);
        if (!v)
            return fail_at(ps, ps->p, CINFER_E_NOMEM, "out of memory");
        out->v = v;
        out->cap = cap;
    }
    out->v[out->n].type = type;
    out->v[out->n].value = value;
    out->n++;
    ps->total++;
    return 1;
}

static int is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Spaces and comments; newlines too when newline_ok. */
static void skip_space(parser *ps, int newline_ok)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t') {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            ps->p++;
        } else {
            break;
        }
    }
}

/* The id of rule name[0..len), added if new. -1 on failure. */
static int rule_id(parser *ps, const char *name, size_t len)
{
    for (int i = 0; i < ps->n_rules; i++)
        if (ps->name_len[i] == len && memcmp(ps->names[i], name, len) == 0)
            return i;
    if (ps->n_rules == ps->cap_rules) {
        int cap = ps->cap_rules ? 2 * ps->cap_rules : 16;
        char **n = realloc(ps->names, (size_t)cap * sizeof *n);
        if (n)
            ps->names = n;
        size_t *l = realloc(ps->name_len, (size_t)cap * sizeof *l);
        if (l)
            ps->name_len = l;
        elems *r = realloc(ps->rules, (size_t)cap * sizeof *r);
        if (r)
            ps->rules = r;
        const char **d = realloc(ps->defined_at, (size_t)cap * sizeof *d);
        if (d)
            ps->defined_at = d;
        const char **u = realloc(ps->used_at, (size_t)cap * sizeof *u);
        if (u)
            ps->used_at = u;
        if (!n || !l || !r || !d || !u) {
            fail_at(ps, ps->p, CINFER_E_NOMEM, "out of memory");
            return -1;
        }
        ps->cap_rules = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        fail_at(ps, ps->p, CINFER_E_NOMEM, "out of memory");
        return -1;
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    int id = ps->n_rules++;
    ps->names[id] = copy;
    ps->name_len[id] = len;
    memset(&ps->rules[id], 0, sizeof ps->rules[id]);
    ps->defined_at[id] = NULL;
    ps->used_at[id] = NULL;
    return id;
}

/* A new rule for a group or repetition inside rule `owner`. */
static int generated_rule(parser *ps, int owner)
{
    char name[160];
    snprintf(name, sizeof name, "%.100s_%d", ps->names[owner], ps->n_rules);
    int id = rule_id(ps, name, strlen(name));
    if (id >= 0)
        ps->defined_at[id] = ps->p;
    return id;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point of the source: its length, 0 if invalid. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                         : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > n)
        return 0;
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f
                                                             : c & 0x07;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

/* A character of a literal or class, escapes decoded. */
static int parse_char(parser *ps, uint32_t *cp)
{
    const char *at = ps->p;
    if (ps->p >= ps->end)
        return fail_at(ps, at, CINFER_E_INVALID_ARG, "unexpected end");
    if (*ps->p != '\\') {
        int n = utf8_decode((const unsigned char *)ps->p,
                            (size_t)(ps->end - ps->p), cp);
        if (!n)
            return fail_at(ps, at, CINFER_E_INVALID_ARG,
                           "the grammar is not valid UTF-8");
        ps->p += n;
        return 1;
    }
    if (ps->p + 1 >= ps->end)
        return fail_at(ps, at, CINFER_E_INVALID_ARG, "unfinished escape");
    char c = ps->p[1];
    ps->p += 2;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = ps->p < ps->end ? hex_value(*ps->p) : -1;
            if (h < 0)
                return fail_at(ps, at, CINFER_E_INVALID_ARG,
                               "bad hexadecimal escape");
            v = v * 16 + (uint32_t)h;
            ps->p++;
        }
        if (v > 0x10ffff)
            return fail_at(ps, at, CINFER_E_INVALID_ARG,
                           "escape beyond U+10FFFF");
        *cp = v;
        return 1;
    }
    switch (c) {
    case 'n': *cp = '\n'; return 1;
    case 't': *cp = '\t'; return 1;
    case 'r': *cp = '\r'; return 1;
    case '\\': case '"': case '[': case ']': case '-': case '^':
        *cp = (uint32_t)c;
        return 1;
    default:
        return fail_at(ps, at, CINFER_E_INVALID_ARG, "unknown escape");
    }
}

static int parse_alternates(parser *ps, int rule, elems *out, int nested);

/* Repeats the symbol out[start..) min..max times (max < 0: unbounded). */
static int repeat(parser *ps, int rule, elems *out, size_t start, int min,
                  int max)
{
    size_t len = out->n - start;
    elem *prev = malloc(len * sizeof *prev);
    if (!prev)
        return fail_at(ps, ps->p, CINFER_E_NOMEM, "out of memory");
    memcpy(prev, out->v + start, len * sizeof *prev);
    int ok = 1;
    if (min == 0) {
        ps->total -= len;
        out->n = start;
    }
    for (int i = 1; ok && i < min; i++)
        for (size_t k = 0; ok && k < len; k++)
            ok = push(ps, out, prev[k].type, prev[k].value);
    /* The optional tail: r ::= prev r | "" for max < 0; else a chain of
     * max - min nested optionals. */
    int n_opt = max < 0 ? 1 : max - min;
    int last = -1;
    for (int i = 0; ok && i < n_opt; i++) {
        int r = generated_rule(ps, rule);
        if (r < 0) {
            ok = 0;
            break;
        }
        elems *rr = &ps->rules[r];
        for (size_t k = 0; ok && k < len; k++)
            ok = push(ps, rr, prev[k].type, prev[k].value);
        if (ok && (i > 0 || max < 0))
            ok = push(ps, rr, E_REF, (uint32_t)(max < 0 ? r : last));
        ok = ok && push(ps, rr, E_ALT, 0) && push(ps, rr, E_END, 0);
        last = r;
    }
    if (ok && n_opt > 0)
        ok = push(ps, out, E_REF, (uint32_t)last);
    free(prev);
    return ok;
}

/* A decimal of a {m,n}: -1 if none. */
static long parse_count(parser *ps)
{
    long v = -1;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*ps->p - '0');
        if (v > CINFER_GRAMMAR_MAX_REPEAT * 10L)
            v = CINFER_GRAMMAR_MAX_REPEAT * 10L;
        ps->p++;
    }
    return v;
}

static int parse_sequence(parser *ps, int rule, elems *out, int nested)
{
    size_t last_sym = out->n;
    int have_sym = 0;
    while (ps->p < ps->end && ps->st == CINFER_OK) {
        const char *at = ps->p;
        char c = *ps->p;
        if (c == '"') {
            ps->p++;
            last_sym = out->n;
            have_sym = 1;
            while (ps->p < ps->end && *ps->p != '"') {
                uint32_t cp;
                if (!parse_char(ps, &cp) || !push(ps, out, E_CHAR, cp))
                    return 0;
            }
            if (ps->p >= ps->end)
                return fail_at(ps, at, CINFER_E_INVALID_ARG,
                               "unterminated literal");
            ps->p++;
        } else if (c == '[') {
            ps->p++;
            last_sym = out->n;
            have_sym = 1;
            uint32_t start = E_CHAR;
            if (ps->p < ps->end && *ps->p == '^') {
                ps->p++;
                start = E_CHAR_NOT;
            }
            int first = 1;
            while (ps->p < ps->end && *ps->p != ']') {
                uint32_t lo, hi;
                if (!parse_char(ps, &lo))
                    return 0;
                if (!push(ps, out, first ? start : E_CHAR_ALT, lo))
                    return 0;
                first = 0;
                if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                    ps->p++;
                    if (!parse_char(ps, &hi))
                        return 0;
                    if (hi < lo)
                        return fail_at(ps, at, CINFER_E_INVALID_ARG,
                                       "a character range runs backwards");
                    if (!push(ps, out, E_RNG_UPPER, hi))
                        return 0;
                }
            }
            if (ps->p >= ps->end)
                return fail_at(ps, at, CINFER_E_INVALID_ARG,
                               "unterminated character class");
            if (first)
                return fail_at(ps, at, CINFER_E_INVALID_ARG,
                               "empty character class");
            ps->p++;
        } else if (is_word(c)) {
            const char *name = ps->p;
            while (ps->p < ps->end && is_word(*ps->p))
                ps->p++;
            int id = rule_id(ps, name, (size_t)(ps->p - name));
            if (id < 0)
                return 0;
            if (!ps->used_at[id])
                ps->used_at[id] = name;
            last_sym = out->n;
            have_sym = 1;
            if (!push(ps, out, E_REF, (uint32_t)id))
                return 0;
        } else if (c == '(') {
            if (++ps->depth > MAX_DEPTH)
                return fail_at(ps, at, CINFER_E_RANGE,
                               "parentheses nest too deep");
            ps->p++;
            int sub = generated_rule(ps, rule);
            if (sub < 0)
                return 0;
            /* parse into a local vector: rules[] may move meanwhile */
            elems body = {0};
            if (!parse_alternates(ps, rule, &body, 1)) {
                free(body.v);
                return 0;
            }
            ps->rules[sub] = body;
            ps->depth--;
            if (ps->p >= ps->end || *ps->p != ')')
                return fail_at(ps, at, CINFER_E_INVALID_ARG,
                               "unclosed parenthesis");
            ps->p++;
            last_sym = out->n;
            have_sym = 1;
            if (!push(ps, out, E_REF, (uint32_t)sub))
                return 0;
        } else if (c == '.') {
            ps->p++;
            last_sym = out->n;
            have_sym = 1;
            if (!push(ps, out, E_ANY, 0))
                return 0;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (!have_sym)
                return fail_at(ps, at, CINFER_E_INVALID_ARG,
                               "a repetition with nothing before it");
            ps->p++;
            long min = c == '+' ? 1 : 0, max = c == '?' ? 1 : -1;
            if (c == '{') {
                skip_space(ps, 0);
                min = parse_count(ps);
                skip_space(ps, 0);
                max = min;
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    skip_space(ps, 0);
                    max = parse_count(ps);
                    skip_space(ps, 0);
                }
                if (min < 0 || ps->p >= ps->end || *ps->p != '}')
                    return fail_at(ps, at, CINFER_E_INVALID_ARG,
                                   "expected {m}, {m,} or {m,n}");
                ps->p++;
                if (min > CINFER_GRAMMAR_MAX_REPEAT ||
                    max > CINFER_GRAMMAR_MAX_REPEAT) {
                    char m[80];
                    snprintf(m, sizeof m, "a repetition count above %d",
                             CINFER_GRAMMAR_MAX_REPEAT);
                    return fail_at(ps, at, CINFER_E_RANGE, m);
                }
                if (max >= 0 && max < min)
                    return fail_at(ps, at, CINFER_E_INVALID_ARG,
                                   "{m,n} with n below m");
            }
            if (!repeat(ps, rule, out, last_sym, (int)min, (int)max))
                return 0;
            have_sym = 0; /* x** is not GBNF */
        } else {
            break;
        }
        skip_space(ps, nested);
    }
    return ps->st == CINFER_OK;
}

static int parse_alternates(parser *ps, int rule, elems *out, int nested)
{
    skip_space(ps, nested);
    if (!parse_sequence(ps, rule, out, nested))
        return 0;
    while (ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        if (!push(ps, out, E_ALT, 0))
            return 0;
        skip_space(ps, 1); /* a rule may go on after a trailing | */
        if (!parse_sequence(ps, rule, out, nested))
            return 0;
    }
    return push(ps, out, E_END, 0);
}

static int parse_rule(parser *ps)
{
    const char *at = ps->p;
    const char *name = ps->p;
    while (ps->p < ps->end && is_word(*ps->p))
        ps->p++;
    if (ps->p == name)
        return fail_at(ps, at, CINFER_E_INVALID_ARG, "expected a rule name");
    int id = rule_id(ps, name, (size_t)(ps->p - name));
    if (id < 0)
        return 0;
    if (ps->defined_at[id])
        return fail_at(ps, at, CINFER_E_INVALID_ARG,
                       "the rule is defined twice");
    ps->defined_at[id] = at;
    skip_space(ps, 0);
    if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3) != 0)
        return fail_at(ps, ps->p, CINFER_E_INVALID_ARG, "expected ::=");
    ps->p += 3;
    elems body = {0};
    if (!parse_alternates(ps, id, &body, 0)) {
        free(body.v);
        return 0;
    }
    ps->rules[id] = body;
    if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r')
        return fail_at(ps, ps->p, CINFER_E_INVALID_ARG,
                       "unexpected character");
    return 1;
}

/* ---------------------------------------------------------------------- */
/* checks and layout                                                       */
/* ---------------------------------------------------------------------- */

/* Left recursion: rule r reaches itself through REFs at the start of an
 * alternative, past rules that can match nothing (nullable). */
static int check_left_recursion(parser *ps)
{
    int n = ps->n_rules;
    unsigned char *nullable = calloc((size_t)n, 1);
    unsigned char *color = calloc((size_t)n, 1);
    int *stack = malloc((size_t)n * 3 * sizeof *stack);
    if (!nullable || !color || !stack) {
        free(nullable);
        free(color);
        free(stack);
        return fail_at(ps, ps->src, CINFER_E_NOMEM, "out of memory");
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r])
                continue;
            const elems *b = &ps->rules[r];
            int all = 1;
            for (size_t i = 0; i < b->n; i++) {
                uint32_t t = b->v[i].type;
                if (t == E_ALT || t == E_END) {
                    if (all) {
                        nullable[r] = 1;
                        changed = 1;
                        break;
                    }
                    all = 1;
                } else if (t != E_REF || !nullable[b->v[i].value]) {
                    all = 0;
                }
            }
        }
    }
    /* Depth-first over "can start with" edges; a grey rule met again is a
     * cycle. Stack entries: rule, element index to resume at, and whether
     * the alternative being scanned is already past a symbol that must
     * match a character (then its later symbols cannot start it). */
    int bad = -1;
    for (int s0 = 0; s0 < n && bad < 0; s0++) {
        if (color[s0])
            continue;
        int top = 0;
        stack[0] = s0;
        stack[1] = 0;
        stack[2] = 0;
        color[s0] = 1;
        while (top >= 0 && bad < 0) {
            int r = stack[3 * top];
            const elems *b = &ps->rules[r];
            size_t i = (size_t)stack[3 * top + 1];
            int skipping = stack[3 * top + 2];
            int pushed = 0;
            for (; i < b->n; i++) {
                uint32_t t = b->v[i].type;
                if (t == E_ALT || t == E_END) {
                    skipping = 0;
                    continue;
                }
                if (skipping)
                    continue;
                if (t != E_REF) {
                    skipping = 1;
                    continue;
                }
                int x = (int)b->v[i].value;
                if (!nullable[x])
                    skipping = 1;
                if (color[x] == 1) {
                    bad = x;
                    break;
                }
                if (color[x] == 0) {
                    stack[3 * top + 1] = (int)i + 1;
                    stack[3 * top + 2] = skipping;
                    top++;
                    stack[3 * top] = x;
                    stack[3 * top + 1] = 0;
                    stack[3 * top + 2] = 0;
                    color[x] = 1;
                    pushed = 1;
                    break;
                }
            }
            if (!pushed && bad < 0) {
                color[r] = 2;
                top--;
            }
        }
    }
    free(nullable);
    free(color);
    free(stack);
    if (bad >= 0) {
        char m[200];
        snprintf(m, sizeof m,
                 "rule '%.100s' is left-recursive (it can reach itself "
                 "before any character)",
                 ps->names[bad]);
        return fail_at(ps, ps->defined_at[bad] ? ps->defined_at[bad]
                                               : ps->src,
                       CINFER_E_INVALID_ARG, m);
    }
    return 1;
}

static cinfer_status layout(parser *ps, int root, cinfer_grammar *g)
{
    int n = ps->n_rules;
    size_t n_alts = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < ps->rules[r].n; i++)
            n_alts += ps->rules[r].v[i].type == E_ALT ||
                      ps->rules[r].v[i].type == E_END;
    g->e = malloc((ps->total + 1) * sizeof *g->e);
    g->alt = malloc((n_alts + 1) * sizeof *g->alt);
    g->rule_alt = malloc(((size_t)n + 1) * sizeof *g->rule_alt);
    if (!g->e || !g->alt || !g->rule_alt)
        return cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    size_t ne = 0, na = 0;
    for (int r = 0; r < n; r++) {
        g->rule_alt[r] = (uint32_t)na;
        const elems *b = &ps->rules[r];
        g->alt[na++] = (uint32_t)ne;
        for (size_t i = 0; i < b->n; i++) {
            g->e[ne++] = b->v[i];
            if (b->v[i].type == E_ALT)
                g->alt[na++] = (uint32_t)ne;
        }
    }
    g->rule_alt[n] = (uint32_t)na;
    g->n_e = ne;
    g->n_rules = n;
    g->root = (uint32_t)root;
    return CINFER_OK;
}

static void parser_free(parser *ps)
{
    for (int i = 0; i < ps->n_rules; i++) {
        free(ps->names[i]);
        free(ps->rules[i].v);
    }
    free(ps->names);
    free(ps->name_len);
    free(ps->rules);
    free(ps->defined_at);
    free(ps->used_at);
}

cinfer_status cinfer_grammar_compile(const char *src, size_t len,
                                     const char *root, cinfer_grammar **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "grammar: out is NULL");
    *out = NULL;
    if (!src && len)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "grammar: no source");
    if (len > CINFER_GRAMMAR_MAX_SOURCE)
        return cinfer_set_error(CINFER_E_RANGE,
                                "grammar: %zu bytes of source (at most %d)",
                                len, CINFER_GRAMMAR_MAX_SOURCE);
    if (!root)
        root = "root";
    parser ps;
    memset(&ps, 0, sizeof ps);
    ps.src = ps.p = src ? src : "";
    ps.end = ps.src + len;
    for (;;) {
        skip_space(&ps, 1);
        if (ps.p >= ps.end || ps.st != CINFER_OK)
            break;
        if (!parse_rule(&ps))
            break;
    }
    int root_id = -1;
    if (ps.st == CINFER_OK) {
        for (int i = 0; i < ps.n_rules; i++) {
            if (!ps.defined_at[i]) {
                char m[200];
                snprintf(m, sizeof m,
                         "rule '%.100s' is used but never defined",
                         ps.names[i]);
                fail_at(&ps, ps.used_at[i] ? ps.used_at[i] : ps.src,
                        CINFER_E_INVALID_ARG, m);
                break;
            }
            if (strlen(root) == ps.name_len[i] &&
                memcmp(root, ps.names[i], ps.name_len[i]) == 0)
                root_id = i;
        }
    }
    if (ps.st == CINFER_OK && root_id < 0) {
        char m[200];
        snprintf(m, sizeof m, "no rule '%.100s' (the start rule)", root);
        fail_at(&ps, ps.end, CINFER_E_INVALID_ARG, m);
    }
    if (ps.st == CINFER_OK)
        check_left_recursion(&ps);
    if (ps.st != CINFER_OK) {
        cinfer_status st = cinfer_set_error(ps.st, "%s", ps.err);
        parser_free(&ps);
        return st;
    }
    cinfer_grammar *g = calloc(1, sizeof *g);
    cinfer_status st = g ? layout(&ps, root_id, g)
                         : cinfer_set_error(CINFER_E_NOMEM,
                                            "grammar: out of memory");
    if (st == CINFER_OK && !(g->ms = mask_shared_create()))
        st = cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    parser_free(&ps);
    if (st != CINFER_OK) {
        cinfer_grammar_destroy(g);
        return st;
    }
    *out = g;
    return CINFER_OK;
}

void cinfer_grammar_destroy(cinfer_grammar *g)
{
    if (!g)
        return;
    free(g->e);
    free(g->alt);
    free(g->rule_alt);
    mask_shared_destroy(g->ms);
    free(g);
}

int cinfer_grammar_n_rules(const cinfer_grammar *g) { return g->n_rules; }

static size_t mask_shared_bytes(struct mask_shared *ms);

size_t cinfer_grammar_bytes(const cinfer_grammar *g)
{
    size_t n_alts = g->rule_alt[g->n_rules];
    return sizeof *g + (g->n_e + 1) * sizeof *g->e +
           (n_alts + 1) * sizeof *g->alt +
           ((size_t)g->n_rules + 1) * sizeof *g->rule_alt +
           mask_shared_bytes(g->ms);
}

/* ---------------------------------------------------------------------- */
/* stack sets                                                              */
/* ---------------------------------------------------------------------- */

typedef struct {
    uint32_t *pool; /* stacks back to back */
    size_t used, cap;
    size_t *start;  /* [n] */
    uint32_t *len;  /* [n] */
    uint64_t *hash; /* [n] */
    size_t n, ncap;
} sset;

static void sset_free(sset *s)
{
    free(s->pool);
    free(s->start);
    free(s->len);
    free(s->hash);
    memset(s, 0, sizeof *s);
}

static uint64_t stack_hash(const uint32_t *v, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

/* Adds a stack unless the set has it. 0 ok, -1 no memory, -2 past the
 * stack bound. */
static int sset_add(sset *s, const uint32_t *v, size_t n)
{
    uint64_t h = stack_hash(v, n);
    for (size_t i = 0; i < s->n; i++)
        if (s->hash[i] == h && s->len[i] == n &&
            memcmp(s->pool + s->start[i], v, n * sizeof *v) == 0)
            return 0;
    if (s->n >= CINFER_GRAMMAR_MAX_STACKS)
        return -2;
    if (s->n == s->ncap) {
        size_t cap = s->ncap ? 2 * s->ncap : 8;
        size_t *st = realloc(s->start, cap * sizeof *st);
        if (st)
            s->start = st;
        uint32_t *ln = realloc(s->len, cap * sizeof *ln);
        if (ln)
            s->len = ln;
        uint64_t *hs = realloc(s->hash, cap * sizeof *hs);
        if (hs)
            s->hash = hs;
        if (!st || !ln || !hs)
            return -1;
        s->ncap = cap;
    }
    /* the pool exists once a set has a stack, empty ones too: pointer
     * arithmetic on a NULL pool is undefined even at offset 0 */
    if (s->used + n > s->cap || !s->pool) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->used + n)
            cap *= 2;
        uint32_t *p = realloc(s->pool, cap * sizeof *p);
        if (!p)
            return -1;
        s->pool = p;
        s->cap = cap;
    }
    if (n)
        memcpy(s->pool + s->used, v, n * sizeof *v);
    s->start[s->n] = s->used;
    s->len[s->n] = (uint32_t)n;
    s->hash[s->n] = h;
    s->used += n;
    s->n++;
    return 0;
}

/* *dst becomes a copy of *src (no dedupe needed: src has none). */
static int sset_copy(sset *dst, const sset *src)
{
    if (src->n > dst->ncap) {
        size_t cap = src->n;
        size_t *st = realloc(dst->start, cap * sizeof *st);
        if (st)
            dst->start = st;
        uint32_t *ln = realloc(dst->len, cap * sizeof *ln);
        if (ln)
            dst->len = ln;
        uint64_t *hs = realloc(dst->hash, cap * sizeof *hs);
        if (hs)
            dst->hash = hs;
        if (!st || !ln || !hs)
            return -1;
        dst->ncap = cap;
    }
    if (src->used > dst->cap || (src->n && !dst->pool)) {
        size_t cap = src->used > 64 ? src->used : 64;
        uint32_t *p = realloc(dst->pool, cap * sizeof *p);
        if (!p)
            return -1;
        dst->pool = p;
        dst->cap = cap;
    }
    if (src->used)
        memcpy(dst->pool, src->pool, src->used * sizeof *dst->pool);
    if (src->n) {
        memcpy(dst->start, src->start, src->n * sizeof *dst->start);
        memcpy(dst->len, src->len, src->n * sizeof *dst->len);
        memcpy(dst->hash, src->hash, src->n * sizeof *dst->hash);
    }
    dst->n = src->n;
    dst->used = src->used;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* matching                                                                */
/* ---------------------------------------------------------------------- */

#define MEMO_SLOTS 1024 /* a power of two */
#define MASK_MEMO 64 /* whole masks a grammar keeps */
/* Interned levels a grammar keeps between masks, in bytes; past it they
 * are dropped at the next mask. A walk that interns past the hard bound
 * within one mask drops them and finishes on the memoized path. */
#define INTERN_KEEP_BYTES (16u << 20)
#define INTERN_HARD_BYTES (64u << 20)
#define NEXT_UNKNOWN (-2)
#define NEXT_DEAD (-1)

struct cinfer_grammar_state {
    const cinfer_grammar *g;
    sset cur;               /* stacks, tops all characters (or empty) */
    unsigned char part[4];  /* bytes of a character not yet whole */
    int n_part;
    /* scratch */
    sset a, b, work;
    uint32_t *tmp;
    size_t tmp_cap;
    uint32_t *moved; /* step's copy of a stack moved past a character */
    size_t moved_cap;
    /* mask: the position after each byte of the current token prefix */
    struct level {
        sset set;
        unsigned char part[4];
        int n_part;
    } *lv;
    size_t n_lv;
    /* mask: level_next's results by (level, byte); they depend on the
     * grammar alone, so they stay valid from mask to mask */
    struct memo {
        uint64_t key;
        int used, viable;
        unsigned char byte;
        struct level in, out;
    } *memo;
    /* fast mask: the walk's level ids by prefix length, and a level */
    int32_t *lid; /* [n_lid] */
    size_t n_lid;
    struct level scratch;
};


static int is_end(const cinfer_grammar *g, uint32_t pos)
{
    return g->e[pos].type == E_END || g->e[pos].type == E_ALT;
}

static int tmp_room(cinfer_grammar_state *s, size_t n)
{
    if (n <= s->tmp_cap)
        return 0;
    size_t cap = s->tmp_cap ? s->tmp_cap : 64;
    while (cap < n)
        cap *= 2;
    uint32_t *t = realloc(s->tmp, cap * sizeof *t);
    if (!t)
        return -1;
    s->tmp = t;
    s->tmp_cap = cap;
    return 0;
}

/* Expands the stack v[0..n) until every top is a character, into out.
 * 0, -1 no memory, -2 the stack bound. */
static int advance(cinfer_grammar_state *s, const uint32_t *v, size_t n,
                   sset *out)
{
    const cinfer_grammar *g = s->g;
    sset *w = &s->work;
    w->n = w->used = 0;
    int r = sset_add(w, v, n);
    size_t steps = 0;
    while (!r && w->n > 0) {
        /* pop the last stack of the work list */
        size_t k = w->n - 1;
        size_t len = w->len[k];
        if (tmp_room(s, len + 2))
            return -1;
        memcpy(s->tmp, w->pool + w->start[k], len * sizeof *s->tmp);
        w->n--;
        w->used = w->start[k];
        if (++steps > 16 * (size_t)CINFER_GRAMMAR_MAX_STACKS)
            return -2;
        if (len == 0 || g->e[s->tmp[len - 1]].type != E_REF) {
            r = sset_add(out, s->tmp, len);
            continue;
        }
        uint32_t top = s->tmp[len - 1];
        uint32_t rule = g->e[top].value;
        size_t base = len - 1;
        if (!is_end(g, top + 1))
            s->tmp[base++] = top + 1;
        for (uint32_t a = g->rule_alt[rule]; !r && a < g->rule_alt[rule + 1];
             a++) {
            uint32_t start = g->alt[a];
            size_t m = base;
            if (!is_end(g, start))
                s->tmp[m++] = start;
            r = sset_add(w, s->tmp, m);
        }
    }
    return r;
}

/* Whether the class (or character) at pos matches cp; *after = the
 * element past it. */
static int match_char(const cinfer_grammar *g, uint32_t pos, uint32_t cp,
                      uint32_t *after)
{
    if (g->e[pos].type == E_ANY) {
        *after = pos + 1;
        return 1;
    }
    int negated = g->e[pos].type == E_CHAR_NOT;
    int found = 0;
    do {
        if (g->e[pos + 1].type == E_RNG_UPPER) {
            found |= g->e[pos].value <= cp && cp <= g->e[pos + 1].value;
            pos += 2;
        } else {
            found |= g->e[pos].value == cp;
            pos += 1;
        }
    } while (g->e[pos].type == E_CHAR_ALT);
    *after = pos;
    return found != negated;
}

/* Whether some code point in [lo, hi] could match the class at pos. */
static int match_range(const cinfer_grammar *g, uint32_t pos, uint32_t lo,
                       uint32_t hi)
{
    if (g->e[pos].type == E_ANY || g->e[pos].type == E_CHAR_NOT)
        return 1; /* a negated class excludes a few: some remain */
    do {
        uint32_t a = g->e[pos].value, b = a;
        if (g->e[pos + 1].type == E_RNG_UPPER) {
            b = g->e[pos + 1].value;
            pos += 2;
        } else {
            pos += 1;
        }
        if (a <= hi && lo <= b)
            return 1;
    } while (g->e[pos].type == E_CHAR_ALT);
    return 0;
}

/* in -> out by one code point. */
static int step(cinfer_grammar_state *s, const sset *in, uint32_t cp,
                sset *out)
{
    const cinfer_grammar *g = s->g;
    out->n = out->used = 0;
    for (size_t i = 0; i < in->n; i++) {
        size_t len = in->len[i];
        if (len == 0)
            continue;
        const uint32_t *v = in->pool + in->start[i];
        uint32_t after;
        if (!match_char(g, v[len - 1], cp, &after))
            continue;
        /* its own buffer: advance uses tmp */
        if (len + 1 > s->moved_cap) {
            size_t cap = s->moved_cap ? 2 * s->moved_cap : 64;
            while (cap < len + 1)
                cap *= 2;
            uint32_t *t = realloc(s->moved, cap * sizeof *t);
            if (!t)
                return -1;
            s->moved = t;
            s->moved_cap = cap;
        }
        uint32_t *t = s->moved;
        memcpy(t, v, (len - 1) * sizeof *t);
        size_t m = len - 1;
        if (!is_end(g, after))
            t[m++] = after;
        int r = advance(s, t, m, out);
        if (r)
            return r;
    }
    return 0;
}

/* Length of the UTF-8 sequence that starts with byte c; 0 if none. */
static int utf8_len(unsigned c)
{
    return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4 : 0;
}

/* The code points a valid prefix p[0..n) of a longer sequence can still
 * become: [*lo, *hi]. 0 if p cannot start one. */
static int prefix_range(const unsigned char *p, int n, uint32_t *lo,
                        uint32_t *hi)
{
    int len = utf8_len(p[0]);
    if (len <= n)
        return 0;
    uint32_t v = len == 2 ? p[0] & 0x1f : len == 3 ? p[0] & 0x0f
                                                   : p[0] & 0x07;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (p[i] & 0x3f);
    }
    int rest = len - n;
    *lo = v << (6 * rest);
    *hi = ((v + 1) << (6 * rest)) - 1;
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (*lo < min[len])
        *lo = min[len];
    if (*hi > 0x10ffff)
        *hi = 0x10ffff;
    return *lo <= *hi;
}

/* Whether some stack of set can take a character that begins with the k
 * bytes at buf (a token that ends inside a character). */
static int partial_viable(const cinfer_grammar *g, const sset *set,
                          const unsigned char *buf, int k)
{
    uint32_t lo, hi;
    if (!prefix_range(buf, k, &lo, &hi))
        return 0;
    for (size_t i = 0; i < set->n; i++)
        if (set->len[i] > 0 &&
            match_range(g, set->pool[set->start[i] + set->len[i] - 1], lo,
                        hi))
            return 1;
    return 0;
}

/* Feeds bytes from *from (s->cur, or a copy) into the result, which ends
 * in *res (one of s->a / s->b) with the new partial bytes in part/n_part.
 * 1 allowed, 0 not, -1 no memory, -2 the stack bound. */
static int feed(cinfer_grammar_state *s, const char *bytes, size_t n,
                sset **res, unsigned char *part, int *n_part)
{
    sset *cur = &s->a, *next = &s->b;
    int r = sset_copy(cur, &s->cur);
    if (r)
        return r;
    unsigned char buf[4];
    int k = s->n_part;
    memcpy(buf, s->part, (size_t)k);
    for (size_t i = 0; i < n; i++) {
        buf[k++] = (unsigned char)bytes[i];
        int len = utf8_len(buf[0]);
        if (!len)
            return 0;
        if (k < len) {
            uint32_t lo, hi;
            if (!prefix_range(buf, k, &lo, &hi))
                return 0;
            continue;
        }
        uint32_t cp;
        if (!utf8_decode(buf, (size_t)k, &cp))
            return 0;
        k = 0;
        r = step(s, cur, cp, next);
        if (r)
            return r;
        if (next->n == 0)
            return 0;
        sset *t = cur;
        cur = next;
        next = t;
    }
    if (k > 0) {
        /* a character begun: some stack must be able to take it */
        if (!partial_viable(s->g, cur, buf, k))
            return 0;
    }
    *res = cur;
    memcpy(part, buf, (size_t)k);
    *n_part = k;
    return 1;
}

cinfer_status cinfer_grammar_state_create(const cinfer_grammar *g,
                                          cinfer_grammar_state **out)
{
    if (!g || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar_state_create: NULL argument");
    *out = NULL;
    cinfer_grammar_state *s = calloc(1, sizeof *s);
    if (!s)
        return cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    s->g = g;
    int r = 0;
    for (uint32_t a = g->rule_alt[g->root]; !r && a < g->rule_alt[g->root + 1];
         a++) {
        uint32_t start = g->alt[a];
        r = advance(s, &start, is_end(g, start) ? 0 : 1, &s->cur);
    }
    if (r) {
        cinfer_grammar_state_destroy(s);
        return r == -1 ? cinfer_set_error(CINFER_E_NOMEM,
                                          "grammar: out of memory")
                       : cinfer_set_error(CINFER_E_RANGE,
                                          "grammar: more than %d parse "
                                          "stacks at the start",
                                          CINFER_GRAMMAR_MAX_STACKS);
    }
    *out = s;
    return CINFER_OK;
}

void cinfer_grammar_state_destroy(cinfer_grammar_state *s)
{
    if (!s)
        return;
    sset_free(&s->cur);
    sset_free(&s->a);
    sset_free(&s->b);
    sset_free(&s->work);
    free(s->tmp);
    free(s->moved);
    for (size_t i = 0; i < s->n_lv; i++)
        sset_free(&s->lv[i].set);
    free(s->lv);
    for (size_t i = 0; s->memo && i < MEMO_SLOTS; i++) {
        sset_free(&s->memo[i].in.set);
        sset_free(&s->memo[i].out.set);
    }
    free(s->memo);
    free(s->lid);
    sset_free(&s->scratch.set);
    free(s);
}

cinfer_status cinfer_grammar_state_copy(cinfer_grammar_state *dst,
                                        const cinfer_grammar_state *src)
{
    if (!dst || !src || dst->g != src->g)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar_state_copy: states of different "
                                "grammars");
    if (dst == src)
        return CINFER_OK;
    if (sset_copy(&dst->cur, &src->cur))
        return cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    memcpy(dst->part, src->part, sizeof dst->part);
    dst->n_part = src->n_part;
    return CINFER_OK;
}

int cinfer_grammar_allows(const cinfer_grammar_state *cs, const char *bytes,
                          size_t n)
{
    if (n == 0)
        return 1;
    /* the scratch sets are the state's own; the position is not changed */
    cinfer_grammar_state *s = (cinfer_grammar_state *)cs;
    sset *res;
    unsigned char part[4];
    int np;
    return feed(s, bytes, n, &res, part, &np) == 1;
}

cinfer_status cinfer_grammar_accept(cinfer_grammar_state *s,
                                    const char *bytes, size_t n)
{
    if (n == 0)
        return CINFER_OK;
    sset *res;
    unsigned char part[4];
    int np;
    int r = feed(s, bytes, n, &res, part, &np);
    if (r == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar: the output cannot continue with "
                                "these %zu bytes",
                                n);
    if (r == -1)
        return cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    if (r == -2)
        return cinfer_set_error(CINFER_E_RANGE,
                                "grammar: more than %d parse stacks (the "
                                "grammar is too ambiguous here)",
                                CINFER_GRAMMAR_MAX_STACKS);
    sset t = s->cur;
    s->cur = *res;
    *res = t;
    memcpy(s->part, part, sizeof part);
    s->n_part = np;
    return CINFER_OK;
}

int cinfer_grammar_complete(const cinfer_grammar_state *s)
{
    if (s->n_part)
        return 0;
    for (size_t i = 0; i < s->cur.n; i++)
        if (s->cur.len[i] == 0)
            return 1;
    return 0;
}

int cinfer_grammar_done(const cinfer_grammar_state *s)
{
    if (s->n_part)
        return 0;
    for (size_t i = 0; i < s->cur.n; i++)
        if (s->cur.len[i] != 0)
            return 0;
    return 1;
}

/* ---------------------------------------------------------------------- */
/* masks over a vocabulary                                                 */
/* ---------------------------------------------------------------------- */

struct cinfer_grammar_vocab {
    int32_t n;
    char *bytes;
    uint32_t *off;   /* [n + 1] */
    int32_t *order;  /* token ids by their bytes, ascending */
    uint32_t *lcp;   /* [n]: bytes order[i] shares with order[i - 1] */
    uint32_t max_len;
    uint64_t serial; /* distinct per vocabulary made: what a state's
                        memoized masks are of */
};

static _Atomic uint64_t vocab_serial;

static int by_bytes(const void *a, const void *b, void *ctx)
{
    const cinfer_grammar_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y],
                   lx < ly ? lx : ly);
    if (c)
        return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : x > y);
}

cinfer_status cinfer_grammar_vocab_create(const char *bytes,
                                          const uint32_t *off,
                                          int32_t n_vocab,
                                          cinfer_grammar_vocab **out)
{
    if (!out || !off || n_vocab < 1 || (!bytes && off[n_vocab]))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar_vocab_create: bad arguments");
    *out = NULL;
    for (int32_t t = 0; t < n_vocab; t++)
        if (off[t + 1] < off[t])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "grammar_vocab_create: offsets of token "
                                    "%d run backwards",
                                    t);
    cinfer_grammar_vocab *v = calloc(1, sizeof *v);
    size_t nb = off[n_vocab] - off[0];
    if (v) {
        v->n = n_vocab;
        v->bytes = malloc(nb ? nb : 1);
        v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
        v->order = malloc((size_t)n_vocab * sizeof *v->order);
        v->lcp = malloc((size_t)n_vocab * sizeof *v->lcp);
    }
    if (!v || !v->bytes || !v->off || !v->order || !v->lcp) {
        cinfer_grammar_vocab_destroy(v);
        return cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    }
    if (nb)
        memcpy(v->bytes, bytes + off[0], nb);
    for (int32_t t = 0; t <= n_vocab; t++)
        v->off[t] = off[t] - off[0];
    for (int32_t t = 0; t < n_vocab; t++) {
        v->order[t] = t;
        uint32_t len = v->off[t + 1] - v->off[t];
        v->max_len = len > v->max_len ? len : v->max_len;
    }
    v->serial = ++vocab_serial;
    qsort_r(v->order, (size_t)n_vocab, sizeof *v->order, by_bytes, v);
    v->lcp[0] = 0;
    for (int32_t i = 1; i < n_vocab; i++) {
        int32_t a = v->order[i - 1], b = v->order[i];
        uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
        uint32_t k = 0, m = la < lb ? la : lb;
        while (k < m && v->bytes[v->off[a] + k] == v->bytes[v->off[b] + k])
            k++;
        v->lcp[i] = k;
    }
    *out = v;
    return CINFER_OK;
}

void cinfer_grammar_vocab_destroy(cinfer_grammar_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->order);
    free(v->lcp);
    free(v);
}

static int same_level(const struct level *a, const struct level *b)
{
    if (a->n_part != b->n_part || a->set.n != b->set.n ||
        a->set.used != b->set.used ||
        memcmp(a->part, b->part, (size_t)a->n_part) != 0)
        return 0;
    for (size_t i = 0; i < a->set.n; i++)
        if (a->set.hash[i] != b->set.hash[i] || a->set.len[i] != b->set.len[i])
            return 0;
    return a->set.used == 0 ||
           memcmp(a->set.pool, b->set.pool, a->set.used * sizeof(uint32_t)) ==
               0;
}

static int copy_level(struct level *dst, const struct level *src)
{
    int r = sset_copy(&dst->set, &src->set);
    memcpy(dst->part, src->part, sizeof dst->part);
    dst->n_part = src->n_part;
    return r;
}

static int level_step(cinfer_grammar_state *s, struct level *in,
                      unsigned char byte, struct level *out);

/* Level d + 1 from level d and one byte: 1 viable, 0 dead, < 0 error.
 * Memoized: inside a string most bytes take a level to the same next one
 * (often itself), and the sorted walk meets those levels again and
 * again. */
static int level_next(cinfer_grammar_state *s, struct level *in,
                      unsigned char byte, struct level *out)
{
    if (!s->memo) {
        s->memo = calloc(MEMO_SLOTS, sizeof *s->memo);
        if (!s->memo)
            return level_step(s, in, byte, out);
    }
    uint64_t key = 1469598103934665603ull ^ byte;
    for (size_t i = 0; i < in->set.n; i++)
        key = (key ^ in->set.hash[i]) * 1099511628211ull;
    for (int i = 0; i < in->n_part; i++)
        key = (key ^ in->part[i]) * 1099511628211ull;
    key ^= (uint64_t)in->n_part << 56;
    struct memo *m = &s->memo[(key ^ (key >> 29)) & (MEMO_SLOTS - 1)];
    if (m->used && m->key == key && m->byte == byte && same_level(&m->in, in)) {
        if (!m->viable)
            return 0;
        return copy_level(out, &m->out) ? -1 : 1;
    }
    int r = level_step(s, in, byte, out);
    if (r < 0)
        return r;
    m->used = 0;
    if (copy_level(&m->in, in) == 0 &&
        (!r || copy_level(&m->out, out) == 0)) {
        m->used = 1;
        m->key = key;
        m->byte = byte;
        m->viable = r;
    }
    return r;
}

static int level_step(cinfer_grammar_state *s, struct level *in,
                      unsigned char byte, struct level *out)
{
    unsigned char buf[4];
    int k = in->n_part;
    memcpy(buf, in->part, (size_t)k);
    buf[k++] = byte;
    int len = utf8_len(buf[0]);
    if (!len)
        return 0;
    if (k < len) {
        if (!partial_viable(s->g, &in->set, buf, k))
            return 0;
        int r = sset_copy(&out->set, &in->set);
        if (r)
            return r;
        memcpy(out->part, buf, (size_t)k);
        out->n_part = k;
        return 1;
    }
    uint32_t cp;
    if (!utf8_decode(buf, (size_t)k, &cp))
        return 0;
    int r = step(s, &in->set, cp, &out->set);
    if (r)
        return r;
    out->n_part = 0;
    return out->set.n > 0;
}

/* The mask by the memoized walk: levels are whole stack sets copied from
 * depth to depth, their steps memoized in a small hash. The fast walk
 * below falls back to it when a grammar interns too much. */
static int64_t mask_memoized(cinfer_grammar_state *s,
                             const cinfer_grammar_vocab *v, uint8_t *allowed)
{
    if (s->n_lv < (size_t)v->max_len + 1) {
        struct level *lv = realloc(s->lv, ((size_t)v->max_len + 1) *
                                              sizeof *lv);
        if (!lv) {
            cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
            return -1;
        }
        memset(lv + s->n_lv, 0,
               ((size_t)v->max_len + 1 - s->n_lv) * sizeof *lv);
        s->lv = lv;
        s->n_lv = (size_t)v->max_len + 1;
    }
    if (sset_copy(&s->lv[0].set, &s->cur)) {
        cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
        return -1;
    }
    memcpy(s->lv[0].part, s->part, sizeof s->part);
    s->lv[0].n_part = s->n_part;
    /* valid: levels 0..valid hold the previous token's prefixes; dead: the
     * previous token's prefix of this length admits nothing (0 = none) */
    uint32_t valid = 0, dead = 0;
    int64_t count = 0;
    for (int32_t i = 0; i < v->n; i++) {
        int32_t t = v->order[i];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
        uint32_t len = v->off[t + 1] - v->off[t];
        uint32_t common = v->lcp[i];
        if (dead && common >= dead) {
            allowed[t] = 0; /* it starts with the dead prefix */
            continue;
        }
        dead = 0;
        uint32_t d = common < valid ? common : valid;
        int ok = len > 0;
        while (ok && d < len) {
            int r = level_next(s, &s->lv[d], b[d], &s->lv[d + 1]);
            if (r < 0) {
                if (r == -1)
                    cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
                else
                    cinfer_set_error(CINFER_E_RANGE,
                                     "grammar: more than %d parse stacks "
                                     "(the grammar is too ambiguous here)",
                                     CINFER_GRAMMAR_MAX_STACKS);
                return -1;
            }
            if (!r) {
                ok = 0;
                dead = d + 1;
                break;
            }
            d++;
        }
        valid = d;
        allowed[t] = (uint8_t)ok;
        count += ok;
    }
    return count;
}

/* ---------------------------------------------------------------------- */
/* the fast mask: interned levels                                          */
/* ---------------------------------------------------------------------- */

/* A level's hash: its stacks' hashes and its partial bytes. */
static uint64_t level_key(const struct level *lv)
{
    uint64_t key = 1469598103934665603ull ^ (uint64_t)lv->set.n;
    for (size_t i = 0; i < lv->set.n; i++)
        key = (key ^ lv->set.hash[i]) * 1099511628211ull;
    for (int i = 0; i < lv->n_part; i++)
        key = (key ^ lv->part[i]) * 1099511628211ull;
    return key ^ ((uint64_t)lv->n_part << 56);
}

/* The tables behind the fast mask, one per grammar: every level a walk of
 * any of its states meets, interned (hash-consed) with its byte
 * transitions, so a step of the walk is a table lookup; and whole masks
 * by the interned id of their level 0 and the vocabulary. A level is a
 * set of parse stacks, which name grammar positions only, never the
 * output's content, so states of different requests in the same place
 * (every request inside the same property's string) share them. A mask
 * holds the lock from start to end. */
struct mask_shared {
    pthread_mutex_t mu;
    struct ilevel {
        struct level lv;
        uint64_t key;
        int32_t *next; /* [256]: NEXT_UNKNOWN, NEXT_DEAD or a level id */
    } *il;
    size_t n_il, cap_il, bytes;
    uint32_t *itab; /* open addressing over il: id + 1, 0 = empty */
    size_t itab_cap;
    struct mask_memo {
        int32_t id;      /* -1 = empty */
        uint64_t vocab;  /* the vocabulary's serial */
        int32_t n;       /* its tokens */
        int64_t count;
        uint64_t used;   /* LRU clock */
        uint8_t *bits;   /* [(n + 7) / 8] */
    } mm[MASK_MEMO];
    uint64_t clock;
};

static struct mask_shared *mask_shared_create(void)
{
    struct mask_shared *ms = calloc(1, sizeof *ms);
    if (!ms)
        return NULL;
    if (pthread_mutex_init(&ms->mu, NULL) != 0) {
        free(ms);
        return NULL;
    }
    for (int i = 0; i < MASK_MEMO; i++)
        ms->mm[i].id = -1;
    return ms;
}

/* Drops the interned levels and the masks keyed by their ids. */
static void intern_reset(struct mask_shared *ms)
{
    for (size_t i = 0; i < ms->n_il; i++) {
        sset_free(&ms->il[i].lv.set);
        free(ms->il[i].next);
    }
    ms->n_il = 0;
    ms->bytes = 0;
    if (ms->itab)
        memset(ms->itab, 0, ms->itab_cap * sizeof *ms->itab);
    for (int i = 0; i < MASK_MEMO; i++)
        ms->mm[i].id = -1;
}

static size_t mask_shared_bytes(struct mask_shared *ms)
{
    pthread_mutex_lock(&ms->mu);
    size_t n = sizeof *ms + ms->bytes + ms->cap_il * sizeof *ms->il +
               ms->itab_cap * sizeof *ms->itab;
    for (int i = 0; i < MASK_MEMO; i++)
        n += ms->mm[i].bits ? ((size_t)ms->mm[i].n + 7) / 8 : 0;
    pthread_mutex_unlock(&ms->mu);
    return n;
}

static void mask_shared_destroy(struct mask_shared *ms)
{
    if (!ms)
        return;
    intern_reset(ms);
    for (int i = 0; i < MASK_MEMO; i++)
        free(ms->mm[i].bits);
    free(ms->il);
    free(ms->itab);
    pthread_mutex_destroy(&ms->mu);
    free(ms);
}

static int itab_grow(struct mask_shared *ms)
{
    size_t cap = ms->itab_cap ? 2 * ms->itab_cap : 1024;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t)
        return -1;
    for (size_t id = 0; id < ms->n_il; id++) {
        size_t j = ms->il[id].key & (cap - 1);
        while (t[j])
            j = (j + 1) & (cap - 1);
        t[j] = (uint32_t)id + 1;
    }
    free(ms->itab);
    ms->itab = t;
    ms->itab_cap = cap;
    return 0;
}

/* The id of the level equal to lv, interned if new; -1 no memory. */
static int32_t intern(struct mask_shared *ms, const struct level *lv)
{
    if (2 * (ms->n_il + 1) > ms->itab_cap && itab_grow(ms))
        return -1;
    uint64_t key = level_key(lv);
    size_t j = key & (ms->itab_cap - 1);
    for (; ms->itab[j]; j = (j + 1) & (ms->itab_cap - 1)) {
        struct ilevel *x = &ms->il[ms->itab[j] - 1];
        if (x->key == key && same_level(&x->lv, lv))
            return (int32_t)(ms->itab[j] - 1);
    }
    if (ms->n_il == ms->cap_il) {
        size_t cap = ms->cap_il ? 2 * ms->cap_il : 64;
        struct ilevel *il = realloc(ms->il, cap * sizeof *il);
        if (!il)
            return -1;
        ms->il = il;
        ms->cap_il = cap;
    }
    struct ilevel *x = &ms->il[ms->n_il];
    memset(x, 0, sizeof *x);
    if (copy_level(&x->lv, lv)) {
        sset_free(&x->lv.set);
        return -1;
    }
    x->key = key;
    ms->bytes += sizeof *x + lv->set.used * sizeof(uint32_t) +
                 lv->set.n * (sizeof(size_t) + 12);
    ms->itab[j] = (uint32_t)ms->n_il + 1;
    return (int32_t)ms->n_il++;
}

/* Level id's successor by one byte into *out: 1 viable, 0 dead, < 0 an
 * error (as level_step). s lends its scratch. */
static int transition(cinfer_grammar_state *s, struct mask_shared *ms,
                      int32_t id, unsigned char byte, int32_t *out)
{
    int32_t *nx = ms->il[id].next;
    if (!nx) {
        nx = malloc(256 * sizeof *nx);
        if (!nx)
            return -1;
        for (int i = 0; i < 256; i++)
            nx[i] = NEXT_UNKNOWN;
        ms->il[id].next = nx;
        ms->bytes += 256 * sizeof *nx;
    }
    if (nx[byte] >= 0) {
        *out = nx[byte];
        return 1;
    }
    if (nx[byte] == NEXT_DEAD)
        return 0;
    int r = level_step(s, &ms->il[id].lv, byte, &s->scratch);
    if (r <= 0) {
        if (r == 0)
            nx[byte] = NEXT_DEAD;
        return r;
    }
    int32_t to = intern(ms, &s->scratch); /* ms->il may move */
    if (to < 0)
        return -1;
    ms->il[id].next[byte] = to;
    *out = to;
    return 1;
}

static void mask_error(int r)
{
    if (r == -1)
        cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
    else
        cinfer_set_error(CINFER_E_RANGE,
                         "grammar: more than %d parse stacks (the grammar is "
                         "too ambiguous here)",
                         CINFER_GRAMMAR_MAX_STACKS);
}

/* The sorted walk over interned levels from level id0. -3 when the levels
 * interned passed the hard bound (the caller starts again on the memoized
 * walk), other negatives as level_step. */
static int64_t walk_interned(cinfer_grammar_state *s, struct mask_shared *ms,
                             const cinfer_grammar_vocab *v, int32_t id0,
                             uint8_t *allowed)
{
    int32_t *lid = s->lid;
    lid[0] = id0;
    uint32_t valid = 0, dead = 0;
    int64_t count = 0;
    for (int32_t i = 0; i < v->n; i++) {
        int32_t t = v->order[i];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
        uint32_t len = v->off[t + 1] - v->off[t];
        uint32_t common = v->lcp[i];
        if (dead && common >= dead) {
            allowed[t] = 0; /* it starts with the dead prefix */
            continue;
        }
        dead = 0;
        uint32_t d = common < valid ? common : valid;
        int ok = len > 0;
        while (ok && d < len) {
            int r = transition(s, ms, lid[d], b[d], &lid[d + 1]);
            if (r < 0)
                return r;
            if (!r) {
                ok = 0;
                dead = d + 1;
                break;
            }
            d++;
        }
        if (ms->bytes > INTERN_HARD_BYTES)
            return -3;
        valid = d;
        allowed[t] = (uint8_t)ok;
        count += ok;
    }
    return count;
}

static struct mask_memo *mask_memo_find(struct mask_shared *ms,
                                        const cinfer_grammar_vocab *v,
                                        int32_t id)
{
    for (int i = 0; i < MASK_MEMO; i++)
        if (ms->mm[i].id == id && ms->mm[i].vocab == v->serial)
            return &ms->mm[i];
    return NULL;
}

static void mask_memo_put(struct mask_shared *ms,
                          const cinfer_grammar_vocab *v, int32_t id,
                          const uint8_t *allowed, int64_t count)
{
    struct mask_memo *m = &ms->mm[0];
    for (int i = 1; i < MASK_MEMO && m->id >= 0; i++)
        if (ms->mm[i].id < 0 || ms->mm[i].used < m->used)
            m = &ms->mm[i];
    size_t nb = ((size_t)v->n + 7) / 8;
    if (!m->bits || m->n != v->n) {
        uint8_t *bits = realloc(m->bits, nb);
        if (!bits)
            return; /* a memo is an optimisation */
        m->bits = bits;
        m->n = v->n;
    }
    memset(m->bits, 0, nb);
    for (int32_t t = 0; t < v->n; t++)
        m->bits[t >> 3] |= (uint8_t)(allowed[t] << (t & 7));
    m->id = id;
    m->vocab = v->serial;
    m->count = count;
    m->used = ++ms->clock;
}

/* Each byte of bits as eight 0/1 bytes, made once. */
static uint8_t spread[256][8];
static pthread_once_t spread_once = PTHREAD_ONCE_INIT;

static void spread_init(void)
{
    for (int b = 0; b < 256; b++)
        for (int k = 0; k < 8; k++)
            spread[b][k] = (uint8_t)((b >> k) & 1);
}

/* allowed[0..n) from the bits, eight tokens a copy. */
static void mask_unpack(const uint8_t *bits, int32_t n, uint8_t *allowed)
{
    pthread_once(&spread_once, spread_init);
    int32_t t = 0;
    for (; t + 8 <= n; t += 8)
        memcpy(allowed + t, spread[bits[t >> 3]], 8);
    for (; t < n; t++)
        allowed[t] = (bits[t >> 3] >> (t & 7)) & 1;
}

static int64_t mask_locked(cinfer_grammar_state *s, struct mask_shared *ms,
                           const cinfer_grammar_vocab *v, uint8_t *allowed)
{
    if (ms->bytes > INTERN_KEEP_BYTES)
        intern_reset(ms);
    if (s->n_lid < (size_t)v->max_len + 1) {
        int32_t *lid = realloc(s->lid, ((size_t)v->max_len + 1) * sizeof *lid);
        if (!lid) {
            cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
            return -1;
        }
        s->lid = lid;
        s->n_lid = (size_t)v->max_len + 1;
    }
    if (sset_copy(&s->scratch.set, &s->cur)) {
        cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
        return -1;
    }
    memcpy(s->scratch.part, s->part, sizeof s->part);
    s->scratch.n_part = s->n_part;
    int32_t id0 = intern(ms, &s->scratch);
    if (id0 < 0) {
        cinfer_set_error(CINFER_E_NOMEM, "grammar: out of memory");
        return -1;
    }
    struct mask_memo *m = mask_memo_find(ms, v, id0);
    if (m) {
        mask_unpack(m->bits, v->n, allowed);
        m->used = ++ms->clock;
        return m->count;
    }
    int64_t n = walk_interned(s, ms, v, id0, allowed);
    if (n == -3) {
        intern_reset(ms);
        return mask_memoized(s, v, allowed);
    }
    if (n < 0) {
        mask_error((int)n);
        return -1;
    }
    mask_memo_put(ms, v, id0, allowed, n);
    return n;
}

int64_t cinfer_grammar_mask(cinfer_grammar_state *s,
                            const cinfer_grammar_vocab *v, uint8_t *allowed)
{
    struct mask_shared *ms = s->g->ms;
    pthread_mutex_lock(&ms->mu);
    int64_t n = mask_locked(s, ms, v, allowed);
    pthread_mutex_unlock(&ms->mu);
    return n;
}
