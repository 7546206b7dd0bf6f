#!/usr/bin/env python3
"""Soak benchmark: cinfer-server at about 80% of its capacity for a long
run (30 minutes by default) under a hostile mix, checking that nothing
grows and nothing is lost.

    bench/soak.py [--build build/release] [--minutes 30] [--load 0.8]
                  [--threads 2] [--model PATH] [--out bench/results/soak.md]

1. The server: cinfer-server-faulty (the real server over a CPU backend
   that fails chosen steps on command, tests/integration/faulty_server.c)
   with the resilience layer on, a per-client rate limit, /metrics, and a
   fault control file.
2. Capacity: a closed loop of --capacity-concurrency clients sending the
   mix's plain request (a 24-token completion, ignore_eos, greedy) for
   --capacity-seconds; capacity = completed requests / s.
3. The soak: Poisson arrivals at --load x capacity for --minutes, each one
   of
     plain      streams to the end
     cancel     cancels after its second token
     deadline   a deadline of about half its service time
     bad        an invalid field (top_p = 2): INVALID_ARGUMENT
     burst      one client id sends 16 at once, past its rate limit
     slow       reads its stream 50 ms a message (a slow reader)
   and every --fault-every seconds the backend fails 5% of its steps for
   --fault-seconds (breaker and INTERNAL paths).
4. Every --sample-seconds: the server's resident memory, open file
   descriptors and threads (/proc/PID), and its KV blocks in use
   (GetModelInfo).
5. Checks, written with the samples to the results file and a gnuplot PNG
   beside it:
     - accounting: every call the clients made is counted once in the
       server's cinfer:request_total{method=Generate} (completed +
       rejected + failed = sent), and by status code side by side;
     - flat: resident memory at the end within 5% of its median over the
       second quarter of the run (after warm-up), file descriptors and
       threads back to their idle values, every KV block free.

The load generator runs on the same machine as the server; the results
file records the machine, its load average and the exact command.
"""
import argparse
import collections
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

KINDS = (("plain", 0.55), ("cancel", 0.10), ("deadline", 0.10),
         ("bad", 0.10), ("burst", 0.05), ("slow", 0.10))
BURST = 16
MAX_TOKENS = 24


def log(*a):
    print("[soak]", *a, file=sys.stderr, flush=True)


class Server:
    def __init__(self, args, work):
        self.args = args
        self.fault_path = os.path.join(work, "faults")
        self.set_faults(0.0)
        self.log_path = os.path.join(work, "server.log")
        binary = os.path.join(args.build, "tests", "integration",
                              "cinfer-server-faulty")
        self.cmd = [binary, "--listen", "127.0.0.1:0", "--model", args.model,
                    "--threads", str(args.threads),
                    "--metrics-listen", "127.0.0.1:0",
                    "--client-rate-limit-qps", "4",
                    "--client-rate-limit-burst", "4",
                    "--breaker-wait-ms", "2000",
                    "--log-level", "info"]
        env = dict(os.environ, CINFER_FAULT_FILE=self.fault_path)
        self.logf = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                     stderr=self.logf, env=env)
        self.port = self.metrics_port = None
        deadline = time.time() + 120
        while self.port is None or self.metrics_port is None:
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("server did not start:\n" +
                                   open(self.log_path).read()[-3000:])
            for line in open(self.log_path):
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("msg") == "listening":
                    self.port = j["port"]
                elif j.get("msg") == "metrics listening":
                    self.metrics_port = j["port"]
            time.sleep(0.05)
        self.addr = "127.0.0.1:%d" % self.port

    def set_faults(self, fail):
        tmp = self.fault_path + ".tmp"
        with open(tmp, "w") as f:
            f.write("fail=%g\n" % fail)
        os.replace(tmp, self.fault_path)

    def proc_sample(self):
        pid = self.proc.pid
        rss = threads = 0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir("/proc/%d/fd" % pid))
        return rss, fds, threads

    def fd_targets(self):
        d = "/proc/%d/fd" % self.proc.pid
        out = []
        for n in sorted(os.listdir(d), key=int):
            try:
                out.append("%s -> %s" % (n, os.readlink(os.path.join(d, n))))
            except OSError:
                pass
        return out

    def request_totals(self):
        """{code: count} of cinfer:request_total for gRPC's Generate."""
        from prometheus_client.parser import text_string_to_metric_families
        body = urllib.request.urlopen(
            "http://127.0.0.1:%d/metrics" % self.metrics_port,
            timeout=10).read().decode()
        out = collections.Counter()
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                if (s.name in ("cinfer:request_total", "cinfer:request")
                        and s.labels.get("frontend", "grpc") == "grpc"
                        and s.labels.get("method", "").split("/")[-1] == "Generate"):
                    out[s.labels.get("code", "?")] += int(s.value)
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()
        return self.proc.returncode


