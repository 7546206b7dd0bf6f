/*
 * test_grammar_regex.c - regular expressions as grammars
 * (engine/grammar_regex.c), judged by PCRE2: for each pattern, strings
 * walked at random through the grammar's own masks (over a vocabulary of
 * single characters and a few longer pieces) fullmatch under PCRE2, and
 * random strings from the pattern's alphabet are sentences of the grammar
 * exactly when PCRE2 fullmatches them; refused constructs name their
 * offset. (PCRE2 reads \uHHHH as Python does with PCRE2_ALT_BSUX.)
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/grammar.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int pcre_full(pcre2_code *re, const char *s, size_t n)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0,
                         PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static int is_sentence(const cinfer_grammar *g, const char *s, size_t n)
{
    cinfer_grammar_state *st = NULL;
    if (cinfer_grammar_state_create(g, &st) != CINFER_OK)
        return -1;
    int r = cinfer_grammar_accept(st, s, n) == CINFER_OK &&
            cinfer_grammar_complete(st);
    cinfer_grammar_state_destroy(st);
    return r;
}

/* The pieces random outputs are made of. */
static const char *pieces[] = {
    "a", "b", "c", "x", "y", "z", "A", "Z", "0", "1", "5", "9", "-", "_",
    ".", "@", " ", "\n", "\t", "(", ")", "+", "\xc3\xa9", "\xe2\x82\xac",
    "ab", "abc", "12", "2026", "-01", "foo", "@x.", ".com",
};
#define N_PIECES ((int)(sizeof pieces / sizeof pieces[0]))

static void check_pattern(const char *pat, int *walked, int *compared)
{
    cinfer_grammar *g = NULL;
    cinfer_status st = cinfer_grammar_compile_regex(pat, strlen(pat), &g);
    if (st != CINFER_OK)
        fprintf(stderr, "  %s: %s\n", pat, cinfer_last_error());
    CHECK_OK(st);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, strlen(pat),
                                   PCRE2_UTF | PCRE2_ALT_BSUX,
                                   &err, &off, NULL);
    CHECK(re != NULL);
    if (!g || !re) {
        cinfer_grammar_destroy(g);
        pcre2_code_free(re);
        return;
    }
    uint32_t off_[N_PIECES + 1];
    char bytes[512];
    uint32_t used = 0;
    for (int t = 0; t < N_PIECES; t++) {
        off_[t] = used;
        memcpy(bytes + used, pieces[t], strlen(pieces[t]));
        used += (uint32_t)strlen(pieces[t]);
    }
    off_[N_PIECES] = used;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off_, N_PIECES, &v));
    uint8_t mask[N_PIECES];
    /* walks: pick among the allowed pieces, stop at random where complete */
    for (int w = 0; v && w < 60; w++) {
        cinfer_grammar_state *s = NULL;
        CHECK_OK(cinfer_grammar_state_create(g, &s));
        char out[256];
        size_t n = 0;
        for (int step = 0; s && step < 40; step++) {
            if (cinfer_grammar_complete(s) && next() % 4 == 0)
                break;
            int64_t k = cinfer_grammar_mask(s, v, mask);
            if (k <= 0)
                break;
            int64_t pick = (int64_t)(next() % (uint64_t)k);
            int t = 0;
            for (; t < N_PIECES; t++)
                if (mask[t] && pick-- == 0)
                    break;
            size_t l = strlen(pieces[t]);
            if (n + l >= sizeof out)
                break;
            CHECK_OK(cinfer_grammar_accept(s, pieces[t], l));
            memcpy(out + n, pieces[t], l);
            n += l;
        }
        if (s && cinfer_grammar_complete(s)) {
            int ok = pcre_full(re, out, n);
            if (!ok)
                fprintf(stderr, "  %s: walked \"%.*s\", PCRE2 disagrees\n",
                        pat, (int)n, out);
            CHECK(ok);
            (*walked)++;
        }
        cinfer_grammar_state_destroy(s);
    }
    /* random strings: the grammar and PCRE2 agree on every one */
    for (int k = 0; k < 300; k++) {
        char s[64];
        size_t n = 0;
        int parts = (int)(next() % 6);
        for (int p = 0; p < parts; p++) {
            const char *pc = pieces[next() % N_PIECES];
            size_t l = strlen(pc);
            if (n + l >= sizeof s)
                break;
            memcpy(s + n, pc, l);
            n += l;
        }
        int a = is_sentence(g, s, n), b = pcre_full(re, s, n);
        if (a != b)
            fprintf(stderr, "  %s: \"%.*s\": grammar %d, PCRE2 %d\n", pat,
                    (int)n, s, a, b);
        CHECK_EQ_INT(a, b);
        (*compared)++;
    }
    cinfer_grammar_vocab_destroy(v);
    cinfer_grammar_destroy(g);
    pcre2_code_free(re);
}

static void test_patterns_agree_with_pcre2(void)
{
    static const char *pats[] = {
        "abc",
        "a|b|abc",
        "[a-c]+",
        "^x?y*z{2,3}$",
        "\\d{4}-\\d{2}",
        "[^\\n@]+@[a-z]+\\.com",
        "(ab|c)*x",
        "(?:foo|bar)?[0-9]{1,3}",
        "\\w+(\\s\\w+)*",
        "[A-Z][a-z]*",
        "-?(0|[1-9][0-9]*)(\\.[0-9]+)?",
        "caf\\u00e9|\xe2\x82\xac\\d+",
        "a.c",
        "(a|)b",
        "[-.@]+",
        "x{0,2}?y+?",
        "\\(\\+\\)",
        "[^a-z0-9 ]*",
    };
    int walked = 0, compared = 0;
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
        check_pattern(pats[i], &walked, &compared);
    fprintf(stderr, "  %zu patterns: %d walked outputs fullmatch under PCRE2, "
                    "%d random strings judged alike\n",
            sizeof pats / sizeof pats[0], walked, compared);
    CHECK(walked > 300);
}

static void refused(const char *pat, const char *words)
{
    cinfer_grammar *g = NULL;
    cinfer_status st = cinfer_grammar_compile_regex(pat, strlen(pat), &g);
    CHECK(st != CINFER_OK);
    CHECK(!g);
    if (!strstr(cinfer_last_error(), words))
        fprintf(stderr, "  %s: %s (wanted \"%s\")\n", pat,
                cinfer_last_error(), words);
    CHECK(strstr(cinfer_last_error(), words) != NULL);
}

static void test_refusals(void)
{
    refused("(a)\\1", "offset 4: backreferences are not supported");
    refused("a(?=b)", "offset 2: (?...) groups other than (?:...)");
    refused("a++", "possessive quantifiers");
    refused("a^b", "offset 1: ^ is supported only at the pattern's start");
    refused("a$b", "$ is supported only at the pattern's end");
    refused("(ab", "an unclosed group");
    refused("ab)", "an unmatched )");
    refused("[ab", "unterminated character class");
    refused("[z-a]", "a range runs backwards");
    refused("*a", "a quantifier with nothing before it");
    refused("a{3,2}", "n below m");
    refused("a{1001}", "a count above 1000");
    refused("\\bword", "the anchor \\b is not supported");
    refused("[[:alpha:]]", "POSIX classes");
    refused("a**", "a quantifier after a quantifier");
}

int main(void)
{
    RUN(test_patterns_agree_with_pcre2);
    RUN(test_refusals);
    return harness_done();
}
