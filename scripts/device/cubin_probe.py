"""Loads one cubin with cuModuleLoadData and launches its kernel alone on fresh inputs
(PyTorch for memory), so a fault names only that cubin; prints whether it ran and how far
its output lies from a float64 reference. Kernels: add_f32, add_bf16 (n = 65,539, so the
tail path runs), reduce_sum_f32 and gemv_bf16 at their library defaults, and `probe`: the
add_f32 signature, whose output's first eight words are printed as integers.

Usage: python3 cubin_probe.py KERNEL CUBIN"""
import ctypes
import sys

import torch

kernel, path = sys.argv[1], sys.argv[2]
name = "add_f32" if kernel == "probe" else kernel
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
cu = ctypes.CDLL("libcuda.so.1")


def check(status, what):
    if status:
        s = ctypes.c_char_p()
        cu.cuGetErrorName(status, ctypes.byref(s))
        print(f"{kernel} {path}: {what} failed: {s.value.decode()}")
        sys.exit(1)


module, fn = ctypes.c_void_p(), ctypes.c_void_p()
check(cu.cuModuleLoadData(ctypes.byref(module), open(path, "rb").read()), "cuModuleLoadData")
check(cu.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction")
ptr = lambda t: ctypes.c_uint64(t.data_ptr())
torch.manual_seed(1)
if name in ("add_f32", "add_bf16"):
    dt, vec = (torch.float32, 4) if name == "add_f32" else (torch.bfloat16, 8)
    n = 65536 + 3
    a, b = (torch.randn(n, device="cuda").to(dt) for _ in range(2))
    out = torch.full_like(a, float("nan"))
    args = [ptr(a), ptr(b), ptr(out), ctypes.c_uint32(n)]
    grid, block = (max(n // vec, n % vec) + 255) // 256, 256
    ref = (a.float() + b.float()).to(dt)
elif name == "reduce_sum_f32":
    x = torch.randn(4096, 4096, device="cuda")
    out = torch.full((4096,), float("nan"), device="cuda")
    args, grid, block = [ptr(x), ptr(out)], 4096, 256
    ref = x.double().sum(1)
elif name == "gemv_bf16":
    w = torch.randn(8192, 8192, device="cuda").bfloat16()
    v = torch.randn(8192, device="cuda").bfloat16()
    out = torch.full((8192,), float("nan"), device="cuda")
    args, grid, block = [ptr(w), ptr(v), ptr(out)], 2048, 128
    ref = w.double() @ v.double()
else:
    sys.exit(f"unknown kernel {name}")
if kernel == "probe":
    grid = 1
params = (ctypes.c_void_p * len(args))(
    *[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args]
)
check(cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, params, None), "cuLaunchKernel")
check(cu.cuCtxSynchronize(), "the kernel")
if kernel == "probe":
    print(f"probe {path}: words {[hex(w) for w in out[:8].view(torch.int32).tolist()]}")
else:
    err = (out.double() - ref.double()).abs().nan_to_num(float("inf")).max().item()
    print(f"{kernel} {path}: ran; identical to the reference: {torch.equal(out, ref.to(out.dtype))}; max error {err:.3g}")
