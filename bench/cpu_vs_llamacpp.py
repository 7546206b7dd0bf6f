#!/usr/bin/env python3
"""cinfer-run against llama.cpp's llama-bench on the same GGUF files, CPU.

For each weight type (the default model's Q4_1, and the same model converted
to Q8_0 and F16 with llama.cpp's llama-quantize) and each thread count, the
two programs run alternately, REPS times each:

  llama.cpp:  llama-bench -m M -p 128 -n 128 -t T -fa on -lm none -r 1 -o json
              (flash attention on, weights read into memory: its fastest
              CPU settings)
  cinfer:     cinfer-run -m M --bench 128,128 -t T -r 1

and the medians of prompt tokens/s (pp128) and decode tokens/s (tg128) are
compared. The machine's floors are measured in the same run with
cinfer-kbench: decode can not beat (weight bytes / read bandwidth) per
token, prefill can not beat (2 * params * tokens) / peak FMA rate.

    bench/cpu_vs_llamacpp.py [--reps 5] [--threads 1,2] [--types q4_1,q8_0,f16]
        [--out FILE]

Types are llama-quantize's names in lower case (q4_k_m, q6_k, ...), each
the default model converted, or `gemma`: the Gemma 3 270M Q4_K_M file
(scripts/gemma-model.sh) as it is.

Writes a markdown table to bench/results/cpu-vs-llamacpp.md (the run before
moves to bench/results/history/) and prints it. llama.cpp is built by scripts/goldens/build-llama-cpp.sh from the
source the PyPI package llama-cpp-python ships.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def llama_bench(bin_dir, model, threads):
    out = sh([os.path.join(bin_dir, "llama-bench"), "-m", model, "-p", "128",
              "-n", "128", "-t", str(threads), "-fa", "on", "-lm", "none",
              "-r", "1", "-o", "json"]).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == 128 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] == 128 and r["n_prompt"] == 0)
    return pp, tg


def cinfer_bench(build, model, threads):
    out = sh([os.path.join(build, "tools", "cinfer-run"), "-m", model,
              "--bench", "128,128", "-t", str(threads), "-r", "1",
              "--ctx", "512"]).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return row["pp_tps"], row["tg_tps"]


def n_params(model):
    """The weights' element count, from the GGUF's tensor table (the gguf
    package); the default model's 134,515,008 if it is not installed."""
    try:
        import gguf
    except ImportError:
        return 134515008
    return sum(int(t.n_elements) for t in gguf.GGUFReader(model).tensors)


