/*
 * test_json_schema.c - JSON schemas compiled to GBNF (server/json_schema.c)
 * and judged by the engine's grammar matcher: for a dozen schemas with
 * nesting, enums, arrays, optional fields, $defs (recursive too), anyOf
 * and patterns, documents that validate are whole sentences and documents
 * that do not are refused or left incomplete; random walks through each
 * grammar's masks give JSON that jansson parses; whitespace is bounded;
 * unsupported keywords and uncompilable schemas are refused naming the
 * keyword and its JSON pointer.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without the server library");
}
#else

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "engine/grammar_cache.h"
#include "server/json_schema.h"

static cinfer_grammar *schema_grammar(const char *schema)
{
    char err[300], *gbnf = NULL;
    int r = cinfer_json_schema_to_gbnf(schema, strlen(schema), &gbnf, err,
                                       sizeof err);
    if (r != 0)
        fprintf(stderr, "  schema %s: %s\n", schema, err);
    CHECK_EQ_INT(r, 0);
    if (r != 0)
        return NULL;
    cinfer_grammar *g = NULL;
    CHECK_OK(cinfer_grammar_compile(gbnf, strlen(gbnf), "root", &g));
    free(gbnf);
    return g;
}

/* 1: a whole sentence, 0: a prefix, -1: refused. */
static int judge(const cinfer_grammar *g, const char *doc)
{
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(g, &s));
    if (!s)
        return -1;
    int r = cinfer_grammar_accept(s, doc, strlen(doc)) != CINFER_OK
                ? -1
                : cinfer_grammar_complete(s);
    cinfer_grammar_state_destroy(s);
    return r;
}

typedef struct {
    const char *schema;
    const char *valid[6];
    const char *invalid[8];
} schema_case;

