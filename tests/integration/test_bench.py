#!/usr/bin/env python3
"""Integration tests of cinfer-bench, the load generator.

    test_bench.py CASE --bench-bin B [--server-bin S --cli-bin C --model M]

Cases:
  workload  --dry-run only (no server): the same seed gives the same
            workload, lengths stay in their range, synthetic ids in the
            vocabulary, arrival gaps have the Poisson / gamma mean and spread.
  grpc      the real cinfer-server (default model, free loopback port):
            8 requests at concurrency 4, 16 prompt and 8 output tokens;
            the JSON must count every token and request, its statistics must
            match what the per-request data gives, the server's own counters
            must agree; an open-loop run; a run the server rejects is counted
            by status name; an unreachable server exits 2.
  retries   --retries: usage errors first (N out of 1..4, llamacpp); then
            the real server with a global rate limit (2/s, burst 2) gets
            a burst of requests: without retries some fail with
            RESOURCE_EXHAUSTED (exit 1); with --retries 4 every request
            completes (exit 0) while the server's log and /metrics show it
            refused attempts, no request more than 4 times, and gRPC waited
            the server's grpc-retry-pushback-ms between a request's attempts.
  llamacpp  --protocol llamacpp against a scripted HTTP server that streams
            in llama-server's /completion format (from its source,
            tools/server): the request fields, token counts from
            tokens_predicted (two tokens in one event), timings at least the
            scripted delays, an HTTP 503 and an error event counted by name.

Exit status: 0 pass, 1 fail, 77 skip (no default model; cinfer-bench
built without libcurl for the llamacpp case).
"""
import argparse
import http.server
import json
import math
import os
import re
import signal
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

SKIP = 77
ARGS = None


class Skip(Exception):
    pass


