#!/usr/bin/env bash
# `quench devices` through the CUDA driver library and through quench's native backend
# (ioctls to the kernel module's resource manager, no libcuda), side by side on the GPU
# machine. Writes both listings and a receipt saying, GPU by GPU, whether the native
# backend's name, multiprocessor count and memory agree with CUDA's, against bounds
# fixed below before anything runs. Needs no network.
#
# Run from the repository root with the release binary carried (target/release/quench),
# or QUENCH_BIN pointing at one:
#
#   bash scripts/device/native-devices.sh
#
# Writes under $OUT (or the repository when OUT is unset):
#   receipts/native-devices.json          the receipt (both listings inside)
#   receipts/native-devices-cuda.txt      `quench devices`, as printed, with its exit status
#   receipts/native-devices-native.txt    `quench devices --backend native`, likewise
# Exits non-zero when either backend fails or a GPU disagrees.
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-.}/receipts
mkdir -p "$DEST" || exit 1
[ -x "$BIN" ] || { echo "no quench binary at $BIN: build it (cargo build --release) and carry it" >&2; exit 1; }
WORK=$(mktemp -d) || exit 1
trap 'rm -rf "$WORK"' EXIT

# CUDA numbers GPUs fastest first unless told otherwise; the driver lists them in PCI
# order. Pair them the same way.
export CUDA_DEVICE_ORDER=PCI_BUS_ID

# One listing: text and JSON, each with its exit status.
listing() {
    local tag=$1; shift
    "$BIN" devices "$@" >"$WORK/$tag.txt" 2>&1
    echo $? >"$WORK/$tag.txt.rc"
    "$BIN" devices "$@" --json >"$WORK/$tag.json" 2>"$WORK/$tag.json.err"
    echo $? >"$WORK/$tag.json.rc"
    { cat "$WORK/$tag.txt"; echo "(exit status $(cat "$WORK/$tag.txt.rc"))"; } >"$DEST/native-devices-$tag.txt"
    cat "$DEST/native-devices-$tag.txt"
}

echo "== quench devices"
listing cuda --backend cuda
echo "== quench devices --backend native"
listing native --backend native

# What the machine says about itself, recorded beside the comparison.
cat /proc/driver/nvidia/version >"$WORK/proc-version" 2>&1 || true
ls -l /dev/nvidia* >"$WORK/dev-nodes" 2>&1 || true
nvidia-smi --query-gpu=pci.bus_id,name,memory.total,driver_version --format=csv,noheader \
    >"$WORK/nvidia-smi" 2>&1 || true
uname -r >"$WORK/kernel" 2>&1 || true
"$BIN" --version >"$WORK/version" 2>&1 || true

python3 - "$WORK" "$DEST" "$BIN" <<'EOF'
import datetime, hashlib, json, os, re, sys

work, dest, binary = sys.argv[1:4]

def read(name):
    try:
        return open(os.path.join(work, name)).read()
    except OSError as e:
        return f"unreadable: {e}"

def listing(tag):
    rc = int(read(f"{tag}.json.rc").strip() or 1)
    try:
        parsed = json.loads(read(f"{tag}.json"))
    except ValueError:
        parsed = {"error": "not JSON: " + read(f"{tag}.json")[:400]}
    return {
        "text": read(f"{tag}.txt"),
        "text_exit_status": int(read(f"{tag}.txt.rc").strip() or 1),
        "json": parsed,
        "json_exit_status": rc,
        "stderr": read(f"{tag}.json.err"),
    }

# The bounds, fixed before the comparison: names equal byte for byte; multiprocessors
# equal; memory: CUDA's total within 1% of one of the three figures the resource
# manager gives (total, usable, heap), the nearest one recorded. GPUs are paired by
# position (both lists in PCI order).
MEMORY_RELATIVE = 0.01
BOUND = {
    "name": "equal",
    "multiprocessors": "equal",
    "memory": f"CUDA total_memory_bytes within {MEMORY_RELATIVE:.0%} of the native "
              "memory_bytes, usable_memory_bytes or heap_bytes (nearest recorded)",
    "pairing": "by position; CUDA_DEVICE_ORDER=PCI_BUS_ID",
}

