/*
 * grammar_cache.h - compiled grammars kept by their text, so requests
 * that send the same schema, regex or GBNF compile it once. An LRU bounded
 * in bytes and in entries, safe to call from any thread; each lookup
 * returns a reference the request holds for as long as it uses the
 * grammar, so eviction never frees a grammar in use (the last release
 * does).
 *
 *     cinfer_grammar_cache_params p = cinfer_grammar_cache_default_params();
 *     cinfer_grammar_cache *c;
 *     cinfer_grammar_cache_create(&p, &c);
 *     cinfer_grammar_entry *e;
 *     if (cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_REGEX, re, len,
 *                                  NULL, NULL, &e) != CINFER_OK) ...
 *     params.grammar = cinfer_grammar_entry_grammar(e); // for the request
 *     ...                                  // the request has finished
 *     cinfer_grammar_entry_release(e);
 *     cinfer_grammar_cache_destroy(c);    // held entries stay valid
 *
 * An entry's bytes are its key and cinfer_grammar_bytes of its grammar,
 * mask tables included; the tables grow as requests mask, so an entry is
 * measured again at each hit (and the least recently used others evicted
 * to keep the bound).
 *
 * Keys are (kind, text): the same text as GBNF and as a regex are two
 * entries. GBNF and regex texts compile here; other kinds (a JSON schema,
 * which the server compiles with jansson) pass a compile function. A text
 * that fails to compile is not kept: each lookup reports its error again.
 *
 * Thread safety: every function may be called from any thread; one mutex
 * guards the table, and compiling runs outside it (two threads missing the
 * same key at once both compile; one result is kept, the other freed).
 */
#ifndef CINFER_GRAMMAR_CACHE_H
#define CINFER_GRAMMAR_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_grammar_cache cinfer_grammar_cache;
typedef struct cinfer_grammar_entry cinfer_grammar_entry;

typedef enum {
    CINFER_GRAMMAR_KIND_GBNF = 1,        /* start rule "root" */
    CINFER_GRAMMAR_KIND_REGEX = 2,       /* cinfer_grammar_compile_regex */
    CINFER_GRAMMAR_KIND_JSON_SCHEMA = 3, /* the caller's compile function */
    CINFER_GRAMMAR_KIND_JSON_OBJECT = 4, /* the caller's compile function */
} cinfer_grammar_kind;

/* Compiles text[0..len) into *out, setting the error (cinfer_set_error)
 * on failure. ctx is the caller's. */
typedef cinfer_status (*cinfer_grammar_compile_fn)(void *ctx,
                                                   const char *text,
                                                   size_t len,
                                                   cinfer_grammar **out);

typedef struct {
    size_t max_bytes;   /* keys and compiled grammars kept, in bytes;
                           0 = 64 MiB */
    size_t max_entries; /* grammars kept; 0 = 256 */
} cinfer_grammar_cache_params;

typedef struct {
    uint64_t hits, misses; /* lookups answered from the cache, or not */
    uint64_t evictions;    /* entries dropped for the bounds */
    size_t entries, bytes; /* kept now */
} cinfer_grammar_cache_stats;

cinfer_grammar_cache_params cinfer_grammar_cache_default_params(void);

cinfer_status cinfer_grammar_cache_create(const cinfer_grammar_cache_params *p,
                                          cinfer_grammar_cache **out);
/* Drops the cache's entries; those a caller still holds stay valid until
 * released. Accepts NULL. */
void cinfer_grammar_cache_destroy(cinfer_grammar_cache *c);

/* The grammar for (kind, text[0..len)): the kept one (a hit), or compiled
 * (compile(ctx, ...) when compile is not NULL, else by kind: GBNF and
 * REGEX only) and kept unless it alone passes max_bytes. *out is a new
 * reference: release it with cinfer_grammar_entry_release. On failure
 * *out is NULL and the compile's status and error are returned
 * (CINFER_E_INVALID_ARG for a kind that needs a compile function). */
cinfer_status cinfer_grammar_cache_get(cinfer_grammar_cache *c, int kind,
                                       const char *text, size_t len,
                                       cinfer_grammar_compile_fn compile,
                                       void *ctx, cinfer_grammar_entry **out);

/* The compiled grammar of e, valid until e is released. */
const cinfer_grammar *cinfer_grammar_entry_grammar(
    const cinfer_grammar_entry *e);

/* Drops a reference from cinfer_grammar_cache_get; the last one of an
 * evicted entry frees it. Accepts NULL. */
void cinfer_grammar_entry_release(cinfer_grammar_entry *e);

void cinfer_grammar_cache_stats_get(cinfer_grammar_cache *c,
                                    cinfer_grammar_cache_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_GRAMMAR_CACHE_H */
