/*
 * grammar.h - context-free grammars in GBNF (the notation llama.cpp's users
 * write) and the position of an output within one: which bytes may come
 * next. The building block of structured output: the engine's token mask
 * (the request param `grammar`), the regex front end (grammar_regex.c)
 * and the server's JSON-schema compiler (server/json_schema.h) are built
 * on it; engine/grammar_cache.h keeps compiled grammars by their text.
 *
 * GBNF, as llama.cpp reads it:
 *
 *     root   ::= object
 *     object ::= "{" ws ( pair ( "," ws pair )* )? "}"
 *     pair   ::= string ":" ws value      # comments run to the line's end
 *     string ::= "\"" [^"\\]* "\""
 *     ws     ::= [ \t\n]*
 *
 * Rules `name ::= alternatives`, one per line (a rule continues on the next
 * line inside parentheses, or when the line ends with `|`); alternatives
 * split by `|`; sequences of literals ("..." with \n \t \r \\ \" \xHH
 * \uHHHH \UHHHHHHHH escapes), character classes ([a-z0-9_], [^...]), `.`
 * (any character), rule names and parenthesised groups, each optionally
 * followed by `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}`. Characters are
 * Unicode code points; an output is UTF-8 bytes, and a token that ends
 * inside a character is matched up to where it ends.
 *
 * Refused at compile with CINFER_E_INVALID_ARG naming the line and column:
 * a syntax error, a rule used but not defined, a missing root, and left
 * recursion (a rule that can reach itself before any character, which a
 * top-down matcher cannot run). Grammars come from clients: the source,
 * the compiled size and each state's number of parse stacks are bounded
 * (CINFER_E_RANGE past them, with the bound in the message), and nothing
 * recurses on the input's nesting.
 *
 *     cinfer_grammar *g;
 *     if (cinfer_grammar_compile(text, len, "root", &g) != CINFER_OK) ...
 *     cinfer_grammar_state *st;
 *     cinfer_grammar_state_create(g, &st);
 *     if (cinfer_grammar_allows(st, tok, tok_len)) ... // mask a token
 *     cinfer_grammar_accept(st, tok, tok_len);         // the chosen one
 *     cinfer_grammar_complete(st);                     // may end here
 *     cinfer_grammar_state_destroy(st);
 *     cinfer_grammar_destroy(g);
 *
 * Thread safety: a compiled grammar may be shared by threads (its only
 * mutable part, the mask's tables, has its own lock); a state is used by
 * one thread at a time.
 */
#ifndef CINFER_GRAMMAR_H
#define CINFER_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_grammar cinfer_grammar;
typedef struct cinfer_grammar_state cinfer_grammar_state;

/* Bounds on what a client can send. */
#define CINFER_GRAMMAR_MAX_SOURCE (256 * 1024) /* bytes of GBNF */
#define CINFER_GRAMMAR_MAX_ELEMS (1 << 20)     /* compiled elements */
#define CINFER_GRAMMAR_MAX_REPEAT 1000         /* m and n of {m,n} */
#define CINFER_GRAMMAR_MAX_STACKS 4096         /* parse stacks of a state */

/* Compiles `len` bytes of GBNF with `root` as the start rule (NULL =
 * "root"). */
cinfer_status cinfer_grammar_compile(const char *src, size_t len,
                                     const char *root, cinfer_grammar **out);
void cinfer_grammar_destroy(cinfer_grammar *g);

/* A regular expression the whole output must match (Python's
 * re.fullmatch; grammar_regex.c has the subset): translated to GBNF and
 * compiled. Refused constructs and syntax errors name the offset. */
cinfer_status cinfer_grammar_compile_regex(const char *re, size_t len,
                                           cinfer_grammar **out);

/* The same pattern as a GBNF expression, "( ... )", to embed in a rule
 * (the JSON-schema compiler's `pattern`); *out is malloc'd, the caller
 * frees it. json_string = 1: the expression matches the text inside a
 * JSON string whose value fullmatches the pattern: literal characters
 * that JSON escapes (", \, control characters) are written as their
 * escapes, and classes and `.` leave those characters out (a class with
 * nothing else is refused), so every output is a valid string whose
 * value the pattern matches. */
