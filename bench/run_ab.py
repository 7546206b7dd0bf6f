#!/usr/bin/env python3
"""cinfer-run's prompt and decode speeds at two commits, in alternation.

Builds cinfer-run at BASE and at NEW (default HEAD), each in a git worktree
under build/ab-<commit> (committed code only: what others have not
committed stays out of both), then runs `cinfer-run --bench PP,TG -r 1` on
the default model (or --models) with each in turn, --rounds times per thread count, the
order flipping every round. Reports medians and the median of the new/old
ratios of rounds run back to back: on a shared machine the ratio of two
runs seconds apart holds better than either rate.

    bench/run_ab.py BASE [--new HEAD] [--rounds 7] [--threads 1,2]
                         [--tests 128,0:512,0:0,64] [--models A.gguf,B.gguf]
                         [--out FILE]

--models runs the same cells on each GGUF file named (default: the
default model), one table row per model, test and thread count.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def build_run(commit):
    """cinfer-run built from a worktree of `commit`; returns its path."""
    wt = os.path.join(ROOT, "build", "ab-" + commit)
    if not os.path.isdir(wt):
        sh(["git", "-C", ROOT, "worktree", "add", "--detach", wt, commit])
    b = os.path.join(wt, "build")
    sh(["cmake", "-S", wt, "-B", b, "-DCMAKE_BUILD_TYPE=Release", "-DCINFER_CUDA=OFF",
        "-DCINFER_WERROR=OFF"])
    sh(["cmake", "--build", b, "-j", "2", "--target", "cinfer-run"])
    return os.path.join(b, "tools", "cinfer-run")


def bench(run, model, pp, tg, threads):
    out = sh([run, "-m", model, "--bench", "%d,%d" % (pp, tg), "-r", "1", "-t",
              str(threads)]).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return row["pp_tps"] if pp else row["tg_tps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tests", default="128,0:512,0:0,64",
                    help="PP,TG pairs separated by ':' (one of the two 0)")
    ap.add_argument("--models", default="",
                    help="GGUF files separated by ',' (default: the default model)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "cinfer-run-ab.md"))
    args = ap.parse_args()
    base = sh(["git", "-C", ROOT, "rev-parse", "--short", args.base]).stdout.strip()
    new = sh(["git", "-C", ROOT, "rev-parse", "--short", args.new]).stdout.strip()
    models = [m for m in args.models.split(",") if m] or [
        sh(["sh", os.path.join(ROOT, "scripts", "default-model.sh")]).stdout.strip()]
    print("building cinfer-run at %s and %s" % (base, new), file=sys.stderr)
    runs = {"old": build_run(base), "new": build_run(new)}
    tests = [tuple(int(v) for v in t.split(",")) for t in args.tests.split(":")]

    rows = []
    for model in models:
        for th in [int(x) for x in args.threads.split(",")]:
            for pp, tg in tests:
                got = {"old": [], "new": []}
                for i in range(args.rounds):
                    order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
                    for who in order:
                        got[who].append(bench(runs[who], model, pp, tg, th))
                ratios = [n / o for n, o in zip(got["new"], got["old"])]
                name = ("pp%d" % pp) if pp else ("tg%d" % tg)
                rows.append((os.path.basename(model), name, th, statistics.median(got["old"]),
                             statistics.median(got["new"]), statistics.median(ratios)))
                print("%s %s %d thr: %.1f -> %.1f tok/s (%.2fx)" % rows[-1], file=sys.stderr)

    info = benchlib.cpu_info()
    lines = [
        "# cinfer-run at %s against %s" % (new, base),
        "",
        "Measured %s on %s (%d online CPUs; vector flags: %s); "
        "OPENBLAS_CORETYPE=%s. `bench/run_ab.py %s --new %s --rounds %d --threads %s "
        "--tests %s%s`: `cinfer-run --bench PP,TG -r 1`, the "
        "two builds in alternation; medians of %d rounds, 'x old' the median of "
        "the ratios of rounds run back to back. The machine was shared with "
        "other work while this ran." % (
            datetime.date.today().isoformat(), info["model"], info["cpus"],
            info["flags"], os.environ.get("OPENBLAS_CORETYPE", "(unset)"), base, new,
            args.rounds, args.threads, args.tests,
            (" --models " + args.models) if args.models else "", args.rounds),
        "",
        "| model | test | threads | old tok/s | new tok/s | x old |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for m, name, th, o, n, r in rows:
        lines.append("| %s | %s | %d | %.1f | %.1f | %.2fx |" % (m, name, th, o, n, r))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    print("recorded in", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
