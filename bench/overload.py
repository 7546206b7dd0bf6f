#!/usr/bin/env python3
"""Overload benchmark: cinfer-server under open-loop load from 0.5x to 10x
its measured capacity, with the resilience layer on and off.

    bench/overload.py [--build build] [--threads 2] [--duration 30]
                      [--levels 0.5,1,2,5,10] [--configs on,retries,off]
                      [--protocol grpc|openai|both]

1. Capacity: a closed-loop cinfer-bench run at a moderate concurrency
   (--capacity-concurrency, default 8) with short requests: 64-token
   synthetic prompts, 32 output tokens (ignore_eos, greedy), each with a
   deadline (--deadline, default 5 s), against a server with the
   resilience layer off where it can be switched off (the engine's own
   capacity, not what admission control lets through). Capacity =
   completed requests / s.
2. The configurations: resilience on; on with client retries when
   cinfer-bench has a retry option; resilience off when cinfer-server has
   `--resilience off`. One server per server flag set, started side by
   side (each idles while another is measured); at each load level the
   configurations take turns in an order that rotates, so drift in the
   machine's background load does not favour one. A level is an
   open-loop (Poisson) run of the same requests at level x capacity for
   --duration seconds of arrivals. Per level:
     goodput     requests that finished OK within their deadline, per
                 second of the run
     p99 TTFT    of admitted requests (those that received a token)
     p99 reject  client-side time to a rejection: no token received, and
                 RESOURCE_EXHAUSTED, UNAVAILABLE, or a DEADLINE_EXCEEDED
                 that came before half the deadline (refused as unable
                 to meet it rather than expired while queued)
     statuses    every non-OK status by name
     RSS         the server's VmRSS (/proc/PID/status) sampled every
                 0.2 s during the run: at the start, the peak, at the end
     KV after    kv_blocks_used from GetModelInfo once the server is idle
                 (cinfer-cli info); every block must be free
   and, where the server serves /metrics, its own rejection latency
   histogram (p99 estimated from the buckets, linear inside a bucket as
   Prometheus's histogram_quantile; it also counts requests shed while
   they waited) and rejections by reason.
3. A table and checks against the targets (goodput at 10x >= 90% of 1x;
   p99 TTFT at 10x <= 2x that at 1x; p99 rejection < 5 ms; RSS flat; all
   KV blocks free) in bench/results/overload.md, and a gnuplot PNG
   (goodput and p99 TTFT against offered load, one line per
   configuration) next to it.

Front ends (--protocol): grpc (the default; bench/results/overload.md),
openai (cinfer-bench --protocol openai against the server's
--http-listen: the OpenAI-compatible API over the same admission path), or
both in one run (bench/results/overload-frontends.md): each front end's
capacity is measured on its own (the median of --capacity-rounds runs,
the front ends taking turns, each run with prompts of its own), its
levels are multiples of its own capacity, the two front ends take turns
at each level like the configurations, and the report compares them
(capacity ratio, goodput at the top level against 1x). The HTTP API
carries no per-request deadline, so with it every server runs with
`--max-request-time` = --deadline: HTTP requests get the deadline gRPC's
send (their deadline-based refusals, --max-ttft-ms among them, need one).
Over HTTP the statuses are HTTP_<code> (HTTP_429 and HTTP_503 are
refusals, HTTP_504 a deadline), SERVER_ERROR an error event in a stream
(with no token received: a request shed at its first token), CURLE_28 the
client's own timeout. Client retries are gRPC's only. The server's
rejection histogram and reasons are read for the front end's own
`frontend` label.

The load generator runs on the same machine as the server and competes
with it for the cores; the results file records the machine, its load
average and the exact commands.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = {
    "server": "server/cinfer-server",
    "cli": "clients/cinfer-cli",
    "bench": "clients/cinfer-bench",
}
REJECT_CODES = ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "HTTP_429", "HTTP_503")
# A shed at the first token: gRPC's UNAVAILABLE, over HTTP an error event
# in a stream whose headers were already sent.
STREAM_REFUSALS = ("SERVER_ERROR",)
DEADLINE_CODES = ("DEADLINE_EXCEEDED", "HTTP_504")
PROTOCOLS = ("grpc", "openai")


def log(*a):
    print("[overload]", *a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True,
                          **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def percentile(values, p):
    """numpy's default (linear) percentile; NaN for no values."""
    v = sorted(values)
    if not v:
        return float("nan")
    rank = p / 100.0 * (len(v) - 1)
    lo = math.floor(rank)
    if lo >= len(v) - 1:
        return v[-1]
    return v[lo] + (v[lo + 1] - v[lo]) * (rank - lo)


