#!/usr/bin/env python3
"""Tensor parallelism on CPU ranks: what TP=2 and TP=3 cost against TP=1.

The default model's 3 KV heads allow only TP=1 and 3, so the model here is
one of its size and shape written by cinfer-mkmodel with heads that divide
by 2 and 3 (30 layers, width 576, 12 query and 6 KV heads, n_ff 1536,
49152 tokens, Q4_1, random weights: the arithmetic per token is the
default model's). Runs `cinfer-run --bench PP,TG` at each --tp in
alternation (--rounds times each, the same --threads shared out over the
ranks), and reports per TP the median prefill and decode tokens/s, the
median of the TP=N/TP=1 ratios of rounds run back to back (the ratio holds
where a shared machine's raw rates wander), and rank 0's time inside the
all-reduces per decode step and per prefill (waiting for the other ranks
included: a rank that finishes its share early waits there).

    bench/tp_cpu.py [--bin build/release/tools/cinfer-run]
                    [--mkmodel build/release/tools/cinfer-mkmodel]
                    [--rounds 5] [--threads 2] [--tp 1,2,3]
                    [--bench 128,32] [--out bench/results/tp-cpu.md]

Writes a Markdown table with the CPU model and OPENBLAS_CORETYPE, and
prints it.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(binary, model, tp, threads, bench):
    """One cinfer-run --bench repetition at this TP: its JSON line."""
    out = subprocess.run(
        [binary, "-m", model, "--device", "cpu", "--tensor-parallel",
         str(tp), "-t", str(threads), "--bench", bench, "--reps", "1"],
        check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/release/tools/"
                                                  "cinfer-run"))
    ap.add_argument("--mkmodel", default=os.path.join(
        ROOT, "build/release/tools/cinfer-mkmodel"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tp", default="1,2,3")
    ap.add_argument("--bench", default="128,32")
    ap.add_argument("--note", default="", help="how the machine was loaded "
                    "while this ran (printed with the results)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/"
                                                  "tp-cpu.md"))
    a = ap.parse_args()
    tps = [int(x) for x in a.tp.split(",")]
    if tps[0] != 1:
        raise SystemExit("--tp must start with 1 (the baseline)")
    model = os.path.join(ROOT, "build", "tp-bench-model.gguf")
    if not os.path.exists(model):
        subprocess.run([a.mkmodel, "-o", model, "--layers", "30", "--embd",
                        "576", "--heads", "12", "--kv-heads", "6", "--ff",
                        "1536", "--vocab", "49152", "--ctx", "2048",
                        "--dtype", "q4_1", "--embd-dtype", "q8_0"],
                       check=True, stdout=subprocess.DEVNULL)
    rows = {tp: [] for tp in tps}
    for _ in range(a.rounds):
        for tp in tps:
            rows[tp].append(run(a.bin, model, tp, a.threads, a.bench))
    med = statistics.median
    n_pp = int(a.bench.split(",")[0])
    lines = [
        "# Tensor parallelism on CPU ranks against TP=1",
        "",
        "Measured %s on this machine (%s, %d threads in all, shared out "
        "over the ranks), `bench/tp_cpu.py --rounds %d --threads %d --tp %s "
        "--bench %s`: a model of the default model's size and shape with "
        "heads that divide by 2 and 3 (see the script), medians of %d "
        "rounds run in alternation; OPENBLAS_CORETYPE=%s (cinfer links no "
        "BLAS). %s" % (
            datetime.date.today().isoformat(), cpu_model(), a.threads,
            a.rounds, a.threads, a.tp, a.bench, a.rounds,
            os.environ.get("OPENBLAS_CORETYPE", "unset"), a.note),
        "",
        "| TP | prefill tok/s | decode tok/s | prefill / TP=1 | "
        "decode / TP=1 | all-reduce per decode step | all-reduce per "
        "prefill |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tp in tps:
        r = rows[tp]
        pp = med([x["pp_tps"] for x in r])
        tg = med([x["tg_tps"] for x in r])
        ppr = med([b["pp_tps"] / a_["pp_tps"] for a_, b in zip(rows[1], r)])
        tgr = med([b["tg_tps"] / a_["tg_tps"] for a_, b in zip(rows[1], r)])
        if tp == 1:
            coll = "-"
            collp = "-"
        else:
            c = med([x["tg_collective_ms_per_token"] for x in r])
            cp = med([x["pp_collective_ms"] for x in r])
            coll = "%.2f ms (%.0f%%)" % (c, 100.0 * c * tg / 1000.0)
            collp = "%.1f ms (%.0f%%)" % (cp, 100.0 * cp * pp /
                                         (1000.0 * n_pp))
        lines.append("| %d | %.1f | %.1f | %.2f | %.2f | %s | %s |" % (
            tp, pp, tg, ppr, tgr, coll, collp))
    lines += [
        "",
        "All-reduce time is rank 0's time inside the collectives "
        "(kernels/comm.c's LOCAL communicator, cinfer_comm_stats; its share "
        "of the step in brackets): the shared-memory sum of its slice and "
        "the wait for the other ranks, two per layer (attention output, "
        "down). On one host of this size TP splits the same work and adds "
        "the collectives and each rank's per-step overhead: it is a "
        "correctness vehicle here, not a speed-up; the speed-up tensor "
        "parallelism is for is across GPUs, where NCCL carries it.",
        "",
    ]
    text = "\n".join(lines)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
