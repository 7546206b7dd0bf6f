#!/usr/bin/env python3
"""Integration tests of /metrics: the real cinfer-server with
--metrics-listen 127.0.0.1:0 (the port read from its log), scraped over
HTTP and parsed with the Prometheus client library's text parser
(prometheus_client).

    test_metrics.py CASE --server-bin S --cli-bin C --run-bin R \\
                    --mkmodel-bin M [--model PATH] [--work DIR]

Cases:
  counts      Generate calls with known lengths, invalid Generate calls and
              Tokenize calls on a tiny random model; the scrape must parse,
              serve the exposition content type, and count exactly what was
              sent: cinfer:request_total by method and code, prompt and
              generation tokens (from the calls' usage), the TTFT, e2e and
              queue histograms (one observation per admitted call), the ITL
              histogram (at most one per token after the first), the
              gauges at rest (nothing running or waiting, serving); other
              paths answer 404.
  rejections  a global token bucket of burst 2 and a very slow refill:
              every RESOURCE_EXHAUSTED the client saw is in
              cinfer:request_total, cinfer:rejected_requests_total and the
              rejection latency histogram.

Reuses run.py's server and stub helpers. Exit status: 0 pass, 1 fail,
77 skip (no grpcio or prometheus_client, or a server without
--metrics-listen).
"""
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (the integration helpers)

from run import Skip, check, check_eq, log  # noqa: E402

ARGS = None
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def server_flags():
    r = subprocess.run([ARGS.server_bin, "--help"], capture_output=True,
                       text=True, timeout=30)
    return r.stdout + r.stderr


def need_metrics_flag():
    if "--metrics-listen" not in server_flags():
        raise Skip("cinfer-server has no --metrics-listen flag (metrics not "
                   "wired into the server)")


def fetch(port, path="/metrics"):
    """(status, content type, body text)."""
    url = "http://127.0.0.1:%d%s" % (port, path)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def scrape(port):
    """{sample name: {frozenset(labels.items()): value}} and the raw text."""
    from prometheus_client.parser import text_string_to_metric_families
    status, ctype, text = fetch(port)
    check_eq(status, 200, "/metrics status")
    check_eq(ctype, CONTENT_TYPE, "/metrics content type")
    samples = {}
    types = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples.setdefault(s.name, {})[frozenset(s.labels.items())] = \
                s.value
    return samples, types, text


def value(samples, name, **labels):
    return samples.get(name, {}).get(frozenset(labels.items()), 0.0)


def total(samples, name):
    return sum(samples.get(name, {}).values())


def wait_until(port, pred, what, timeout=10):
    """Scrapes until pred(samples) holds (a call's status can reach the
    client just before the server counts it); returns the last scrape."""
    deadline = time.time() + timeout
    while True:
        samples, types, text = scrape(port)
        if pred(samples):
            return samples, types, text
        if time.time() > deadline:
            raise AssertionError("%s never held; last scrape:\n%s" %
                                 (what, text[-6000:]))
        time.sleep(0.05)


def start(extra=()):
    """A server on a tiny model with /metrics on a port of its choosing
    (read back from its "metrics listening" log line)."""
    need_metrics_flag()
    model = run.tiny_model(ctx=256)
    return run.Server(model, extra=["--metrics-listen", "127.0.0.1:0"] +
                      list(extra), name="metrics-server")


def metrics_port(srv):
    deadline = time.time() + 30
    while time.time() < deadline:
        for line in srv.log_lines():
            if line.get("msg") == "metrics listening" and "port" in line:
                return int(line["port"])
        time.sleep(0.05)
    raise AssertionError("no \"metrics listening\" line with a port in the "
                         "server log:\n" + srv.log_text()[-3000:])


def histogram_counts(samples, name, frontend="grpc"):
    """(+Inf bucket, _count, _sum) of one front end's histogram."""
    return (value(samples, name + "_bucket", frontend=frontend, le="+Inf"),
            value(samples, name + "_count", frontend=frontend),
            value(samples, name + "_sum", frontend=frontend))


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------

