#!/usr/bin/env python3
"""The K-quant and IQ4 products over packed weights against the file's
layout, both on AVX-512, measured in the same cinfer-kbench runs.

    bench/kquant_pack.py [--build build/release] [--rounds 3]
                         [--types q4_k,q5_k,q6_k,q2_k,q3_k,iq4_xs,iq4_nl]
                         [--threads 1,2] [--out bench/results/kernels-kquant-packed.md]

Each round runs `cinfer-kbench --isa avx512 --cpu-time --no-model` once:
every cell is timed over the file's layout ("avx512") and then over the
packed layout ("avx512p", kernels/cpu/matmul.h), moments apart, in each
thread's CPU time. Per cell the script takes the ratio packed / file's
layout within the round, then the median over the rounds, beside the
median rates: decode (one row, one pass over ~93 MB of distinct matrices,
GB/s of weights), prefill (128 and 512 rows, prepare + compute) and the
batched cells (16 .. 512 rows, GOP/s, with the int8 dot peak measured
after each timing).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROW = re.compile(r"^\s+(avx512p?)\s+(\S+)\s+(\d+)\s+(.*)$")


def parse_text(text):
    """{(section, variant, type, threads, n): rate} from kbench's tables."""
    out, section = {}, None
    for line in text.splitlines():
        if line.startswith("decode:"):
            section = "decode"
        elif line.startswith("prefill:"):
            section = "prefill"
        elif line.startswith("batched:"):
            section = None  # from the JSON
        m = ROW.match(line)
        if not m or section is None:
            continue
        var, typ, thr, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4).split()
        if section == "decode":  # GB/s, % of bw, us/pass
            out[(section, var, typ, thr, 1)] = float(rest[0])
        else:  # n, GFLOP/s, % peak, ms
            out[(section, var, typ, thr, int(rest[0]))] = float(rest[1])
    return out


def run_round(kbench, types, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as js:
        p = subprocess.run([kbench, "--isa", "avx512", "--types", types, "--threads", threads,
                            "--cpu-time", "--no-model", "--json", js.name],
                           check=True, text=True, capture_output=True)
        cells = parse_text(p.stdout)
        data = json.load(open(js.name))
    for c in data.get("batched", []):
        var = "avx512p" if c["isa"] == "avx512p" else c["isa"]
        cells[("batched", var, c["type"], c["threads"], c["n"])] = c["gops"]
    return cells, data.get("floors", [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", default="q4_k,q5_k,q6_k,q2_k,q3_k,iq4_xs,iq4_nl")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "kernels-kquant-packed.md"))
    args = ap.parse_args()
    kbench = os.path.join(args.build, "tools", "cinfer-kbench")
    rounds, floors = [], []
    for i in range(args.rounds):
        print("round %d of %d" % (i + 1, args.rounds), file=sys.stderr)
        cells, fl = run_round(kbench, args.types, args.threads)
        rounds.append(cells)
        floors.append(fl)

    keys = sorted({k[:1] + k[2:] for r in rounds for k in r if k[1] == "avx512"})
    rows = {}
    for sec, typ, thr, n in keys:
        ratios, old, new = [], [], []
        for r in rounds:
            a, b = r.get((sec, "avx512", typ, thr, n)), r.get((sec, "avx512p", typ, thr, n))
            if a and b:
                ratios.append(b / a)
                old.append(a)
                new.append(b)
        if ratios:
            rows[(sec, typ, thr, n)] = (statistics.median(ratios), statistics.median(old),
                                        statistics.median(new))

    info = benchlib.cpu_info()
    read = [f["read_gbs"] for fl in floors for f in fl if f["threads"] == 1]
    peak = [f["int8_dot_gops_avx512"] for fl in floors for f in fl if f["threads"] == 1]
    lines = [
        "# K-quant and IQ4 products: packed weights against the file's layout (AVX-512)",
        "",
        "Measured %s on %s (%d online CPUs; vector flags: %s); OPENBLAS_CORETYPE=%s. "
        "`bench/kquant_pack.py --rounds %d --types %s --threads %s`: each round one "
        "`cinfer-kbench --isa avx512 --cpu-time --no-model` run, which times every cell "
        "over the file's layout and then over the packed one (kernels/cpu/matmul.h), in "
        "thread CPU time. Cell: the median over the rounds of the ratio packed / file's "
        "layout within a round (the median rates, file's layout -> packed). Decode: one "
        "row, one pass over ~93 MB of distinct [1536 x 768] matrices ([1536 x 576] for IQ4_NL), GB/s of weights "
        "(the 1-thread read floor measured in the same runs: %s GB/s). Prefill: "
        "prepare + compute, GFLOP/s. Batched: GOP/s (the 1-thread int8 dot peak: %s "
        "GOP/s). Both layouts compute the same bits (tests/unit/test_matmul.c)." % (
            datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), info["model"],
            info["cpus"], info["flags"], os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
            args.rounds, args.types, args.threads,
            "%.1f-%.1f" % (min(read), max(read)) if read else "?",
            "%.0f-%.0f" % (min(peak), max(peak)) if peak else "?"),
        "",
    ]
    types = []
    for k in rows:
        if k[1] not in types:
            types.append(k[1])
    for sec, title, ns in (("decode", "Decode (one row)", [1]),
                           ("prefill", "Prefill", [128, 512]),
                           ("batched", "Batched", [16, 64, 256, 512])):
        thr_list = [int(t) for t in args.threads.split(",")]
        cols = [(t, n) for n in ns for t in thr_list]
        lines.append("## " + title)
        lines.append("")
        lines.append("| type | " + " | ".join(
            ("%d thr" % t) if sec == "decode" else ("%d rows, %d thr" % (n, t))
            for t, n in cols) + " |")
        lines.append("| --- |" + " ---: |" * len(cols))
        for typ in types:
            cells = []
            for t, n in cols:
                v = rows.get((sec, typ, t, n))
                cells.append("%.2fx (%.1f -> %.1f)" % v if v else "-")
            lines.append("| %s | %s |" % (typ, " | ".join(cells)))
        lines.append("")
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    print("recorded in", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
