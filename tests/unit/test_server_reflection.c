/*
 * test_server_reflection.c - the reflection index over the descriptor set
 * embedded at build time (server/reflection_index.c).
 *
 * Checks the symbols grpcurl asks for, the answers to each request kind
 * (decoded with the generated reflection messages), and that a damaged
 * descriptor set fails cleanly at every truncation point.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <stdlib.h>

#include "grpc/reflection/v1/reflection.pb-c.h"
#include "proto/descriptor_set.h"
#include "server/reflection_index.h"

static cinfer_refl_index *ix;

static void test_services(void)
{
    CHECK_EQ_INT(cinfer_refl_index_n_services(ix), 4);
    const char *want[] = {"cinfer.v1.Inference", "grpc.health.v1.Health",
                          "grpc.reflection.v1.ServerReflection",
                          "grpc.reflection.v1alpha.ServerReflection"};
    for (size_t i = 0; i < 4; i++) {
        int found = 0;
        for (size_t k = 0; k < cinfer_refl_index_n_services(ix); k++)
            found |= strcmp(cinfer_refl_index_service(ix, k), want[i]) == 0;
        if (!found)
            fprintf(stderr, "missing service %s\n", want[i]);
        CHECK(found);
    }
    CHECK(cinfer_refl_index_service(ix, 99) == NULL);
}

static void test_symbols(void)
{
    const char *known[] = {
        "cinfer.v1.Inference",
        "cinfer.v1.Inference.Generate",
        "cinfer.v1.GenerateRequest",
        "cinfer.v1.GenerateRequest.text",
        "cinfer.v1.GenerateRequest.input",      /* a oneof */
        "cinfer.v1.SamplingParams.temperature",
        "cinfer.v1.FinishReason",
        "cinfer.v1.FINISH_REASON_EOS",          /* enum values: siblings */
        "grpc.health.v1.HealthCheckResponse.ServingStatus",
        "grpc.health.v1.HealthCheckResponse.SERVING",
        "grpc.reflection.v1alpha.ServerReflectionRequest",
    };
    int cinfer_file = cinfer_refl_index_find_symbol(ix, "cinfer.v1.Inference");
    CHECK(cinfer_file >= 0);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        int f = cinfer_refl_index_find_symbol(ix, known[i]);
        if (f < 0)
            fprintf(stderr, "symbol not found: %s\n", known[i]);
        CHECK(f >= 0);
    }
    CHECK_EQ_INT(cinfer_refl_index_find_symbol(ix, "cinfer.v1.Chunk"),
                 cinfer_file);
    CHECK(cinfer_refl_index_find_symbol(ix, "grpc.health.v1.Health") !=
          cinfer_file);
    CHECK_EQ_INT(cinfer_refl_index_find_symbol(ix, "cinfer.v1"), -1);
    CHECK_EQ_INT(cinfer_refl_index_find_symbol(ix, "cinfer.v1.Nope"), -1);
    CHECK_EQ_INT(cinfer_refl_index_find_symbol(ix, ""), -1);
}

/* Packs a request, answers it, unpacks the response. */
static Grpc__Reflection__V1__ServerReflectionResponse *
ask(Grpc__Reflection__V1__ServerReflectionRequest *rq)
{
    size_t n = grpc__reflection__v1__server_reflection_request__get_packed_size(rq);
    uint8_t *buf = malloc(n ? n : 1);
    grpc__reflection__v1__server_reflection_request__pack(rq, buf);
    uint8_t *out = NULL;
    size_t out_len = 0;
    cinfer_status st = cinfer_refl_answer(ix, buf, n, &out, &out_len);
    free(buf);
    CHECK_OK(st);
    if (st != CINFER_OK)
        return NULL;
    Grpc__Reflection__V1__ServerReflectionResponse *r =
        grpc__reflection__v1__server_reflection_response__unpack(NULL, out_len,
                                                                 out);
    free(out);
    CHECK(r != NULL);
    return r;
}

