/*
 * test_grammar.c - GBNF compile and match (engine/grammar.c): sentences
 * accepted byte by byte and split anywhere (inside UTF-8 characters too),
 * near-misses refused, repetition bounds, classes and escapes, the
 * compile errors with their line and column, left recursion refused and
 * right recursion kept, the bounds a client's grammar meets, an output
 * nested ten thousand deep, and mutated grammars that never crash.
 */
#include "engine/gguf.h"
#include "engine/grammar.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static cinfer_grammar *compile(const char *src)
{
    cinfer_grammar *g = NULL;
    cinfer_status st = cinfer_grammar_compile(src, strlen(src), NULL, &g);
    if (st != CINFER_OK)
        fprintf(stderr, "  compile: %s\n", cinfer_last_error());
    CHECK_OK(st);
    return g;
}

/* Whether the whole of text is a sentence, fed in pieces of `chunk` bytes
 * (0 = all at once); -1 when a prefix is refused. */
static int sentence(const cinfer_grammar *g, const char *text, size_t chunk)
{
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(g, &s));
    if (!s)
        return -1;
    size_t n = strlen(text), step = chunk ? chunk : (n ? n : 1);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i += step) {
        size_t k = n - i < step ? n - i : step;
        int allowed = cinfer_grammar_allows(s, text + i, k);
        cinfer_status st = cinfer_grammar_accept(s, text + i, k);
        CHECK_EQ_INT(allowed, st == CINFER_OK); /* allows predicts accept */
        ok = st == CINFER_OK;
    }
    int r = ok ? cinfer_grammar_complete(s) : -1;
    cinfer_grammar_state_destroy(s);
    return r;
}

static void test_alternatives_and_completion(void)
{
    cinfer_grammar *g = compile("root ::= \"yes\" | \"no\" | \"yesno\"\n");
    if (!g)
        return;
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(g, &s));
    CHECK(cinfer_grammar_allows(s, "y", 1));
    CHECK(cinfer_grammar_allows(s, "n", 1));
    CHECK(!cinfer_grammar_allows(s, "x", 1));
    CHECK(!cinfer_grammar_complete(s));
    CHECK_EQ_INT(cinfer_grammar_accept(s, "x", 1), CINFER_E_INVALID_ARG);
    CHECK_OK(cinfer_grammar_accept(s, "ye", 2));
    CHECK(!cinfer_grammar_complete(s));
    CHECK_OK(cinfer_grammar_accept(s, "s", 1));
    CHECK(cinfer_grammar_complete(s));
    CHECK(!cinfer_grammar_done(s)); /* "yesno" may go on */
    CHECK_OK(cinfer_grammar_accept(s, "no", 2));
    CHECK(cinfer_grammar_complete(s));
    CHECK(cinfer_grammar_done(s));
    CHECK(!cinfer_grammar_allows(s, "o", 1));
    cinfer_grammar_state_destroy(s);
    cinfer_grammar_destroy(g);
}

static const char *json_gbnf =
    "# a small JSON\n"
    "root   ::= value\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" |\n"
    "           \"null\")\n"
    "object ::= \"{\" ws ( pair ( \",\" ws pair )* )? \"}\" ws\n"
    "pair   ::= string \":\" ws value\n"
    "array  ::= \"[\" ws ( value ( \",\" ws value )* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] )* "
    "\"\\\"\" ws\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ws\n"
    "ws     ::= [ \\t\\n]*\n";

