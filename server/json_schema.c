/*
 * json_schema.c - JSON schema to GBNF (json_schema.h). One walk over the
 * schema: each object, array, string of a bound, enum and anyOf becomes a
 * rule of its own (r1, r2, ...), each $ref target one rule named once
 * (so recursion is a rule that refers to itself), and the JSON
 * primitives (string, number, ...) are rules written once at the end if
 * something used them. Errors carry the JSON pointer of the schema being
 * compiled.
 */
#include "json_schema.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/grammar.h"

/* ---------------------------------------------------------------------- */
/* the primitives                                                          */
/* ---------------------------------------------------------------------- */

enum { P_SPACE, P_CHAR, P_STRING, P_INTEGRAL, P_INTEGER, P_NUMBER,
       P_BOOLEAN, P_NULL, P_VALUE, P_OBJECT, P_ARRAY, P_N };

static const char *const prim_name[P_N] = {
    "space", "char", "string", "integral", "integer", "number",
    "boolean", "null", "value", "object", "array"};

static const char *const prim_rule[P_N] = {
    "space ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n",
    /* one character of a string: no escaped surrogates, so one char is
     * one code point */
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( "
    "[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )\n",
    "string ::= \"\\\"\" char* \"\\\"\" space\n",
    "integral ::= \"0\" | [1-9] [0-9]{0,15}\n",
    "integer ::= \"-\"? integral space\n",
    "number ::= \"-\"? integral ( \".\" [0-9]{1,16} )? ( [eE] [-+]? "
    "[0-9]{1,3} )? space\n",
    "boolean ::= ( \"true\" | \"false\" ) space\n",
    "null ::= \"null\" space\n",
    "value ::= object | array | string | number | boolean | null\n",
    "object ::= \"{\" space ( string \":\" space value ( \",\" space string "
    "\":\" space value )* )? \"}\" space\n",
    "array ::= \"[\" space ( value ( \",\" space value )* )? \"]\" space\n",
};

/* What each primitive's rule refers to. */
static const unsigned prim_deps[P_N] = {
    [P_CHAR] = 0,
    [P_STRING] = 1u << P_CHAR | 1u << P_SPACE,
    [P_INTEGER] = 1u << P_INTEGRAL | 1u << P_SPACE,
    [P_NUMBER] = 1u << P_INTEGRAL | 1u << P_SPACE,
    [P_BOOLEAN] = 1u << P_SPACE,
    [P_NULL] = 1u << P_SPACE,
    [P_VALUE] = 1u << P_OBJECT | 1u << P_ARRAY | 1u << P_STRING |
                1u << P_NUMBER | 1u << P_BOOLEAN | 1u << P_NULL,
    [P_OBJECT] = 1u << P_SPACE | 1u << P_STRING | 1u << P_VALUE,
    [P_ARRAY] = 1u << P_SPACE | 1u << P_VALUE,
};

/* ---------------------------------------------------------------------- */
/* the compiler's state                                                    */
/* ---------------------------------------------------------------------- */

typedef struct {
    char *v;
    size_t n, cap;
    int oom;
} buf;

typedef struct {
    char *ref;  /* the $ref text */
    char name[24];
} def;

typedef struct {
    json_t *root;
    buf rules;      /* the rules made so far */
    int n_rules;
    unsigned prims; /* primitives used */
    def *defs;
    size_t n_defs, cap_defs;
    char *err;
    size_t errlen;
    int failed;
    int depth;
} sc;

static void bput(buf *b, const char *s, size_t k)
{
    if (b->oom)
        return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + k + 1)
            cap *= 2;
        char *v = realloc(b->v, cap);
        if (!v) {
            b->oom = 1;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    memcpy(b->v + b->n, s, k);
    b->n += k;
    b->v[b->n] = '\0';
}

static void bputs(buf *b, const char *s) { bput(b, s, strlen(s)); }

static void bprintf(buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k >= 0)
        bput(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* Fails the compile with the schema's pointer and a message; returns
 * NULL so a visit can `return fail(...)`. */
static char *fail(sc *c, const char *path, const char *fmt, ...)
{
    if (c->failed)
        return NULL;
    c->failed = 1;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* a deep pointer keeps its two ends, so the reason still fits */
    size_t pl = strlen(path);
    if (c->errlen && pl > 120)
        snprintf(c->err, c->errlen, "json_schema: %.50s...%s: %s", path,
                 path + pl - 60, what);
    else if (c->errlen)
        snprintf(c->err, c->errlen, "json_schema: %s: %s", path, what);
    return NULL;
}

static char *oom(sc *c, const char *path)
{
    return fail(c, path, "out of memory");
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* A primitive's name, marking it and what it needs as used. */
static char *use(sc *c, int p)
{
    unsigned todo = 1u << p;
    while (todo & ~c->prims) {
        unsigned add = todo & ~c->prims;
        c->prims |= add;
        for (int i = 0; i < P_N; i++)
            if (add & (1u << i))
                todo |= prim_deps[i];
    }
    return dup_str(prim_name[p]);
}

/* A new rule with this body; its name (malloc'd). Takes body. */
static char *add_rule(sc *c, char *body, const char *path)
{
    if (!body)
        return NULL;
    char name[24];
    snprintf(name, sizeof name, "r%d", ++c->n_rules);
    bprintf(&c->rules, "%s ::= ", name);
    bputs(&c->rules, body);
    bputs(&c->rules, "\n");
    free(body);
    char *n = dup_str(name);
    return n && !c->rules.oom ? n : (free(n), oom(c, path));
}

/* path + "/" + token, escaped as a JSON pointer (~0, ~1). */
static char *child_path(const char *path, const char *token)
{
    buf b = {0};
    bputs(&b, path);
    bputs(&b, "/");
    for (const char *t = token; *t; t++)
        bputs(&b, *t == '~' ? "~0" : *t == '/' ? "~1" : (char[2]){*t, 0});
    return b.oom ? (free(b.v), NULL) : b.v;
}

static char *child_index(const char *path, const char *key, size_t i)
{
    char t[32];
    snprintf(t, sizeof t, "%zu", i);
    char *p = child_path(path, key);
    char *q = p ? child_path(p, t) : NULL;
    free(p);
    return q;
}

/* A JSON text as a GBNF literal (quoted, escaped). */
static void put_literal(buf *b, const char *text)
{
    bputs(b, "\"");
    for (const unsigned char *t = (const unsigned char *)text; *t; t++) {
        if (*t == '"' || *t == '\\') {
            char e[3] = {'\\', (char)*t, 0};
            bputs(b, e);
        } else if (*t < 0x20) {
            bprintf(b, "\\x%02X", *t);
        } else {
            bput(b, (const char *)t, 1);
        }
    }
    bputs(b, "\"");
}

/* ---------------------------------------------------------------------- */
/* keywords                                                                */
/* ---------------------------------------------------------------------- */

static const char *const known[] = {
    "type", "properties", "required", "additionalProperties", "items",
    "minItems", "maxItems", "enum", "const", "pattern", "minLength",
    "maxLength", "anyOf", "$ref",
    /* annotations and containers, ignored */
    "$defs", "definitions", "title", "description", "$schema", "$id",
    "$comment", "examples", "default", "deprecated", "readOnly",
    "writeOnly", NULL};

static int is_known(const char *k)
{
    for (int i = 0; known[i]; i++)
        if (strcmp(k, known[i]) == 0)
            return 1;
    return 0;
}

static char *visit(sc *c, json_t *s, const char *path);

/* A non-negative count keyword (minItems, ...): its value, `dflt` when
 * absent, -2 after a failure. */
static long count_kw(sc *c, json_t *s, const char *kw, long dflt,
                     const char *path)
{
    json_t *v = json_object_get(s, kw);
    if (!v)
        return dflt;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : -1;
    if (d < 0 || d != (double)(long long)d) {
        fail(c, path, "'%s' must be a non-negative integer", kw);
        return -2;
    }
    if (d > CINFER_JSON_SCHEMA_MAX_REPEAT) {
        fail(c, path, "'%s' of %.0f is above %d", kw, d,
             CINFER_JSON_SCHEMA_MAX_REPEAT);
        return -2;
    }
    return (long)d;
}

/* " {min,max}" for a repetition, max < 0 unbounded. */
static void put_bounds(buf *b, long min, long max)
{
    if (max < 0)
        bprintf(b, "{%ld,}", min);
    else
        bprintf(b, "{%ld,%ld}", min, max);
}

/* ---------------------------------------------------------------------- */
/* the types                                                               */
/* ---------------------------------------------------------------------- */

/* A json value as one alternative: its compact text, then space. */
static int put_value_literal(sc *c, buf *b, json_t *v, const char *path)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        oom(c, path);
        return 0;
    }
    put_literal(b, text);
    free(text);
    free(use(c, P_SPACE));
    bputs(b, " space");
    return 1;
}

static int type_is(const char *type, json_t *v)
{
    if (!strcmp(type, "string"))
        return json_is_string(v);
    if (!strcmp(type, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) &&
                json_real_value(v) == (double)(long long)json_real_value(v));
    if (!strcmp(type, "number"))
        return json_is_number(v);
    if (!strcmp(type, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(type, "null"))
        return json_is_null(v);
    if (!strcmp(type, "object"))
        return json_is_object(v);
    if (!strcmp(type, "array"))
        return json_is_array(v);
    return 0;
}

/* Whether v is of type (a name, an array of names, or NULL: any). */
static int type_matches(json_t *type, json_t *v)
{
    if (json_is_string(type))
        return type_is(json_string_value(type), v);
    if (!json_is_array(type))
        return 1;
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t)
    {
        if (json_is_string(t) && type_is(json_string_value(t), v))
            return 1;
    }
    return 0;
}

/* enum / const, the values of the schema's type among them. */
static char *visit_enum(sc *c, json_t *s, const char *path)
{
    json_t *type = json_object_get(s, "type");
    json_t *cv = json_object_get(s, "const");
    json_t *ev = json_object_get(s, "enum");
    buf b = {0};
    int n = 0;
    if (cv && type_matches(type, cv)) {
        if (!put_value_literal(c, &b, cv, path))
            return free(b.v), NULL;
        n++;
    }
    if (ev && !cv) {
        if (!json_is_array(ev) || json_array_size(ev) == 0) {
            free(b.v);
            return fail(c, path, "'enum' must be a non-empty array");
        }
        size_t i;
        json_t *x;
        json_array_foreach(ev, i, x)
        {
            if (!type_matches(type, x))
                continue;
            if (n++)
                bputs(&b, " | ");
            if (!put_value_literal(c, &b, x, path))
                return free(b.v), NULL;
        }
    }
    if (!n) {
        free(b.v);
        return fail(c, path, "no value of '%s' is of the schema's type",
                    cv ? "const" : "enum");
    }
    if (b.oom)
        return free(b.v), oom(c, path);
    return add_rule(c, b.v, path);
}

static char *visit_string(sc *c, json_t *s, const char *path)
{
    json_t *pat = json_object_get(s, "pattern");
    long min = count_kw(c, s, "minLength", 0, path);
    long max = count_kw(c, s, "maxLength", -1, path);
    if (min == -2 || max == -2)
        return NULL;
    if (max >= 0 && max < min)
        return fail(c, path, "'maxLength' is below 'minLength'");
    if (pat) {
        if (!json_is_string(pat))
            return fail(c, path, "'pattern' must be a string");
        if (min > 0 || max >= 0)
            return fail(c, path,
                        "'pattern' with 'minLength' or 'maxLength' is not "
                        "supported");
        char *expr = NULL;
        if (cinfer_grammar_regex_to_gbnf(json_string_value(pat),
                                         json_string_length(pat), 1,
                                         &expr) != CINFER_OK)
            return fail(c, path, "'pattern': %s", cinfer_last_error());
        buf b = {0};
        free(use(c, P_SPACE));
        bputs(&b, "\"\\\"\" ");
        bputs(&b, expr);
        bputs(&b, " \"\\\"\" space");
        free(expr);
        if (b.oom)
            return free(b.v), oom(c, path);
        return add_rule(c, b.v, path);
    }
    if (min == 0 && max < 0)
        return use(c, P_STRING);
    buf b = {0};
    free(use(c, P_CHAR));
    free(use(c, P_SPACE));
    bputs(&b, "\"\\\"\" char");
    put_bounds(&b, min, max);
    bputs(&b, " \"\\\"\" space");
    if (b.oom)
        return free(b.v), oom(c, path);
    return add_rule(c, b.v, path);
}

static char *visit_array(sc *c, json_t *s, const char *path)
{
    json_t *items = json_object_get(s, "items");
    long min = count_kw(c, s, "minItems", 0, path);
    long max = count_kw(c, s, "maxItems", -1, path);
    if (min == -2 || max == -2)
        return NULL;
    if (max >= 0 && max < min)
        return fail(c, path, "'maxItems' is below 'minItems'");
    char *item;
    if (!items) {
        item = use(c, P_VALUE);
    } else if (json_is_array(items)) {
        return fail(c, path, "'items' as an array (tuples) is not supported");
    } else {
        char *p = child_path(path, "items");
        if (!p)
            return oom(c, path);
        item = visit(c, items, p);
        free(p);
    }
    if (!item)
        return NULL;
    buf b = {0};
    free(use(c, P_SPACE));
    bputs(&b, "\"[\" space ");
    if (max != 0) {
        if (min == 0)
            bputs(&b, "( ");
        bputs(&b, item);
        long lo = min > 0 ? min - 1 : 0, hi = max < 0 ? -1 : max - 1;
        if (hi != 0) {
            bputs(&b, " ( \",\" space ");
            bputs(&b, item);
            bputs(&b, " )");
            put_bounds(&b, lo, hi);
        }
        if (min == 0)
            bputs(&b, " )?");
        bputs(&b, " ");
    }
    bputs(&b, "\"]\" space");
    free(item);
    if (b.oom)
        return free(b.v), oom(c, path);
    return add_rule(c, b.v, path);
}

typedef struct {
    const char *key;
    json_t *schema; /* NULL: any value */
    int required;
    char *sym;      /* the value's rule */
} prop;

/* The members from i on as rules, i from n down to 0: names[2 * i +
 * first] (first = no comma before the next member written). Linear in
 * the members: each optional one is "it, then the rest" or "the rest". */
static int members(sc *c, prop *p, size_t n, char **names, const char *path)
{
    for (size_t i = n + 1; i-- > 0;) {
        for (int first = 0; first < 2; first++) {
            buf b = {0};
            if (i == n) {
                bputs(&b, "\"\"");
            } else {
                if (!p[i].required)
                    bputs(&b, "( ");
                if (!first)
                    bputs(&b, "\",\" space ");
                json_t *k = json_string(p[i].key);
                char *kt = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
                json_decref(k);
                if (!kt) {
                    free(b.v);
                    oom(c, path);
                    return 0;
                }
                put_literal(&b, kt);
                free(kt);
                bprintf(&b, " space \":\" space %s %s", p[i].sym,
                        names[2 * (i + 1)]);
                if (!p[i].required)
                    bprintf(&b, " | %s )", names[2 * (i + 1) + first]);
            }
            if (b.oom) {
                free(b.v);
                oom(c, path);
                return 0;
            }
            names[2 * i + first] = add_rule(c, b.v, path);
            if (!names[2 * i + first])
                return 0;
        }
    }
    return 1;
}

static char *visit_object(sc *c, json_t *s, const char *path)
{
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, path, "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail(c, path, "'required' must be an array");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, path,
                    "'additionalProperties' must be a boolean or a schema");
    size_t n_props = props ? json_object_size(props) : 0;
    size_t n_req = req ? json_array_size(req) : 0;
    free(use(c, P_SPACE));
    if (n_props == 0 && n_req == 0) {
        if (addl && json_is_false(addl)) {
            buf b = {0};
            bputs(&b, "\"{\" space \"}\" space");
            return b.oom ? (free(b.v), oom(c, path)) : add_rule(c, b.v, path);
        }
        if (!addl || json_is_true(addl))
            return use(c, P_OBJECT);
        char *p = child_path(path, "additionalProperties");
        char *val = p ? visit(c, addl, p) : oom(c, path);
        free(p);
        if (!val)
            return NULL;
        free(use(c, P_STRING));
        buf b = {0};
        bprintf(&b,
                "\"{\" space ( string \":\" space %s ( \",\" space string "
                "\":\" space %s )* )? \"}\" space",
                val, val);
        free(val);
        return b.oom ? (free(b.v), oom(c, path)) : add_rule(c, b.v, path);
    }
    prop *p = calloc(n_props + n_req + 1, sizeof *p);
    char **names = calloc(2 * (n_props + n_req + 1), sizeof *names);
    size_t n = 0;
    char *out = NULL;
    if (!p || !names) {
        oom(c, path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v)
    {
        p[n].key = key;
        p[n].schema = v;
        n++;
    }
    for (size_t i = 0; i < n_req; i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            char *q = child_index(path, "required", i);
            fail(c, q ? q : path, "a required name must be a string");
            free(q);
            goto done;
        }
        size_t j = 0;
        while (j < n && strcmp(p[j].key, json_string_value(r)) != 0)
            j++;
        if (j == n) { /* required, not described: any value */
            p[n].key = json_string_value(r);
            n++;
        }
        p[j].required = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!p[i].schema) {
            p[i].sym = use(c, P_VALUE);
        } else {
            char *pp = child_path(path, "properties");
            char *q = pp ? child_path(pp, p[i].key) : NULL;
            free(pp);
            p[i].sym = q ? visit(c, p[i].schema, q) : oom(c, path);
            free(q);
        }
        if (!p[i].sym)
            goto done;
    }
    if (members(c, p, n, names, path)) {
        buf b = {0};
        bprintf(&b, "\"{\" space %s \"}\" space", names[1]);
        out = b.oom ? (free(b.v), oom(c, path)) : add_rule(c, b.v, path);
    }
