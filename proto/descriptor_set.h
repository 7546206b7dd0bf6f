/*
 * descriptor_set.h - the serialized FileDescriptorSet of every proto the
 * server speaks (cinfer.v1, grpc.health.v1, grpc.reflection.v1 and
 * v1alpha), with comments, as `protoc --include_imports
 * --include_source_info --descriptor_set_out` wrote it at build time.
 *
 * Server reflection answers from it, so clients (grpcurl) need no .proto
 * files. Generated into the build tree by proto/cmake/bin2c.cmake.
 */
#ifndef CINFER_PROTO_DESCRIPTOR_SET_H
#define CINFER_PROTO_DESCRIPTOR_SET_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

extern const unsigned char cinfer_proto_descriptor_set[];
extern const size_t cinfer_proto_descriptor_set_len;

#ifdef __cplusplus
}
#endif
#endif /* CINFER_PROTO_DESCRIPTOR_SET_H */