static void test_json_sentences_split_anywhere(void)
{
    cinfer_grammar *g = compile(json_gbnf);
    if (!g)
        return;
    const char *good[] = {
        "{\"a\": 1, \"b\": [true, null, -0.5], \"c\": {}}",
        "[]", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", "-12.25",
        "{\"k\": \"esc \\\" \\n\"}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        for (size_t chunk = 0; chunk <= 3; chunk++)
            CHECK_EQ_INT(sentence(g, good[i], chunk), 1);
    /* prefixes are not sentences, near-misses are refused */
    CHECK_EQ_INT(sentence(g, "{\"a\": 1", 1), 0);
    CHECK_EQ_INT(sentence(g, "{\"a\" 1}", 1), -1);
    CHECK_EQ_INT(sentence(g, "[1,]", 1), -1);
    CHECK_EQ_INT(sentence(g, "01", 1), -1);
    CHECK_EQ_INT(sentence(g, "\"tab\there\"", 1), -1); /* control char */
    CHECK_EQ_INT(sentence(g, "\"bad \xc3\x28\"", 1), -1); /* not UTF-8 */
    /* a token that ends inside a character is allowed up to there */
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(g, &s));
    CHECK_OK(cinfer_grammar_accept(s, "\"\xe2", 2));
    CHECK(!cinfer_grammar_complete(s));
    CHECK(cinfer_grammar_allows(s, "\x82", 1));
    CHECK(!cinfer_grammar_allows(s, "A", 1)); /* not a continuation byte */
    CHECK_OK(cinfer_grammar_accept(s, "\x82\xac\"", 3));
    CHECK(cinfer_grammar_complete(s));
    cinfer_grammar_state_destroy(s);
    cinfer_grammar_destroy(g);
}

static void test_classes_escapes_and_any(void)
{
    cinfer_grammar *g = compile("root ::= [a-cx\\x41-\\x42] [^0-9] . "
                                "\"\\u00e9\" [\\U0001F600]\n");
    if (!g)
        return;
    CHECK_EQ_INT(sentence(g, "bZ!\xc3\xa9\xf0\x9f\x98\x80", 1), 1);
    CHECK_EQ_INT(sentence(g, "AZ\n\xc3\xa9\xf0\x9f\x98\x80", 0), 1);
    CHECK_EQ_INT(sentence(g, "dZ", 1), -1);
    CHECK_EQ_INT(sentence(g, "a5", 1), -1);
    CHECK_EQ_INT(sentence(g, "ab!e", 1), -1);
    cinfer_grammar_destroy(g);
}

static void test_repetition_bounds(void)
{
    cinfer_grammar *g = compile("root ::= \"a\"{2,3} \"b\"{0,1} \"c\"{2} "
                                "\"d\"{1,}\n");
    if (!g)
        return;
    CHECK_EQ_INT(sentence(g, "aaccd", 1), 1);
    CHECK_EQ_INT(sentence(g, "aaabccddd", 1), 1);
    CHECK_EQ_INT(sentence(g, "accd", 1), -1);
    CHECK_EQ_INT(sentence(g, "aaaacc", 1), -1);
    CHECK_EQ_INT(sentence(g, "aabbccd", 1), -1);
    CHECK_EQ_INT(sentence(g, "aacccd", 1), -1);
    CHECK_EQ_INT(sentence(g, "aacc", 1), 0);
    cinfer_grammar_destroy(g);
    g = compile("root ::= (\"ab\" | \"c\")+ \"!\"?\n");
    if (!g)
        return;
    CHECK_EQ_INT(sentence(g, "abcab!", 1), 1);
    CHECK_EQ_INT(sentence(g, "c", 1), 1);
    CHECK_EQ_INT(sentence(g, "", 1), 0);
    CHECK_EQ_INT(sentence(g, "a!", 1), -1);
    cinfer_grammar_destroy(g);
}

/* The message names the line and column and says what is wrong. */
static void refused(const char *src, cinfer_status want, const char *words)
{
    cinfer_grammar *g = NULL;
    CHECK_EQ_INT(cinfer_grammar_compile(src, strlen(src), NULL, &g), want);
    CHECK(!g);
    if (!strstr(cinfer_last_error(), words))
        fprintf(stderr, "  %s\n  (wanted \"%s\")\n", cinfer_last_error(),
                words);
    CHECK(strstr(cinfer_last_error(), words) != NULL);
}