done:
    for (size_t i = 0; p && i < n; i++)
        free(p[i].sym);
    for (size_t i = 0; names && i < 2 * (n_props + n_req + 1); i++)
        free(names[i]);
    free(p);
    free(names);
    return out;
}

/* The schema as one type of its "type" (or the one implied). */
static char *visit_type(sc *c, json_t *s, const char *type, const char *path)
{
    if (!type)
        return use(c, P_VALUE);
    if (!strcmp(type, "object"))
        return visit_object(c, s, path);
    if (!strcmp(type, "array"))
        return visit_array(c, s, path);
    if (!strcmp(type, "string"))
        return visit_string(c, s, path);
    if (!strcmp(type, "number"))
        return use(c, P_NUMBER);
    if (!strcmp(type, "integer"))
        return use(c, P_INTEGER);
    if (!strcmp(type, "boolean"))
        return use(c, P_BOOLEAN);
    if (!strcmp(type, "null"))
        return use(c, P_NULL);
    return fail(c, path, "unknown type '%s'", type);
}

/* $ref: a JSON pointer into the schema, "#" or "#/...". */
static char *visit_ref(sc *c, json_t *ref, const char *path)
{
    if (!json_is_string(ref))
        return fail(c, path, "'$ref' must be a string");
    const char *r = json_string_value(ref);
    for (size_t i = 0; i < c->n_defs; i++)
        if (strcmp(c->defs[i].ref, r) == 0)
            return dup_str(c->defs[i].name);
    if (r[0] != '#' || (r[1] != '\0' && r[1] != '/'))
        return fail(c, path,
                    "'$ref' \"%.80s\" is not a pointer into this schema "
                    "(\"#/$defs/...\")",
                    r);
    json_t *t = c->root;
    const char *q = r + 1;
    while (t && *q == '/') {
        q++;
        const char *e = strchr(q, '/');
        size_t k = e ? (size_t)(e - q) : strlen(q);
        char *tok = malloc(k + 1);
        if (!tok)
            return oom(c, path);
        size_t m = 0;
        for (size_t i = 0; i < k; i++) {
            if (q[i] == '~' && i + 1 < k && (q[i + 1] == '0' || q[i + 1] == '1')) {
                tok[m++] = q[i + 1] == '0' ? '~' : '/';
                i++;
            } else {
                tok[m++] = q[i];
            }
        }
        tok[m] = '\0';
        if (json_is_object(t)) {
            t = json_object_get(t, tok);
        } else if (json_is_array(t)) {
            char *end;
            long idx = strtol(tok, &end, 10);
            t = *tok && !*end && idx >= 0 ? json_array_get(t, (size_t)idx)
                                          : NULL;
        } else {
            t = NULL;
        }
        free(tok);
        q += k;
    }
    if (!t)
        return fail(c, path, "'$ref' \"%.80s\" resolves to nothing", r);
    if (c->n_defs == c->cap_defs) {
        size_t cap = c->cap_defs ? 2 * c->cap_defs : 8;
        def *d = realloc(c->defs, cap * sizeof *d);
        if (!d)
            return oom(c, path);
        c->defs = d;
        c->cap_defs = cap;
    }
    /* named before its body is made, so the body may refer to it */
    def *d = &c->defs[c->n_defs];
    d->ref = dup_str(r);
    if (!d->ref)
        return oom(c, path);
    snprintf(d->name, sizeof d->name, "r%d", ++c->n_rules);
    c->n_defs++;
    char name[24];
    snprintf(name, sizeof name, "%s", d->name);
    char *tp = dup_str(r);
    char *body = tp ? visit(c, t, tp) : oom(c, path);
    free(tp);
    if (!body)
        return NULL;
    bprintf(&c->rules, "%s ::= %s\n", name, body);
    free(body);
    return c->rules.oom ? oom(c, path) : dup_str(name);
}