def case_counts():
    import grpc
    pb, _, _, _ = run.stubs()
    n_ok, n_tokens = 5, 6
    with start() as srv:
        port = metrics_port(srv)
        stub = srv.stub()
        samples, types, text = scrape(port)
        check_eq(total(samples, "cinfer:request_total"), 0,
                 "no requests counted before any call")
        for fam in ("cinfer:time_to_first_token_seconds",
                    "cinfer:inter_token_latency_seconds",
                    "cinfer:e2e_request_latency_seconds",
                    "cinfer:request_queue_time_seconds",
                    "cinfer:rejection_latency_seconds"):
            check_eq(types.get(fam), "histogram", fam + " type")
        check_eq(types.get("cinfer:request"), "counter",
                 "cinfer:request_total type")

        prompt_sum = gen_sum = 0
        for i in range(n_ok):
            req = pb.GenerateRequest(text="hello metrics %d" % i)
            req.sampling.temperature = 0
            req.stopping.max_tokens = n_tokens
            req.stopping.ignore_eos = True
            _, final, _ = run.collect(stub.Generate(req, timeout=120))
            check_eq(final.usage.completion_tokens, n_tokens,
                     "completion tokens of call %d" % i)
            prompt_sum += final.usage.prompt_tokens
            gen_sum += final.usage.completion_tokens

        bad = [pb.GenerateRequest(), pb.GenerateRequest(text="")]
        neg = pb.GenerateRequest(text="hello")
        neg.sampling.temperature = -1
        bad.append(neg)
        for req in bad:
            try:
                list(stub.Generate(req, timeout=30))
                raise AssertionError("an invalid request was accepted")
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         "invalid request status")
        for _ in range(2):
            stub.Tokenize(pb.TokenizeRequest(text="count me"), timeout=30)

        def settled(s):
            return (value(s, "cinfer:request_total", frontend="grpc",
                          method="Generate",
                          code="OK") >= n_ok and
                    value(s, "cinfer:request_total", frontend="grpc",
                          method="Generate",
                          code="INVALID_ARGUMENT") >= len(bad) and
                    value(s, "cinfer:request_total", frontend="grpc",
                          method="Tokenize",
                          code="OK") >= 2)
        samples, _, text = wait_until(port, settled, "request counts")
        log("scrape:\n" + "\n".join(l for l in text.splitlines()
                                    if l.startswith("cinfer:") and
                                    "_bucket" not in l))
        check_eq(value(samples, "cinfer:request_total", frontend="grpc",
                       method="Generate",
                       code="OK"), n_ok, "Generate OK")
        check_eq(value(samples, "cinfer:request_total", frontend="grpc",
                       method="Generate",
                       code="INVALID_ARGUMENT"), len(bad),
                 "Generate INVALID_ARGUMENT")
        check_eq(value(samples, "cinfer:request_total", frontend="grpc",
                       method="Tokenize",
                       code="OK"), 2, "Tokenize OK")
        ours = sum(v for k, v in samples["cinfer:request_total"].items()
                   if dict(k)["method"] in ("Generate", "Tokenize"))
        check_eq(ours, n_ok + len(bad) + 2,
                 "Generate and Tokenize calls counted once each")
        check_eq(value(samples, "cinfer:generation_tokens_total",
                       frontend="grpc"), gen_sum,
                 "generation tokens")
        check_eq(value(samples, "cinfer:prompt_tokens_total",
                       frontend="grpc"), prompt_sum,
                 "prompt tokens")
        inf, count, tsum = histogram_counts(
            samples, "cinfer:time_to_first_token_seconds")
        check_eq(count, n_ok, "TTFT observations")
        check_eq(inf, count, "TTFT +Inf bucket")
        check(0 < tsum < 120 * n_ok, "TTFT sum %r in range" % tsum)
        _, e2e, e2e_sum = histogram_counts(
            samples, "cinfer:e2e_request_latency_seconds")
        check_eq(e2e, n_ok, "e2e observations")
        check(e2e_sum >= tsum, "e2e sum %r >= TTFT sum %r" % (e2e_sum, tsum))
        _, queue, _ = histogram_counts(samples,
                                       "cinfer:request_queue_time_seconds")
        check_eq(queue, n_ok, "queue-time observations")
        _, itl, _ = histogram_counts(samples,
                                     "cinfer:inter_token_latency_seconds")
        check(0 < itl <= gen_sum - n_ok,
              "ITL observations %r in (0, %d]" % (itl, gen_sum - n_ok))
        _, rej, _ = histogram_counts(samples,
                                     "cinfer:rejection_latency_seconds")
        check_eq(rej, 0, "no rejections")
        # Gauges at rest.
        check_eq(value(samples, "cinfer:num_requests_running"), 0, "running")
        check_eq(value(samples, "cinfer:num_requests_waiting"), 0, "waiting")
        kv = value(samples, "cinfer:kv_cache_usage_perc")
        check(0 <= kv <= 1, "kv usage %r in [0, 1]" % kv)
        check_eq(value(samples, "cinfer:health_serving"), 1, "serving")
        check_eq(value(samples, "cinfer:breaker_state"), 0, "breaker closed")
        check(value(samples, "process_resident_memory_bytes") > 1e6,
              "resident memory reported")
        q = value(samples, "cinfer:prefix_cache_queries_total")
        h = value(samples, "cinfer:prefix_cache_hits_total")
        check(0 <= h <= q, "prefix cache hits %r <= queries %r" % (h, q))

        status, _, _ = fetch(port, "/")
        check_eq(status, 404, "GET / status")
        status, _, _ = fetch(port, "/metrics/x")
        check_eq(status, 404, "GET /metrics/x status")