static void test_compile_errors(void)
{
    refused("root ::= \"a\" b\n", CINFER_E_INVALID_ARG,
            "line 1, column 14: rule 'b' is used but never defined");
    refused("start ::= \"a\"\n", CINFER_E_INVALID_ARG,
            "no rule 'root' (the start rule)");
    refused("root ::= \"a\n", CINFER_E_INVALID_ARG, "unterminated literal");
    refused("root ::= [ab\n", CINFER_E_INVALID_ARG,
            "unterminated character class");
    refused("root ::= [z-a]\n", CINFER_E_INVALID_ARG, "runs backwards");
    refused("root ::= \"a\"\nroot ::= \"b\"\n", CINFER_E_INVALID_ARG,
            "line 2, column 1: the rule is defined twice");
    refused("root ::= ( \"a\"\n", CINFER_E_INVALID_ARG,
            "unclosed parenthesis");
    refused("root ::= * \"a\"\n", CINFER_E_INVALID_ARG,
            "a repetition with nothing before it");
    refused("root = \"a\"\n", CINFER_E_INVALID_ARG,
            "line 1, column 6: expected ::=");
    refused("root ::= \"\\q\"\n", CINFER_E_INVALID_ARG, "unknown escape");
    refused("root ::= \"a\"{3,2}\n", CINFER_E_INVALID_ARG, "n below m");
    refused("root ::= \"a\"{1001}\n", CINFER_E_RANGE, "above 1000");
    refused("root ::= \"a\" )\n", CINFER_E_INVALID_ARG,
            "unexpected character");
    refused("root ::= \"\xff\"\n", CINFER_E_INVALID_ARG, "not valid UTF-8");
}

static void test_left_recursion(void)
{
    refused("root ::= expr\nexpr ::= expr \"+\" term | term\n"
            "term ::= [0-9]\n",
            CINFER_E_INVALID_ARG, "rule 'expr' is left-recursive");
    refused("root ::= a\na ::= b \"x\"\nb ::= a | \"y\"\n",
            CINFER_E_INVALID_ARG, "is left-recursive");
    /* through a rule that can match nothing */
    refused("root ::= c root \"x\" | \"y\"\nc ::= \"z\"?\n",
            CINFER_E_INVALID_ARG, "rule 'root' is left-recursive");
    /* right recursion is fine, also after a symbol that consumes */
    cinfer_grammar *g = compile("root ::= item root | \"\"\n"
                                "item ::= \"x\"\n");
    if (g) {
        CHECK_EQ_INT(sentence(g, "xxxx", 1), 1);
        CHECK_EQ_INT(sentence(g, "", 1), 1);
        cinfer_grammar_destroy(g);
    }
}

/* An output nested 10,000 deep: stacks grow with it, the C stack does
 * not. */
static void test_deep_output(void)
{
    cinfer_grammar *g = compile("root ::= \"[\" root \"]\" | \"x\"\n");
    if (!g)
        return;
    enum { D = 10000 };
    char *text = malloc(2 * D + 2);
    memset(text, '[', D);
    text[D] = 'x';
    memset(text + D + 1, ']', D);
    text[2 * D + 1] = '\0';
    CHECK_EQ_INT(sentence(g, text, 7), 1);
    text[2 * D] = '\0';
    CHECK_EQ_INT(sentence(g, text, 0), 0); /* one ] short */
    free(text);
    cinfer_grammar_destroy(g);
}

static void test_limits(void)
{
    size_t n = CINFER_GRAMMAR_MAX_SOURCE + 1;
    char *big = malloc(n);
    memset(big, ' ', n);
    cinfer_grammar *g = NULL;
    CHECK_EQ_INT(cinfer_grammar_compile(big, n, NULL, &g), CINFER_E_RANGE);
    free(big);
    /* literals repeated past the element bound: 20 rules of 60 characters
     * a thousand times (groups repeat as one reference each, so only
     * characters multiply) */
    char *many = malloc(20 * 100 + 64);
    size_t m = (size_t)sprintf(many, "root ::= r0\n");
    for (int r = 0; r < 20; r++)
        m += (size_t)sprintf(many + m,
                             "r%d ::= \"%060d\"{1000} r%d\n", r, r,
                             r + 1 < 20 ? r + 1 : 0);
    refused(many, CINFER_E_RANGE,
            "the grammar compiles to more than 1048576 elements");
    free(many);
    /* parentheses nested past the parser's bound */
    char deep[1200];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 300; i++)
        deep[k++] = '(';
    deep[k++] = '"';
    deep[k++] = 'a';
    deep[k++] = '"';
    for (int i = 0; i < 300; i++)
        deep[k++] = ')';
    deep[k++] = '\n';
    deep[k] = '\0';
    refused(deep, CINFER_E_RANGE, "nest too deep");
}