static char *visit_any_of(sc *c, json_t *alts, const char *path)
{
    if (!json_is_array(alts) || json_array_size(alts) == 0)
        return fail(c, path, "'anyOf' must be a non-empty array");
    buf b = {0};
    size_t i;
    json_t *x;
    json_array_foreach(alts, i, x)
    {
        char *q = child_index(path, "anyOf", i);
        char *sym = q ? visit(c, x, q) : oom(c, path);
        free(q);
        if (!sym)
            return free(b.v), NULL;
        if (i)
            bputs(&b, " | ");
        bputs(&b, sym);
        free(sym);
    }
    return b.oom ? (free(b.v), oom(c, path)) : add_rule(c, b.v, path);
}

static const char *implied_type(json_t *s)
{
    if (json_object_get(s, "properties") || json_object_get(s, "required") ||
        json_object_get(s, "additionalProperties"))
        return "object";
    if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems"))
        return "array";
    if (json_object_get(s, "pattern") || json_object_get(s, "minLength") ||
        json_object_get(s, "maxLength"))
        return "string";
    return NULL;
}

/* The rule (or primitive) for schema s at path; malloc'd name, or NULL
 * after a failure. */
static char *visit(sc *c, json_t *s, const char *path)
{
    if (c->failed)
        return NULL;
    if (json_is_true(s))
        return use(c, P_VALUE);
    if (json_is_false(s))
        return fail(c, path, "the schema false admits no value");
    if (!json_is_object(s))
        return fail(c, path, "a schema must be an object or a boolean");
    if (++c->depth > CINFER_JSON_SCHEMA_MAX_DEPTH) {
        c->depth--;
        return fail(c, path, "schemas nest more than %d deep",
                    CINFER_JSON_SCHEMA_MAX_DEPTH);
    }
    char *out = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v)
    {
        if (!is_known(key)) {
            out = fail(c, path, "unsupported keyword '%s'", key);
            goto done;
        }
    }
    json_t *ref = json_object_get(s, "$ref"), *any = json_object_get(s, "anyOf");
    json_t *type = json_object_get(s, "type");
    if (ref && (any || type || implied_type(s) ||
                json_object_get(s, "enum") || json_object_get(s, "const"))) {
        out = fail(c, path, "'$ref' beside other keywords is not supported");
    } else if (ref) {
        out = visit_ref(c, ref, path);
    } else if (any) {
        if (type || implied_type(s) || json_object_get(s, "enum") ||
            json_object_get(s, "const"))
            out = fail(c, path,
                       "'anyOf' beside other keywords is not supported");
        else
            out = visit_any_of(c, any, path);
    } else if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        out = visit_enum(c, s, path);
    } else if (json_is_array(type)) {
        if (json_array_size(type) == 0) {
            out = fail(c, path, "'type' is an empty array");
            goto done;
        }
        buf b = {0};
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t)
        {
            if (!json_is_string(t)) {
                free(b.v);
                out = fail(c, path, "'type' must name types");
                goto done;
            }
            char *sym = visit_type(c, s, json_string_value(t), path);
            if (!sym) {
                free(b.v);
                goto done;
            }
            if (i)
                bputs(&b, " | ");
            bputs(&b, sym);
            free(sym);
        }
        out = b.oom ? (free(b.v), oom(c, path)) : add_rule(c, b.v, path);
    } else if (type && !json_is_string(type)) {
        out = fail(c, path, "'type' must be a string or an array");
    } else {
        out = visit_type(c, s, type ? json_string_value(type) : implied_type(s),
                         path);
    }
