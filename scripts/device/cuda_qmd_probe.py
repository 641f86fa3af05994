#!/usr/bin/env python3
"""What libcuda writes for a launch: finds the QMDs (Hopper QMD V04_00) and the push-buffer
methods around them in this process's own memory, so the native backend's choices can be
compared field by field with CUDA's.

Launches, through libcuda (ctypes, no toolkit), kernels with grids of marked widths:
  single     one launch, grid (0x2345, 3, 1), 96 threads, no shared memory
  stream     four back-to-back launches in one stream, grids 0x2351..0x2354, the last two
             with 12 and 32 KiB of dynamic shared memory and 256 threads
  graph      a captured graph of three launches, grids 0x2361..0x2363, replayed twice
then reads every readable mapping of the process (through /proc/self/mem, or directly where
the kernel does not allow that) and reports each place where the QMD's GRID_WIDTH (word 32),
GRID_HEIGHT (word 33, low half) and CTA_THREAD_DIMENSION0 (word 36, low half) hold a marked
launch, with the 96 words of the QMD and the 160 words before it (the push-buffer methods
that carry or send it).

Usage: cuda_qmd_probe.py OUT.json
"""
import ctypes
import json
import os
import re
import sys

import numpy as np

PTX = r"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry marked(.param .u64 p)
{
    ret;
}
.extern .shared .align 16 .b8 dyn[];
.visible .entry shared_user(.param .u64 p)
{
    .reg .b32 r<3>;
    .reg .b64 rd<3>;
    mov.u32 r1, %tid.x;
    shl.b32 r2, r1, 2;
    mov.u64 rd1, dyn;
    cvt.u64.u32 rd2, r2;
    add.u64 rd1, rd1, rd2;
    st.shared.u32 [rd1], r1;
    bar.sync 0;
    ret;
}
"""

cuda = ctypes.CDLL("libcuda.so.1")


def ck(result, what):
    if result != 0:
        raise SystemExit(f"{what} failed: CUresult {result}")


def launch(func, grid, block, shared, stream, arg):
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
    ck(
        cuda.cuLaunchKernel(
            func, grid[0], grid[1], grid[2], block[0], block[1], block[2],
            shared, stream, params, None,
        ),
        "cuLaunchKernel",
    )


def regions():
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            perms = parts[1]
            path = parts[5] if len(parts) > 5 else ""
            if "r" not in perms or path.startswith(("[vvar", "[vsyscall", "[vdso")):
                continue
            # Code and data of loaded files cannot hold a launch's QMD.
            if path.startswith("/") and not path.startswith("/dev/"):
                continue
            if hi - lo > (1 << 30):
                continue
            yield lo, hi, perms, path


def read(mem, lo, hi, path):
    try:
        return os.pread(mem, hi - lo, lo), "proc"
    except OSError:
        # UVM's ranges may be reserved without memory behind them: reading one directly
        # would kill the process.
        if "nvidia-uvm" in path:
            return b"", "unreadable"
        buf = ctypes.create_string_buffer(hi - lo)
        ctypes.memmove(buf, lo, hi - lo)
        return buf.raw, "direct"


def scan(markers, block):
    """Every place a QMD of a marked launch lies."""
    found = []
    mem = os.open("/proc/self/mem", os.O_RDONLY)
    for lo, hi, perms, path in list(regions()):
        print(f"scan {lo:#x}-{hi:#x} {perms} {path}", flush=True)
        data, how = read(mem, lo, hi, path)
        words = np.frombuffer(data[: len(data) // 4 * 4], dtype="<u4")
        for marker, height in markers:
            for i in np.nonzero(words == marker)[0]:
                base = int(i) - 32
                if base < 0 or base + 96 > len(words):
                    continue
                if words[base + 33] & 0xFFFF != height:
                    continue
                if words[base + 36] & 0xFFFF not in block:
                    continue
                before = max(0, base - 160)
                found.append({
                    "marker": hex(marker),
                    "region": f"{lo:#x}-{hi:#x} {perms} {path}",
                    "read": how,
                    "address": hex(lo + 4 * base),
                    "qmd": [int(w) for w in words[base : base + 96]],
                    "before": [int(w) for w in words[before:base]],
                    "after": [int(w) for w in words[base + 96 : base + 160]],
                })
    os.close(mem)
    return found


def save(out, report):
    with open(out, "w") as f:
        json.dump(report, f)


def main():
    out = sys.argv[1]
    ck(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ck(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    version = ctypes.c_int()
    ck(cuda.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    module = ctypes.c_void_p()
    ck(cuda.cuModuleLoadData(ctypes.byref(module), PTX.encode() + b"\0"), "cuModuleLoadData")
    marked = ctypes.c_void_p()
    ck(cuda.cuModuleGetFunction(ctypes.byref(marked), module, b"marked"), "marked")
    shared_user = ctypes.c_void_p()
    ck(cuda.cuModuleGetFunction(ctypes.byref(shared_user), module, b"shared_user"), "shared_user")
    stream = ctypes.c_void_p()
    ck(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    arg = ctypes.c_uint64(0x1234_5678_9ABC)
    report = {"driver": version.value}

    launch(marked, (0x2345, 3, 1), (96, 1, 1), 0, stream, arg)
    ck(cuda.cuStreamSynchronize(stream), "sync")
    report["single"] = scan([(0x2345, 3)], {96})
    save(out, report)

    launch(marked, (0x2351, 1, 1), (96, 1, 1), 0, stream, arg)
    launch(marked, (0x2352, 1, 1), (96, 1, 1), 0, stream, arg)
    launch(shared_user, (0x2353, 1, 1), (256, 1, 1), 12288, stream, arg)
    launch(shared_user, (0x2354, 1, 1), (256, 1, 1), 32768, stream, arg)
    ck(cuda.cuStreamSynchronize(stream), "sync")
    report["stream"] = scan([(0x2351, 1), (0x2352, 1), (0x2353, 1), (0x2354, 1)], {96, 256})
    save(out, report)

    ck(cuda.cuStreamBeginCapture_v2(stream, 0), "cuStreamBeginCapture")
    for width in (0x2361, 0x2362, 0x2363):
        launch(marked, (width, 1, 1), (96, 1, 1), 0, stream, arg)
    graph = ctypes.c_void_p()
    ck(cuda.cuStreamEndCapture(stream, ctypes.byref(graph)), "cuStreamEndCapture")
    exec_ = ctypes.c_void_p()
    ck(cuda.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, ctypes.c_ulonglong(0)),
       "cuGraphInstantiate")
    ck(cuda.cuGraphUpload(exec_, stream), "cuGraphUpload")
    for _ in range(2):
        ck(cuda.cuGraphLaunch(exec_, stream), "cuGraphLaunch")
    ck(cuda.cuStreamSynchronize(stream), "sync")
    report["graph"] = scan([(0x2361, 1), (0x2362, 1), (0x2363, 1)], {96})

    save(out, report)
    for k in ("single", "stream", "graph"):
        print(k, len(report[k]), "QMDs found", [(h["marker"], h["address"], h["read"]) for h in report[k]])


if __name__ == "__main__":
    main()