def ensure_built(build):
    paths = {k: os.path.join(build, v) for k, v in PROGRAMS.items()}
    if not all(os.access(p, os.X_OK) for p in paths.values()):
        log("building cinfer in", build)
        sh(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"])
        sh(["cmake", "--build", build, "-j", "2", "--target",
            "cinfer-server", "cinfer-cli", "cinfer-bench"])
    return paths


def help_text(prog):
    r = subprocess.run([prog, "--help"], capture_output=True, text=True)
    return r.stdout + r.stderr


def default_model():
    r = subprocess.run(["sh", os.path.join(ROOT, "scripts",
                                           "default-model.sh")],
                       capture_output=True, text=True)
    return r.stdout.strip()


# ---------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------

class Server:
    def __init__(self, progs, model, threads, extra, work, name,
                 http=False):
        self.progs = progs
        self.addr = "127.0.0.1:%d" % free_port()
        self.http_addr = None
        self.metrics_port = None
        cmd = [progs["server"], "--listen", self.addr, "--model", model,
               "--threads", str(threads), "--log-level", "warn"]
        if http:
            # The OpenAI-compatible API beside gRPC, on the same engine.
            self.http_addr = "127.0.0.1:%d" % free_port()
            cmd += ["--http-listen", self.http_addr]
        if "--metrics-listen" in help_text(progs["server"]):
            self.metrics_port = free_port()
            cmd += ["--metrics-listen", "127.0.0.1:%d" % self.metrics_port]
        cmd += list(extra)
        self.cmd = cmd
        self.log_path = os.path.join(work, name + ".log")
        self.log_file = open(self.log_path, "w")
        log("start", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=self.log_file,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("cinfer-server exited:\n" + self.tail())
            r = subprocess.run([progs["cli"], "--server", self.addr,
                                "--timeout", "5", "health"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("cinfer-server never became SERVING")
            time.sleep(0.2)

    def tail(self):
        self.log_file.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def rss_kib(self):
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return None

    def info(self):
        """The GetModelInfo response as a dict (cinfer-cli --json info)."""
        r = subprocess.run([self.progs["cli"], "--server", self.addr,
                            "--timeout", "10", "--json", "info"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("cinfer-cli info failed: " + r.stderr)
        return json.loads(r.stdout)

    def engine_stats(self):
        """(running, waiting, kv blocks used, kv blocks total). proto3 JSON
        leaves zero fields out, so an absent field is 0."""
        st = self.info().get("stats", {})
        total = int(st.get("kvBlocksTotal", 0))
        used = int(st.get("kvBlocksUsed", 0))
        free = int(st.get("kvBlocksFree", 0))
        if total and used + free != total:
            raise RuntimeError("GetModelInfo: kv blocks used %d + free %d != "
                               "total %d" % (used, free, total))
        return (int(st.get("running", 0)), int(st.get("waiting", 0)), used,
                total)

    def wait_idle(self, timeout=30):
        deadline = time.time() + timeout
        while True:
            st = self.engine_stats()
            if (st[0] == 0 and st[1] == 0 and st[2] == 0) or \
                    time.time() > deadline:
                return st
            time.sleep(0.2)

    def scrape(self):
        """{(name, frozenset(labels)): value} from /metrics, or None."""
        if not self.metrics_port:
            return None
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" %
                                        self.metrics_port, timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return None
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$',
                         line)
            if not m:
                continue
            labels = frozenset(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|'
                                          r'\\.)*)"', m.group(3) or ""))
            out[(m.group(1), labels)] = float(m.group(4))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


class RssSampler(threading.Thread):
    def __init__(self, server, period=0.2):
        super().__init__(daemon=True)
        self.server = server
        self.period = period
        self.samples = []
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set():
            v = self.server.rss_kib()
            if v is not None:
                self.samples.append(v)
            self.stop_event.wait(self.period)

    def finish(self):
        self.stop_event.set()
        self.join()
        v = self.server.rss_kib()
        if v is not None:
            self.samples.append(v)
        return self.samples


def metrics_delta(before, after, frontend="grpc"):
    """Server-side rejection stats of one front end between two scrapes:
    (p99 estimate in ms from the histogram buckets, {reason: count}).
    Series without a frontend label (servers before it) count as gRPC's."""
    if before is None or after is None:
        return None, {}

    def ours(labels):
        return dict(labels).get("frontend", "grpc") == frontend
    name = "cinfer:rejection_latency_seconds_bucket"
    buckets = []
    for (n, labels), v in after.items():
        if n != name or not ours(labels):
            continue
        le = dict(labels).get("le")
        b = float("inf") if le == "+Inf" else float(le)
        buckets.append((b, v - before.get((n, labels), 0.0)))
    buckets.sort()
    p99 = None
    if buckets and buckets[-1][1] > 0:
        want = 0.99 * buckets[-1][1]
        prev_b, prev_c = 0.0, 0.0
        for b, c in buckets:
            if c >= want:
                if math.isinf(b):
                    p99 = -prev_b * 1e3  # "more than the last bound"
                else:
                    # Linear inside the bucket, as Prometheus's
                    # histogram_quantile does.
                    frac = (want - prev_c) / (c - prev_c) if c > prev_c else 1
                    p99 = (prev_b + (b - prev_b) * frac) * 1e3
                break
            prev_b, prev_c = b, c
    reasons = {}
    for (n, labels), v in after.items():
        if n == "cinfer:rejected_requests_total" and ours(labels):
            d = v - before.get((n, labels), 0.0)
            if d:
                reasons[dict(labels).get("reason", "?")] = int(d)
    return p99, reasons


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------

def bench_cmd(progs, server, args, out, extra, protocol="grpc"):
    target = ["--server", server.addr]
    if protocol == "openai":
        target = ["--protocol", "openai", "--server", server.http_addr]
    return [progs["bench"]] + target + ["--input-len",
            str(args.input_len), "--output-len", str(args.output_len),
            "--ignore-eos", "--temperature", "0", "--timeout",
            str(args.deadline), "--json", out, "--save-detailed",
            "-q"] + [str(x) for x in extra]


def run_bench(cmd, timeout):
    log(" ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode not in (0, 1):
        raise RuntimeError("cinfer-bench failed (%d):\n%s" %
                           (r.returncode, r.stderr[-3000:]))
    out = cmd[cmd.index("--json") + 1]
    with open(out) as f:
        return json.load(f)


def measure_capacity(progs, model, args, work, server_flags,
                     protocols=("grpc",)):
    """{protocol: (capacity req/s, cinfer-bench result)}: each front end's
    closed-loop runs on one server. With several front ends they take
    turns for --capacity-rounds rounds, in an order that rotates, and each
    one's capacity is the run with its median throughput, so drift in the
    machine's load does not favour one."""
    srv = Server(progs, model, args.threads, server_flags, work, "capacity",
                 http="openai" in protocols)
    rounds = args.capacity_rounds if len(protocols) > 1 else 1
    out = {p: [] for p in protocols}
    try:
        for k in range(rounds):
            order = list(protocols[k % len(protocols):]) + \
                list(protocols[:k % len(protocols)])
            for proto in order:
                # Prompts of their own for every run: a run after another
                # would otherwise find its prompts in the prefix cache.
                seed = 1 + 10 * k + protocols.index(proto)
                path = os.path.join(work, "capacity-%s-%d.json" % (proto, k))
                out[proto].append(run_bench(bench_cmd(progs, srv, args, path, [
                    "--concurrency", args.capacity_concurrency,
                    "--num-requests", args.capacity_requests, "--warmups",
                    args.capacity_concurrency, "--seed", seed], proto),
                    timeout=900))
                srv.wait_idle()
    finally:
        srv.stop()
    result = {}
    for proto, runs in out.items():
        runs.sort(key=lambda r: r["request_throughput"])
        if len(runs) > 1:
            log("capacity (%s) over %d runs: %s req/s" % (
                proto, len(runs), ", ".join("%.2f" % r["request_throughput"]
                                           for r in runs)))
        result[proto] = capacity_of(proto, runs[(len(runs) - 1) // 2])
        result[proto][1]["capacity_runs"] = [r["request_throughput"]
                                             for r in runs]
    return result


def capacity_of(proto, res):
    cap = res["request_throughput"]
    log("capacity (%s): %.2f req/s (%d completed, %d failed, %.1f s)" %
        (proto, cap, res["completed"], res["failed"], res["duration"]))
    if cap <= 0:
        raise RuntimeError("capacity run completed nothing: %r" %
                           res.get("errors"))
    return cap, res


def summarize(res, deadline_s):
    st = res["statuses"]
    e2el = res["e2els"]
    outl = res["output_lens"]
    ttft = res["ttfts"]
    good = sum(1 for i, s in enumerate(st)
               if s == "OK" and e2el[i] <= deadline_s)
    admitted_ttft = [ttft[i] * 1e3 for i in range(len(st)) if outl[i] > 0]
    # A rejection: no token received, and either a limiter / shedder code
    # or a DEADLINE_EXCEEDED that came well before the deadline (a request
    # refused because it could not meet it), not one that expired queued.
    reject_ms = [e2el[i] * 1e3 for i in range(len(st))
                 if outl[i] == 0 and
                 (st[i] in REJECT_CODES or st[i] in STREAM_REFUSALS or
                  (st[i] in DEADLINE_CODES and
                   e2el[i] < 0.5 * deadline_s))]
    by_status = {}
    for s in st:
        if s != "OK":
            by_status[s] = by_status.get(s, 0) + 1
    dur = res["duration"]
    return {
        "sent": len(st),
        "ok": sum(1 for s in st if s == "OK"),
        "good": good,
        "duration": dur,
        "goodput": good / dur if dur > 0 else 0.0,
        "p99_ttft_ms": percentile(admitted_ttft, 99),
        "p50_ttft_ms": percentile(admitted_ttft, 50),
        "admitted": len(admitted_ttft),
        "rejected": len(reject_ms),
        "p99_reject_ms": percentile(reject_ms, 99),
        "p50_reject_ms": percentile(reject_ms, 50),
        "statuses": by_status,
    }


def run_level(progs, srv, args, work, name, level, seed, bench_flags,
              capacity, protocol="grpc"):
    rate = level * capacity
    n = max(10, int(round(rate * args.duration)))
    out = os.path.join(work, "%s-%gx.json" % (re.sub(r"[^\w.-]+", "_", name),
                                               level))
    before = srv.scrape()
    sampler = RssSampler(srv)
    sampler.start()
    t0 = time.time()
    res = run_bench(bench_cmd(progs, srv, args, out, [
        "--rate", "%.4f" % rate, "--num-requests", n, "--seed",
        seed] + list(bench_flags), protocol),
        timeout=args.duration * 4 + 300)
    wall = time.time() - t0
    rss = sampler.finish()
    idle = srv.wait_idle()
    after = srv.scrape()
    srv_p99, reasons = metrics_delta(before, after, protocol)
    row = summarize(res, args.deadline)
    row.update({
        "level": level, "rate": rate, "wall": wall,
        "rss_start_mib": rss[0] / 1024 if rss else float("nan"),
        "rss_max_mib": max(rss) / 1024 if rss else float("nan"),
        "rss_end_mib": rss[-1] / 1024 if rss else float("nan"),
        "kv_used_after": idle[2], "kv_total": idle[3],
        "busy_after": idle[0] + idle[1],
        "server_p99_reject_ms": srv_p99, "reasons": reasons,
        "loadavg": loadavg(),
    })
    log("%s %gx: offered %.2f/s, goodput %.2f/s, p99 TTFT %.0f ms, "
        "p99 reject %.2f ms, %s, RSS max %.0f MiB, KV used after %d"
        % (name, level, rate, row["goodput"], row["p99_ttft_ms"],
           row["p99_reject_ms"], row["statuses"], row["rss_max_mib"],
           idle[2]))
    return row


def run_all(progs, model, args, work, configs_to_run, capacities):
    """Every configuration at every level. The servers (one per distinct
    server flag set, serving every front end measured) run side by side,
    idle while another is measured, and the configurations (front ends
    included) take turns at each level in an order that rotates, so a
    change in the machine's background load does not favour one. A
    configuration's levels are multiples of its own front end's
    capacity."""
    servers = {}
    configs = []
    http = "openai" in capacities
    try:
        for name, sflags, bflags, proto in configs_to_run:
            key = tuple(sflags)
            if key not in servers:
                srv = Server(progs, model, args.threads, sflags, work,
                             "server-%d" % len(servers), http=http)
                servers[key] = srv
                # A short closed-loop warm-up: first-touch page faults of
                # the weights and the KV cache are not part of any level.
                run_bench(bench_cmd(progs, srv, args, os.path.join(
                    work, "warmup-%d.json" % len(servers)), [
                        "--concurrency", args.capacity_concurrency,
                        "--num-requests", args.capacity_concurrency,
                        "--seed", 2]), timeout=300)
                srv.wait_idle()
            configs.append({"name": name, "server_flags": sflags,
                            "bench_flags": list(bflags),
                            "protocol": proto,
                            "capacity": capacities[proto],
                            "cmd": servers[key].cmd, "rows": []})
        for k, level in enumerate(args.levels):
            order = list(range(len(configs)))
            shift = k % len(order)
            order = order[shift:] + order[:shift]
            for i in order:
                cfg = configs[i]
                srv = servers[tuple(cfg["server_flags"])]
                # Prompts of their own for every run: configurations that
                # share a server would otherwise find the prompts of the
                # one before in its prefix cache.
                cfg["rows"].append(run_level(progs, srv, args, work,
                                             cfg["name"], level,
                                             100 + 100 * i + k,
                                             cfg["bench_flags"],
                                             cfg["capacity"],
                                             cfg["protocol"]))
    finally:
        for srv in servers.values():
            srv.stop()
    return configs


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def fmt(v, spec="%.1f"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return spec % v


def srv_p99_text(v):
    if v is None:
        return "-"
    if v < 0:
        return "> %g" % -v
    return "%.2f" % v


def checks(cfg):
    """The issue's targets for one configuration: [(what, ok, detail)]."""
    rows = {r["level"]: r for r in cfg["rows"]}
    out = []
    top = max(rows)
    if 1 in rows and top > 1:
        g1, gt = rows[1]["goodput"], rows[top]["goodput"]
        out.append(("goodput at %gx >= 90%% of 1x" % top,
                    g1 > 0 and gt >= 0.9 * g1,
                    "%.2f vs %.2f req/s (%.0f%%)" %
                    (gt, g1, 100 * gt / g1 if g1 else 0)))
        t1, tt = rows[1]["p99_ttft_ms"], rows[top]["p99_ttft_ms"]
        out.append(("p99 TTFT at %gx <= 2x that at 1x" % top,
                    not math.isnan(tt) and not math.isnan(t1) and
                    tt <= 2 * t1,
                    "%s vs %s ms" % (fmt(tt, "%.0f"), fmt(t1, "%.0f"))))
    rej = [r["p99_reject_ms"] for r in cfg["rows"]
           if not math.isnan(r["p99_reject_ms"])]
    out.append(("p99 rejection < 5 ms at every level",
                max(rej) < 5.0 if rej else None,
                "worst %s ms" % fmt(max(rej), "%.2f")
                if rej else "no rejections"))
    peaks = [r["rss_max_mib"] for r in cfg["rows"]]
    first_end = cfg["rows"][0]["rss_end_mib"]
    out.append(("RSS flat (peak within 10% + 16 MiB of the first level's "
                "end)", max(peaks) <= first_end * 1.1 + 16,
                "first level end %.0f MiB, peak %.0f MiB" %
                (first_end, max(peaks))))
    kv = [r["kv_used_after"] for r in cfg["rows"]]
    out.append(("every KV block free after each level",
                all(k == 0 for k in kv),
                "kv_blocks_used after: %s" % ", ".join(map(str, kv))))
    return out


def write_plot(path_png, configs, work):
    dat = os.path.join(work, "overload.dat")
    with open(dat, "w") as f:
        for cfg in configs:
            f.write("# %s\n" % cfg["name"])
            for r in cfg["rows"]:
                f.write("%g %g %g\n" % (r["level"], r["goodput"],
                                        r["p99_ttft_ms"]
                                        if not math.isnan(r["p99_ttft_ms"])
                                        else 0))
            f.write("\n\n")
    plots_g, plots_t = [], []
    for i, cfg in enumerate(configs):
        plots_g.append("'%s' index %d using 1:2 with linespoints lw 2 "
                       "title '%s'" % (dat, i, cfg["name"]))
        plots_t.append("'%s' index %d using 1:3 with linespoints lw 2 "
                       "title '%s'" % (dat, i, cfg["name"]))
    script = """
set terminal pngcairo size 1200,480 font ",10"
set output '%s'
set multiplot layout 1,2 title 'cinfer-server under overload (open loop, x measured capacity)'
set logscale x
set xrange [0.3:15]
set xlabel 'offered load (x capacity)'
set grid
set key top left
set ylabel 'goodput (requests within deadline / s)'
set yrange [0:*]
plot %s
set ylabel 'p99 TTFT of admitted requests (ms)'
set logscale y
set yrange [*:*]
plot %s
unset multiplot
""" % (path_png, ", ".join(plots_g), ", ".join(plots_t))
    gp = os.path.join(work, "overload.gp")
    with open(gp, "w") as f:
        f.write(script)
    if not shutil.which("gnuplot"):
        log("gnuplot is not installed (scripts/install-bench-deps.sh installs it): no plot (its script is %s)" % gp)
        return False
    sh(["gnuplot", gp])
    return True


def frontend_table(configs, capacities):
    """The front ends side by side: per configuration, its capacity (and
    against gRPC's), goodput at 1x and at the top level, p99 TTFT, the
    worst p99 rejection."""
    L = ["## Front ends", "",
         "Each front end's levels are multiples of its own capacity; the "
         "ratios are measured in this run.", "",
         "| configuration | front end | capacity req/s | vs gRPC | goodput "
         "1x req/s | goodput top req/s | top / 1x | p99 TTFT 1x / top ms | "
         "worst p99 reject ms (client) |",
         "|" + "---|" * 9]
    g = capacities.get("grpc")
    for cfg in configs:
        rows = {r["level"]: r for r in cfg["rows"]}
        top = max(rows)
        r1, rt = rows.get(1.0), rows[top]
        cap = capacities[cfg["protocol"]]
        rej = [r["p99_reject_ms"] for r in cfg["rows"]
               if not math.isnan(r["p99_reject_ms"])]
        L.append("| %s | %s | %.2f | %s | %s | %.2f (%gx) | %s | %s / %s | "
                 "%s |" % (
                     cfg["name"], cfg["protocol"], cap,
                     "%.2fx" % (cap / g) if g else "-",
                     "%.2f" % r1["goodput"] if r1 else "-", rt["goodput"],
                     top,
                     "%.0f%%" % (100 * rt["goodput"] / r1["goodput"])
                     if r1 and r1["goodput"] > 0 else "-",
                     fmt(r1["p99_ttft_ms"], "%.0f") if r1 else "-",
                     fmt(rt["p99_ttft_ms"], "%.0f"),
                     fmt(max(rej), "%.2f") if rej else "-"))
    L.append("")
    return L


def write_report(path_md, png_name, args, capacities, cap_runs, configs,
                 notes, started, load_start, load_end, model, commit):
    L = []
    L.append("# Overload benchmark, %s" % started.strftime("%Y-%m-%d"))
    L.append("")
    L.append("cinfer-server on the default model (%s), driven open-loop by "
             "cinfer-bench at multiples of its measured capacity; written "
             "by `bench/overload.py`." % os.path.basename(model))
    L.append("")
    L.append("- machine: %s, %d cores (vector flags: %s), OPENBLAS_CORETYPE=%s, "
             "load average %s at the start and %s at the end; the load "
             "generator shares the cores" %
             (cpu_model(), os.cpu_count() or 0, benchlib.cpu_info()["flags"],
              os.environ.get("OPENBLAS_CORETYPE", "(unset)"), load_start, load_end))
    L.append("- commit: %s" % commit)
    L.append("- requests: %d-token synthetic prompts, %d output tokens "
             "(ignore_eos, greedy), deadline %g s each (`--timeout`)" %
             (args.input_len, args.output_len, args.deadline))
    for proto, capacity in capacities.items():
        cap_res = cap_runs[proto]
        runs = cap_res.get("capacity_runs") or []
        L.append("- capacity%s: closed loop at concurrency %d, %d requests "
                 "(after %d warm-ups)%s: **%.2f req/s** (%d completed, %d "
                 "failed, p99 TTFT %.0f ms)%s" %
                 ("" if list(capacities) == ["grpc"] else " (%s)" % proto,
                  args.capacity_concurrency, args.capacity_requests,
                  args.capacity_concurrency,
                  ", server with `%s`" % " ".join(cap_res["server_flags"])
                  if cap_res.get("server_flags") else "", capacity,
                  cap_res["completed"], cap_res["failed"],
                  cap_res.get("p99_ttft_ms", float("nan")),
                  "; the median of %d runs taking turns with the other "
                  "front end (%s req/s)" % (len(runs), ", ".join(
                      "%.2f" % v for v in runs)) if len(runs) > 1 else ""))
    L.append("- each level: Poisson arrivals at level x capacity for %g s "
             "(the number of requests is rate x duration); goodput = "
             "requests finished OK within their deadline / run duration" %
             args.duration)
    L.append("")
    for n in notes:
        L.append("> " + n)
        L.append("")
    if png_name:
        L.append("![goodput and p99 TTFT against offered load](%s)" %
                 png_name)
        L.append("")
    if args.analysis:
        with open(args.analysis) as f:
            L.append("## Observations")
            L.append("")
            L.append(f.read().strip())
            L.append("")
    if len(capacities) > 1:
        L += frontend_table(configs, capacities)
    for cfg in configs:
        L.append("## %s" % cfg["name"])
        L.append("")
        L.append("`%s`" % " ".join(short_path(a, model)
                                   for a in cfg["cmd"]))
        if cfg["bench_flags"]:
            L.append("")
            L.append("cinfer-bench also with `%s`" %
                     " ".join(map(str, cfg["bench_flags"])))
        L.append("")
        L.append("| load | offered req/s | sent | OK | goodput req/s | "
                 "p50 / p99 TTFT ms | rejected | p50 / p99 reject ms "
                 "(client) | p99 reject ms (server) | not OK by status | "
                 "server reasons | RSS start / peak / end MiB | KV used "
                 "after |")
        L.append("|" + "---|" * 13)
        for r in cfg["rows"]:
            L.append("| %gx | %.2f | %d | %d | %.2f | %s / %s | %d | "
                     "%s / %s | %s | %s | %s | %.0f / %.0f / %.0f | %d / %d |"
                     % (r["level"], r["rate"], r["sent"], r["ok"],
                        r["goodput"], fmt(r["p50_ttft_ms"], "%.0f"),
                        fmt(r["p99_ttft_ms"], "%.0f"), r["rejected"],
                        fmt(r["p50_reject_ms"], "%.2f"),
                        fmt(r["p99_reject_ms"], "%.2f"),
                        srv_p99_text(r["server_p99_reject_ms"]),
                        ", ".join("%s %d" % kv for kv in
                                  sorted(r["statuses"].items())) or "-",
                        ", ".join("%s %d" % kv for kv in
                                  sorted(r["reasons"].items())) or "-",
                        r["rss_start_mib"], r["rss_max_mib"],
                        r["rss_end_mib"], r["kv_used_after"], r["kv_total"]))
        L.append("")
        L.append("| target | met | measured |")
        L.append("|---|---|---|")
        for what, ok, detail in checks(cfg):
            L.append("| %s | %s | %s |" % (
                what, "n/a" if ok is None else "yes" if ok else "**no**",
                detail))
        L.append("")
    with open(path_md, "w") as f:
        f.write("\n".join(L))


def short_path(a, model):
    """A command-line argument as the report shows it: paths inside the
    repository relative to it, the model by its file name."""
    a = str(a)
    if a == model:
        return os.path.basename(model)
    if a.startswith(ROOT + os.sep):
        return os.path.relpath(a, ROOT)
    return a


def commit_id():
    try:
        return sh(["git", "-C", ROOT, "rev-parse", "--short",
                   "HEAD"]).stdout.strip()
    except (subprocess.CalledProcessError, OSError):
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.environ.get("CINFER_MODEL", ""))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--duration", type=float, default=30.0,
                    help="seconds of arrivals per level")
    ap.add_argument("--levels", default="0.5,1,2,5,10")
    ap.add_argument("--configs", default="on,retries,off",
                    help="on, retries (on with client retries), off")
    ap.add_argument("--compute-priority", default="",
                    choices=("", "idle", "low", "normal"),
                    help="every server's --compute-priority (default: the "
                    "server's, idle; on a machine other busy processes "
                    "share, idle compute threads starve)")
    ap.add_argument("--protocol", default="grpc",
                    choices=("grpc", "openai", "both"),
                    help="the front end cinfer-bench drives: gRPC, the "
                    "OpenAI-compatible HTTP API (--http-listen), or both in "
                    "turn (bench/results/overload-frontends.md)")
    ap.add_argument("--deadline", type=float, default=5.0)
    ap.add_argument("--max-ttft-ms", type=int, default=400,
                    help="the server's first-token bound in the resilience-on "
                         "configurations (0 = none)")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--capacity-concurrency", type=int, default=8)
    ap.add_argument("--capacity-requests", type=int, default=48)
    ap.add_argument("--capacity-rounds", type=int, default=3,
                    help="with several front ends: closed-loop runs of "
                    "each, in turns; the median is its capacity")
    ap.add_argument("--capacity", type=float, default=0.0,
                    help="skip the capacity run and use this req/s")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--analysis", default=None,
                    help="a Markdown file whose text goes into the report "
                    "as its Observations section")
    ap.add_argument("--report-from", default=None, metavar="WORK",
                    help="write the report again from the overload.json "
                    "of an earlier run's work directory (no new run)")
    args = ap.parse_args()
    if args.report_from:
        with open(os.path.join(args.report_from, "overload.json")) as f:
            report(json.load(f), args, args.report_from)
        return
    args.levels = [float(x) for x in args.levels.split(",")]
    if 1.0 not in args.levels:
        args.levels.append(1.0)
        args.levels.sort()
    model = args.model or default_model()
    if not os.path.isfile(model):
        sys.exit("overload: the default model is not installed "
                 "(scripts/install-deps.sh)")
    work = args.work or tempfile.mkdtemp(prefix="cinfer-overload-")
    os.makedirs(work, exist_ok=True)
    progs = ensure_built(os.path.abspath(args.build))
    started = datetime.datetime.now()
    load_start = loadavg()

    server_help = help_text(progs["server"])
    bench_help = help_text(progs["bench"])
    notes = []
    m = re.search(r"--(max-)?retries\b", bench_help)
    retry_flag = m.group(0) if m else None
    wanted = args.configs.split(",")
    # a latency-bound request is not admitted to wait for a first token
    # later than this, behind the queue and beside the running batch
    on_flags = []
    if args.max_ttft_ms and "--max-ttft-ms" in server_help:
        on_flags += ["--max-ttft-ms", str(args.max_ttft_ms)]
    protocols = list(PROTOCOLS) if args.protocol == "both" else \
        [args.protocol]
    # The HTTP API carries no per-request deadline, and the server's
    # deadline-based refusals (--max-ttft-ms among them) apply to requests
    # that have one: with the OpenAI front end measured, every server caps
    # each call's deadline at the client's (--max-request-time), which
    # gives HTTP requests the deadline gRPC ones send and changes nothing
    # for gRPC's.
    common_flags = []
    if "openai" in protocols:
        common_flags = ["--max-request-time", "%g" % args.deadline]
        notes.append("The HTTP API has no per-request deadline: every "
                     "server runs with `--max-request-time %g`, the "
                     "deadline gRPC's requests carry (`--timeout`), so "
                     "both front ends' requests have the same one." %
                     args.deadline)
    if args.compute_priority:
        common_flags += ["--compute-priority", args.compute_priority]
    # Flags of every server: the capacity run's and each configuration's.
    on_flags += common_flags
    configs_to_run = []
    if "on" in wanted:
        configs_to_run.append(("resilience on", on_flags, []))
    if "retries" in wanted:
        if retry_flag:
            configs_to_run.append(("resilience on, client retries", on_flags,
                                   [retry_flag, 3]))
        else:
            notes.append("cinfer-bench has no retry option: the runs are "
                         "without client retries only.")
    resilience_switch = bool(re.search(r"--resilience\b", server_help))
    if "off" in wanted:
        if resilience_switch:
            configs_to_run.append(("resilience off",
                                   ["--resilience", "off"] + common_flags,
                                   []))
        else:
            notes.append("cinfer-server has no `--resilience off` switch "
                         "yet: only the resilience-on configuration ran.")
    if "--metrics-listen" not in server_help:
        notes.append("cinfer-server serves no /metrics yet: the server-side "
                     "rejection columns are empty.")
    if "openai" in protocols:
        if "--http-listen" not in server_help:
            sys.exit("overload: cinfer-server has no --http-listen")
        if not re.search(r"--protocol\b", bench_help):
            sys.exit("overload: cinfer-bench has no --protocol")
    # Every configuration once per front end; gRPC's names stay as they
    # were when it is the only one.
    runs = []
    for proto in protocols:
        for name, sflags, bflags in configs_to_run:
            if proto != "grpc" and bflags:
                notes.append("client retries are gRPC's (cinfer-bench "
                             "--retries): no \"%s\" over %s." %
                             (name, proto))
                continue
            label = name if protocols == ["grpc"] else \
                "%s, %s" % (proto, name)
            runs.append((label, sflags, bflags, proto))
    for n in notes:
        log("note:", n)

    if args.capacity > 0:
        capacities = {p: args.capacity for p in protocols}
        cap_runs = {p: {"completed": 0, "failed": 0} for p in protocols}
    else:
        # The engine's capacity, without admission control where it can
        # be switched off: what the server completes when nothing is
        # refused is the yardstick for the offered loads.
        cap_flags = (["--resilience", "off"] if resilience_switch else []) + \
            common_flags
        measured = measure_capacity(progs, model, args, work, cap_flags,
                                    protocols)
        capacities, cap_runs = {}, {}
        for proto, (cap, cap_res) in measured.items():
            cap_res["server_flags"] = cap_flags
            ok_ttft = [t * 1e3 for t, o in zip(cap_res["ttfts"],
                                               cap_res["output_lens"])
                       if o > 0]
            cap_res["p99_ttft_ms"] = percentile(ok_ttft, 99)
            capacities[proto] = cap
            cap_runs[proto] = {k: v for k, v in cap_res.items()
                               if k in ("server_flags", "capacity_runs") or
                               not isinstance(v, list)}

    configs = run_all(progs, model, args, work, runs, capacities)

    saved = {
        "capacity": capacities[protocols[0]],
        "capacity_run": cap_runs[protocols[0]],
        "capacities": capacities, "capacity_runs": cap_runs,
        "configs": configs, "notes": notes,
        "started": started.isoformat(), "load_start": load_start,
        "load_end": loadavg(), "model": model, "commit": commit_id(),
        "args": {k: v for k, v in vars(args).items()
                 if k not in ("analysis", "out", "report_from")},
    }
    with open(os.path.join(work, "overload.json"), "w") as f:
        json.dump(saved, f, indent=1)
    report(saved, args, work)


def report(saved, args, work):
    """Writes the Markdown report and the plot from a run's saved data."""
    started = datetime.datetime.fromisoformat(saved["started"])
    run_args = argparse.Namespace(**saved["args"])
    run_args.analysis = args.analysis
    # Runs from before the front ends were measured hold gRPC's only.
    capacities = saved.get("capacities") or {"grpc": saved["capacity"]}
    cap_runs = saved.get("capacity_runs") or {"grpc": saved["capacity_run"]}
    stem = "overload" if list(capacities) == ["grpc"] else \
        "overload-frontends"
    base = benchlib.current_result(args.out, stem, (".md", ".png"))
    png = base + ".png"
    md = base + ".md"
    plotted = write_plot(png, saved["configs"], work)
    write_report(md, stem + ".png" if plotted else None, run_args, capacities, cap_runs,
                 saved["configs"], saved["notes"], started,
                 saved["load_start"], saved["load_end"], saved["model"],
                 saved["commit"])
    log("wrote", md, "and", png, "(work dir %s)" % work)
    print(open(md).read())

if __name__ == "__main__":
    main()