done:
    c->depth--;
    return out;
}

/* ---------------------------------------------------------------------- */
/* entry points                                                            */
/* ---------------------------------------------------------------------- */

/* The GBNF, checked to compile; the compiled grammar in *compiled when it
 * is not NULL. */
static int to_gbnf(const char *schema, size_t len, char **gbnf_out,
                   cinfer_grammar **compiled, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    if (!gbnf_out) {
        if (errlen)
            snprintf(err, errlen, "json_schema: no output pointer");
        return -1;
    }
    *gbnf_out = NULL;
    json_error_t je;
    json_t *root = json_loadb(schema ? schema : "", schema ? len : 0,
                              JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (errlen)
            snprintf(err, errlen,
                     "json_schema: not JSON (line %d, column %d: %s)",
                     je.line, je.column, je.text);
        return -1;
    }
    sc c;
    memset(&c, 0, sizeof c);
    c.root = root;
    c.err = err;
    c.errlen = errlen;
    char *top = visit(&c, root, "#");
    buf g = {0};
    if (top) {
        bprintf(&g, "root ::= %s\n", top);
        if (c.rules.n)
            bputs(&g, c.rules.v);
        for (int i = 0; i < P_N; i++)
            if (c.prims & (1u << i))
                bputs(&g, prim_rule[i]);
        if (g.oom)
            oom(&c, "#");
    }
    free(top);
    free(c.rules.v);
    for (size_t i = 0; i < c.n_defs; i++)
        free(c.defs[i].ref);
    free(c.defs);
    json_decref(root);
    if (!c.failed) {
        cinfer_grammar *gr = NULL;
        if (cinfer_grammar_compile(g.v, g.n, "root", &gr) != CINFER_OK) {
            /* a reference cycle that writes nothing is left recursion */
            c.failed = 1;
            if (errlen)
                snprintf(err, errlen, "json_schema: #: the schema compiles "
                         "to a grammar that is refused (%s)",
                         cinfer_last_error());
        }
        if (compiled && !c.failed)
            *compiled = gr;
        else
            cinfer_grammar_destroy(gr);
    }
    if (c.failed) {
        free(g.v);
        return -1;
    }
    *gbnf_out = g.v;
    return 0;
}