def case_rejections():
    import grpc
    if "--rate-limit-qps" not in server_flags():
        raise Skip("cinfer-server has no --rate-limit-qps flag")
    pb, _, _, _ = run.stubs()
    n_calls = 8
    with start(["--rate-limit-qps", "0.01", "--rate-limit-burst", "2"]) as srv:
        port = metrics_port(srv)
        stub = srv.stub()
        codes = {}
        for i in range(n_calls):
            req = pb.GenerateRequest(text="limit %d" % i)
            req.stopping.max_tokens = 2
            try:
                run.collect(stub.Generate(req, timeout=60))
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            codes[code] = codes.get(code, 0) + 1
        log("client saw", codes)
        limited = codes.get("RESOURCE_EXHAUSTED", 0)
        check(limited >= n_calls - 3,
              "most calls rate limited: %r" % codes)

        def settled(s):
            return sum(value(s, "cinfer:request_total", frontend="grpc",
                             method="Generate",
                             code=c) for c in codes) >= n_calls
        samples, _, _ = wait_until(port, settled, "request counts")
        for c, n in codes.items():
            check_eq(value(samples, "cinfer:request_total", frontend="grpc",
                           method="Generate", code=c), n, "Generate " + c)
        reasons = samples.get("cinfer:rejected_requests_total", {})
        log("rejections by reason:", {dict(k).get("reason"): v
                                      for k, v in reasons.items()})
        check_eq(total(samples, "cinfer:rejected_requests_total"), limited,
                 "rejections by reason add up to the RESOURCE_EXHAUSTED "
                 "calls")
        check(all(dict(k).get("reason", "").startswith("rate_limited")
                  for k in reasons),
              "every reason is a rate limit: %r" % list(reasons))
        inf, count, rsum = histogram_counts(
            samples, "cinfer:rejection_latency_seconds")
        check_eq(count, limited, "rejection latency observations")
        check_eq(inf, count, "rejection +Inf bucket")
        check(0 <= rsum < limited * 1.0, "rejection latency sum %r" % rsum)


CASES = {
    "counts": case_counts,
    "rejections": case_rejections,
}


def prepare():
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        raise Skip("prometheus_client not installed "
                   "(scripts/install-deps.sh installs it)")


if __name__ == "__main__":
    sys.exit(run.case_main(__name__, CASES, "metrics", prepare=prepare))