/* Mutated grammars: every outcome is OK or an error with a message, never
 * a crash (the sanitizer build runs this too). */
static void test_mutations_never_crash(void)
{
    size_t n = strlen(json_gbnf);
    char *buf = malloc(n + 1);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int compiled = 0;
    for (int round = 0; round < 2000; round++) {
        memcpy(buf, json_gbnf, n + 1);
        for (int m = 0; m < 1 + round % 4; m++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            static const char pool[] = "()[]{}|*+?\"\\-^.:=# \nab0,";
            buf[x % n] = pool[(x >> 20) % (sizeof pool - 1)];
        }
        cinfer_grammar *g = NULL;
        cinfer_status st = cinfer_grammar_compile(buf, n, NULL, &g);
        if (st == CINFER_OK) {
            compiled++;
            cinfer_grammar_state *s = NULL;
            if (cinfer_grammar_state_create(g, &s) == CINFER_OK) {
                (void)cinfer_grammar_accept(s, "{\"a\": [1, 2]}", 13);
                cinfer_grammar_state_destroy(s);
            }
            cinfer_grammar_destroy(g);
        } else {
            CHECK(strncmp(cinfer_last_error(), "grammar: ", 9) == 0);
        }
    }
    fprintf(stderr, "  %d of 2000 mutated grammars compiled\n", compiled);
    free(buf);
}

/* The mask over a vocabulary equals cinfer_grammar_allows token by
 * token, at every position of a JSON output: tokens that share prefixes,
 * repeat, are empty, or end inside a character. */
static void test_mask_equals_allows(void)
{
    cinfer_grammar *g = compile(json_gbnf);
    if (!g)
        return;
    static const char *fixed[] = {
        "{", "{\"", "\"", "\":", ": ", ",", ", \"", "}", "]", "[", "[1",
        "true", "tr", "t", "null", "nul", "-", "-0", "0.", "0.5", "12",
        " ", "\n", "  ", "a", "ab", "abc", "\\", "\\n", "\xc3",
        "\xc3\xa9", "\xa9", "\xe2\x82", "\xe2\x82\xac", "\xff",
        "\"}", "\"]", "1}", "e", "", "{\"a\"", "caf\xc3\xa9",
    };
    enum { N_FIXED = sizeof fixed / sizeof fixed[0], N = N_FIXED + 600 };
    char *bytes = malloc(N * 8);
    uint32_t off[N + 1];
    uint32_t used = 0;
    uint64_t x = 12345;
    for (int t = 0; t < N; t++) {
        off[t] = used;
        if (t < N_FIXED) {
            size_t l = strlen(fixed[t]);
            memcpy(bytes + used, fixed[t], l);
            used += (uint32_t)l;
        } else {
            /* random fragments from JSON's alphabet, UTF-8 lead and
             * continuation bytes included */
            static const char alpha[] = "{}[]\",: 0123456789-.truefalsn\\a"
                                        "\xc3\xa9\xe2\x82\xac";
            int l = 1 + (int)(x % 5);
            for (int k = 0; k < l; k++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bytes[used++] = alpha[x % (sizeof alpha - 1)];
            }
        }
    }
    off[N] = used;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off, N, &v));
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(g, &s));
    const char *out = "{\"k\": [1, \"caf\xc3\xa9\", {\"z\": null}], \"b\": -0.5}";
    uint8_t *mask = malloc(N);
    int positions = 0, mismatches = 0;
    for (size_t i = 0; s && v && i <= strlen(out); i++) {
        int64_t n_ok = cinfer_grammar_mask(s, v, mask);
        CHECK(n_ok >= 0);
        int64_t count = 0;
        for (int t = 0; t < N; t++) {
            size_t l = off[t + 1] - off[t];
            int want = l > 0 && cinfer_grammar_allows(s, bytes + off[t], l);
            mismatches += mask[t] != want;
            count += mask[t];
        }
        CHECK_EQ_INT(count, n_ok);
        positions++;
        if (i < strlen(out))
            CHECK_OK(cinfer_grammar_accept(s, out + i, 1));
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(s && cinfer_grammar_complete(s));
    fprintf(stderr, "  %d positions x %d tokens: mask = allows\n", positions,
            N);
    free(mask);
    cinfer_grammar_state_destroy(s);
    cinfer_grammar_vocab_destroy(v);
    free(bytes);
    cinfer_grammar_destroy(g);
}

