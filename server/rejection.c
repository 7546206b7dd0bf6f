/*
 * rejection.c - the google.rpc.Status a rejection carries in its
 * grpc-status-details-bin trailer.
 *
 * gRPC's rich error model: a client (or a mesh sidecar) that knows
 * google.rpc.Status reads the code, the message and typed details from the
 * trailer; one that does not still sees grpc-status, grpc-message and
 * grpc-retry-pushback-ms. Every rejection (rate limited, breaker open,
 * shed, draining, loading) carries a google.rpc.RetryInfo whose retry_delay
 * equals the pushback, and a rate limit also a google.rpc.QuotaFailure
 * naming the bucket that refused (the global one or the client's). The
 * details are google.protobuf.Any messages with the type URLs every gRPC
 * library resolves ("type.googleapis.com/google.rpc.RetryInfo").
 */
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/any.pb-c.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "server/server_impl.h"

/* Packs m into a malloc'd buffer (*out, *len). Returns 0 when out of
 * memory. */
static int pack(const ProtobufCMessage *m, uint8_t **out, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    protobuf_c_message_pack(m, buf);
    *out = buf;
    *len = n;
    return 1;
}

int cinfer_rpc_status_pack(int grpc_code, const char *message,
                           const cinfer_pushback *pb, grpc_slice *out)
{
    int ok = 0;
    uint8_t *retry_buf = NULL, *quota_buf = NULL, *status_buf = NULL;
    size_t retry_len = 0, quota_len = 0, status_len = 0;

    int64_t ms = pb && pb->retry_after_ms > 0 ? pb->retry_after_ms : 0;
    Google__Protobuf__Duration delay = GOOGLE__PROTOBUF__DURATION__INIT;
    delay.seconds = ms / 1000;
    delay.nanos = (int32_t)(ms % 1000) * 1000000;
    Google__Rpc__RetryInfo retry = GOOGLE__RPC__RETRY_INFO__INIT;
    retry.retry_delay = &delay;
    if (!pack(&retry.base, &retry_buf, &retry_len))
        goto out;

    Google__Protobuf__Any any[2];
    Google__Protobuf__Any *anyp[2];
    size_t n_details = 0;
    google__protobuf__any__init(&any[0]);
    any[0].type_url = "type.googleapis.com/google.rpc.RetryInfo";
    any[0].value.data = retry_buf;
    any[0].value.len = retry_len;
    anyp[n_details] = &any[0];
    n_details++;

    if (pb && pb->quota_subject) {
        Google__Rpc__QuotaFailure__Violation v =
            GOOGLE__RPC__QUOTA_FAILURE__VIOLATION__INIT;
        v.subject = (char *)pb->quota_subject;
        v.description = (char *)(pb->quota_desc ? pb->quota_desc : "");
        Google__Rpc__QuotaFailure__Violation *vp = &v;
        Google__Rpc__QuotaFailure qf = GOOGLE__RPC__QUOTA_FAILURE__INIT;
        qf.n_violations = 1;
        qf.violations = &vp;
        if (!pack(&qf.base, &quota_buf, &quota_len))
            goto out;
        google__protobuf__any__init(&any[1]);
        any[1].type_url = "type.googleapis.com/google.rpc.QuotaFailure";
        any[1].value.data = quota_buf;
        any[1].value.len = quota_len;
        anyp[n_details] = &any[1];
        n_details++;
    }

    Google__Rpc__Status st = GOOGLE__RPC__STATUS__INIT;
    st.code = grpc_code;
    st.message = (char *)(message ? message : "");
    st.n_details = n_details;
    st.details = anyp;
    if (!pack(&st.base, &status_buf, &status_len))
        goto out;
    *out = grpc_slice_from_copied_buffer((const char *)status_buf,
                                         status_len);
    ok = 1;
out:
    free(status_buf);
    free(quota_buf);
    free(retry_buf);
    return ok;
}