class Load:
    """The clients: one thread per call, counted by kind and by status."""

    def __init__(self, server, pb, rpc, grpc, service_s):
        self.server = server
        self.pb, self.grpc = pb, grpc
        self.channel = grpc.insecure_channel(server.addr)
        self.stub = rpc.InferenceStub(self.channel)
        self.service_s = service_s
        self.lock = threading.Lock()
        self.sent = 0
        self.by_code = collections.Counter()
        self.by_kind = collections.defaultdict(collections.Counter)
        self.threads = set()
        self.seq = 0

    def request(self, kind):
        pb = self.pb
        sampling = pb.SamplingParams(temperature=0.0)
        if kind == "bad":
            sampling = pb.SamplingParams(temperature=0.8, top_p=2.0)
        return pb.GenerateRequest(
            text="Write a short story about a lighthouse keeper number %d."
                 % random.randrange(1000),
            sampling=sampling,
            stopping=pb.StoppingCriteria(max_tokens=MAX_TOKENS,
                                         ignore_eos=True))

    def call(self, kind, client):
        md = (("x-client-id", client),)
        timeout = 60.0
        if kind == "deadline":
            timeout = max(0.05, 0.5 * self.service_s)
        code = "OK"
        try:
            stream = self.stub.Generate(self.request(kind), timeout=timeout,
                                        metadata=md)
            n = 0
            for _ in stream:
                n += 1
                if kind == "cancel" and n == 2:
                    stream.cancel()
                    break
                if kind == "slow":
                    time.sleep(0.05)
            if kind == "cancel" and n == 2:
                code = "CANCELLED"
        except self.grpc.RpcError as e:
            code = e.code().name
        with self.lock:
            self.sent += 1
            self.by_code[code] += 1
            self.by_kind[kind][code] += 1

    def spawn(self, kind):
        self.seq += 1
        clients = ["burst-%d" % self.seq] * BURST if kind == "burst" else \
            ["soak-%d" % (self.seq % 64)]
        for c in clients:
            t = threading.Thread(target=self._run, args=(kind, c),
                                 daemon=True)
            with self.lock:
                self.threads.add(t)
            t.start()

    def _run(self, kind, client):
        try:
            self.call(kind, client)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def wait(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                if not self.threads:
                    return True
            time.sleep(0.1)
        return False


def capacity(server, pb, rpc, grpc, args):
    """Completed plain requests / s, and a request's mean service time."""
    load = Load(server, pb, rpc, grpc, 1.0)
    stop = time.time() + args.capacity_seconds
    done = []

    def loop(i):
        while time.time() < stop:
            t0 = time.time()
            load.call("plain", "cap-%d" % i)
            done.append(time.time() - t0)

    ts = [threading.Thread(target=loop, args=(i,))
          for i in range(args.capacity_concurrency)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.time() - t0
    ok = load.by_code["OK"]
    if ok == 0:
        raise RuntimeError("capacity run completed nothing: %r" %
                           dict(load.by_code))
    load.channel.close()
    return ok / elapsed, statistics.median(done), dict(load.by_code)


def kv_used(stub, pb):
    return stub.GetModelInfo(pb.GetModelInfoRequest(),
                             timeout=30).stats.kv_blocks_used


def wait_serving(server, grpc, hpb, hrpc, timeout=300):
    ch = grpc.insecure_channel(server.addr)
    stub = hrpc.HealthStub(ch)
    end = time.time() + timeout
    try:
        while time.time() < end:
            try:
                r = stub.Check(hpb.HealthCheckRequest(service=""), timeout=5)
                if r.status == hpb.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    finally:
        ch.close()
    raise RuntimeError("the server never reported SERVING")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--capacity-seconds", type=float, default=30.0)
    ap.add_argument("--capacity-concurrency", type=int, default=8)
    ap.add_argument("--sample-seconds", type=float, default=5.0)
    ap.add_argument("--fault-every", type=float, default=120.0)
    ap.add_argument("--fault-seconds", type=float, default=5.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "soak.md"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.model is None:
        args.model = subprocess.run(
            ["sh", os.path.join(ROOT, "scripts", "default-model.sh")],
            check=True, capture_output=True, text=True).stdout.strip()
    random.seed(args.seed)

    import grpc
    import cinfer_client
    work = tempfile.mkdtemp(prefix="soak-")
    pb, rpc = cinfer_client.load_stubs(os.path.join(work, "stubs"))
    hpb, hrpc = cinfer_client.load_health_stubs(os.path.join(work, "stubs"))

    server = Server(args, work)
    failures = []
    try:
        wait_serving(server, grpc, hpb, hrpc)
        ch = grpc.insecure_channel(server.addr)
        stub = rpc.InferenceStub(ch)
        cap, service_s, cap_codes = capacity(server, pb, rpc, grpc, args)
        log("capacity %.2f requests/s, service %.2f s (%r)" %
            (cap, service_s, cap_codes))
        kv_used(stub, pb)  # the sampling channel connects before the idle sample
        time.sleep(2)
        idle = server.proc_sample()
        idle_fds = server.fd_targets()
        base_totals = server.request_totals()
        log("idle: rss %.1f MB, fds %d, threads %d" %
            (idle[0] / 1e6, idle[1], idle[2]))

        load = Load(server, pb, rpc, grpc, service_s)
        rate = args.load * cap
        kinds = [k for k, _ in KINDS]
        weights = [w for _, w in KINDS]
        t0 = time.time()
        end = t0 + args.minutes * 60
        next_arrival = t0
        next_sample = t0
        next_fault = t0 + args.fault_every / 2
        fault_off = None
        samples = []
        while True:
            now = time.time()
            if now >= end:
                break
            if now >= next_sample:
                rss, fds, threads = server.proc_sample()
                samples.append((now - t0, rss, fds, threads,
                                kv_used(stub, pb), load.sent))
                next_sample += args.sample_seconds
            if fault_off is None and now >= next_fault:
                server.set_faults(0.05)
                fault_off = now + args.fault_seconds
            elif fault_off is not None and now >= fault_off:
                server.set_faults(0.0)
                fault_off = None
                next_fault += args.fault_every
            if now >= next_arrival:
                kind = random.choices(kinds, weights)[0]
                load.spawn(kind)
                # A burst is BURST calls of one arrival: it counts as that
                # many of the offered rate.
                n = BURST if kind == "burst" else 1
                for _ in range(n):
                    next_arrival += random.expovariate(rate)
            time.sleep(max(0.0, min(next_arrival, next_sample) - time.time()))
        server.set_faults(0.0)
        if not load.wait(180):
            failures.append("calls still running 180 s after the load ended")
        # Idle again: the engine has let go of everything.
        deadline = time.time() + 60
        while time.time() < deadline and kv_used(stub, pb) != 0:
            time.sleep(0.5)
        load.channel.close()
        # Closed connections and finished calls' threads go within moments.
        deadline = time.time() + 15
        while True:
            rss, fds, threads = server.proc_sample()
            if (fds <= idle[1] and threads <= idle[2]) or time.time() > deadline:
                break
            time.sleep(0.5)
        fd_targets = server.fd_targets()
        final_kv = kv_used(stub, pb)
        samples.append((time.time() - t0, rss, fds, threads, final_kv,
                        load.sent))
        totals = server.request_totals()
        ch.close()
    finally:
        rc = server.stop()

    # Checks.
    server_codes = collections.Counter(totals)
    server_codes.subtract(base_totals)
    server_codes = +server_codes
    server_sum = sum(server_codes.values())
    if server_sum != load.sent:
        failures.append("accounting: clients sent %d calls, the server counted "
                        "%d" % (load.sent, server_sum))
    quarter = [s[1] for s in samples if args.minutes * 60 / 4 <= s[0] <=
               args.minutes * 60 / 2] or [samples[0][1]]
    rss_ref = statistics.median(quarter)
    if rss > 1.05 * rss_ref:
        failures.append("resident memory grew: %.1f MB at the end, median %.1f MB "
                        "in the second quarter" % (rss / 1e6, rss_ref / 1e6))
    if fds > idle[1]:
        failures.append("file descriptors: %d at the end, %d idle (%s; idle: %s)"
                        % (fds, idle[1], ", ".join(fd_targets),
                           ", ".join(idle_fds)))
    if threads > idle[2]:
        failures.append("threads: %d at the end, %d idle" % (threads, idle[2]))
    if final_kv != 0:
        failures.append("%d KV blocks still in use" % final_kv)
    if rc != 0:
        failures.append("the server exited %d after SIGTERM" % rc)

    write_results(args, cap, service_s, idle, samples, load, server_codes,
                  failures, work)
    for f in failures:
        log("FAIL:", f)
    log("wrote", args.out)
    return 1 if failures else 0


def git_commit():
    r = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def write_results(args, cap, service_s, idle, samples, load, server_codes,
                  failures, work):
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    png = os.path.splitext(args.out)[0] + ".png"
    data = os.path.join(work, "samples.dat")
    with open(data, "w") as f:
        for s in samples:
            f.write("%.1f %.2f %d %d %d\n" % (s[0] / 60, s[1] / 1e6, s[2],
                                                s[3], s[4]))
    gp = os.path.join(work, "plot.gp")
    with open(gp, "w") as f:
        f.write('set terminal png size 900,500\nset output "%s"\n' % png)
        f.write('set xlabel "minutes"\nset ylabel "MB"\nset y2label "count"\n')
        f.write('set y2tics\nset ytics nomirror\nset key outside bottom center horizontal\n')
        f.write('set title "cinfer-server soak at %.0f%% of capacity"\n' %
                (100 * args.load))
        f.write('plot "%s" u 1:2 w l lw 2 t "resident MB", '
                '"" u 1:3 axes x1y2 w l t "open fds", '
                '"" u 1:4 axes x1y2 w l t "threads", '
                '"" u 1:5 axes x1y2 w l t "KV blocks used"\n' % data)
    try:
        have_png = subprocess.run(["gnuplot", gp],
                                  capture_output=True).returncode == 0
    except FileNotFoundError:
        log("gnuplot not installed (scripts/install-bench-deps.sh installs it): no plot")
        have_png = False

    cpu = benchlib.cpu_info()
    lines = ["# Soak: cinfer-server at %.0f%% of capacity for %g minutes" %
             (100 * args.load, args.minutes), ""]
    lines += ["Measured %s on %s (%d CPUs; %s), load average before: %s; "
              "OPENBLAS_CORETYPE=%s." % (
                  datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
                  cpu["model"], cpu["cpus"], cpu["flags"],
                  " ".join("%.2f" % x for x in os.getloadavg()),
                  os.environ.get("OPENBLAS_CORETYPE", "unset")),
              "", "Command: `%s`, at commit %s." % (
                  " ".join([sys.argv[0]] + sys.argv[1:]), git_commit()),
              "", "Model: `%s`, %d threads (%s)." % (
                  os.path.basename(args.model), args.threads, platform.node()),
              "",
              "Capacity (closed loop, %d clients): %.2f requests/s, median "
              "service %.2f s; offered %.2f requests/s." % (
                  args.capacity_concurrency, cap, service_s, args.load * cap),
              "", "## Verdict", ""]
    lines += ["- FAIL: " + f for f in failures] or ["- pass: every call "
              "accounted for, memory, descriptors, threads and KV blocks flat"]
    lines += ["", "## Calls by status", "",
              "| status | clients saw | server counted |", "|---|---:|---:|"]
    for code in sorted(set(load.by_code) | set(server_codes)):
        lines.append("| %s | %d | %d |" % (code, load.by_code.get(code, 0),
                                           server_codes.get(code, 0)))
    lines.append("| total | %d | %d |" % (load.sent, sum(server_codes.values())))
    lines += ["", "Client and server may differ per status where a deadline "
              "and the last token meet (the server finished, the client's "
              "deadline fired first); the totals must agree.", "",
              "## By kind (client side)", "", "| kind | statuses |", "|---|---|"]
    for kind, _ in KINDS:
        c = load.by_kind.get(kind, {})
        lines.append("| %s | %s |" % (kind, ", ".join(
            "%s %d" % kv for kv in sorted(c.items()))))
    lines += ["", "## Samples", "",
              "Idle before the soak: resident %.1f MB, %d fds, %d threads." % (
                  idle[0] / 1e6, idle[1], idle[2]), "",
              "| minute | resident MB | fds | threads | KV blocks used | calls sent |",
              "|---:|---:|---:|---:|---:|---:|"]
    step = max(1, len(samples) // 40)
    for i, s in enumerate(samples):
        if i % step == 0 or i == len(samples) - 1:
            lines.append("| %.1f | %.1f | %d | %d | %d | %d |" % (
                s[0] / 60, s[1] / 1e6, s[2], s[3], s[4], s[5]))
    if have_png:
        lines += ["", "![soak](%s)" % os.path.basename(png)]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
