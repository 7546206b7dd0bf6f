#!/usr/bin/env python3
"""Batched int8-block products of this tree against an older commit's.

Builds the kernels of BASE (a git worktree under build/ab-<commit>) and of
this tree, links the current tools/cinfer-kbench.c against each (so both
binaries measure the same cells the same way), and runs the two in
alternation, --rounds times each, with --json. Each cinfer-kbench run
already pairs every timing with the int8 dot peak measured right after it;
this script takes, per cell (ISA, type, threads, rows), the median over the
rounds of each binary's ratio to that peak, and the median of the new/old
rate ratios of rounds run back to back. On a shared machine another
process slows the kernel and its peak alike, so the ratios hold where the
raw rates wander.

    bench/kbench_ab.py BASE [--rounds 5] [--threads 1,2] [--isa avx2]
                            [--types q8_0,q4_0,q4_1,f16,bf16] [--cpu-time]
                            [--out bench/results/kernels-batched.md]

--cpu-time passes cinfer-kbench's --cpu-time: timings in each thread's
CPU time, so on a busy machine the slices other processes take do not
count. Cells of the AVX-512 int8-block types also carry their ratio to
the int8 block mix (vpdpbusd + vcvtdq2ps + FMA, what the bits require).

Writes a Markdown table with the CPU model, its vector flags and
OPENBLAS_CORETYPE, and prints it.
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


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def build_kernels(src, build):
    """Configures and builds cinfer_kernels and cinfer_common of tree src."""
    sh(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
        "-DCINFER_CUDA=OFF", "-DCINFER_WERROR=OFF"])
    sh(["cmake", "--build", build, "-j", "2", "--target", "cinfer_kernels",
        "cinfer_common", "cinfer_cuda_absent"])


def link_kbench(build, out):
    """The current kbench source linked against build's kernels."""
    libs = [os.path.join(build, "kernels", "libcinfer_kernels.a"),
            os.path.join(build, "kernels", "libcinfer_cuda_absent.a"),
            os.path.join(build, "common", "libcinfer_common.a")]
    sh(["cc", "-O2", "-DNDEBUG", "-ffp-contract=off", "-std=gnu17", "-I", ROOT,
        os.path.join(ROOT, "tools", "cinfer-kbench.c"), "-o", out] + libs +
       ["-lm", "-lpthread"])