static const schema_case cases[] = {
    {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": "
     "\"string\"}, \"age\": {\"type\": \"integer\"}, \"email\": {\"type\": "
     "\"string\"}}, \"required\": [\"name\", \"age\"], "
     "\"additionalProperties\": false}",
     {"{\"name\": \"Ada\", \"age\": 36}",
      "{\"name\":\"Ada\",\"age\":-1,\"email\":\"a@b.c\"}",
      "{\n  \"name\": \"A\\\"d\\u00e9\",\n  \"age\": 0\n}",
      "{\"name\": \"\", \"age\": 7} "},
     {"{\"age\": 36, \"name\": \"Ada\"}", "{\"name\": \"Ada\"}",
      "{\"name\": \"Ada\", \"age\": 3.5}", "{\"name\": \"Ada\", \"age\": 01}",
      "{\"name\": \"Ada\", \"age\": 1, \"x\": 2}", " {\"name\":\"a\",\"age\":1}",
      "{\"name\": \"a\nb\", \"age\": 1}"}},
    {"{\"type\": \"string\", \"enum\": [\"red\", \"green\", \"blue\"]}",
     {"\"red\"", "\"blue\" "},
     {"\"Red\"", "\"redd\"", "red", "\"\""}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"number\"}, \"minItems\": "
     "1, \"maxItems\": 3}",
     {"[1]", "[1.5, -2e10, 0.25]", "[ 3 ,4]"},
     {"[]", "[1, 2, 3, 4]", "[1,]", "[\"1\"]", "[.5]", "[1e]"}},
    {"{\"type\": \"object\", \"properties\": {\"address\": {\"type\": "
     "\"object\", \"properties\": {\"street\": {\"type\": \"string\"}, "
     "\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}, \"tags\": "
     "{\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, "
     "\"required\": [\"address\"]}",
     {"{\"address\": {\"city\": \"Paris\"}}",
      "{\"address\": {\"street\": \"Rue\", \"city\": \"Paris\"}, \"tags\": []}",
      "{\"address\": {\"city\": \"P\"}, \"tags\": [\"a\", \"b\"]}"},
     {"{}", "{\"tags\": []}", "{\"address\": {}}",
      "{\"address\": {\"city\": 1}}",
      "{\"address\": {\"city\": \"P\"}, \"tags\": [1]}"}},
    {"{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": "
     "{\"value\": {\"type\": \"integer\"}, \"children\": {\"type\": "
     "\"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, \"required\": "
     "[\"value\", \"children\"]}}, \"$ref\": \"#/$defs/node\"}",
     {"{\"value\": 1, \"children\": []}",
      "{\"value\": 1, \"children\": [{\"value\": 2, \"children\": "
      "[{\"value\": 3, \"children\": []}]}, {\"value\": 4, \"children\": "
      "[]}]}"},
     {"{\"value\": 1}", "{\"value\": 1, \"children\": [{\"value\": 2}]}",
      "{\"value\": 1, \"children\": [1]}"}},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}, "
     "{\"type\": \"null\"}]}",
     {"\"x\"", "42", "null"},
     {"true", "1.5", "[]", "nul"}},
    {"{\"type\": [\"string\", \"null\"], \"maxLength\": 3}",
     {"\"abc\"", "null", "\"\""},
     {"\"abcd\"", "1", "false"}},
    {"{\"const\": {\"a\": [1, true, \"x\"]}}",
     {"{\"a\":[1,true,\"x\"]}"},
     {"{\"a\": [1, true, \"x\"]}", "{\"a\":[1,true]}", "{}"}},
    {"{\"type\": \"string\", \"pattern\": \"^[A-Z]{2}-\\\\d{3}$\"}",
     {"\"AB-123\"", "\"ZZ-000\" "},
     {"\"AB-12\"", "\"ab-123\"", "\"AB-1234\"", "\"AB123\""}},
    {"{\"type\": \"string\", \"pattern\": \"a\\\"b.c\"}",
     {"\"a\\\"bxc\"", "\"a\\\"b\xc3\xa9" "c\""},
     {"\"a\"bxc\"", "\"a\\\"b\\\"c\"", "\"a\\\"b\\\\c\""}},
    {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 4}",
     {"\"ab\"", "\"abcd\"", "\"\\u00e9\\n\"", "\"\xc3\xa9\xe2\x82\xac\""},
     {"\"a\"", "\"abcde\"", "\"\\ud83d\\ude00\""}},
    {"{\"type\": \"object\", \"additionalProperties\": {\"type\": "
     "\"integer\"}}",
     {"{}", "{\"a\": 1, \"b\": 2}", "{\"\": -5}"},
     {"{\"a\": \"1\"}", "{\"a\": 1,}", "{a: 1}"}},
    {"{\"type\": \"object\"}",
     {"{}", "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}"},
     {"[]", "{\"a\"}", "1"}},
    {"{\"enum\": [1, \"x\", null, true, [2]]}",
     {"1", "\"x\"", "null", "true", "[2]"},
     {"2", "false", "\"y\"", "[2, 3]"}},
    {"{\"required\": [\"id\"], \"properties\": {\"opt1\": {\"type\": "
     "\"boolean\"}, \"opt2\": {\"type\": \"boolean\"}}}",
     {"{\"opt1\": true, \"opt2\": false, \"id\": {\"any\": 1}}",
      "{\"id\": 1}", "{\"opt2\": true, \"id\": \"x\"}"},
     {"{}", "{\"opt1\": true}", "{\"opt2\": true, \"opt1\": true, \"id\": 1}",
      "{\"opt1\": true,, \"id\": 1}", "{, \"id\": 1}"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
     "\"integer\"}, \"b\": {\"type\": \"integer\"}}}",
     {"{}", "{\"a\": 1}", "{\"b\": 2}", "{\"a\": 1, \"b\": 2}"},
     {"{,}", "{\"b\": 2, \"a\": 1}", "{\"a\": 1,}", "{\"a\": 1 \"b\": 2}"}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"maxItems\": "
     "0}",
     {"[]", "[ ]"},
     {"[true]"}},
};

