"""Peers measured in the same device run as quench's kernels: torch.matmul (cuBLAS)
bf16 GEMM TFLOP/s (square, and at llama-3.1-8b prefill shapes) and the device-to-device
copy bandwidth through PyTorch.
Medians over repeats after warm-up, fresh random inputs (never zeros).
Prints one JSON object."""
import json
import statistics
import sys

import torch


def median_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main():
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    # Copy bandwidth: 2 GiB buffer, bytes read + written.
    n = 1 << 30
    src = torch.randint(0, 255, (n * 2,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    out["copy_bytes"] = 2 * src.numel()
    out["copy_ms"] = ms
    out["copy_gbps"] = 2 * src.numel() / ms / 1e6
    del src, dst
    gemms = []
    for (m, n_, k) in [(4096, 4096, 4096), (8192, 8192, 8192)]:
        # Several input sets so repeats do not all hit the same cache lines.
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(k, n_, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
        i = [0]

        def run():
            a, b = sets[i[0] % 3]
            i[0] += 1
            return torch.matmul(a, b)
        ms = median_ms(run)
        gemms.append({"m": m, "n": n_, "k": k, "ms": ms, "tflops": 2 * m * n_ * k / ms / 1e9})
    out["matmul_bf16"] = gemms
    # llama-3.1-8b prefill: activations [m, k] times a weight stored [n, k] (as quench's
    # gemm_* kernels take it), at 512 and 2048 tokens through the q|k|v, o, gate/up and
    # down projections.
    prefill = []
    for m in (512, 2048):
        for (n_, k) in [(6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]:
            sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                     torch.randn(n_, k, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
            i = [0]

            def run():
                a, w = sets[i[0] % 3]
                i[0] += 1
                return torch.matmul(a, w.t())
            ms = median_ms(run)
            prefill.append({"m": m, "n": n_, "k": k, "ms": ms, "tflops": 2 * m * n_ * k / ms / 1e9})
    out["matmul_bf16_prefill"] = prefill
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
