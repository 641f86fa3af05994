#!/usr/bin/env python3
"""Run the PTX cases written by `tests/device_cases.rs` on the GPU and compare every
element with the expected bytes. Needs only the driver's libcuda (no toolkit).

usage: run_cases.py CASES_DIR [RESULT_JSON]
Exits 1 if any case fails; prints one line per case and the first mismatches.
"""
import ctypes
import json
import struct
import sys
from pathlib import Path

ELEM = {  # name: (bytes, struct format or None, float)
    "s8": (1, "b", False), "u8": (1, "B", False), "s16": (2, "h", False), "u16": (2, "H", False),
    "s32": (4, "i", False), "u32": (4, "I", False), "s64": (8, "q", False), "u64": (8, "Q", False),
    "f16": (2, "H", True), "bf16": (2, "H", True), "f32": (4, "I", True), "f64": (8, "Q", True),
}
FLOAT_BITS = {"f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52)}
POISON = 0xA5


def is_nan(elem, bits):
    e, m = FLOAT_BITS[elem]
    return (bits >> m) & ((1 << e) - 1) == (1 << e) - 1 and bits & ((1 << m) - 1) != 0


class Cuda:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        version = ctypes.c_int()
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        self.driver = version.value

    def check(self, r, what):
        if r != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(r, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else r}")

    def load(self, ptx, kernel):
        # Ask for the JIT's error log so that a rejected module says why.
        log = ctypes.create_string_buffer(8192)
        opts = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, ..._SIZE_BYTES
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(8192))
        mod = ctypes.c_void_p()
        r = self.lib.cuModuleLoadDataEx(ctypes.byref(mod), ctypes.c_char_p(ptx + b"\0"), 2, opts, vals)
        if r != 0:
            raise RuntimeError(f"JIT failed ({r}): {log.value.decode(errors='replace')}")
        fn = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, kernel.encode()), "cuModuleGetFunction")
        return mod, fn

    def alloc(self, data):
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(len(data), 1))), "cuMemAlloc")
        self.check(self.lib.cuMemcpyHtoD_v2(ptr, ctypes.c_char_p(bytes(data)), ctypes.c_size_t(len(data))), "cuMemcpyHtoD")
        return ptr

    def read(self, ptr, n):
        buf = ctypes.create_string_buffer(n)
        self.check(self.lib.cuMemcpyDtoH_v2(buf, ptr, ctypes.c_size_t(n)), "cuMemcpyDtoH")
        return buf.raw

    def launch(self, fn, grid, block, ptrs):
        vals = [ctypes.c_uint64(p.value) for p in ptrs]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        self.check(self.lib.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, params, None), "cuLaunchKernel")
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")


def compare(elem, got, want):
    size, fmt, is_float = ELEM[elem]
    n = len(want) // size
    g = struct.unpack(f"<{n}{fmt}", got)
    w = struct.unpack(f"<{n}{fmt}", want)
    bad = []
    for i in range(n):
        if g[i] == w[i] or (is_float and is_nan(elem, g[i]) and is_nan(elem, w[i])):
            continue
        bad.append((i, g[i], w[i]))
    return n, bad


def main():
    root = Path(sys.argv[1])
    cases = json.loads((root / "cases.json").read_text())
    cuda = Cuda()
    results, failed = [], 0
    for case in cases:
        name = case["kernel"]
        try:
            _, fn = cuda.load((root / case["ptx"]).read_bytes(), name)
            ptrs, checks = [], []
            for a in case["args"]:
                data = (root / a["input"]).read_bytes() if "input" in a else bytes([POISON]) * a["bytes"]
                ptr = cuda.alloc(data)
                ptrs.append(ptr)
                if "expect" in a:
                    checks.append((ptr, a["elem"], (root / a["expect"]).read_bytes()))
            block = case["block"]
            cuda.launch(fn, (case["threads"] + block - 1) // block, block, ptrs)
            total, bad = 0, []
            for ptr, elem, want in checks:
                n, b = compare(elem, cuda.read(ptr, len(want)), want)
                total += n
                bad += [(elem, *x) for x in b]
            for p in ptrs:
                cuda.lib.cuMemFree_v2(p)
            ok = not bad
            per = {}
            for e, i, g, w in bad:
                per.setdefault(e, []).append(f"[{i}] got {g:#x} want {w:#x}")
            detail = f"{total} elements" if ok else f"{len(bad)} of {total} differ: " + "; ".join(
                f"{e} ({len(v)}): " + ", ".join(v[:3]) for e, v in per.items())
        except RuntimeError as err:
            ok, detail, bad = False, str(err), []
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        results.append({"kernel": name, "pass": ok, "detail": detail})
    summary = {"driver": cuda.driver, "cases": len(cases), "failed": failed, "results": results}
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(summary, indent=1))
    print(f"{len(cases) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
