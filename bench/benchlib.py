"""Helpers the benchmark scripts share: the machine's description and the
floors cinfer-kbench measures, read from its JSON output (--json) rather
than parsed from its text."""
import json
import os
import subprocess
import tempfile

# Flags that say which kernels a machine can run (cinfer's and a peer's).
VECTOR_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                "avx512dq", "avx512_vnni", "avx512_bf16", "avx_vnni",
                "amx_tile", "amx_int8", "amx_bf16")


def cpu_info():
    """{'model', 'cpus', 'flags'}: the CPU model, the online CPU count and
    the vector flags /proc/cpuinfo lists (what the kernel grants)."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = [f for f in VECTOR_FLAGS if f in flags]
    return {"model": model, "cpus": os.cpu_count() or 0,
            "flags": " ".join(have) if have else "none of " + " ".join(VECTOR_FLAGS)}


def kbench_json(kbench, extra=()):
    """Runs cinfer-kbench with --json and returns what it wrote."""
    fd, path = tempfile.mkstemp(prefix="kbench-", suffix=".json")
    os.close(fd)
    try:
        subprocess.run([kbench, "--json", path] + list(extra), check=True,
                       text=True, capture_output=True)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def kbench_floors(kbench, threads):
    """The floors at `threads` threads: {'read_gbs', 'fma_gflops',
    'fma_isa', 'int8_dot_gops', 'dot_isa'}; the FMA and int8 dot rates are
    those of the best ISA the machine runs (0 and None where it has no int8
    dot kernels)."""
    j = kbench_json(kbench, ["--types", "q4_1", "--threads", str(threads),
                             "--no-prefill", "--no-decode", "--no-model",
                             "--no-batched"])
    row = next((f for f in j["floors"] if f["threads"] == threads), None)
    if row is None:
        raise RuntimeError("cinfer-kbench measured no floors at %d threads" % threads)
    out = {"read_gbs": row["read_gbs"], "fma_gflops": 0.0, "fma_isa": None,
           "int8_dot_gops": 0.0, "dot_isa": None}
    for isa in ("portable", "avx2", "avx512"):
        if "fma_gflops_" + isa in row:
            out["fma_gflops"], out["fma_isa"] = row["fma_gflops_" + isa], isa
        if "int8_dot_gops_" + isa in row:
            out["int8_dot_gops"], out["dot_isa"] = row["int8_dot_gops_" + isa], isa
    return out



def current_result(out_dir, stem, exts):
    """The path (without extension) of a benchmark's current results,
    out_dir/stem: bench/results/ keeps one current file per benchmark
    (stem.md, with its stem.png beside it) and older runs in history/.
    Files already there for `stem` move to history/stem-<date they were
    written>[-N].<ext> first, all of one run under one name."""
    hist = os.path.join(out_dir, "history")
    old = [e for e in exts if os.path.exists(os.path.join(out_dir, stem + e))]
    if old:
        import datetime
        mtime = os.path.getmtime(os.path.join(out_dir, stem + old[0]))
        day = datetime.date.fromtimestamp(mtime).isoformat()
        os.makedirs(hist, exist_ok=True)
        name, k = "%s-%s" % (stem, day), 2
        while any(os.path.exists(os.path.join(hist, name + e)) for e in exts):
            name, k = "%s-%s-r%d" % (stem, day, k), k + 1
        for e in old:
            os.replace(os.path.join(out_dir, stem + e), os.path.join(hist, name + e))
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, stem)
