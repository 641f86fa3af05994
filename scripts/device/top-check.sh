#!/usr/bin/env bash
# `quench top --json` against nvidia-smi, field by field, idle and under a matrix-product
# load: each quench reading sits between two nvidia-smi readings taken just before and
# just after it. Static fields must match exactly; moving ones must fall within the two
# nvidia-smi readings widened by a tolerance fixed below, before the run. Also captures
# the terminal view (tmux capture-pane, or --once-text where tmux is missing).
# Run from the repository root with the release binary carried (target/release/quench).
# Writes receipts/top-nvidia-smi.json and receipts/top-tui-capture.txt under $OUT (or
# the repository when OUT is unset); exits non-zero when a field disagrees.
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-.}/receipts
mkdir -p "$DEST"
WORK=$(mktemp -d)
QUERY=name,utilization.gpu,memory.used,memory.total,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu
QUERY=$QUERY,fan.speed,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total
# Recorded beside the comparison, not compared: which power reading power.draw is.
INFO_QUERY=power.draw.instant,power.draw.average

smi() { nvidia-smi --query-gpu=$QUERY --format=csv,noheader,nounits -i 0; }

# One round: nvidia-smi, quench, nvidia-smi, back to back.
round() {
    local tag=$1
    smi >"$WORK/$tag.before.csv"
    "$BIN" top --json --no-server >"$WORK/$tag.quench.json"
    smi >"$WORK/$tag.after.csv"
    nvidia-smi --query-gpu=$INFO_QUERY --format=csv,noheader,nounits -i 0 >"$WORK/$tag.info.csv" 2>&1 || true
}

round idle1
round idle2

# A load: bf16 matrix products in a loop for LOAD_SECONDS, so utilization, clocks,
# power and memory move and a process holds the GPU.
LOAD_SECONDS=25
python3 - "$WORK/load.ready" "$LOAD_SECONDS" <<'EOF' &
import sys, time, os, torch
ready, seconds = sys.argv[1], float(sys.argv[2])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
open(ready, "w").write(str(os.getpid()))
end = time.time() + seconds
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
EOF
LOAD_PID=$!
for _ in $(seq 120); do [ -s "$WORK/load.ready" ] && break; sleep 0.5; done
[ -s "$WORK/load.ready" ] || { echo "the load did not start"; kill "$LOAD_PID" 2>/dev/null || true; exit 1; }
sleep 2
round load1
round load2

# The terminal view under load.
if command -v tmux >/dev/null; then
    CAPTURE_TOOL="tmux capture-pane (160x48, after 3 s)"
    tmux new-session -d -s quench-top -x 160 -y 48 "$BIN top --no-server --interval 0.5"
    sleep 3
    tmux capture-pane -p -t quench-top >"$DEST/top-tui-capture.txt"
    tmux send-keys -t quench-top q
    sleep 0.5
    tmux kill-session -t quench-top 2>/dev/null || true
else
    CAPTURE_TOOL="quench top --once-text (160x48; tmux is not installed)"
    "$BIN" top --once-text --no-server --interval 0.5 --size 160x48 >"$DEST/top-tui-capture.txt"
fi
wait "$LOAD_PID"

QUENCH_VERSION=$("$BIN" --version)
python3 - "$WORK" "$DEST" "$BIN" "$CAPTURE_TOOL" "$QUENCH_VERSION" "$QUERY" "$INFO_QUERY" <<'EOF'
import datetime, hashlib, json, os, subprocess, sys

work, dest, binary, capture_tool, version, query, info_query = sys.argv[1:8]
columns = query.split(",")
rounds = ["idle1", "idle2", "load1", "load2"]
MIB = 1 << 20
load_pid = int(open(os.path.join(work, "load.ready")).read())

# field: (quench JSON field, converter to nvidia-smi's unit, kind, tolerance)
# "static": equal to both nvidia-smi readings. "moving": within [min - tol, max + tol]
# of the two nvidia-smi readings around it.
FIELDS = {
    "name": ("name", lambda v: v, "static", None),
    "memory.total": ("memory_total_bytes", lambda v: v // MIB, "static", 0),
    "power.limit": ("power_limit_watts", lambda v: round(v, 2), "static", 0.01),
    "utilization.gpu": ("utilization_gpu_percent", lambda v: v, "moving", 10),
    "memory.used": ("memory_used_bytes", lambda v: v / MIB, "moving", 64),
    "clocks.sm": ("sm_clock_mhz", lambda v: v, "moving", 60),
    "clocks.mem": ("memory_clock_mhz", lambda v: v, "moving", 0),
    "power.draw": ("power_draw_watts", lambda v: v, "moving", 40),
    "temperature.gpu": ("temperature_c", lambda v: v, "moving", 2),
    "fan.speed": ("fan_speed_percent", lambda v: v, "moving", 5),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected_volatile_count", lambda v: v, "static", 0),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected_volatile_count", lambda v: v, "static", 0),
}
assert sorted(columns) == sorted(FIELDS), "the nvidia-smi query and the compared fields differ"
UNITS = {"memory.total": "MiB", "power.limit": "W", "utilization.gpu": "%", "memory.used": "MiB",
         "clocks.sm": "MHz", "clocks.mem": "MHz", "power.draw": "W", "temperature.gpu": "C", "fan.speed": "%",
         "ecc.errors.corrected.volatile.total": "errors", "ecc.errors.uncorrected.volatile.total": "errors"}

