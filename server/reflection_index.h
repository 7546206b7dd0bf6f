/*
 * reflection_index.h - the symbol index behind server reflection.
 *
 * Built once from the FileDescriptorSet embedded at build time
 * (proto/descriptor_set.h): each FileDescriptorProto keeps its serialized
 * bytes (sent as they are) and its dependencies; every fully-qualified
 * symbol it declares (messages, nested messages, fields, enums, enum
 * values, services, methods) maps to it. The set is walked with a small
 * bounds-checked protobuf wire reader, so no descriptor.proto code is
 * linked in.
 *
 * cinfer_refl_answer decodes one ServerReflectionRequest and encodes its
 * ServerReflectionResponse. grpc.reflection.v1 and v1alpha messages are the
 * same on the wire, so one codec serves both services:
 *   list_services            -> every service in the set
 *   file_by_filename         -> the file, then its transitive dependencies
 *   file_containing_symbol   -> likewise, for the file declaring the symbol
 *   file_containing_extension, all_extension_numbers_of_type
 *                            -> the protos declare no extensions: NOT_FOUND,
 *                               or an empty list for a known message type
 * Unknown names get an error_response with NOT_FOUND (code 5), as gRPC's
 * own reflection servers answer.
 *
 *     cinfer_refl_index *ix;
 *     cinfer_refl_index_create(cinfer_proto_descriptor_set,
 *                              cinfer_proto_descriptor_set_len, &ix);
 *     uint8_t *out; size_t n;
 *     cinfer_refl_answer(ix, req, req_len, &out, &n);  ... free(out);
 *
 * Thread safety: the index is immutable after create; answer may run on
 * any number of threads at once.
 */
#ifndef CINFER_SERVER_REFLECTION_INDEX_H
#define CINFER_SERVER_REFLECTION_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_refl_index cinfer_refl_index;

/* Parses the set (which must outlive the index: file bytes point into it).
 * CINFER_E_FORMAT if it does not parse, CINFER_E_NOMEM. */
cinfer_status cinfer_refl_index_create(const uint8_t *set, size_t len,
                                       cinfer_refl_index **out);
void cinfer_refl_index_destroy(cinfer_refl_index *ix);

size_t cinfer_refl_index_n_services(const cinfer_refl_index *ix);
/* Fully-qualified name of service i ("cinfer.v1.Inference"). */
const char *cinfer_refl_index_service(const cinfer_refl_index *ix, size_t i);
/* Index of the file declaring `symbol`, or -1. */
int cinfer_refl_index_find_symbol(const cinfer_refl_index *ix,
                                  const char *symbol);

/* Answers one serialized ServerReflectionRequest with a malloc'd serialized
 * ServerReflectionResponse (*out, *out_len; the caller frees). Requests
 * about unknown names are answered (with error_response), not failed.
 * Errors: CINFER_E_INVALID_ARG (the request does not decode),
 * CINFER_E_NOMEM. */
cinfer_status cinfer_refl_answer(const cinfer_refl_index *ix,
                                 const uint8_t *req, size_t req_len,
                                 uint8_t **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_REFLECTION_INDEX_H */
