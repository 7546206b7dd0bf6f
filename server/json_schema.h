/*
 * json_schema.h - a JSON schema compiled to a GBNF grammar
 * (engine/grammar.h) whose every sentence is a JSON document that
 * validates against the schema: structured output for OpenAI's
 * response_format json_schema / json_object and GenerateRequest's
 * json_schema. The model of it is llama.cpp's json-schema-to-grammar, the
 * grammar its users know; what it accepts is the subset OpenAI's
 * structured outputs document.
 *
 *     char err[256], *gbnf;
 *     if (cinfer_json_schema_to_gbnf(text, len, &gbnf, err, sizeof err))
 *         ... INVALID_ARGUMENT with err
 *     cinfer_grammar_compile(gbnf, strlen(gbnf), "root", &g);
 *     free(gbnf);
 *
 * The subset:
 *   - type: "object", "array", "string", "number", "integer", "boolean",
 *     "null", or an array of them (any one of them); without type, what
 *     the other keywords imply (properties: an object, items: an array,
 *     pattern or a length: a string), else any JSON value. true and {}
 *     are any value.
 *   - object: properties (written in the schema's order, each required
 *     one always, each other one optional), required (a required name
 *     not in properties takes any value), additionalProperties. The
 *     output never has a property the schema does not declare when it
 *     declares some: additionalProperties false is what it always does,
 *     and absent or true change nothing (OpenAI's structured outputs
 *     require false; llama.cpp lets the model add others). With no
 *     properties and no required, an object of any members (or, with
 *     additionalProperties a schema, of members with values of it; false:
 *     only {}).
 *   - array: items (a schema), minItems, maxItems (at most 1000).
 *   - string: minLength, maxLength (at most 1000, counted in characters;
 *     an escaped surrogate pair is never written, so a character is one
 *     code point), pattern (the regex subset of grammar_regex.c; the
 *     value must fullmatch it, which also satisfies JSON Schema's search;
 *     characters JSON escapes are written escaped).
 *   - enum and const (any JSON values, written compactly; with type,
 *     values of other types are dropped), anyOf, $ref to a JSON pointer
 *     into the schema ("#", "#/$defs/x", "#/definitions/x"), recursion
 *     included where some alternative ends it.
 *   - annotations are ignored: title, description, $schema, $id, $comment,
 *     examples, default, deprecated, readOnly, writeOnly, and $defs and
 *     definitions themselves.
 * Any other keyword (minimum, format, oneOf, allOf, not, prefixItems,
 * patternProperties, ...) is refused, naming it and where it is, as a
 * JSON pointer: "json_schema: #/properties/age: unsupported keyword
 * 'minimum'". So are schemas this cannot compile, saying where and why
 * (an enum left empty by its type, a $ref that resolves nowhere, a
 * pattern the regex subset refuses, a reference cycle that writes
 * nothing).
 *
 * Whitespace is bounded, as llama.cpp's: after each token of JSON
 * (a brace, a bracket, a colon, a comma, a value) at most one space, or
 * one newline and up to 20 spaces or tabs; nothing before the value. A
 * model cannot spend its tokens on whitespace, and the output can always
 * finish. Numbers have at most 16 digits before the point, 16 after and
 * 3 in the exponent.
 *
 * Thread safety: the functions keep no state; any thread may call them.
 */
#ifndef CINFER_SERVER_JSON_SCHEMA_H
#define CINFER_SERVER_JSON_SCHEMA_H

#include <stddef.h>

#include "../engine/grammar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds on what a client's schema may make. */
#define CINFER_JSON_SCHEMA_MAX_DEPTH 64    /* nested schemas */
#define CINFER_JSON_SCHEMA_MAX_REPEAT 1000 /* items, lengths */

/* The `len` bytes of JSON at schema as GBNF with start rule "root".
 * 0 on success: *gbnf_out is a NUL-terminated string the caller frees
 * with free(). -1 on failure: *gbnf_out is NULL and err (errlen bytes,
 * always terminated when errlen > 0) says what and where, starting
 * "json_schema: ". The GBNF is checked to compile (cinfer_grammar_compile)
 * before it is returned. */
int cinfer_json_schema_to_gbnf(const char *schema, size_t len,
                               char **gbnf_out, char *err, size_t errlen);

/* The schema compiled to a grammar in one call, in the shape of
 * cinfer_grammar_compile_fn (engine/grammar_cache.h; ctx unused), so the
 * grammar cache can key compiled schemas by their text:
 *
 *     cinfer_grammar_cache_get(cache, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
 *                              schema, len, cinfer_json_schema_compile,
 *                              NULL, &entry);
 *
 * CINFER_E_INVALID_ARG with the message above (cinfer_last_error) when
 * the schema is refused. */
cinfer_status cinfer_json_schema_compile(void *ctx, const char *schema,
                                         size_t len, cinfer_grammar **out);

/* response_format json_object: GBNF for any JSON object (bounded
 * whitespace as above). The string is static: do not free it. */
const char *cinfer_json_object_gbnf(void);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_JSON_SCHEMA_H */
