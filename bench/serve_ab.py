#!/usr/bin/env python3
"""cinfer-server at two commits, serving the same closed-loop load.

Builds cinfer-server, cinfer-cli and cinfer-bench at BASE and at NEW
(default HEAD), each in a git worktree under build/ab-<commit> (committed
code only), starts both servers on loopback with the default model, and
drives them with the same cinfer-bench workload (serve_vs_llamacpp.py's
run, its wait for quiet cores and its count of other work's CPU time) at
each level, alternating the two servers (one running at a time, started afresh for
each run) and flipping the order every round.
Reports the median output tokens/s and p99 ITL per level and the median
new/old throughput ratio of rounds run back to back.

    bench/serve_ab.py BASE [--new HEAD] [--levels 16,64] [--rounds 3]
                           [--threads 2] [--output-len 32] [--out FILE]
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import serve_vs_llamacpp as svl  # noqa: E402


def build(commit):
    """The serving programs at `commit`, built in a worktree."""
    wt = os.path.join(ROOT, "build", "ab-" + commit)
    if not os.path.isdir(wt):
        svl.sh(["git", "-C", ROOT, "worktree", "add", "--detach", wt, commit])
    b = os.path.join(wt, "build")
    svl.sh(["cmake", "-S", wt, "-B", b, "-DCMAKE_BUILD_TYPE=Release",
            "-DCINFER_CUDA=OFF", "-DCINFER_WERROR=OFF"])
    svl.sh(["cmake", "--build", b, "-j", "2", "--target", "cinfer-server",
            "cinfer-cli", "cinfer-bench"])
    return {k: os.path.join(b, v) for k, v in svl.PROGRAMS.items() if k != "kbench"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--levels", default="16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-stream", type=int, default=1)
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--warmups", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batched-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-foreign", type=float, default=0.15)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--quiet-wait", type=float, default=60)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "serve-ab.md"))
    args = ap.parse_args()
    base = svl.sh(["git", "-C", ROOT, "rev-parse", "--short", args.base]).stdout.strip()
    new = svl.sh(["git", "-C", ROOT, "rev-parse", "--short", args.new]).stdout.strip()
    model = svl.sh(["sh", os.path.join(ROOT, "scripts", "default-model.sh")]).stdout.strip()
    progs = {"old": build(base), "new": build(new)}
    work = tempfile.mkdtemp(prefix="serve-ab-")
    levels = [int(x) for x in args.levels.split(",")]
    got = {(who, n): [] for who in ("old", "new") for n in levels}
    for i in range(args.rounds):
        for n in levels:
            requests = max(args.min_requests, args.per_stream * n)
            order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
            for who in order:
                # one server at a time, started afresh: an idle one would
                # share the cores with the one measured
                proc, addr = svl.start_cinfer(progs[who], model, args.threads, work,
                                              args.max_batched_tokens)
                try:
                    got[(who, n)].append(svl.run_bench(progs[who], "grpc", addr,
                                                       proc.proc.pid, n, requests,
                                                       args, work))
                finally:
                    proc.stop()

    info = benchlib.cpu_info()
    lines = [
        "# cinfer-server at %s against %s" % (new, base),
        "",
        "Measured %s on %s (%d online CPUs; vector flags: %s); "
        "OPENBLAS_CORETYPE=%s. `bench/serve_ab.py %s --new %s --levels %s "
        "--rounds %d --threads %d --output-len %d`: the default model (%s), "
        "cinfer-bench over gRPC, closed loop at N streams, max(%d, %d x N) "
        "requests a level, %d-token synthetic prompts, %d output tokens, "
        "ignore_eos, greedy; `--max-batched-tokens %d`; the two servers in "
        "alternation, medians of %d rounds. 'other work' is the share of the "
        "cores other processes took during the runs (median). The machine "
        "was shared." % (
            datetime.date.today().isoformat(), info["model"], info["cpus"],
            info["flags"], os.environ.get("OPENBLAS_CORETYPE", "(unset)"), base,
            new, args.levels, args.rounds, args.threads, args.output_len,
            os.path.basename(model), args.min_requests, args.per_stream,
            args.input_len, args.output_len, args.max_batched_tokens, args.rounds),
        "",
        "| streams | old tok/s | new tok/s | x old | old p99 ITL ms | new p99 ITL ms "
        "| other work |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in levels:
        o, w = got[("old", n)], got[("new", n)]
        ratio = statistics.median(b["output_throughput"] / a["output_throughput"]
                                  for a, b in zip(o, w))
        foreign = statistics.median(r["foreign_cpu_share"] for r in o + w)
        lines.append("| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.0f%% |" % (
            n, statistics.median(r["output_throughput"] for r in o),
            statistics.median(r["output_throughput"] for r in w), ratio,
            statistics.median(r["p99_itl_ms"] for r in o),
            statistics.median(r["p99_itl_ms"] for r in w), 100 * foreign))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    print("recorded in", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