int cinfer_json_schema_to_gbnf(const char *schema, size_t len,
                               char **gbnf_out, char *err, size_t errlen)
{
    return to_gbnf(schema, len, gbnf_out, NULL, err, errlen);
}

cinfer_status cinfer_json_schema_compile(void *ctx, const char *schema,
                                         size_t len, cinfer_grammar **out)
{
    (void)ctx;
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "json_schema: out is NULL");
    *out = NULL;
    char err[320], *gbnf = NULL;
    if (to_gbnf(schema, len, &gbnf, out, err, sizeof err) != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s", err);
    free(gbnf);
    return CINFER_OK;
}

const char *cinfer_json_object_gbnf(void)
{
    return "root ::= object\n"
           "object ::= \"{\" space ( string \":\" space value ( \",\" space "
           "string \":\" space value )* )? \"}\" space\n"
           "value ::= object | array | string | number | boolean | null\n"
           "array ::= \"[\" space ( value ( \",\" space value )* )? \"]\" "
           "space\n"
           "string ::= \"\\\"\" char* \"\\\"\" space\n"
           "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
           "( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} "
           ") )\n"
           "integral ::= \"0\" | [1-9] [0-9]{0,15}\n"
           "number ::= \"-\"? integral ( \".\" [0-9]{1,16} )? ( [eE] [-+]? "
           "[0-9]{1,3} )? space\n"
           "boolean ::= ( \"true\" | \"false\" ) space\n"
           "null ::= \"null\" space\n"
           "space ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n";
}