cinfer_status cinfer_grammar_regex_to_gbnf(const char *re, size_t len,
                                           int json_string, char **out);

/* Rules, counting the ones the compiler made for groups and repetitions. */
int cinfer_grammar_n_rules(const cinfer_grammar *g);

/* The bytes the compiled grammar holds now: its rules and its mask
 * tables (which grow with the masks made, up to the bound above; its
 * states' own memory is theirs). */
size_t cinfer_grammar_bytes(const cinfer_grammar *g);

/* The position before any output. g must outlive the state. */
cinfer_status cinfer_grammar_state_create(const cinfer_grammar *g,
                                          cinfer_grammar_state **out);
void cinfer_grammar_state_destroy(cinfer_grammar_state *s);
/* *dst (created from the same grammar) becomes a copy of src. */
cinfer_status cinfer_grammar_state_copy(cinfer_grammar_state *dst,
                                        const cinfer_grammar_state *src);

/* 1 when the output may continue with these n bytes (n = 0: 1), 0 when it
 * cannot (or the check hit the stack bound). s is unchanged. */
int cinfer_grammar_allows(const cinfer_grammar_state *s, const char *bytes,
                          size_t n);

/* Moves s past n bytes of output. CINFER_E_INVALID_ARG when the grammar
 * does not allow them (s unchanged), CINFER_E_RANGE past the stack
 * bound. */
cinfer_status cinfer_grammar_accept(cinfer_grammar_state *s,
                                    const char *bytes, size_t n);

/* 1 when the output so far is a whole sentence of the grammar (it may end
 * here), and no character is left half-fed. */
int cinfer_grammar_complete(const cinfer_grammar_state *s);

/* 1 when nothing can follow: the output must end here. */
int cinfer_grammar_done(const cinfer_grammar_state *s);

/* A vocabulary's token texts, sorted once for masking: token t's bytes
 * are bytes[off[t] .. off[t + 1]) (off has n_vocab + 1 entries; the bytes
 * are copied). Immutable; may be shared by threads. */
typedef struct cinfer_grammar_vocab cinfer_grammar_vocab;
cinfer_status cinfer_grammar_vocab_create(const char *bytes,
                                          const uint32_t *off,
                                          int32_t n_vocab,
                                          cinfer_grammar_vocab **out);
void cinfer_grammar_vocab_destroy(cinfer_grammar_vocab *v);

/* allowed[t] = 1 for every token the output may continue with
 * (cinfer_grammar_allows of its bytes), else 0; a token of no bytes gets 0
 * (end-of-generation tokens are the caller's: allowed when
 * cinfer_grammar_complete). Returns how many are allowed, or -1
 * (CINFER_E_NOMEM / CINFER_E_RANGE set) on failure.
 *
 * Cost: the vocabulary is walked in sorted order, so tokens sharing a
 * prefix share its work (a token trie walked once per step), and every
 * position the walk meets is interned with its transitions by byte,
 * computed once: a step of the walk is a table lookup. These tables
 * belong to the grammar, not the state: positions name places in the
 * grammar, never the output's content, so every request with the same
 * compiled grammar (grammar_cache.h) reuses what the others computed.
 * Whole masks are memoized by the position they start from and the
 * vocabulary (the last 64), so a mask met before costs a copy. A new
 * position costs about the distinct prefixes the grammar lets through
 * (a fraction of a millisecond over 49,152 tokens; bench with
 * cinfer-maskbench). The tables keep up to 16 MiB, then are dropped and
 * made again; they never change a result. A mask holds the grammar's
 * lock from start to end: masks of one grammar from several threads run
 * one at a time. */
int64_t cinfer_grammar_mask(cinfer_grammar_state *s,
                            const cinfer_grammar_vocab *v, uint8_t *allowed);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_GRAMMAR_H */