static void test_documents_judged(void)
{
    int n_valid = 0, n_invalid = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cinfer_grammar *g = schema_grammar(cases[i].schema);
        if (!g)
            continue;
        for (int k = 0; k < 6 && cases[i].valid[k]; k++) {
            int r = judge(g, cases[i].valid[k]);
            if (r != 1)
                fprintf(stderr, "  case %zu: valid %s judged %d\n", i,
                        cases[i].valid[k], r);
            CHECK_EQ_INT(r, 1);
            n_valid++;
        }
        for (int k = 0; k < 8 && cases[i].invalid[k]; k++) {
            int r = judge(g, cases[i].invalid[k]);
            if (r == 1)
                fprintf(stderr, "  case %zu: invalid %s accepted\n", i,
                        cases[i].invalid[k]);
            CHECK(r != 1);
            n_invalid++;
        }
        cinfer_grammar_destroy(g);
    }
    fprintf(stderr, "  %zu schemas: %d valid documents accepted, %d invalid "
                    "refused\n",
            sizeof cases / sizeof *cases, n_valid, n_invalid);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random walks through each schema's grammar over a vocabulary of single
 * characters and JSON pieces, picking among the tokens the mask allows
 * (structural ones more often, so outputs end): every output that ends
 * parses as JSON. Whitespace runs stay bounded. */
static void test_random_outputs_parse(void)
{
    static const char *pieces[] = {
        "\"", "{", "}", "[", "]", ",", ":", " ", "\n", "\t", "true",
        "false", "null", "0", "1", "7", "-", ".", "e", "\\", "\\n", "\\u00e9",
        "\", \"", "\": ", "  ", "\n  ", "AB-", "a", "Z", "x", "\xc3\xa9",
    };
    enum { NP = sizeof pieces / sizeof *pieces };
    char bytes[4096];
    uint32_t off[NP + 128];
    uint32_t used = 0;
    int32_t n = 0;
    for (int i = 0; i < NP; i++) {
        off[n++] = used;
        memcpy(bytes + used, pieces[i], strlen(pieces[i]));
        used += (uint32_t)strlen(pieces[i]);
    }
    for (int c = 0x20; c < 0x7f; c++) {
        off[n++] = used;
        bytes[used++] = (char)c;
    }
    off[n] = used;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off, n, &v));
    uint8_t mask[NP + 128];
    int finished = 0, walks = 0, max_ws = 0;
    for (size_t i = 0; v && i < sizeof cases / sizeof *cases; i++) {
        cinfer_grammar *g = schema_grammar(cases[i].schema);
        if (!g)
            continue;
        for (int w = 0; w < 20; w++) {
            cinfer_grammar_state *s = NULL;
            CHECK_OK(cinfer_grammar_state_create(g, &s));
            char out[8192];
            size_t len = 0;
            int ws = 0;
            walks++;
            for (int step = 0; s && step < 600; step++) {
                if (cinfer_grammar_complete(s) &&
                    (next_rand() % 4 == 0 || cinfer_grammar_done(s))) {
                    out[len] = '\0';
                    json_error_t je;
                    json_t *j = json_loads(out, JSON_DECODE_ANY, &je);
                    if (!j)
                        fprintf(stderr, "  case %zu: %s does not parse: %s\n",
                                i, out, je.text);
                    CHECK(j != NULL);
                    json_decref(j);
                    finished++;
                    break;
                }
                int64_t k = cinfer_grammar_mask(s, v, mask);
                CHECK(k > 0); /* never a dead end */
                if (k <= 0)
                    break;
                int64_t total = 0;
                for (int32_t t = 0; t < n; t++)
                    total += mask[t] ? (t < NP ? 40 : 1) : 0;
                int64_t pick = (int64_t)(next_rand() % (uint64_t)total);
                int32_t t = 0;
                for (; t < n; t++) {
                    pick -= mask[t] ? (t < NP ? 40 : 1) : 0;
                    if (pick < 0)
                        break;
                }
                size_t l = off[t + 1] - off[t];
                if (len + l >= sizeof out - 1)
                    break;
                CHECK_OK(cinfer_grammar_accept(s, bytes + off[t], l));
                for (size_t q = 0; q < l; q++) {
                    char ch = bytes[off[t] + q];
                    ws = ch == ' ' || ch == '\n' || ch == '\t' ? ws + 1 : 0;
                    max_ws = ws > max_ws ? ws : max_ws;
                }
                memcpy(out + len, bytes + off[t], l);
                len += l;
            }
            cinfer_grammar_state_destroy(s);
        }
        cinfer_grammar_destroy(g);
    }
    fprintf(stderr, "  %d of %d walks ended in JSON; longest whitespace "
                    "run %d\n",
            finished, walks, max_ws);
    CHECK(finished > walks / 2);
    CHECK(max_ws <= 22 + 40); /* inside strings spaces are text */
    cinfer_grammar_vocab_destroy(v);
}

