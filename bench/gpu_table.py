#!/usr/bin/env python3
"""Rows of scripts/gpu-check.sh's benchmark table from cinfer-devbench's JSON
lines: medians of the repetitions per batch, beside the bandwidth floor
(a decode step reads every weight once: floor tok/s = batch * copy
bandwidth / weight bytes; an upper bound while weights dominate the
traffic).

    gpu_table.py devbench.jsonl MODEL TYPE COPY_GB_S
"""
import json
import statistics
import sys


def main():
    path, model, dtype, bw = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    runs = {}
    pp = []
    wbytes = 0
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        wbytes = r["weight_bytes"]
        # a prefill-only run (--steps 0) has no decode figure
        runs.setdefault(r["batch"], []).append(
            r["tg_tps"] if r.get("steps", 1) > 0 else None)
        if r["prompt"] > 0:
            pp.append(r["pp_tps"])
    if not runs:
        print(f"| {model} | {dtype} | - | failed (see log.txt) | | | |")
        return 0
    pp_s = f"{statistics.median(pp):.0f}" if pp else ""
    for batch in sorted(runs):
        if None in runs[batch]:
            print(f"| {model} | {dtype} | {batch} | - | | | {pp_s} |")
            pp_s = ""
            continue
        tps = statistics.median(runs[batch])
        floor = batch * bw * 1e9 / wbytes if bw > 0 and wbytes else 0
        frac = f"{100 * tps / floor:.0f}%" if floor else ""
        print(f"| {model} | {dtype} | {batch} | {tps:.1f} | {floor:.0f} | {frac} | {pp_s} |")
        pp_s = ""
    return 0


if __name__ == "__main__":
    sys.exit(main())
