/*
 * pb_json.h - any protobuf-c message as one line of proto3 JSON.
 *
 * Walks the message's descriptor, so it prints every message type the
 * client knows with no per-type code. Follows the proto3 JSON mapping the
 * way grpcurl and protobuf's json_format print it: lowerCamelCase names,
 * fields at their default value left out (oneof members and `optional`
 * fields are printed whenever set), 64-bit integers as strings, enums by
 * name, bytes as base64, NaN and infinities as strings.
 *
 *     pb_json_print(stdout, &response->base);   // {"chunk":{"text":"Hi"}}
 */
#ifndef CINFER_CLIENTS_PB_JSON_H
#define CINFER_CLIENTS_PB_JSON_H

#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

/* Writes the message as a JSON object (no newline). */
void pb_json_print(FILE *f, const ProtobufCMessage *m);

/* Writes s[0..len) as a JSON string literal. */
void pb_json_string(FILE *f, const char *s, size_t len);

#endif /* CINFER_CLIENTS_PB_JSON_H */