def smi_row(path):
    cells = [c.strip() for c in open(path).read().strip().split(",")]
    out = {}
    for key, cell in zip(columns, cells):
        if cell.startswith("[") or cell in ("N/A", ""):
            out[key] = None
        elif key == "name":
            out[key] = cell
        else:
            out[key] = float(cell)
    return out

results, failures = [], []
print(f"{'round':7} {'field':38} {'quench':>12} {'smi before':>12} {'smi after':>12} {'bound':>14}  agree")
for r in rounds:
    q = json.load(open(os.path.join(work, f"{r}.quench.json")))
    gpu = q["gpus"][0]
    before, after = smi_row(os.path.join(work, f"{r}.before.csv")), smi_row(os.path.join(work, f"{r}.after.csv"))
    fields = {}
    for key, (qfield, conv, kind, tol) in FIELDS.items():
        raw = gpu.get(qfield)
        qv = None if raw is None else conv(raw)
        b, a = before[key], after[key]
        if qv is None or b is None or a is None:
            agree = qv is None and (b is None or a is None)
            bound = "both unavailable"
        elif kind == "static":
            agree = qv == b == a if tol in (None, 0) else abs(qv - b) <= tol and abs(qv - a) <= tol
            bound = "exact" if tol in (None, 0) else f"±{tol}"
        else:
            lo, hi = min(b, a) - tol, max(b, a) + tol
            agree = lo <= qv <= hi
            bound = f"[{lo:g}, {hi:g}]"
        fields[key] = {"quench": qv, "nvidia_smi_before": b, "nvidia_smi_after": a,
                       "unit": UNITS.get(key), "kind": kind, "tolerance": tol, "agree": agree}
        if not agree:
            failures.append(f"{r} {key}: quench {qv} vs nvidia-smi {b} / {a}")
        show = lambda v: "null" if v is None else (f"{v:.2f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v))
        print(f"{r:7} {key:38} {show(qv):>12} {show(b):>12} {show(a):>12} {bound:>14}  {'yes' if agree else 'NO'}")
    procs = gpu.get("processes")
    info = open(os.path.join(work, f"{r}.info.csv")).read().strip()
    results.append({"round": r, "under_load": r.startswith("load"), "fields": fields,
                    "nvidia_smi_" + info_query.replace(",", "_").replace(".", "_"): info,
                    "quench_sample": q,
                    "load_process_listed": None if procs is None else any(p["pid"] == load_pid for p in procs)})

def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()

def git_commit():
    env = os.environ.get("QUENCH_GIT_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"

smi_header = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
                            capture_output=True, text=True).stdout.strip().split(", ")
capture = open(os.path.join(dest, "top-tui-capture.txt")).read().splitlines()
receipt = {
    "format": "quench.receipt.v1",
    "kind": "top-vs-nvidia-smi",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "git_commit": git_commit(),
    "binary_sha256": sha256(binary),
    "quench_version": version,
    "device": {"name": smi_header[0] if smi_header else None,
               "driver": smi_header[1] if len(smi_header) > 1 else None},
    "inputs": {
        "quench": "quench top --json --no-server",
        "nvidia_smi": "nvidia-smi --query-gpu=" + query + " --format=csv,noheader,nounits -i 0",
        "order": "nvidia-smi, quench, nvidia-smi, back to back; two rounds idle, two under a bf16 8192^3 matmul loop",
        "load_pid": load_pid,
    },
    "bound": {k: {"kind": v[2], "tolerance": v[3], "unit": UNITS.get(k)} for k, v in FIELDS.items()},
    "outcome": {
        "all_agree": not failures,
        "failures": failures,
        "rounds": results,
        "tui_capture_tool": capture_tool,
        "tui_capture": capture,
    },
}
with open(os.path.join(dest, "top-nvidia-smi.json"), "w") as f:
    json.dump(receipt, f, indent=2)
    f.write("\n")
print("load process listed by quench:", [r["load_process_listed"] for r in results if r["under_load"]])
print("all fields agree" if not failures else "DISAGREE:\n  " + "\n  ".join(failures))
sys.exit(0 if not failures else 1)
EOF
