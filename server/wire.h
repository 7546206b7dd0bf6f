/*
 * wire.h - what a call brings off the wire, checked before anything else
 * reads it: the request message's bytes, before protobuf-c unpacks them,
 * and the call's deadline, before it becomes a monotonic time.
 *
 * Messages. protobuf-c hands string fields over as NUL-terminated C
 * strings, so a NUL byte inside one would silently cut it, and it takes
 * any bytes as a string while proto3 requires UTF-8; and protobuf-c 1.4
 * refuses (or replaces instead of merging) a singular message field that
 * appears more than once, which protobuf's parsers merge. So every request
 * passes cinfer_wire_unpack, which walks the encoding with the message's
 * descriptor:
 *   - a string field (at any depth) that holds a NUL byte or is not
 *     well-formed UTF-8 fails with CINFER_E_INVALID_ARG naming it
 *     ("chat.messages[1].content holds a NUL byte at offset 3");
 *   - a singular message field that occurs more than once is merged the way
 *     protobuf merges: the occurrences' payloads concatenated (merging two
 *     encodings is parsing their concatenation), a oneof member reset by
 *     another member of its oneof that comes after it;
 *   - a message that is not a protobuf encoding fails with "<Message> does
 *     not decode" and what is wrong.
 *
 *     Cinfer__V1__GenerateRequest *r;
 *     if (cinfer_wire_unpack(&cinfer__v1__generate_request__descriptor,
 *                            buf, len, (ProtobufCMessage **)&r) != CINFER_OK)
 *         ...INVALID_ARGUMENT cinfer_last_error()
 *     ...
 *     protobuf_c_message_free_unpacked(&r->base, NULL);
 *
 * Compression. gRPC core's own decompression is off (it inflated a
 * message in full before the receive limit applied); a compressed message
 * arrives as it came and cinfer_wire_inflate inflates it within the limit.
 *
 * Deadlines. A grpc-timeout may lie up to 99999999 hours (about 11,000
 * years) away, past what int64 nanoseconds hold; such a deadline is no
 * deadline.
 *
 * Pure functions, thread-safe; cinfer_wire_unpack allocates only the
 * merged copy (when there is something to merge) and the unpacked message.
 */
#ifndef CINFER_SERVER_WIRE_H
#define CINFER_SERVER_WIRE_H

#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Deadlines further than this are no deadline (100 years). */
#define CINFER_WIRE_FAR_DEADLINE_S ((int64_t)100 * 366 * 24 * 3600)

/* Message nesting the walk follows; deeper is "does not decode". */
#define CINFER_WIRE_MAX_DEPTH 32

/* Checks buf[0..len) as an encoding of `d` (strings, structure), merges
 * repeated singular message fields, and unpacks it into *out (free with
 * protobuf_c_message_free_unpacked). Errors: CINFER_E_INVALID_ARG (the
 * message names the field or says why it does not decode), CINFER_E_NOMEM.
 * *out is NULL on error. */
cinfer_status cinfer_wire_unpack(const ProtobufCMessageDescriptor *d,
                                 const uint8_t *buf, size_t len,
                                 ProtobufCMessage **out);

/* The checks of cinfer_wire_unpack without unpacking: CINFER_OK and
 * *needs_merge = 1 when some singular message field occurs twice. */
cinfer_status cinfer_wire_check(const ProtobufCMessageDescriptor *d,
                                const uint8_t *buf, size_t len,
                                int *needs_merge);

/* The merged encoding (*out malloc'd, *out_len bytes) of a message that
 * cinfer_wire_check passed: every singular message field once. */
cinfer_status cinfer_wire_merge(const ProtobufCMessageDescriptor *d,
                                const uint8_t *buf, size_t len, uint8_t **out,
                                size_t *out_len);

/* Inflates a compressed request message (gzip or zlib-wrapped deflate,
 * gRPC's two message encodings) given as n_in slices, refusing it once it
 * inflates past max_len bytes, before inflating the rest: a 1 MB message
 * that would inflate to 1 GiB costs at most max_len + 1 bytes. *out is
 * malloc'd. Errors: CINFER_E_EXHAUSTED (past max_len), CINFER_E_INVALID_ARG
 * (not a complete deflate stream), CINFER_E_NOMEM. */
cinfer_status cinfer_wire_inflate(const grpc_slice *in, size_t n_in,
                                  size_t max_len, uint8_t **out,
                                  size_t *out_len);

/* A call's deadline on the monotonic clock: now_mono_ns plus what is left
 * of `deadline` at `now` (both on deadline's clock), at least now_mono_ns +
 * 1 (one already past), or 0 = no deadline (infinite, or more than
 * CINFER_WIRE_FAR_DEADLINE_S away). Never overflows. */
int64_t cinfer_wire_deadline_ns(gpr_timespec deadline, gpr_timespec now,
                                int64_t now_mono_ns);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_WIRE_H */