/* The fast mask (interned levels, whole masks memoized by their start)
 * equals a straightforward per-token check on many states: random walks
 * through several grammars, each step choosing one of the tokens the mask
 * allows, the mask compared with cinfer_grammar_allows on every token,
 * and masked twice (the second from the memo). */
static void test_mask_equals_allows_on_random_walks(void)
{
    static const char *grammars[] = {
        NULL, /* json_gbnf */
        "root ::= \"{\" space \"\\\"name\\\"\" space \":\" space string "
        "\",\" space \"\\\"tags\\\"\" space \":\" space tags ( \",\" space "
        "\"\\\"n\\\"\" space \":\" space number )? \"}\" space\n"
        "tags ::= \"[\" space ( string ( \",\" space string ){0,3} )? \"]\" "
        "space\n"
        "space ::= ( \" \" | \"\\n\" [ \\t]{0,4} )?\n"
        "string ::= \"\\\"\" char{0,12} \"\\\"\" space\n"
        "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
        "[0-9a-fA-F]{4} )\n"
        "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,5} ) ( \".\" [0-9]{1,4} "
        ")? space\n",
        "root ::= ( [a-c\\u00e9-\\u00ff] | \"\\u20AC\" | \"ab\" [^a]{2} )* "
        "\"!\"\n",
        "root ::= item+\nitem ::= \"(\" item* \")\" | [0-9]{1,3} \",\"\n",
    };
    static const char alpha[] = "{}[]\",: 0123456789-.truefalsn\\a!()bc"
                                "\xc3\xa9\xe2\x82\xac";
    enum { N = 900 };
    char *bytes = malloc(N * 8);
    uint32_t off[N + 1];
    uint32_t used = 0;
    uint64_t x = 777;
    for (int t = 0; t < N; t++) {
        off[t] = used;
        int l = t < 40 ? 1 : (int)(x % 6); /* single bytes, and empties */
        for (int k = 0; k < l; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes[used++] = t < 40 ? alpha[t % (sizeof alpha - 1)]
                                   : alpha[x % (sizeof alpha - 1)];
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    off[N] = used;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off, N, &v));
    uint8_t *mask = malloc(N), *again = malloc(N);
    int states = 0, mismatches = 0;
    for (size_t gi = 0; v && gi < sizeof grammars / sizeof *grammars; gi++) {
        cinfer_grammar *g = compile(gi == 0 ? json_gbnf : grammars[gi]);
        if (!g)
            continue;
        for (int walk = 0; walk < 12; walk++) {
            cinfer_grammar_state *s = NULL;
            CHECK_OK(cinfer_grammar_state_create(g, &s));
            for (int stepi = 0; s && stepi < 40; stepi++) {
                int64_t n_ok = cinfer_grammar_mask(s, v, mask);
                CHECK(n_ok >= 0);
                int64_t count = 0;
                for (int t = 0; t < N; t++) {
                    size_t l = off[t + 1] - off[t];
                    int want =
                        l > 0 && cinfer_grammar_allows(s, bytes + off[t], l);
                    mismatches += mask[t] != want;
                    count += mask[t];
                }
                CHECK_EQ_INT(count, n_ok);
                CHECK_EQ_INT(cinfer_grammar_mask(s, v, again), n_ok);
                CHECK(memcmp(mask, again, N) == 0);
                states++;
                if (n_ok == 0)
                    break;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                int64_t pick = (int64_t)(x % (uint64_t)n_ok);
                int t = 0;
                for (; t < N; t++)
                    if (mask[t] && pick-- == 0)
                        break;
                CHECK_OK(cinfer_grammar_accept(s, bytes + off[t],
                                               off[t + 1] - off[t]));
            }
            cinfer_grammar_state_destroy(s);
        }
        cinfer_grammar_destroy(g);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(states > 500);
    fprintf(stderr, "  %d states x %d tokens: mask = allows\n", states, N);
    free(mask);
    free(again);
    cinfer_grammar_vocab_destroy(v);
    free(bytes);
}

struct mask_worker {
    const cinfer_grammar *g;
    const cinfer_grammar_vocab *v;
    const char *bytes;
    const uint32_t *off;
    int n, seed, mismatches, steps;
};

static void *mask_work(void *arg)
{
    struct mask_worker *w = arg;
    uint8_t *mask = malloc((size_t)w->n);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(w->seed + 1);
    for (int walk = 0; mask && walk < 6; walk++) {
        cinfer_grammar_state *s = NULL;
        if (cinfer_grammar_state_create(w->g, &s) != CINFER_OK)
            break;
        for (int k = 0; k < 30; k++) {
            int64_t n_ok = cinfer_grammar_mask(s, w->v, mask);
            if (n_ok <= 0)
                break;
            for (int t = 0; t < w->n; t++) {
                size_t l = w->off[t + 1] - w->off[t];
                int want = l > 0 && cinfer_grammar_allows(
                                        s, w->bytes + w->off[t], l);
                w->mismatches += mask[t] != want;
            }
            w->steps++;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            int64_t pick = (int64_t)(x % (uint64_t)n_ok);
            int t = 0;
            for (; t < w->n; t++)
                if (mask[t] && pick-- == 0)
                    break;
            cinfer_grammar_accept(s, w->bytes + w->off[t],
                                  w->off[t + 1] - w->off[t]);
        }
        cinfer_grammar_state_destroy(s);
    }
    free(mask);
    return NULL;
}

/* The mask's tables belong to the grammar and are shared by its states:
 * four threads masking states of one grammar at once each get what
 * cinfer_grammar_allows says. */
static void test_mask_shared_by_threads(void)
{
    cinfer_grammar *g = compile(json_gbnf);
    static const char alpha[] = "{}[]\",: 0123456789-.truefalsn\\a";
    enum { N = 400 };
    char *bytes = malloc(N * 4);
    uint32_t off[N + 1], used = 0;
    uint64_t x = 4242;
    for (int t = 0; t < N; t++) {
        off[t] = used;
        int l = t < 32 ? 1 : 1 + (int)(x % 3);
        for (int k = 0; k < l; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes[used++] = alpha[(t < 32 ? (uint64_t)t : x) % (sizeof alpha - 1)];
        }
    }
    off[N] = used;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off, N, &v));
    struct mask_worker w[4];
    pthread_t th[4];
    for (int i = 0; g && v && i < 4; i++) {
        w[i] = (struct mask_worker){g, v, bytes, off, N, i, 0, 0};
        pthread_create(&th[i], NULL, mask_work, &w[i]);
    }
    int mismatches = 0, steps = 0;
    for (int i = 0; g && v && i < 4; i++) {
        pthread_join(th[i], NULL);
        mismatches += w[i].mismatches;
        steps += w[i].steps;
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(steps > 100);
    fprintf(stderr, "  4 threads, %d masks of one grammar: mask = allows\n",
            steps);
    cinfer_grammar_vocab_destroy(v);
    cinfer_grammar_destroy(g);
    free(bytes);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The default model's 49,152 byte-level tokens under the JSON grammar:
 * the mask equals allows on every token at a few positions, lets "{" and
 * "[" open a value and refuses prose. Its time is printed (what it costs
 * is bench's to judge, not a test's). */
static void test_mask_on_the_default_vocabulary(void)
{
    const char *path = cinfer_model_default_path();
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = path;
    cinfer_gguf *gf = NULL;
    CHECK_OK(cinfer_gguf_create(&gp, &gf));
    cinfer_tokenizer_params tp = cinfer_tokenizer_default_params();
    tp.gguf = gf;
    cinfer_tokenizer *tk = NULL;
    if (gf)
        CHECK_OK(cinfer_tokenizer_create(&tp, &tk));
    cinfer_grammar *g = compile(json_gbnf);
    if (!tk || !g) {
        cinfer_grammar_destroy(g);
        cinfer_tokenizer_destroy(tk);
        cinfer_gguf_destroy(gf);
        return;
    }
    int32_t V = cinfer_tokenizer_n_vocab(tk);
    uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
    size_t cap = 1 << 20, used = 0;
    char *bytes = malloc(cap);
    for (int32_t t = 0; t < V; t++) {
        const char *b;
        size_t l;
        CHECK_OK(cinfer_tokenizer_token_piece(tk, t, &b, &l));
        if (used + l > cap) {
            cap = 2 * (used + l);
            bytes = realloc(bytes, cap);
        }
        memcpy(bytes + used, b, l);
        off[t] = (uint32_t)used;
        used += l;
    }
    off[V] = (uint32_t)used;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off, V, &v));
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(g, &s));
    uint8_t *mask = malloc((size_t)V);
    const char *prefixes[] = {"", "{\"na", "{\"name\": [1, 2", "{\"a\": \"x"};
    for (size_t p = 0; s && v && p < 4; p++) {
        cinfer_grammar_state *q = NULL;
        CHECK_OK(cinfer_grammar_state_create(g, &q));
        CHECK_OK(cinfer_grammar_accept(q, prefixes[p], strlen(prefixes[p])));
        double t0 = now_s();
        int64_t n_ok = cinfer_grammar_mask(q, v, mask);
        double ms = (now_s() - t0) * 1e3;
        int mismatches = 0;
        for (int32_t t = 0; t < V; t++) {
            size_t l = off[t + 1] - off[t];
            int want = l > 0 && cinfer_grammar_allows(q, bytes + off[t], l);
            mismatches += mask[t] != want;
        }
        CHECK_EQ_INT(mismatches, 0);
        fprintf(stderr, "  after \"%s\": %lld of %d tokens allowed, mask "
                        "%.1f ms\n",
                prefixes[p], (long long)n_ok, V, ms);
        if (p == 0) {
            int32_t open = cinfer_tokenizer_token_id(tk, "{", 1);
            int32_t hello = cinfer_tokenizer_token_id(tk, "Hello", 5);
            CHECK(open >= 0 && mask[open]);
            CHECK(hello >= 0 && !mask[hello]);
        }
        cinfer_grammar_state_destroy(q);
    }
    free(mask);
    cinfer_grammar_state_destroy(s);
    cinfer_grammar_vocab_destroy(v);
    free(bytes);
    free(off);
    cinfer_grammar_destroy(g);
    cinfer_tokenizer_destroy(tk);
    cinfer_gguf_destroy(gf);
}

int main(void)
{
    RUN(test_alternatives_and_completion);
    RUN(test_json_sentences_split_anywhere);
    RUN(test_classes_escapes_and_any);
    RUN(test_repetition_bounds);
    RUN(test_compile_errors);
    RUN(test_left_recursion);
    RUN(test_deep_output);
    RUN(test_limits);
    RUN(test_mutations_never_crash);
    RUN(test_mask_equals_allows);
    RUN(test_mask_equals_allows_on_random_walks);
    RUN(test_mask_shared_by_threads);
    const char *dm = cinfer_model_default_path();
    if (dm[0] && access(dm, R_OK) == 0) {
        RUN(test_mask_on_the_default_vocabulary);
    } else {
        fprintf(stderr, "  no default model: its vocabulary's mask not "
                        "checked\n");
    }
    return harness_done();
}
