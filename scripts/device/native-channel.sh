#!/usr/bin/env bash
# The native backend on a real GPU: runs the ignored GPU tests of quench-rt's native layer,
# which, with no libcuda, through the kernel module's resource manager:
#   native::channel::tests::on_the_gpu_a_semaphore_release_reaches_host_memory
#   1. checks the driver version and opens GPU 0 (client, device, subdevice, and a
#      FERMI_VASPACE_A address space);
#   2. allocates 4 KiB of host memory (NV01_MEMORY_SYSTEM) and 1 MiB of GPU memory
#      (NV01_MEMORY_LOCAL_USER), maps both into the address space (NV50_MEMORY_VIRTUAL +
#      NV_ESC_RM_MAP_MEMORY_DMA) and into the process (NV_ESC_RM_MAP_MEMORY + mmap), and
#      writes and reads back a word of the GPU memory through BAR1;
#   3. makes a channel: KEPLER_CHANNEL_GROUP_A, HOPPER_CHANNEL_GPFIFO_A over a ring and
#      USERD in GPU memory, HOPPER_COMPUTE_A and HOPPER_DMA_COPY_A on it, the work submit
#      token, the group scheduled, HOPPER_USERMODE_A mapped for the doorbell;
#   4. writes a push buffer holding one host semaphore release (a 64-bit payload to the
#      host memory) and submits it (GPFIFO entry, GP_PUT, doorbell);
#   5. waits up to 5 s for the payload to appear in host memory.
#   native::dispatch::tests::on_the_gpu_kernels_run_from_quench_sass_and_from_ptxas
#   1. compiles one kernel (y[i] = 3 x[i] + i over 100,003 elements) twice: with quench's
#      own code generator and with ptxas;
#   2. binds HOPPER_COMPUTE_A on a channel and places the shared and local windows;
#   3. for each cubin: copies its code into GPU memory, writes constant bank 0 and a QMD
#      into GPU memory, starts the grid (SEND_PCAS_A) and waits for a semaphore released
#      after it; checks every element written to host memory, then runs it 200 times
#      more and reports the median time from submission to the semaphore.
# The tests print each step as it passes ("native-channel: ...", "native-dispatch: ..."),
# so a failure shows how far they got; the error names the call that failed and the status the driver returned.
# Needs no network.
#
# Run from the repository root, either with cargo available on the GPU machine, or with a
# test binary built elsewhere and carried, named by QUENCH_RT_TEST:
#
#   cargo test -p quench-rt --lib --no-run --message-format=json \
#     | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("profile",{}).get("test") and m.get("executable") and "quench_rt" in m["executable"]]'
#   QUENCH_RT_TEST=target/debug/deps/quench_rt-<hash> \
#   QUENCH_RT_CONTRACT=target/debug/deps/native_backend-<hash> bash scripts/device/native-channel.sh
# (the second is the test binary of crates/rt/tests/native_backend.rs: the executor's
# contract on the native backend, with ptxas's code and with quench's own, and a kernel
# storing 16 GiB past its allocation, which must come back as an error naming it, after
# which the contract passes again on the same executor; and the contract on two threads
# at once, each with its own executor and channel; and the latency table: an almost empty
# kernel launched and waited for, 1,000 launched back to back, a captured graph of 195
# launches replayed, kernels of different shared memory launched in turn, 256 MiB copies
# each way and on the device, and a copy kernel's bandwidth, through libcuda and through
# the native backend in one process; ptxas from QUENCH_PTXAS, PATH or the
# nvidia-cuda-nvcc wheel).
#
# Writes under $OUT (or the repository when OUT is unset):
#   receipts/native-channel.json   the receipt: what ran, on what, and its output
#   receipts/native-channel.txt    the test's output, with its exit status
# Exits with the test's status.
set -uo pipefail
DEST=${OUT:-.}/receipts
mkdir -p "$DEST" || exit 1
# Every ignored test of the native layer (all of them need the GPU).
TEST=native::
WORK=$(mktemp -d) || exit 1
trap 'rm -rf "$WORK"' EXIT