def log(*a):
    print("[bench-it]", *a, file=sys.stderr, flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_eq(a, b, what):
    if a != b:
        raise AssertionError("%s: %r != %r" % (what, a, b))


def close(a, b, what, rel=1e-9, abs_=1e-9):
    if not math.isclose(a, b, rel_tol=rel, abs_tol=abs_):
        raise AssertionError("%s: %r vs %r" % (what, a, b))


def bench(*args, timeout=600):
    cmd = [ARGS.bench_bin] + [str(a) for a in args]
    log(" ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.stderr:
        log("stderr:", r.stderr.strip()[-2000:])
    return r


def percentile(values, p):
    """numpy's default (linear) percentile."""
    v = sorted(values)
    if not v:
        return 0.0
    rank = p / 100.0 * (len(v) - 1)
    lo = math.floor(rank)
    if lo >= len(v) - 1:
        return v[-1]
    return v[lo] + (v[lo + 1] - v[lo]) * (rank - lo)


def check_stats(res, what):
    """The summary statistics agree with the per-request arrays."""
    ok = [i for i, s in enumerate(res["statuses"]) if s == "OK"]
    ttft = [res["ttfts"][i] * 1e3 for i in ok if res["output_lens"][i] > 0]
    e2el = [res["e2els"][i] * 1e3 for i in ok]
    itl = [x * 1e3 for i in ok for x in res["itls"][i]]
    tpot = [(res["e2els"][i] - res["ttfts"][i]) * 1e3 /
            (res["output_lens"][i] - 1)
            for i in ok if res["output_lens"][i] > 1]
    for name, vals in (("ttft", ttft), ("e2el", e2el), ("itl", itl),
                       ("tpot", tpot)):
        close(res["mean_%s_ms" % name], statistics.fmean(vals) if vals else 0,
              "%s mean %s" % (what, name), rel=1e-6, abs_=1e-6)
        close(res["std_%s_ms" % name], statistics.pstdev(vals) if vals else 0,
              "%s std %s" % (what, name), rel=1e-5, abs_=1e-5)
        for p, key in ((50, "median"), (50, "p50"), (90, "p90"), (95, "p95"),
                       (99, "p99")):
            close(res["%s_%s_ms" % (key, name)], percentile(vals, p),
                  "%s %s %s" % (what, key, name), rel=1e-6, abs_=1e-6)
        check(res["median_%s_ms" % name] <= res["p90_%s_ms" % name] <=
              res["p99_%s_ms" % name], "%s %s percentiles ordered" %
              (what, name))
    check_eq(res["completed"], len(ok), what + " completed")
    check_eq(res["total_output_tokens"],
             sum(res["output_lens"][i] for i in ok), what + " output tokens")
    check_eq(res["total_input_tokens"],
             sum(res["input_lens"][i] for i in ok), what + " input tokens")
    d = res["duration"]
    check(d > 0, what + " duration > 0")
    close(res["request_throughput"], len(ok) / d, what + " req/s")
    close(res["output_throughput"], res["total_output_tokens"] / d,
          what + " tok/s")
    close(res["total_token_throughput"],
          (res["total_input_tokens"] + res["total_output_tokens"]) / d,
          what + " total tok/s")
    for i in ok:
        check(0 < res["ttfts"][i] <= res["e2els"][i] <= d + 1e-6,
              "%s request %d: 0 < ttft <= e2el <= duration" % (what, i))
        check_eq(len(res["itls"][i]), max(res["output_lens"][i] - 1, 0),
                 "%s request %d: one ITL per token after the first" %
                 (what, i))
        check(all(x >= 0 for x in res["itls"][i]), what + " ITLs >= 0")
        check(res["ttfts"][i] + sum(res["itls"][i]) <= res["e2els"][i] + 1e-6,
              "%s request %d: ttft + itls <= e2el" % (what, i))


# ---------------------------------------------------------------------------
# workload
# ---------------------------------------------------------------------------

def dry(*args):
    r = bench("--dry-run", *args)
    check_eq(r.returncode, 0, "dry run exit status")
    return [json.loads(l) for l in r.stdout.splitlines()]


def case_workload():
    a = dry("--num-requests", 50, "--input-len", 64, "--output-len", 32,
            "--range-ratio", 0.5, "--vocab-size", 1000, "--seed", 7,
            "--rate", 10)
    b = dry("--num-requests", 50, "--input-len", 64, "--output-len", 32,
            "--range-ratio", 0.5, "--vocab-size", 1000, "--seed", 7,
            "--rate", 10)
    check_eq(a, b, "the same seed gives the same workload")
    c = dry("--num-requests", 50, "--input-len", 64, "--output-len", 32,
            "--range-ratio", 0.5, "--vocab-size", 1000, "--seed", 8,
            "--rate", 10)
    check(sum(x["prompt_hash"] != y["prompt_hash"] for x, y in zip(a, c)) >= 45,
          "another seed gives other prompts")
    # A different rate leaves prompts and lengths alone.
    e = dry("--num-requests", 50, "--input-len", 64, "--output-len", 32,
            "--range-ratio", 0.5, "--vocab-size", 1000, "--seed", 7,
            "--rate", 3)
    check_eq([(x["prompt_hash"], x["input_len"], x["output_len"]) for x in a],
             [(x["prompt_hash"], x["input_len"], x["output_len"]) for x in e],
             "the rate does not change prompts")
    for x in a:
        check(32 <= x["input_len"] <= 96, "input_len in [32, 96]: %r" % x)
        check(16 <= x["output_len"] <= 48, "output_len in [16, 48]: %r" % x)
        check(0 <= x["min_id"] <= x["max_id"] < 1000, "ids in vocab: %r" % x)
    check(len({x["input_len"] for x in a}) > 10, "input lengths vary")
    fixed = dry("--num-requests", 20, "--input-len", 16, "--output-len", 8,
                "--vocab-size", 50)
    check(all(x["input_len"] == 16 and x["output_len"] == 8 for x in fixed),
          "range ratio 0 gives fixed lengths")
    check(all(x["arrival_s"] == 0 for x in fixed),
          "no rate: every request arrives at 0")

    n = 4000
    for shape in (1.0, 0.25, 4.0):
        w = dry("--num-requests", n, "--input-len", 1, "--output-len", 1,
                "--vocab-size", 10, "--rate", 20, "--burstiness", shape,
                "--seed", 3)
        t = [x["arrival_s"] for x in w]
        check_eq(t[0], 0.0, "the first request arrives at 0")
        gaps = [b - a for a, b in zip(t, t[1:])]
        check(all(g >= 0 for g in gaps), "arrivals in order")
        mean = statistics.fmean(gaps)
        cv = statistics.pstdev(gaps) / mean
        log("burstiness %.2f: mean gap %.4f s (want 0.05), cv %.3f (want "
            "%.3f)" % (shape, mean, cv, 1 / math.sqrt(shape)))
        check(abs(mean - 0.05) < 0.05 * 0.1, "mean gap 1/rate")
        check(abs(cv - 1 / math.sqrt(shape)) < 0.1 / math.sqrt(shape),
              "gamma gaps: coefficient of variation 1/sqrt(shape)")

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("first prompt\n\nsecond prompt\r\nthird\n")
        path = f.name
    try:
        w = dry("--num-requests", 6, "--prompts-file", path)
        hashes = [x["prompt_hash"] for x in w]
        check_eq(hashes[:3], hashes[3:], "prompt lines are cycled")
        check_eq(len(set(hashes)), 3, "empty lines are skipped")
    finally:
        os.unlink(path)
    r = bench("--dry-run", "--prompts-file", "/nonexistent/prompts")
    check(r.returncode != 0, "a missing prompts file fails")
    r = bench("--dry-run", "--range-ratio", "1.5")
    check_eq(r.returncode, 64, "a bad range ratio is a usage error")
    r = bench("--dry-run", "--goodput", "ttft:100", "tpot:x")
    check_eq(r.returncode, 64, "a bad goodput pair is a usage error")


# ---------------------------------------------------------------------------
# grpc: the real server
# ---------------------------------------------------------------------------

class Server:
    def __init__(self, work, extra=()):
        self.work = work
        self.extra = [str(a) for a in extra]
        self.proc = None

    def __enter__(self):
        self.log_path = os.path.join(self.work, "server.log")
        self.log_file = open(self.log_path, "w")
        cmd = [ARGS.server_bin, "--listen", "127.0.0.1:0", "--model",
               ARGS.model, "--threads", "2"] + self.extra
        log("start", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=self.log_file)
        deadline = time.time() + 120
        port = None
        while port is None:
            check(self.proc.poll() is None,
                  "server exited early:\n" + self.log_text())
            check(time.time() < deadline,
                  "server did not listen:\n" + self.log_text())
            for line in self.log_text().splitlines():
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("msg") == "listening":
                    port = j["port"]
            time.sleep(0.05)
        self.addr = "127.0.0.1:%d" % port
        while True:
            r = subprocess.run([ARGS.cli_bin, "--server", self.addr,
                                "--timeout", "10", "health"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            check(self.proc.poll() is None,
                  "server exited:\n" + self.log_text())
            check(time.time() < deadline, "server never became SERVING")
            time.sleep(0.1)
        return self

    def log_text(self):
        self.log_file.flush()
        with open(self.log_path) as f:
            return f.read()

    def log_lines(self):
        out = []
        for line in self.log_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def info(self):
        r = subprocess.run([ARGS.cli_bin, "--server", self.addr, "--json",
                            "--timeout", "30", "info"],
                           capture_output=True, text=True)
        check_eq(r.returncode, 0, "cinfer-cli info")
        return json.loads(r.stdout)

    def __exit__(self, exc_type, exc, tb):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        if exc_type is None:
            check_eq(self.proc.returncode, 0, "server exit status")
        return False


def case_grpc(work):
    if not ARGS.model or not os.path.isfile(ARGS.model):
        raise Skip("the default model is not installed")
    with Server(work) as srv:
        out = os.path.join(work, "bench.json")
        r = bench("--server", srv.addr, "--num-requests", 8, "--concurrency",
                  4, "--input-len", 16, "--output-len", 8, "--seed", 1,
                  "--json", out, "--save-detailed", "--goodput", "ttft:60000",
                  "tpot:60000", timeout=300)
        check_eq(r.returncode, 0, "cinfer-bench exit status")
        check("Serving Benchmark Result" in r.stdout, "the text report")
        res = json.load(open(out))
        check_eq(res["backend"], "cinfer", "backend")
        check_eq(res["completed"], 8, "completed")
        check_eq(res["failed"], 0, "failed")
        check_eq(res["errors"], {}, "errors")
        check_eq(res["total_output_tokens"], 64, "output tokens")
        check_eq(res["total_input_tokens"], 128, "input tokens")
        check_eq(res["max_concurrency"], 4, "max_concurrency")
        check_eq(res["request_rate"], "inf", "request_rate")
        check_eq(res["output_lens"], [8] * 8, "8 tokens each")
        check_eq(res["request_goodput"], res["request_throughput"],
                 "a loose SLO: every request is good")
        check(0 < res["mean_ttft_ms"] < 120000, "mean TTFT sane")
        check(0 < res["mean_tpot_ms"] < 60000, "mean TPOT sane")
        check(0 < res["p99_e2el_ms"] < 300000, "p99 E2EL sane")
        check_stats(res, "closed loop")
        # At most 4 in flight: the 5th request starts after one ended.
        starts = sorted(res["start_times"])
        ends = sorted(s + e for s, e in zip(res["start_times"], res["e2els"]))
        check(starts[4] >= ends[0] - 1e-6,
              "concurrency 4: request 5 starts after the first end")

        st = srv.info()["stats"]
        check_eq(int(st.get("generatedTokens", 0)), 64,
                 "the server generated 64 tokens")
        check_eq(int(st.get("promptTokens", 0)), 128,
                 "the server saw 128 prompt tokens")

        # Open loop: Poisson arrivals, no concurrency cap.
        r = bench("--server", srv.addr, "--num-requests", 4, "--rate", 20,
                  "--input-len", 8, "--output-len", 4, "--range-ratio", 0.5,
                  "--json", out, "--save-detailed", "--seed", 2, timeout=300)
        check_eq(r.returncode, 0, "open loop exit status")
        res = json.load(open(out))
        check_eq(res["completed"], 4, "open loop completed")
        check_eq(res["request_rate"], 20, "request_rate")
        check_stats(res, "open loop")
        check(sorted(res["start_times"]) != [res["start_times"][0]] * 4,
              "arrivals spread out")

        # The server rejects every request: counted by status name.
        r = bench("--server", srv.addr, "--num-requests", 3, "--concurrency",
                  2, "--input-len", 4, "--output-len", 2, "--temperature",
                  500, "--json", out, timeout=300)
        check_eq(r.returncode, 1, "failed requests: exit status 1")
        res = json.load(open(out))
        check_eq(res["completed"], 0, "rejected: completed")
        check_eq(res["failed"], 3, "rejected: failed")
        check_eq(res["errors"], {"INVALID_ARGUMENT": 3}, "errors by name")
        check("INVALID_ARGUMENT" in r.stderr, "the first failure is shown")

        # Deadlines far shorter than the generation.
        r = bench("--server", srv.addr, "--num-requests", 2, "--concurrency",
                  2, "--input-len", 4, "--output-len", 64, "--timeout", 0.05,
                  "--json", out, timeout=300)
        check_eq(r.returncode, 1, "deadlines: exit status 1")
        res = json.load(open(out))
        check_eq(res["errors"], {"DEADLINE_EXCEEDED": 2}, "deadline errors")

    # Nothing listens there any more.
    r = bench("--server", srv.addr, "--num-requests", 1, timeout=120)
    check_eq(r.returncode, 2, "unreachable server: exit status 2")


# ---------------------------------------------------------------------------
# retries: gRPC core's retry policy against the server's rate limiter
# ---------------------------------------------------------------------------

def rejected_total(port):
    """cinfer:rejected_requests_total{frontend="grpc",
    reason="rate_limited_global"}."""
    url = "http://127.0.0.1:%d/metrics" % port
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^cinfer:rejected_requests_total\{frontend="grpc",reason="'
                  r'rate_limited_global"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def log_ms(line):
    """A log line's "ts" (2026-11-30T03:24:34.269Z) in ms of the day."""
    h, m, s = line["ts"].split("T")[1].rstrip("Z").split(":")
    return (int(h) * 3600 + int(m) * 60 + float(s)) * 1e3


def case_retries(work):
    # Usage errors, before any server is contacted.
    for args, what in ((["--retries", 9], "--retries 9"),
                       (["--retries", 5], "--retries 5 (6 attempts)"),
                       (["--retries", -1], "--retries -1"),
                       (["--retries", 2, "--retry-backoff-ms", 0],
                        "--retry-backoff-ms 0"),
                       (["--retries", 1, "--protocol", "llamacpp"],
                        "--retries with --protocol llamacpp")):
        r = bench("--server", "127.0.0.1:1", "--num-requests", 1, *args,
                  timeout=60)
        check_eq(r.returncode, 64, what + ": usage error")
        check("retr" in r.stderr or "bad value" in r.stderr,
              what + ": says why")
    r = bench("--protocol", "llamacpp", "--retries", 1, "--server",
              "127.0.0.1:1", timeout=60)
    check("llamacpp has no retries" in r.stderr,
          "llamacpp: the message names the protocol")

    if not ARGS.model or not os.path.isfile(ARGS.model):
        raise Skip("the default model is not installed")
    qps, burst = 2, 2
    with Server(work, ["--rate-limit-qps", qps, "--rate-limit-burst", burst,
                       "--metrics-listen", "127.0.0.1:0"]) as srv:
        port = None
        for line in srv.log_lines():
            if line.get("msg") == "metrics listening":
                port = int(line["port"])
        check(port is not None, "the server's metrics port is logged")
        out = os.path.join(work, "retries.json")
        common = ["--server", srv.addr, "--input-len", 4, "--output-len", 2,
                  "--timeout", 60, "--json", out, "--save-detailed"]

        # No retries: all at once, beyond the burst some are refused.
        n = 6
        r = bench("--num-requests", n, *common, timeout=120)
        check_eq(r.returncode, 1, "no retries: exit status 1")
        res = json.load(open(out))
        log("no retries:", res["completed"], "completed, errors",
            res["errors"])
        check_eq(res["max_attempts"], 1, "no retries: max_attempts")
        check(res["failed"] >= 1, "no retries: some requests refused")
        check_eq(res["completed"] + res["failed"], n,
                 "no retries: every request finished")
        check_eq(res["errors"], {"RESOURCE_EXHAUSTED": res["failed"]},
                 "no retries: refused by the rate limiter")
        check("RESOURCE_EXHAUSTED" in r.stderr, "the first failure is shown")

        # The bucket refills (burst / qps seconds), so the retried run
        # starts from a full one: its first round admits `burst`, each
        # pushback round at least one more, so 4 requests need at most 3
        # attempts; 5 leave room for a retry that arrives a hair before
        # its token (a pushback rounded to 1 ms) and is refused again.
        time.sleep(burst / qps + 0.2)
        before = rejected_total(port)
        skip_lines = len(srv.log_lines())
        n = 4
        r = bench("--num-requests", n, "--retries", 4, "--retry-backoff-ms",
                  10, *common, timeout=120)
        check_eq(r.returncode, 0, "--retries 4: exit status 0")
        res = json.load(open(out))
        check_eq(res["max_attempts"], 5, "--retries 4: max_attempts")
        check_eq(res["completed"], n, "--retries 4: every request completed")
        check_eq(res["errors"], {}, "--retries 4: no errors")
        check_eq(res["statuses"], ["OK"] * n, "--retries 4: statuses")
        check_eq(res["total_output_tokens"], 2 * n, "--retries 4: tokens")

        refused = [l for l in srv.log_lines()[skip_lines:]
                   if l.get("msg") == "call rejected"]
        by_id = {}
        for l in refused:
            check_eq(l.get("reason"), "rate_limited_global",
                     "refused by the global rate limit")
            by_id.setdefault(l.get("request_id"), []).append(l)
        log("refused attempts:", {k: len(v) for k, v in by_id.items()})
        check(len(refused) >= n - burst,
              "the rate limiter refused attempts of the retried run: %d" %
              len(refused))
        check(set(by_id) <= {"bench-%d" % i for i in range(n)},
              "refusals belong to the run's requests")
        check(all(len(v) <= 4 for v in by_id.values()),
              "no request refused more than --retries times")
        # gRPC waited the server's pushback (500 ms here), not the 10 ms
        # backoff, before trying a refused request again.
        for rid, v in by_id.items():
            for a, b in zip(v, v[1:]):
                gap = log_ms(b) - log_ms(a)
                check(gap >= a["retry_after_ms"] - 5,
                      "%s: %.0f ms between refusals, pushback %d ms" %
                      (rid, gap, a["retry_after_ms"]))
        deadline = time.time() + 10
        while rejected_total(port) - before < len(refused):
            check(time.time() < deadline,
                  "/metrics counts the refusals: %r of %d" %
                  (rejected_total(port) - before, len(refused)))
            time.sleep(0.05)
        check_eq(rejected_total(port) - before, len(refused),
                 "/metrics: rate_limited_global refusals")


# ---------------------------------------------------------------------------
# llamacpp: llama-server's streaming format
# ---------------------------------------------------------------------------

FIRST_DELAY = 0.15
TOKEN_DELAY = 0.03
VOCAB = 1000


class Script:
    """What the scripted server saw and how it answers."""

    def __init__(self):
        self.lock = threading.Lock()
        self.posts = 0
        self.problems = []
        self.bodies = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script = None

    def log_message(self, fmt, *args):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{
                "id": "scripted", "object": "model",
                "meta": {"n_vocab": VOCAB, "n_ctx": 512}}]})
        else:
            self.send_json(404, {"error": {"code": 404}})

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        s = self.script
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with s.lock:
            s.posts += 1
            k = s.posts
            s.bodies.append(body)
        if self.path != "/completion":
            s.problems.append("path %s" % self.path)
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and len(prompt) == 12 and
                all(isinstance(t, int) and 0 <= t < VOCAB for t in prompt)):
            s.problems.append("prompt %r" % (prompt,))
        for key, want in (("n_predict", 8), ("stream", True),
                          ("ignore_eos", True), ("cache_prompt", False),
                          ("temperature", 0)):
            if body.get(key) != want:
                s.problems.append("%s = %r" % (key, body.get(key)))
        if k == 3:
            self.send_json(503, {"error": {"code": 503, "message":
                                           "Loading model",
                                           "type": "unavailable_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = body["n_predict"]
        time.sleep(FIRST_DELAY)
        predicted = 0
        ev = 0
        while predicted < n:
            # The fourth event carries two tokens (the server held back a
            # token that ended inside a UTF-8 character).
            step = 2 if ev == 3 else 1
            predicted = min(n, predicted + step)
            if ev > 0:
                time.sleep(TOKEN_DELAY)
            ev += 1
            if k == 5 and predicted >= 3:
                self.chunk("data: " + json.dumps(
                    {"error": {"code": 500, "message": "scripted failure",
                               "type": "server_error"}}) + "\n\n")
                break
            self.chunk("data: " + json.dumps({
                "index": 0, "content": "t\"stop\":true%d" % predicted,
                "tokens": [predicted], "stop": False, "id_slot": -1,
                "tokens_predicted": predicted,
                "tokens_evaluated": len(prompt)}) + "\n\n")
        else:
            self.chunk("data: " + json.dumps({
                "index": 0, "content": "", "tokens": [], "id_slot": 0,
                "stop": True, "tokens_predicted": predicted,
                "tokens_evaluated": len(prompt),
                "timings": {"prompt_n": len(prompt)}}) + "\n\n")
        self.chunk("")


class ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def case_llamacpp(work):
    script = Script()
    Handler.script = script
    httpd = ThreadingServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=httpd.serve_forever, daemon=True)
    th.start()
    try:
        out = os.path.join(work, "llama.json")
        r = bench("--protocol", "llamacpp", "--server",
                  "127.0.0.1:%d" % httpd.server_address[1],
                  "--num-requests", 8, "--concurrency", 3, "--input-len", 12,
                  "--output-len", 8, "--json", out, "--save-detailed",
                  timeout=120)
        if r.returncode == 2 and "without libcurl" in r.stderr:
            raise Skip("cinfer-bench was built without libcurl")
        check_eq(r.returncode, 1, "exit status (two requests fail)")
    finally:
        httpd.shutdown()
        httpd.server_close()
    check_eq(script.problems, [], "requests as llama-server wants them")
    check_eq(script.posts, 8, "8 POSTs")
    res = json.load(open(out))
    check_eq(res["backend"], "llamacpp", "backend")
    check_eq(res["completed"], 6, "completed")
    check_eq(res["errors"], {"HTTP_503": 1, "SERVER_ERROR": 1},
             "errors by name")
    check_eq(res["total_output_tokens"], 48, "output tokens")
    check_eq(res["total_input_tokens"], 72, "input tokens")
    check_stats(res, "llamacpp")
    for i, s in enumerate(res["statuses"]):
        if s != "OK":
            continue
        itl = res["itls"][i]
        check_eq(len(itl), 7, "request %d: 7 ITLs" % i)
        check(itl.count(0.0) >= 1,
              "request %d: two tokens of one event arrive together" % i)
        check(res["ttfts"][i] >= FIRST_DELAY * 0.95,
              "request %d: TTFT %.3f >= the scripted delay" %
              (i, res["ttfts"][i]))
        check(sum(itl) >= 6 * TOKEN_DELAY * 0.95,
              "request %d: ITLs add up to the scripted delays" % i)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["workload", "grpc", "retries",
                                     "llamacpp"])
    ap.add_argument("--bench-bin", required=True)
    ap.add_argument("--server-bin")
    ap.add_argument("--cli-bin")
    ap.add_argument("--model", default=os.environ.get("CINFER_MODEL", ""))
    ARGS = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cinfer-bench-it-")
    try:
        if ARGS.case == "workload":
            case_workload()
        elif ARGS.case == "grpc":
            case_grpc(work)
        elif ARGS.case == "retries":
            case_retries(work)
        else:
            case_llamacpp(work)
    except Skip as e:
        log("SKIP:", e)
        return SKIP
    except Exception:
        traceback.print_exc()
        log("FAIL, work files in", work)
        return 1
    log("PASS")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