cuda, native = listing("cuda"), listing("native")
cuda_devs = cuda["json"].get("devices")
native_devs = native["json"].get("devices")
failures, gpus = [], []
if cuda_devs is None:
    failures.append("cuda listing failed: " + str(cuda["json"].get("error")))
if native_devs is None:
    failures.append("native listing failed: " + str(native["json"].get("error")))
if cuda_devs is not None and native_devs is not None:
    if len(cuda_devs) != len(native_devs):
        failures.append(f"CUDA lists {len(cuda_devs)} GPUs, the native backend {len(native_devs)}")
    if not cuda_devs and not native_devs:
        failures.append("no GPU listed")
    for c, n in zip(cuda_devs, native_devs):
        total = c["total_memory_bytes"]
        figures = {k: n[k] for k in ("memory_bytes", "usable_memory_bytes", "heap_bytes")}
        diffs = {k: (v - total) / total if total else None for k, v in figures.items()}
        nearest = min(diffs, key=lambda k: abs(diffs[k]) if diffs[k] is not None else 1e9)
        gpu = {
            "ordinal": c["ordinal"],
            "cuda": {"name": c["name"], "multiprocessors": c["multiprocessors"],
                     "total_memory_bytes": total,
                     "compute_capability": c["compute_capability"],
                     "driver_version": c["driver_version"]},
            "native": n,
            "name_agrees": c["name"] == n["name"],
            "multiprocessors_agree": c["multiprocessors"] == n["multiprocessors"],
            "memory_relative_difference": diffs,
            "memory_nearest": nearest,
            "memory_exact": [k for k, v in figures.items() if v == total],
            "memory_agrees": diffs[nearest] is not None and abs(diffs[nearest]) <= MEMORY_RELATIVE,
            "hopper": bool(n.get("architecture", {}).get("hopper")),
        }
        gpus.append(gpu)
        for key in ("name_agrees", "multiprocessors_agree", "memory_agrees"):
            if not gpu[key]:
                failures.append(f"GPU {c['ordinal']}: {key.replace('_', ' ')} is false")

version_line = read("version").strip()
m = re.search(r"\(git ([0-9a-f]+|unknown), uncommitted changes: (\w+)\)", version_line)
try:
    binary_sha = hashlib.sha256(open(binary, "rb").read()).hexdigest()
except OSError as e:
    binary_sha = f"unreadable: {e}"

receipt = {
    "format": "quench.receipt.v1",
    "kind": "native-devices",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "git_commit": m.group(1) if m else "unknown",
    "git_dirty": (m.group(2) == "true") if m else None,
    "quench_version": version_line,
    "binary_sha256": binary_sha,
    "device": {
        "nvidia_smi": read("nvidia-smi").strip(),
        "proc_driver_nvidia_version": read("proc-version").strip(),
        "device_nodes": read("dev-nodes").strip(),
        "kernel": read("kernel").strip(),
    },
    "inputs": {"commands": ["quench devices [--json]",
                            "quench devices --backend native [--json]"]},
    "bound": BOUND,
    "outcome": {
        "agree": not failures,
        "failures": failures,
        "gpus": gpus,
        "cuda": cuda,
        "native": native,
    },
}
path = os.path.join(dest, "native-devices.json")
with open(path + ".partial", "w") as f:
    json.dump(receipt, f, indent=2, sort_keys=True)
    f.write("\n")
os.replace(path + ".partial", path)

print()
for g in gpus:
    n, c = g["native"], g["cuda"]
    d = g["memory_relative_difference"][g["memory_nearest"]]
    print(f"GPU {g['ordinal']}: name {c['name']!r} / {n['name']!r}; multiprocessors "
          f"{c['multiprocessors']} / {n['multiprocessors']}; memory CUDA "
          f"{c['total_memory_bytes']} vs native total {n['memory_bytes']}, usable "
          f"{n['usable_memory_bytes']}, heap {n['heap_bytes']} (nearest: "
          f"{g['memory_nearest']}, {'n/a' if d is None else f'{d:+.4%}'})")
print("agree" if not failures else "DISAGREE: " + "; ".join(failures))
print(f"receipt: {path}")
sys.exit(0 if not failures else 1)
EOF