if [ -n "${QUENCH_RT_TEST:-}" ]; then
    [ -x "$QUENCH_RT_TEST" ] || { echo "QUENCH_RT_TEST=$QUENCH_RT_TEST is not an executable" >&2; exit 1; }
    [ -x "${QUENCH_RT_CONTRACT:-}" ] || { echo "QUENCH_RT_CONTRACT=${QUENCH_RT_CONTRACT:-} is not an executable" >&2; exit 1; }
    BIN=$QUENCH_RT_TEST
    "$BIN" --ignored "$TEST" --nocapture --test-threads=1 >"$WORK/out" 2>&1
    RC=$?
    # The executor's contract on the native backend (tests/native_backend.rs).
    "$QUENCH_RT_CONTRACT" --ignored --nocapture --test-threads=1 >>"$WORK/out" 2>&1 || RC=1
elif command -v cargo >/dev/null; then
    BIN=cargo
    cargo test -p quench-rt --lib -- --ignored "$TEST" --nocapture --test-threads=1 \
        >"$WORK/out" 2>&1
    RC=$?
    cargo test -p quench-rt --test native_backend -- --ignored --nocapture --test-threads=1 \
        >>"$WORK/out" 2>&1 || RC=1
else
    echo "neither QUENCH_RT_TEST nor cargo: build the test binary and carry it (see the top of $0)" >&2
    exit 1
fi
{ cat "$WORK/out"; echo "(exit status $RC)"; } >"$DEST/native-channel.txt"
cat "$DEST/native-channel.txt"

cat /proc/driver/nvidia/version >"$WORK/proc-version" 2>&1 || true
nvidia-smi --query-gpu=pci.bus_id,name,memory.total,driver_version --format=csv,noheader \
    >"$WORK/nvidia-smi" 2>&1 || true
uname -r >"$WORK/kernel" 2>&1 || true
git rev-parse HEAD >"$WORK/commit" 2>/dev/null || echo unknown >"$WORK/commit"
git status --porcelain >"$WORK/dirty" 2>/dev/null || true

python3 - "$WORK" "$DEST" "$BIN" "$RC" "$TEST" <<'PY'
import datetime, hashlib, json, os, sys

work, dest, binary, rc, test = sys.argv[1:6]
rc = int(rc)

def read(name):
    try:
        return open(os.path.join(work, name)).read()
    except OSError as e:
        return f"unreadable: {e}"

out = read("out")
steps = [l for l in out.splitlines() if l.startswith(("native-channel: ", "native-dispatch: "))]
# "latency-table: BACKEND | WHAT | VALUE" rows of the latency test.
table = [[c.strip() for c in l.split("latency-table:", 1)[1].split("|")]
         for l in out.splitlines() if "latency-table:" in l]
try:
    binary_sha = hashlib.sha256(open(binary, "rb").read()).hexdigest() if binary != "cargo" else None
except OSError as e:
    binary_sha = f"unreadable: {e}"
receipt = {
    "format": "quench.receipt.v1",
    "kind": "native-channel",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "git_commit": read("commit").strip(),
    "git_dirty": bool(read("dirty").strip()),
    "binary": binary,
    "binary_sha256": binary_sha,
    "device": {
        "nvidia_smi": read("nvidia-smi").strip(),
        "proc_driver_nvidia_version": read("proc-version").strip(),
        "kernel": read("kernel").strip(),
    },
    "inputs": {"tests": test, "payload": "0x0123456789abcdef", "elements": 100003},
    "bound": "the 64-bit payload of one host semaphore release appears in host memory "
             "within 5 s of the doorbell; every element a kernel writes equals 3 x[i] + i; "
             "the executor contract's checks pass on the native backend (ptxas's and "
             "quench's own code); a faulting kernel is an error naming it, and the contract "
             "passes after it on the same executor; and on two threads at once; the "
             "latency test's kernel writes its ones and its copies keep their bytes",
    "outcome": {
        "passed": rc == 0 and "test result: ok. 2 passed" in out
                  and "test result: ok. 5 passed" in out,
        "latency_table": table,
        "exit_status": rc,
        "steps_passed": steps,
        "output": out[-20000:],
    },
}
path = os.path.join(dest, "native-channel.json")
with open(path + ".partial", "w") as f:
    json.dump(receipt, f, indent=2, sort_keys=True)
    f.write("\n")
os.replace(path + ".partial", path)
print("passed" if receipt["outcome"]["passed"] else "FAILED", "- receipt:", path)
PY
exit $RC
