#!/usr/bin/env python3
"""cinfer-server against llama.cpp's llama-server, serving many streams.

Both servers run the default model on loopback with the same thread count;
cinfer-bench drives each with the same closed-loop workload at every
concurrency level (synthetic 128-token prompts, the same ids for both, 128
output tokens, ignore_eos, greedy), each through its own protocol:

  cinfer:     cinfer-server --threads T           (gRPC Generate streams)
  llama.cpp:  llama-server -m M -np N -c N*(in+out+16) -t T -lm none -fa on
              (N parallel slots, continuous batching, its default; weights
              read into memory: `-lm none` is this version's --no-mmap;
              flash attention on: its fastest CPU settings)

The two alternate (the order flips at each level); llama-server starts
afresh for each level (its slot count is the level), cinfer-server runs
throughout. On a shared machine each run waits for idle cores first, and
the CPU time other work took during it is measured (/proc/stat less the
server's and the client's own); a disturbed run is measured again. The machine's floors come from cinfer-kbench in the same run:
a decode step can not beat weight bytes / read bandwidth, N tokens of a
step can not beat 2 * params * N / compute rate (the int8 dot peak, the
instructions the default model's int8-block products run on; the FP32 FMA
peak only on a machine without them), so at N streams the output rate can
not beat N / max(those two) and ITL can not beat their max; a 128-token
prompt can not prefill faster than 2 * params * 128 / compute rate.

    bench/serve_vs_llamacpp.py [--levels 1,4,16,64] [--per-stream 2]
                               [--build build/release] [--threads 2]

Prints a table and writes bench/results/serve-vs-llamacpp.md (the run before
moves to bench/results/history/) and a
gnuplot PNG (output tokens/s and p99 ITL against concurrency) next to it.
llama.cpp is built by scripts/goldens/build-llama-cpp.sh from the source the
PyPI package llama-cpp-python ships; cinfer is built into --build when its
programs are missing there.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = {
    "server": "server/cinfer-server",
    "cli": "clients/cinfer-cli",
    "bench": "clients/cinfer-bench",
    "kbench": "tools/cinfer-kbench",
}


def log(*a):
    print("[serve-bench]", *a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


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


# ---------------------------------------------------------------------------
# Builds and floors
# ---------------------------------------------------------------------------

def ensure_cinfer(build):
    paths = {k: os.path.join(build, v) for k, v in PROGRAMS.items()}
    if not all(os.access(p, os.X_OK) for p in paths.values()):
        log("building cinfer in", build)
        sh(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"])
        sh(["cmake", "--build", build, "-j", str(os.cpu_count() or 2),
            "--target", "cinfer-server", "cinfer-cli", "cinfer-bench",
            "cinfer-kbench"])
    return paths


def floors(kbench, threads):
    """Read bandwidth (GB/s, the better of cinfer-kbench's two sums) and the
    compute rate of the default model's products at `threads` threads: the
    int8 dot peak of the best ISA (its weights are int8-block types), or
    the peak FP32 FMA rate on a machine without int8 dot kernels. Returns
    (bandwidth, rate, what the rate is)."""
    f = benchlib.kbench_floors(kbench, threads)
    if f["int8_dot_gops"]:
        return f["read_gbs"], f["int8_dot_gops"], "GOP/s int8 dot (%s)" % f["dot_isa"]
    return f["read_gbs"], f["fma_gflops"], "GFLOP/s FP32 FMA (%s)" % f["fma_isa"]


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------

class Proc:
    def __init__(self, name, cmd, log_path):
        self.name = name
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        log("start", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=self.log_file,
                                     stderr=subprocess.STDOUT)

    def alive(self):
        return self.proc.poll() is None

    def tail(self):
        self.log_file.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def start_cinfer(progs, model, threads, work, budget=64):
    port = free_port()
    addr = "127.0.0.1:%d" % port
    p = Proc("cinfer-server", [progs["server"], "--listen", addr, "--model",
                               model, "--threads", str(threads),
                               "--max-batched-tokens", str(budget)],
             os.path.join(work, "cinfer-server.log"))
    deadline = time.time() + 300
    while True:
        if not p.alive():
            raise RuntimeError("cinfer-server exited:\n" + p.tail())
        r = subprocess.run([progs["cli"], "--server", addr, "--timeout", "5",
                            "health"], capture_output=True, text=True)
        if r.returncode == 0:
            return p, addr
        if time.time() > deadline:
            p.stop()
            raise RuntimeError("cinfer-server never became SERVING")
        time.sleep(0.2)


def start_llama(bin_dir, model, slots, ctx, threads, work):
    port = free_port()
    p = Proc("llama-server",
             [os.path.join(bin_dir, "llama-server"), "-m", model, "-np",
              str(slots), "-c", str(ctx), "-t", str(threads), "-lm", "none",
              "-fa", "on", "--host", "127.0.0.1", "--port", str(port)],
             os.path.join(work, "llama-server-%d.log" % slots))
    deadline = time.time() + 300
    while True:
        if not p.alive():
            raise RuntimeError("llama-server exited:\n" + p.tail())
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port,
                                        timeout=5) as r:
                if r.status == 200:
                    return p, "127.0.0.1:%d" % port
        except OSError:
            pass
        if time.time() > deadline:
            p.stop()
            raise RuntimeError("llama-server never became ready")
        time.sleep(0.2)


def cpu_busy_s():
    """Seconds of CPU time the whole machine has spent busy (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """CPU seconds a process (all its threads) has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_wait_s, idle_share=0.85):
    """Waits (up to max_wait_s) for a few seconds in which other work
    leaves the cores idle."""
    deadline = time.time() + max_wait_s
    ncpu = os.cpu_count() or 1
    while True:
        b0, t0 = cpu_busy_s(), time.time()
        time.sleep(3)
        busy = (cpu_busy_s() - b0) / (ncpu * (time.time() - t0))
        if busy <= 1 - idle_share or time.time() > deadline:
            return busy
        time.sleep(5)


def run_bench_once(progs, protocol, addr, server_pid, n, requests, args,
                   work):
    out = os.path.join(work, "%s-%d.json" % (protocol, n))
    cmd = [progs["bench"], "--protocol", protocol, "--server", addr,
           "--concurrency", str(n), "--num-requests", str(requests),
           "--input-len", str(args.input_len), "--output-len",
           str(args.output_len), "--seed", str(args.seed + n),
           "--warmups", str(min(n, args.warmups)), "--ignore-eos",
           "--temperature", "0", "--json", out, "-q"]
    log(" ".join(cmd))
    t0 = time.time()
    busy0, srv0 = cpu_busy_s(), proc_cpu_s(server_pid)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    _, stderr = p.communicate()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, srv1 = cpu_busy_s(), proc_cpu_s(server_pid)
    wall = time.time() - t0
    if p.returncode not in (0, 1):
        raise RuntimeError("cinfer-bench failed (%d):\n%s" %
                           (p.returncode, stderr))
    with open(out) as f:
        res = json.load(f)
    # CPU time of other work during the run: the machine's busy time less
    # the server's and the client's own (cinfer-bench, a reaped child).
    client_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    foreign = (busy1 - busy0) - (srv1 - srv0) - client_s
    res["foreign_cpu_share"] = max(0.0, foreign / ((os.cpu_count() or 1) * wall))
    log("%s N=%d: %.1f tok/s, TTFT p50 %.0f p99 %.0f ms, ITL p50 %.1f p99 "
        "%.1f ms, %d/%d completed, %.0f s, other work %.0f%% of the cores" % (
            protocol, n, res["output_throughput"], res["median_ttft_ms"],
            res["p99_ttft_ms"], res["median_itl_ms"], res["p99_itl_ms"],
            res["completed"], requests, wall,
            100 * res["foreign_cpu_share"]))
    return res


def run_bench(progs, protocol, addr, server_pid, n, requests, args, work):
    """Runs the level, again (up to --retries times) while other work took
    more than --max-foreign of the cores; keeps the least disturbed run."""
    best = None
    for attempt in range(args.retries + 1):
        wait_quiet(args.quiet_wait)
        res = run_bench_once(progs, protocol, addr, server_pid, n, requests,
                             args, work)
        res["attempts"] = attempt + 1
        if best is None or res["foreign_cpu_share"] < best["foreign_cpu_share"]:
            best = res
        if res["foreign_cpu_share"] <= args.max_foreign:
            break
        log("other work took %.0f%% of the cores: measuring again" %
            (100 * res["foreign_cpu_share"]))
    best["attempts"] = attempt + 1
    return best


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

def plot(rows, png, work, args):
    data = os.path.join(work, "plot.dat")
    with open(data, "w") as f:
        f.write("# N cinfer_tps llama_tps ceiling_tps cinfer_p99_itl "
                "llama_p99_itl itl_floor\n")
        for r in rows:
            f.write("%d %.3f %.3f %.3f %.3f %.3f %.3f\n" % (
                r["n"], r["c"]["output_throughput"],
                r["l"]["output_throughput"], r["ceiling_tps"],
                r["c"]["p99_itl_ms"], r["l"]["p99_itl_ms"], r["itl_floor_ms"]))
    script = f"""
set terminal pngcairo size 1200,480 font ",10"
set output "{png}"
set multiplot layout 1,2 title "cinfer-server vs llama.cpp llama-server, {args.input_len}+{args.output_len} tokens per request, closed loop, {args.threads} threads"
set logscale x 2
set xlabel "concurrent streams"
set grid
set key right center
set ylabel "output tokens/s"
plot "{data}" using 1:2 with linespoints lw 2 pt 7 title "cinfer", \\
     "{data}" using 1:3 with linespoints lw 2 pt 5 title "llama.cpp", \\
     "{data}" using 1:4 with lines dt 2 lc rgb "gray" title "ceiling (bandwidth and int8 dot floors)"
set ylabel "p99 inter-token latency (ms)"
set key top left
set logscale y
plot "{data}" using 1:5 with linespoints lw 2 pt 7 title "cinfer", \\
     "{data}" using 1:6 with linespoints lw 2 pt 5 title "llama.cpp", \\
     "{data}" using 1:7 with lines dt 2 lc rgb "gray" title "step floor"
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True,
                       capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError) as e:
        log("gnuplot failed (scripts/install-bench-deps.sh installs it), no plot:", e)
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--per-stream", type=int, default=2,
                    help="requests per stream at each level")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--warmups", type=int, default=4,
                    help="warmup requests before each run (at most N)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batched-tokens", type=int, default=64,
                    help="cinfer-server's per-step token budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--max-foreign", type=float, default=0.15,
                    help="measure a level again when other work took more "
                         "than this share of the cores during it")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--quiet-wait", type=float, default=300,
                    help="seconds to wait for idle cores before each run")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    t_start = time.time()
    load_start = loadavg()
    progs = ensure_cinfer(os.path.abspath(args.build))
    bin_dir = sh(["sh", os.path.join(ROOT, "scripts/goldens/build-llama-cpp.sh")]
                 ).stdout.strip().splitlines()[-1]
    model = sh(["sh", os.path.join(ROOT, "scripts/default-model.sh")]).stdout.strip()
    wbytes = os.path.getsize(model)
    work = tempfile.mkdtemp(prefix="serve-bench-")
    log("work files in", work)

    wait_quiet(args.quiet_wait)
    bw0, rate0, rate_what = floors(progs["kbench"], args.threads)
    log("floors: %.1f GB/s read, %.1f %s" % (bw0, rate0, rate_what))

    cinfer, c_addr = start_cinfer(progs, model, args.threads, work,
                                    args.max_batched_tokens)
    rows = []
    try:
        info = json.loads(sh([progs["cli"], "--server", c_addr, "--json",
                              "info"]).stdout)
        params = int(info["parameters"])
        for i, n in enumerate(levels):
            requests = max(args.min_requests, args.per_stream * n)
            order = ["cinfer", "llamacpp"] if i % 2 == 0 else ["llamacpp", "cinfer"]
            res = {}
            for who in order:
                if who == "cinfer":
                    res["c"] = run_bench(progs, "grpc", c_addr,
                                         cinfer.proc.pid, n, requests, args,
                                         work)
                else:
                    ctx = n * (args.input_len + args.output_len + 16)
                    llama, l_addr = start_llama(bin_dir, model, n, ctx,
                                                args.threads, work)
                    try:
                        res["l"] = run_bench(progs, "llamacpp", l_addr,
                                             llama.proc.pid, n, requests,
                                             args, work)
                    finally:
                        llama.stop()
            rows.append({"n": n, "requests": requests, "c": res["c"],
                         "l": res["l"]})
    finally:
        cinfer.stop()
    # Floors again at the end: other work on the machine lowers a
    # measurement, never raises it, so the better of the two is the floor.
    wait_quiet(args.quiet_wait)
    bw1, rate1, _ = floors(progs["kbench"], args.threads)
    log("floors at the end: %.1f GB/s read, %.1f %s" % (bw1, rate1, rate_what))
    bw, rate = max(bw0, bw1), max(rate0, rate1)
    for r in rows:
        n = r["n"]
        step_bw_ms = wbytes / (bw * 1e9) * 1e3
        step_compute_ms = 2.0 * params * n / (rate * 1e9) * 1e3
        r["itl_floor_ms"] = max(step_bw_ms, step_compute_ms)
        r["ceiling_tps"] = n / r["itl_floor_ms"] * 1e3
    load_end = loadavg()
    elapsed = time.time() - t_start

    prefill_floor_ms = 2.0 * params * args.input_len / (rate * 1e9) * 1e3
    budget_floor_ms = 2.0 * params * args.max_batched_tokens / (rate * 1e9) * 1e3
    step_bw_ms = wbytes / (bw * 1e9) * 1e3
    date = datetime.date.today()
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass

    def ratio(a, b):
        return a / b if b else float("nan")

    lines = [
        f"# cinfer-server vs llama.cpp llama-server: serving, {date}",
        "",
        f"Machine: {cpu}, {os.cpu_count()} cores, {platform.platform()}; "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; "
        f"load average {load_start} at the start, {load_end} at the end "
        f"(the machine is shared with other work, which adds noise to both "
        f"servers' figures). Whole run {elapsed / 60:.1f} min.",
        "",
        f"Workload: `cinfer-bench`, closed loop at N concurrent streams, "
        f"max({args.min_requests}, {args.per_stream} x N) requests per level "
        f"after min(N, {args.warmups}) warmup requests; synthetic prompts of "
        f"{args.input_len} random token ids (the same ids for both servers), "
        f"{args.output_len} output tokens, ignore_eos, greedy. Default model "
        f"({os.path.basename(model)}, {wbytes / 1e6:.1f} MB, {params} "
        f"parameters), {args.threads} threads each.",
        f"cinfer: `cinfer-server --threads {args.threads}` (defaults: "
        f"--max-seqs 64) --max-batched-tokens {args.max_batched_tokens}, gRPC. "
        f"llama.cpp: `llama-server -np N -c N*{args.input_len + args.output_len + 16} "
        f"-t {args.threads} -lm none -fa on` (llama-cpp-python 0.3.36's "
        f"llama.cpp; continuous batching is its default; `-lm none` is this "
        f"version's --no-mmap), /completion streamed, `cache_prompt: false`. "
        f"The two run alternately, the order flipping at each level.",
        "",
        f"Floors (cinfer-kbench, {args.threads} threads, at the start and "
        f"the end of the run: {bw0:.1f} / {bw1:.1f} GB/s read bandwidth, "
        f"{rate0:.1f} / {rate1:.1f} {rate_what} peak; the better of each "
        f"is used): read bandwidth {bw:.1f} GB/s, compute rate {rate:.1f} "
        f"{rate_what} (the instructions the model's int8-block products run "
        f"on; FP32 FMA only where the machine has no int8 dot kernels). "
        f"CPU vector flags: {benchlib.cpu_info()['flags']}. Decode "
        f"step >= weight bytes / bandwidth = {step_bw_ms:.2f} ms; N tokens "
        f"of a step >= 2 x params x N / compute rate; prefill of one "
        f"{args.input_len}-token prompt >= {prefill_floor_ms:.1f} ms. The "
        f"ceiling column is N / max(the two step floors), the ITL floor "
        f"column their max. A step that carries cinfer's whole prefill "
        f"budget (--max-batched-tokens {args.max_batched_tokens}) takes >= {budget_floor_ms:.0f} "
        f"ms, so where new prompts are prefilled in the same steps as "
        f"running decodes, the decodes' worst gaps can not be shorter.",
        "",
        "Ratios are cinfer / llama.cpp (above 1 is better for tok/s, below 1 "
        "is better for latencies). The machine is shared: the last column "
        "is the share of the cores that other work took during each run "
        "(the machine's busy time less the server's and the client's); a "
        f"run above {100 * args.max_foreign:.0f}% was measured again (up to "
        f"{args.retries} times, after waiting for idle cores) and the least "
        "disturbed one kept.",
        "",
        "| N | requests | cinfer tok/s | llama.cpp tok/s | ratio | ceiling tok/s "
        "| cinfer TTFT p50 / p99 ms | llama.cpp TTFT p50 / p99 ms | p99 ratio "
        "| cinfer ITL p50 / p99 ms | llama.cpp ITL p50 / p99 ms | p99 ratio "
        "| ITL floor ms | other work % (cinfer / llama.cpp runs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, l = r["c"], r["l"]
        lines.append(
            f"| {r['n']} | {r['requests']} | {c['output_throughput']:.1f} | "
            f"{l['output_throughput']:.1f} | "
            f"**{ratio(c['output_throughput'], l['output_throughput']):.2f}x** | "
            f"{r['ceiling_tps']:.0f} | {c['median_ttft_ms']:.0f} / "
            f"{c['p99_ttft_ms']:.0f} | {l['median_ttft_ms']:.0f} / "
            f"{l['p99_ttft_ms']:.0f} | "
            f"{ratio(c['p99_ttft_ms'], l['p99_ttft_ms']):.2f} | "
            f"{c['median_itl_ms']:.1f} / {c['p99_itl_ms']:.1f} | "
            f"{l['median_itl_ms']:.1f} / {l['p99_itl_ms']:.1f} | "
            f"{ratio(c['p99_itl_ms'], l['p99_itl_ms']):.2f} | "
            f"{r['itl_floor_ms']:.2f} | {100 * c['foreign_cpu_share']:.0f} / "
            f"{100 * l['foreign_cpu_share']:.0f} |")
    failed = [(r["n"], who, r[k]["errors"]) for r in rows
              for k, who in (("c", "cinfer"), ("l", "llama.cpp"))
              if r[k]["failed"]]
    lines.append("")
    if failed:
        lines.append("Failed requests: " + "; ".join(
            f"N={n} {who}: {json.dumps(e)}" for n, who, e in failed) + ".")
    else:
        lines.append("Every request of every run completed.")

    by_n = {r["n"]: r for r in rows}
    checks = []
    for n in (16, 64):
        if n in by_n:
            r = by_n[n]
            tr = ratio(r["c"]["output_throughput"], r["l"]["output_throughput"])
            checks.append(f"N={n}: throughput {tr:.2f}x llama.cpp's "
                          f"(target >= 1.5x: {'met' if tr >= 1.5 else 'not met'}); "
                          f"p99 ITL {r['c']['p99_itl_ms']:.1f} vs "
                          f"{r['l']['p99_itl_ms']:.1f} ms (target no worse: "
                          f"{'met' if r['c']['p99_itl_ms'] <= r['l']['p99_itl_ms'] else 'not met'})")
    if 16 in by_n and 64 in by_n:
        a = by_n[16]["c"]["output_throughput"]
        b = by_n[64]["c"]["output_throughput"]
        la = by_n[16]["l"]["output_throughput"]
        lb = by_n[64]["l"]["output_throughput"]
        checks.append(f"16 -> 64 streams: cinfer {a:.1f} -> {b:.1f} tok/s "
                      f"({'does not fall' if b >= a else 'falls'}); llama.cpp "
                      f"{la:.1f} -> {lb:.1f} tok/s")
    if checks:
        lines += ["", "Against the targets of issue 4:", ""]
        lines += ["- " + c for c in checks]

    text = "\n".join(lines) + "\n"
    base = benchlib.current_result(args.out_dir, "serve-vs-llamacpp", (".md", ".png"))
    png_ok = plot(rows, base + ".png", work, args)
    with open(base + ".md", "w") as f:
        f.write(text)
        if png_ok:
            f.write("\n![throughput and p99 ITL against concurrency]"
                    "(serve-vs-llamacpp.png)\n")
        f.write("\nEach run's cinfer-bench JSON (without per-request "
                "arrays):\n\n```\n")
        for r in rows:
            for k in ("c", "l"):
                f.write(json.dumps(r[k], sort_keys=True) + "\n")
        f.write("```\n")
    print(text)
    print("written", base + ".md", "and .png" if png_ok else "(no plot)")


if __name__ == "__main__":
    main()
