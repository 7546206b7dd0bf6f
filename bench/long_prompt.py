#!/usr/bin/env python3
"""A long prompt's time to first token on an idle server, two commits and
llama.cpp side by side.

Builds cinfer-server and cinfer-bench at BASE and at NEW (default HEAD),
each in a git worktree under build/ab-<commit> (committed code only, as
bench/serve_ab.py does), and for each round starts each server afresh on
loopback with the default model and its own defaults, sends one synthetic
prompt of --input-len tokens with one output token (cinfer-bench over gRPC,
greedy, ignore_eos) and records its time to first token; the two servers
alternate, the order flipping every round, one running at a time. Beside
them, llama-bench (scripts/goldens/build-llama-cpp.sh) processes a prompt
of the same length (flash attention on; --llama-fa on,off adds off); its time is the
prompt's tokens over its tokens/s.

Reports the median TTFT per server, the median old/new ratio of rounds
run back to back, and llama.cpp's prompt time, in
bench/results/long-prompt.md (an earlier one moves to history/).

    bench/long_prompt.py BASE [--new HEAD] [--input-len 8000]
                              [--rounds 3] [--threads 2] [--out FILE]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import serve_ab  # noqa: E402
import serve_vs_llamacpp as svl  # noqa: E402


def ttft_s(progs, addr, n_prompt, seed, work):
    """One request of n_prompt tokens and one output token: its TTFT."""
    out = os.path.join(work, "ttft.json")
    svl.sh([progs["bench"], "--protocol", "grpc", "--server", addr,
            "--concurrency", "1", "--num-requests", "1", "--input-len",
            str(n_prompt), "--output-len", "1", "--seed", str(seed),
            "--warmups", "0", "--ignore-eos", "--temperature", "0",
            "--json", out, "-q"])
    with open(out) as f:
        res = json.load(f)
    if res["completed"] != 1:
        raise RuntimeError("the long prompt did not complete: %r" % res)
    return res["median_ttft_ms"] / 1000.0


def llama_prompt_s(bin_dir, model, n_prompt, threads, fa):
    """llama-bench's time for a prompt of n_prompt tokens (seconds)."""
    out = svl.sh([os.path.join(bin_dir, "llama-bench"), "-m", model, "-p",
                  str(n_prompt), "-n", "0", "-t", str(threads), "-fa", fa,
                  "-lm", "none", "-r", "1", "-o", "json"]).stdout
    row = next(r for r in json.loads(out) if r["n_prompt"] == n_prompt)
    return n_prompt / row["avg_ts"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--input-len", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet-wait", type=float, default=30)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-fa", default="on",
                    help="llama-bench's flash attention settings to run: on, off or on,off")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = svl.sh(["git", "-C", ROOT, "rev-parse", "--short", args.base]).stdout.strip()
    new = svl.sh(["git", "-C", ROOT, "rev-parse", "--short", args.new]).stdout.strip()
    model = svl.sh(["sh", os.path.join(ROOT, "scripts", "default-model.sh")]).stdout.strip()
    progs = {"old": serve_ab.build(base), "new": serve_ab.build(new)}
    bin_dir = None
    if not args.no_llama:
        bin_dir = svl.sh(["sh", os.path.join(ROOT, "scripts/goldens/build-llama-cpp.sh")]
                         ).stdout.strip().splitlines()[-1]
    work = tempfile.mkdtemp(prefix="long-prompt-")
    got = {"old": [], "new": [], "fa on": [], "fa off": []}
    for i in range(args.rounds):
        order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
        for who in order:
            svl.wait_quiet(args.quiet_wait)
            proc, addr = svl.start_cinfer(progs[who], model, args.threads, work)
            try:
                t = ttft_s(progs[who], addr, args.input_len, i, work)
            finally:
                proc.stop()
            svl.log("%s (%s) round %d: TTFT %.2f s" % (
                who, base if who == "old" else new, i, t))
            got[who].append(t)
        if bin_dir:
            for fa in args.llama_fa.split(","):
                svl.wait_quiet(args.quiet_wait)
                t = llama_prompt_s(bin_dir, model, args.input_len, args.threads, fa)
                svl.log("llama-bench -fa %s round %d: %.2f s" % (fa, i, t))
                got["fa " + fa].append(t)

    with open(os.path.join(work, "rounds.json"), "w") as f:
        json.dump(got, f)
    info = benchlib.cpu_info()
    med = {k: statistics.median(v) for k, v in got.items() if v}
    ratio = statistics.median(o / n for o, n in zip(got["old"], got["new"]))
    lines = [
        "# A %d-token prompt's time to first token: cinfer-server at %s "
        "against %s" % (args.input_len, new, base),
        "",
        "Measured %s on %s (%d online CPUs; vector flags: %s); "
        "OPENBLAS_CORETYPE=%s. `bench/long_prompt.py %s --new %s "
        "--input-len %d --rounds %d --threads %d`: the default model (%s), "
        "each server started afresh with its defaults and `--threads %d` "
        "(nothing cached, nothing else running), one synthetic prompt of %d "
        "tokens and one output token over gRPC (cinfer-bench, greedy); the "
        "servers in alternation, medians of %d rounds. llama.cpp: "
        "`llama-bench -p %d -n 0 -t %d -fa on` (and `off` where listed), the prompt's tokens over "
        "its tokens/s, in the same rounds. The machine was shared." % (
            datetime.date.today().isoformat(), info["model"],
            info["cpus"], info["flags"],
            os.environ.get("OPENBLAS_CORETYPE", "(unset)"), base, new,
            args.input_len, args.rounds, args.threads,
            os.path.basename(model), args.threads, args.input_len,
            args.rounds, args.input_len, args.threads),
        "",
        "| what | seconds to the first token | tokens/s | rounds |",
        "| --- | ---: | ---: | --- |",
    ]
    names = {"old": "cinfer-server at %s" % base,
             "new": "cinfer-server at %s" % new,
             "fa on": "llama-bench, flash attention on",
             "fa off": "llama-bench, flash attention off"}
    for k in ("old", "new", "fa on", "fa off"):
        if k in med:
            lines.append("| %s | %.2f | %.1f | %s |" % (
                names[k], med[k], args.input_len / med[k],
                ", ".join("%.2f" % t for t in got[k])))
    lines += ["", "%s's time to first token is %.2fx shorter than %s's "
              "(median of the rounds' ratios)." % (new, ratio, base)]
    for fa in ("on", "off"):
        if "fa " + fa in med:
            lines[-1] += " llama.cpp's prompt with flash attention %s takes " \
                         "%.2fx as long." % (fa, med["fa " + fa] / med["new"])
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or benchlib.current_result(
        os.path.join(ROOT, "bench", "results"), "long-prompt", (".md",)) + ".md"
    with open(out, "w") as f:
        f.write(text)
    print("recorded in", out, file=sys.stderr)


if __name__ == "__main__":
    main()
