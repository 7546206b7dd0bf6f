#!/usr/bin/env python3
"""AVX2 against AVX-512 for the K-quant and IQ4 products, one thread, in
thread CPU time (kquant_isa_ab.c says why), alternating the two ISAs cell
by cell for --rounds rounds; prints a markdown table of the median ratio
(AVX2 time / AVX-512 time) and the median GOP/s of each side.

Cells: one row from L2 (1536 x 768, decode compute) and from DRAM (a
~30 MB matrix, decode as served), then 16 .. 512 rows (prefill).

    bench/kquant_isa_ab.py --build build/release --rounds 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = [("Q4_K", 12, 256), ("Q5_K", 13, 256), ("Q6_K", 14, 256), ("Q2_K", 10, 256),
         ("Q3_K", 11, 256), ("IQ4_XS", 23, 256), ("IQ4_NL", 20, 32)]
ROW_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q2_K": 84, "Q3_K": 110,
             "IQ4_XS": 136, "IQ4_NL": 18}
N_IN = 768
# (label, rows, n_out or None for ~30 MB, iters)
CELLS = [("1 row, L2", 1, 1536, 1000), ("1 row, DRAM", 1, None, 4), ("16 rows", 16, 1536, 40),
         ("64 rows", 64, 1536, 10), ("256 rows", 256, 1536, 3), ("512 rows", 512, 1536, 2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build/release"))
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    subprocess.run(["cmake", "--build", a.build, "--target", "cinfer_kernels", "cinfer_common"],
                   check=True, stdout=subprocess.DEVNULL)
    exe = os.path.join(tempfile.mkdtemp(), "kquant_isa_ab")
    subprocess.run(["cc", "-O2", "-I" + ROOT, os.path.join(ROOT, "bench/kquant_isa_ab.c"),
                    os.path.join(a.build, "kernels/libcinfer_kernels.a"),
                    os.path.join(a.build, "common/libcinfer_common.a"), "-lm", "-lpthread",
                    "-o", exe], check=True)
    up0 = open("/proc/loadavg").read().split()[:3]
    res = {}
    for _ in range(a.rounds):
        for name, t, be in TYPES:
            for label, n, n_out, iters in CELLS:
                if n_out is None:
                    n_out = 30_000_000 // (ROW_BYTES[name] * N_IN // be)
                for isa in (2, 3):  # cinfer_cpu_isa: AVX2, AVX512
                    out = subprocess.run([exe, str(t), str(isa), str(n), str(N_IN), str(iters),
                                          str(n_out)], check=True, capture_output=True,
                                         text=True).stdout.split()
                    res.setdefault((name, label), []).append((isa, float(out[0]), float(out[1])))
    up1 = open("/proc/loadavg").read().split()[:3]
    print("load average before %s, after %s; %d rounds\n" % (" ".join(up0), " ".join(up1),
                                                            a.rounds))
    print("| type | " + " | ".join(c[0] for c in CELLS) + " |")
    print("| --- |" + " ---: |" * len(CELLS))
    for name, _, _ in TYPES:
        cells = []
        for label, *_ in CELLS:
            r = res[(name, label)]
            a2 = [x for x in r if x[0] == 2]
            a5 = [x for x in r if x[0] == 3]
            ratio = statistics.median(p[1] / q[1] for p, q in zip(a2, a5))
            cells.append("%.2fx (%.0f / %.0f)" % (ratio, statistics.median(p[2] for p in a2),
                                                statistics.median(q[2] for q in a5)))
        print("| %s | %s |" % (name, " | ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
