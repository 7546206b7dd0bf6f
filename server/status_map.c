/*
 * status_map.c - cinfer_status -> grpc_status_code (status_map.h).
 *
 * The choices, and why:
 *   INVALID_ARG, RANGE -> INVALID_ARGUMENT: a bad field or a prompt longer
 *       than the context is the caller's to fix (OUT_OF_RANGE in gRPC means
 *       "iterated past the end", which nothing here does);
 *   NOMEM, EXHAUSTED   -> RESOURCE_EXHAUSTED: retry later, maybe smaller
 *       (rate limits: resilience's CINFER_REJECT_RATE_LIMITED_*);
 *   UNAVAILABLE        -> UNAVAILABLE: loading, draining, breaker open,
 *       shed; safe to retry, after the pushback, maybe on another replica;
 *   TIMEOUT            -> DEADLINE_EXCEEDED: a deadline that passed or can
 *       not be met;
 *   CANCELLED          -> CANCELLED;
 *   NOT_FOUND          -> NOT_FOUND (health: an unknown service name);
 *   UNSUPPORTED        -> UNIMPLEMENTED (an unknown method);
 *   UNAUTHENTICATED    -> UNAUTHENTICATED (no API key, or a wrong one);
 *   PERMISSION         -> PERMISSION_DENIED (a priority above the key's);
 *   IO, FORMAT, DEVICE, INTERNAL -> INTERNAL: a server-side fault the
 *       breaker counts.
 */
#include "server/status_map.h"

grpc_status_code cinfer_server_grpc_status(cinfer_status s)
{
    switch (s) {
    case CINFER_OK:
        return GRPC_STATUS_OK;
    case CINFER_E_INVALID_ARG:
    case CINFER_E_RANGE:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case CINFER_E_NOMEM:
    case CINFER_E_EXHAUSTED:
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case CINFER_E_UNAVAILABLE:
        return GRPC_STATUS_UNAVAILABLE;
    case CINFER_E_TIMEOUT:
        return GRPC_STATUS_DEADLINE_EXCEEDED;
    case CINFER_E_CANCELLED:
        return GRPC_STATUS_CANCELLED;
    case CINFER_E_NOT_FOUND:
        return GRPC_STATUS_NOT_FOUND;
    case CINFER_E_UNSUPPORTED:
        return GRPC_STATUS_UNIMPLEMENTED;
    case CINFER_E_UNAUTHENTICATED:
        return GRPC_STATUS_UNAUTHENTICATED;
    case CINFER_E_PERMISSION:
        return GRPC_STATUS_PERMISSION_DENIED;
    case CINFER_E_IO:
    case CINFER_E_FORMAT:
    case CINFER_E_DEVICE:
    case CINFER_E_INTERNAL:
        return GRPC_STATUS_INTERNAL;
    }
    return GRPC_STATUS_UNKNOWN;
}