static void test_answers(void)
{
    Grpc__Reflection__V1__ServerReflectionRequest rq =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    rq.host = "localhost";
    rq.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES;
    rq.list_services = "*";
    Grpc__Reflection__V1__ServerReflectionResponse *r = ask(&rq);
    if (r) {
        CHECK_EQ_STR(r->valid_host, "localhost");
        CHECK(r->original_request != NULL);
        CHECK_EQ_INT(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE);
        CHECK_EQ_INT(r->list_services_response->n_service, 4);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    rq.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
    rq.file_containing_symbol = "cinfer.v1.Inference.Generate";
    r = ask(&rq);
    if (r) {
        CHECK_EQ_INT(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE);
        CHECK(r->file_descriptor_response->n_file_descriptor_proto >= 1);
        /* The FileDescriptorProto starts with field 1, its name. */
        ProtobufCBinaryData fd =
            r->file_descriptor_response->file_descriptor_proto[0];
        const char name[] = "cinfer/v1/cinfer.proto";
        CHECK(fd.len > sizeof name);
        CHECK(fd.data[0] == 0x0a && fd.data[1] == sizeof name - 1);
        CHECK(memcmp(fd.data + 2, name, sizeof name - 1) == 0);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    rq.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME;
    rq.file_by_filename = "grpc/reflection/v1alpha/reflection.proto";
    r = ask(&rq);
    if (r) {
        CHECK_EQ_INT(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    rq.file_by_filename = "nope.proto";
    r = ask(&rq);
    if (r) {
        CHECK_EQ_INT(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE);
        CHECK_EQ_INT(r->error_response->error_code, 5);
        CHECK(strstr(r->error_response->error_message, "nope.proto") != NULL);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    Grpc__Reflection__V1__ExtensionRequest er =
        GRPC__REFLECTION__V1__EXTENSION_REQUEST__INIT;
    er.containing_type = "cinfer.v1.GenerateRequest";
    er.extension_number = 100;
    rq.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION;
    rq.file_containing_extension = &er;
    r = ask(&rq);
    if (r) {
        CHECK_EQ_INT(r->error_response ? r->error_response->error_code : -1, 5);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    rq.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE;
    rq.all_extension_numbers_of_type = "cinfer.v1.GenerateRequest";
    r = ask(&rq);
    if (r) {
        CHECK_EQ_INT(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE);
        CHECK_EQ_STR(r->all_extension_numbers_response->base_type_name,
                     "cinfer.v1.GenerateRequest");
        CHECK_EQ_INT(r->all_extension_numbers_response->n_extension_number, 0);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    rq.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST__NOT_SET;
    r = ask(&rq);
    if (r) {
        CHECK_EQ_INT(r->error_response ? r->error_response->error_code : -1,
                     12);
        grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    }

    /* Bytes that are not a request. */
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    uint8_t *out = NULL;
    size_t out_len = 0;
    CHECK_EQ_INT(cinfer_refl_answer(ix, junk, sizeof junk, &out, &out_len),
                 CINFER_E_INVALID_ARG);
    CHECK(out == NULL);
}

/* Every truncation of the set fails with FORMAT or parses a prefix; none
 * crashes (ASan watches the reads). */
static void test_damaged_set(void)
{
    size_t n = cinfer_proto_descriptor_set_len;
    int formats = 0;
    for (size_t cut = 0; cut < n; cut += n / 97 + 1) {
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, cinfer_proto_descriptor_set, cut);
        cinfer_refl_index *bad = NULL;
        cinfer_status st = cinfer_refl_index_create(copy, cut, &bad);
        if (st == CINFER_OK)
            cinfer_refl_index_destroy(bad);
        else
            formats += st == CINFER_E_FORMAT;
        free(copy);
    }
    CHECK(formats > 50);
    const uint8_t wrong_type[] = {0x0b, 0x00}; /* field 1, wire type 3 */
    cinfer_refl_index *bad = NULL;
    CHECK_EQ_INT(cinfer_refl_index_create(wrong_type, sizeof wrong_type, &bad),
                 CINFER_E_FORMAT);
    CHECK(bad == NULL);
}

int main(void)
{
    CHECK_OK(cinfer_refl_index_create(cinfer_proto_descriptor_set,
                                      cinfer_proto_descriptor_set_len, &ix));
    if (!ix)
        return harness_done();
    RUN(test_services);
    RUN(test_symbols);
    RUN(test_answers);
    RUN(test_damaged_set);
    cinfer_refl_index_destroy(ix);
    return harness_done();
}
#endif
