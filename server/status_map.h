/*
 * status_map.h - the project's status enum as a gRPC status code.
 *
 * The one place where a cinfer_status becomes a grpc_status_code: every
 * reply the server sends (validation failures, draining, engine faults,
 * unknown methods) goes through cinfer_server_grpc_status, so the mapping
 * in the table of DESIGN.md lives in exactly one function.
 */
#ifndef CINFER_SERVER_STATUS_MAP_H
#define CINFER_SERVER_STATUS_MAP_H

#include <grpc/status.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pure; thread-safe. Unknown values map to GRPC_STATUS_UNKNOWN. */
grpc_status_code cinfer_server_grpc_status(cinfer_status s);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_STATUS_MAP_H */