def floors(build, threads):
    """Read bandwidth (GB/s, huge pages), peak FP32 FMA rate (GFLOP/s) and
    peak int8 dot rate (GOP/s) of the best ISA, from cinfer-kbench's JSON."""
    f = benchlib.kbench_floors(os.path.join(build, "tools", "cinfer-kbench"), threads)
    return f["read_gbs"], f["fma_gflops"], f["int8_dot_gops"] or f["fma_gflops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default="q4_1,q8_0,f16")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", "work"))
    ap.add_argument("--out", help="results file (default: "
                    "bench/results/cpu-vs-llamacpp.md; the run before moves "
                    "to bench/results/history/)")
    args = ap.parse_args()

    bin_dir = sh(["sh", os.path.join(ROOT, "scripts/goldens/build-llama-cpp.sh")]).stdout.strip().splitlines()[-1]
    default = sh(["sh", os.path.join(ROOT, "scripts/default-model.sh")]).stdout.strip()
    os.makedirs(args.work, exist_ok=True)
    models = {}
    for t in args.types.split(","):
        if t == "q4_1":
            models[t] = default
            continue
        if t == "gemma":  # the second real model, Gemma 3 270M Q4_K_M
            models[t] = sh(["sh", os.path.join(ROOT, "scripts/gemma-model.sh")]).stdout.strip()
            continue
        path = os.path.join(args.work, f"smollm2-135m-{t}.gguf")
        if not os.path.exists(path):
            sh([os.path.join(bin_dir, "llama-quantize"), "--allow-requantize",
                default, path, t.upper()])
        models[t] = path

    rows = []
    for t, model in models.items():
        wbytes = os.path.getsize(model)
        for th in [int(x) for x in args.threads.split(",")]:
            bw, fma, dot = floors(args.build, th)
            # int8-block products run on vpdpbusd, float ones on FMA
            # (the K-quants and IQ4 types pair with Q8_K or Q8_0 blocks)
            rate = fma if t in ("f16", "bf16", "f32") else dot
            res = {"cinfer": [], "llama.cpp": []}
            for rep in range(args.reps):
                order = ["cinfer", "llama.cpp"] if rep % 2 == 0 else ["llama.cpp", "cinfer"]
                for who in order:
                    if who == "cinfer":
                        res[who].append(cinfer_bench(args.build, model, th))
                    else:
                        res[who].append(llama_bench(bin_dir, model, th))
            med = {k: (statistics.median(p for p, _ in v), statistics.median(g for _, g in v))
                   for k, v in res.items()}
            params = n_params(model)
            rows.append({
                "type": t, "threads": th,
                "c_pp": med["cinfer"][0], "l_pp": med["llama.cpp"][0],
                "c_tg": med["cinfer"][1], "l_tg": med["llama.cpp"][1],
                "floor_tg": bw * 1e9 / wbytes,
                "floor_pp": rate * 1e9 / (2.0 * params),
                "bw": bw, "rate": rate,
                "runs": res,
            })
            r = rows[-1]
            print(f"{t} t={th}: pp {r['c_pp']:.1f} vs {r['l_pp']:.1f} ({r['c_pp']/r['l_pp']:.2f}x), "
                  f"tg {r['c_tg']:.1f} vs {r['l_tg']:.1f} ({r['c_tg']/r['l_tg']:.2f}x)", flush=True)

    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        f"# cinfer-run vs llama.cpp llama-bench, {datetime.date.today()}",
        "",
        f"Machine: {cpu}, {os.cpu_count()} cores, {platform.platform()}; "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}. "
        f"Medians of {args.reps} alternating runs each; 128-token prompt (pp128), "
        "128 decoded tokens (tg128). llama.cpp: llama-cpp-python 0.3.36 sdist, "
        "-fa on -lm none. Floors measured in the same run by cinfer-kbench: "
        "decode <= read bandwidth (huge pages) / file bytes; prefill <= peak rate / "
        "(2 x params): the FP32 FMA rate for F16, the int8 dot rate (vpdpbusd on "
        "AVX-512 VNNI, vpmaddubsw + vpmaddwd on AVX2) for the int8-block types. "
        f"CPU vector flags: {benchlib.cpu_info()['flags']}.",
        "",
        "| type | threads | cinfer pp tok/s | llama.cpp pp tok/s | pp ratio | prefill floor | "
        "cinfer tg tok/s | llama.cpp tg tok/s | tg ratio | decode floor (BW) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['type']} | {r['threads']} | {r['c_pp']:.1f} | {r['l_pp']:.1f} | "
            f"**{r['c_pp']/r['l_pp']:.2f}x** | {r['floor_pp']:.0f} | {r['c_tg']:.1f} | "
            f"{r['l_tg']:.1f} | **{r['c_tg']/r['l_tg']:.2f}x** | {r['floor_tg']:.0f} "
            f"({r['bw']:.1f} GB/s) |")
    text = "\n".join(lines) + "\n"
    out = args.out or benchlib.current_result(os.path.join(ROOT, "bench", "results"),
                                              "cpu-vs-llamacpp", (".md",)) + ".md"
    with open(out, "w") as f:
        f.write(text)
        f.write("\nRaw (pp, tg) per run:\n\n```\n")
        for r in rows:
            f.write(f"{r['type']} t={r['threads']}: {json.dumps(r['runs'])}\n")
        f.write("```\n")
    print(text)
    print("written", out)


if __name__ == "__main__":
    main()
