#!/usr/bin/env python3
"""Ceilings of the GPU in this run, measured with PyTorch (scripts/gpu-check.sh):

- copy_gb_s: device-to-device copy bandwidth (bytes read + written, 4 GiB
  buffers, best of 20), the floor every decode step's weight reads are
  held to;
- bf16_gemm_tflops: cuBLAS BF16 GEMM rate at 8192^3 (best of 20), the
  floor of compute-bound steps.

Prints one JSON object. Needs a CUDA device and torch.
"""
import json
import sys

import torch


def best_ms(fn, reps=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main():
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    n = 1 << 30  # floats: 4 GiB
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    ms = best_ms(lambda: b.copy_(a))
    copy_gb_s = 2 * a.numel() * 4 / (ms * 1e-3) / 1e9
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    ms = best_ms(lambda: torch.matmul(x, y))
    tflops = 2 * m ** 3 / (ms * 1e-3) / 1e12
    print(json.dumps({"device": torch.cuda.get_device_name(0),
                      "torch": torch.__version__,
                      "copy_gb_s": round(copy_gb_s, 1),
                      "bf16_gemm_tflops": round(tflops, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