def run(kbench, args, tmp, tag, i):
    path = os.path.join(tmp, "%s-%d.json" % (tag, i))
    cmd = [kbench, "--no-decode", "--no-prefill", "--types", args.types,
           "--threads", args.threads, "--json", path]
    if args.cpu_time:
        cmd.append("--cpu-time")
    if args.isa:
        cmd += ["--isa", args.isa]
    sh(cmd)
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default="q8_0,q4_0,q4_1")
    ap.add_argument("--isa", default=None, help="avx2 or avx512 (default: all)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by thread CPU time (cinfer-kbench --cpu-time)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "kernels-batched.md"))
    args = ap.parse_args()

    base = sh(["git", "-C", ROOT, "rev-parse", "--short", args.base]).stdout.strip()
    head = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--", "kernels/cpu",
                "tools/cinfer-kbench.c"]).stdout.strip()
    wt = os.path.join(ROOT, "build", "ab-" + base)
    if not os.path.isdir(wt):
        sh(["git", "-C", ROOT, "worktree", "add", "--detach", wt, base])
    print("building kernels of %s and of this tree" % base, file=sys.stderr)
    build_kernels(wt, os.path.join(wt, "build"))
    build_kernels(ROOT, os.path.join(ROOT, "build", "ab-this"))
    tmp = tempfile.mkdtemp(prefix="kbench-ab-")
    kb_old = os.path.join(tmp, "kbench-old")
    kb_new = os.path.join(tmp, "kbench-new")
    link_kbench(os.path.join(wt, "build"), kb_old)
    link_kbench(os.path.join(ROOT, "build", "ab-this"), kb_new)

    old_runs, new_runs = [], []
    for i in range(args.rounds):
        order = [("old", kb_old, old_runs), ("new", kb_new, new_runs)]
        if i % 2:
            order.reverse()
        for tag, kb, runs in order:
            print("round %d: %s" % (i + 1, tag), file=sys.stderr)
            runs.append(run(kb, args, tmp, tag, i))

    def cells(r):
        return {(c["isa"], c["type"], c["threads"], c["n"]): c for c in r["batched"]}

    keys = list(cells(new_runs[0]).keys())
    rows = []
    for k in keys:
        ro = [cells(r)[k]["ratio"] for r in old_runs if k in cells(r)]
        rn = [cells(r)[k]["ratio"] for r in new_runs]
        gn = [cells(r)[k]["gops"] for r in new_runs]
        go = [cells(r)[k]["gops"] for r in old_runs if k in cells(r)]
        sp = [n / o for n, o in zip(gn, go)]
        mx = [cells(r)[k].get("mix_ratio", 0.0) for r in new_runs]
        pk = cells(new_runs[0])[k].get("peak", "int8_dot")
        rows.append((k, statistics.median(go), statistics.median(gn),
                     statistics.median(ro), statistics.median(rn),
                     statistics.median(sp), statistics.median(mx), pk))

    info = benchlib.cpu_info()
    fl = new_runs[0]["floors"]

    def scaling(r):
        """The 2-thread FMA floor over the 1-thread one (about 2 when no
        other process holds a core), or None without both."""
        f = {x["threads"]: x for x in r["floors"]}
        if 1 not in f or 2 not in f:
            return None
        k = next((k for k in f[2] if k.startswith("fma_gflops_avx")), None)
        return f[2][k] / f[1][k] if k and f[1].get(k) else None

    sc = [x for x in (scaling(r) for r in old_runs + new_runs) if x is not None]
    contention = ""
    if args.cpu_time:
        contention = (" Thread CPU time leaves out the slices other processes take, "
                      "so the floors cannot show contention; the caches they "
                      "disturb still count.")
    elif sc:
        contention = (" The 2-thread FMA floor was %.2fx to %.2fx the 1-thread one "
                      "over the runs (about 2 on an idle machine): %s" % (
                          min(sc), max(sc),
                          "2-thread cells are unreliable." if min(sc) < 1.7
                          else "no run lost a core to other work."))
    lines = [
        "# Batched int8-block products: %s against %s" % (
            head + (" + uncommitted kernels" if dirty else ""), base),
        "",
        "Measured %s on %s (%s online CPUs; vector flags: %s); "
        "OPENBLAS_CORETYPE=%s. `bench/kbench_ab.py %s --rounds %d --threads %s "
        "--types %s%s%s`: the current cinfer-kbench source linked against each "
        "tree's kernels, run in alternation; every timing (prepare + compute, "
        "w [1536 x n_in], best of a few runs, %s) is followed by the peak of "
        "its instructions measured again ('peak': int8 dot, bf16 dot or fp32 "
        "FMA; first run's floors: %s). 'new %% mix' is against the int8 block "
        "mix (vpdpbusd + vcvtdq2ps + FMA per 64 multiply-adds, what the "
        "reduction order requires). Medians over %d rounds; 'x old' is the "
        "median of the rate ratios of rounds run back to back. The machine "
        "was shared with other work while this ran: read the ratios, not the "
        "raw rates.%s" % (
            datetime.date.today().isoformat(), info["model"], info["cpus"],
            info["flags"], os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
            args.base, args.rounds, args.threads, args.types,
            (" --isa " + args.isa) if args.isa else "",
            " --cpu-time" if args.cpu_time else "",
            "thread CPU time" if args.cpu_time else "wall time",
            "; ".join("%d thr: %s" % (f["threads"], ", ".join(
                "%s %.0f" % (k, v) for k, v in f.items()
                if k.startswith(("int8_dot_gops_", "int8_mix_gops_", "bf16_dot_gflops_",
                                 "fma_gflops_"))))
                for f in fl), args.rounds, contention),
        "",
        "| isa | type | thr | rows | old GOP/s | new GOP/s | peak | old % peak "
        "| new % peak | new % mix | x old |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for (isa, t, thr, n), go, gn, ro, rn, sp, mx, pk in rows:
        lines.append("| %s | %s | %d | %d | %.1f | %.1f | %s | %.0f%% | %.0f%% | %s | %.2fx |" % (
            isa, t, thr, n, go, gn, pk, 100 * ro, 100 * rn,
            "%.0f%%" % (100 * mx) if mx > 0 else "", sp))
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print("recorded in", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