static void expect_error(const char *schema, const char *want)
{
    char err[300], *gbnf = (char *)"unset";
    int r = cinfer_json_schema_to_gbnf(schema, strlen(schema), &gbnf, err,
                                       sizeof err);
    CHECK_EQ_INT(r, -1);
    CHECK(gbnf == NULL);
    if (r == -1 && !strstr(err, want))
        fprintf(stderr, "  %s: got \"%s\", want \"%s\"\n", schema, err, want);
    CHECK(r == -1 && strstr(err, want) != NULL);
    if (r == 0)
        free(gbnf);
}

static void test_errors_name_keyword_and_path(void)
{
    expect_error("{\"type\": \"object\", \"properties\": {\"age\": {\"type\": "
                 "\"integer\", \"minimum\": 0}}}",
                 "json_schema: #/properties/age: unsupported keyword "
                 "'minimum'");
    expect_error("{\"type\": \"string\", \"format\": \"date-time\"}",
                 "#: unsupported keyword 'format'");
    expect_error("{\"oneOf\": [{\"type\": \"string\"}]}",
                 "unsupported keyword 'oneOf'");
    expect_error("{\"type\": \"array\", \"items\": {\"anyOf\": [{\"type\": "
                 "\"string\"}, {\"allOf\": []}]}}",
                 "#/items/anyOf/1: unsupported keyword 'allOf'");
    expect_error("{\"properties\": {\"a/b~c\": {\"not\": {}}}}",
                 "#/properties/a~1b~0c: unsupported keyword 'not'");
    expect_error("{\"$ref\": \"#/$defs/missing\"}",
                 "'$ref' \"#/$defs/missing\" resolves to nothing");
    expect_error("{\"$ref\": \"http://example.com/s.json\"}",
                 "is not a pointer into this schema");
    expect_error("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": "
                 "{\"$ref\": \"#/$defs/a\"}}, \"$ref\": \"#/$defs/a\"}",
                 "left-recursive");
    expect_error("{\"type\": \"string\", \"pattern\": \"(a)\\\\1\"}",
                 "#: 'pattern': regex: at offset 4: backreferences");
    expect_error("{\"type\": \"string\", \"pattern\": \"[\\\"]\"}",
                 "a class of only characters a JSON string must escape");
    expect_error("{\"type\": \"integer\", \"enum\": [\"a\"]}",
                 "no value of 'enum' is of the schema's type");
    expect_error("{\"type\": \"array\", \"maxItems\": 100000}",
                 "'maxItems' of 100000 is above 1000");
    expect_error("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}",
                 "'maxItems' is below 'minItems'");
    expect_error("{\"type\": \"array\", \"items\": [{}]}", "tuples");
    expect_error("{\"type\": \"decimal\"}", "unknown type 'decimal'");
    expect_error("false", "#: the schema false admits no value");
    expect_error("{\"type\": ", "json_schema: not JSON");
    expect_error("{\"a\": 1, \"a\": 2}", "not JSON");
    expect_error("[]", "a schema must be an object or a boolean");
    /* nesting past the bound */
    char deep[64 * 16 + 64];
    size_t n = 0;
    for (int i = 0; i < 70; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{\"items\":");
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{}");
    for (int i = 0; i < 70; i++)
        deep[n++] = '}';
    deep[n] = '\0';
    expect_error(deep, "schemas nest more than 64 deep");
}

static void test_annotations_and_json_object(void)
{
    cinfer_grammar *g = schema_grammar(
        "{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\", "
        "\"title\": \"T\", \"description\": \"d\", \"type\": \"boolean\", "
        "\"default\": true, \"examples\": [false]}");
    if (g) {
        CHECK_EQ_INT(judge(g, "true"), 1);
        CHECK_EQ_INT(judge(g, "\"true\""), -1);
        cinfer_grammar_destroy(g);
    }
    g = schema_grammar("true");
    if (g) {
        CHECK_EQ_INT(judge(g, "[1, {\"a\": null}]"), 1);
        cinfer_grammar_destroy(g);
    }
    const char *jo = cinfer_json_object_gbnf();
    g = NULL;
    CHECK_OK(cinfer_grammar_compile(jo, strlen(jo), "root", &g));
    if (g) {
        CHECK_EQ_INT(judge(g, "{\"a\": [1, 2.5e-3, \"x\", true, null]}"), 1);
        CHECK_EQ_INT(judge(g, "{}"), 1);
        CHECK(judge(g, "[]") != 1);
        CHECK(judge(g, "\"x\"") != 1);
        CHECK(judge(g, "{\"a\": 1}                         ") != 1);
        cinfer_grammar_destroy(g);
    }
}

/* The server's path: schemas compiled through the grammar cache, keyed by
 * their text; a refused schema is INVALID_ARG with the compiler's
 * message, and json_object is GBNF of its own. */
static void test_through_the_cache(void)
{
    cinfer_grammar_cache *c = NULL;
    CHECK_OK(cinfer_grammar_cache_create(NULL, &c));
    const char *schema = cases[0].schema;
    cinfer_grammar_entry *a = NULL, *b = NULL, *o = NULL;
    CHECK_OK(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
                                      schema, strlen(schema),
                                      cinfer_json_schema_compile, NULL, &a));
    CHECK_OK(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
                                      schema, strlen(schema),
                                      cinfer_json_schema_compile, NULL, &b));
    CHECK(a && a == b);
    if (a)
        CHECK_EQ_INT(judge(cinfer_grammar_entry_grammar(a), cases[0].valid[0]),
                     1);
    const char *bad = "{\"type\": \"number\", \"maximum\": 3}";
    cinfer_grammar_entry *x = NULL;
    CHECK_EQ_INT(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
                                          bad, strlen(bad),
                                          cinfer_json_schema_compile, NULL,
                                          &x),
                 CINFER_E_INVALID_ARG);
    CHECK(x == NULL);
    CHECK(strstr(cinfer_last_error(),
                 "json_schema: #: unsupported keyword 'maximum'") != NULL);
    const char *jo = cinfer_json_object_gbnf();
    CHECK_OK(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_GBNF, jo,
                                      strlen(jo), NULL, NULL, &o));
    if (o)
        CHECK_EQ_INT(judge(cinfer_grammar_entry_grammar(o), "{\"k\": 1}"), 1);
    cinfer_grammar_cache_stats st;
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.entries, 2);
    cinfer_grammar_entry_release(a);
    cinfer_grammar_entry_release(b);
    cinfer_grammar_entry_release(o);
    cinfer_grammar_cache_destroy(c);
}

int main(void)
{
    RUN(test_documents_judged);
    RUN(test_random_outputs_parse);
    RUN(test_errors_name_keyword_and_path);
    RUN(test_annotations_and_json_object);
    RUN(test_through_the_cache);
    return harness_done();
}
#endif
