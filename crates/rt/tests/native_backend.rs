//! The native backend (quench's own driver over NVIDIA's open kernel module). Everywhere,
//! opening it without the module is an error that names what is missing, never a panic.
//! The contract on a GPU is ignored by a plain `cargo test`: scripts/device/native-channel.sh
//! runs it with `--ignored` on the GPU machine, where a missing GPU fails it.

mod common;

use quench_rt::native::NativeExecutor;
use quench_rt::{Codegen, Executor, RtError};

#[test]
fn no_kernel_module_is_an_error_not_a_panic() {
    let opened = std::panic::catch_unwind(|| NativeExecutor::open(0).map(|ex| ex.device_name()));
    match opened {
        Err(_) => panic!("NativeExecutor::open panicked"),
        Ok(Ok(name)) => println!("GPU present: {name}"),
        Ok(Err(RtError::Native(e))) => {
            let message = e.to_string();
            assert!(
                message.contains("kernel module") || message.contains("/dev/nvidia"),
                "the error does not say what is missing: {message}"
            );
        }
        Ok(Err(other)) => panic!("expected a native backend error, got {other}"),
    }
}

fn gpu(codegen: Codegen) -> NativeExecutor {
    let mut ex = match NativeExecutor::open(0) {
        Ok(ex) => ex,
        Err(e) => panic!("this test needs an NVIDIA GPU and its open kernel module: {e}"),
    };
    ex.set_codegen(codegen);
    ex
}

#[test]
#[ignore = "needs an NVIDIA GPU and the open kernel module: scripts/device/native-channel.sh"]
fn contract_on_the_gpu_with_ptxas_code() {
    common::all(&mut gpu(Codegen::Ptx));
}

#[test]
#[ignore = "needs an NVIDIA GPU and the open kernel module: scripts/device/native-channel.sh"]
fn contract_on_the_gpu_with_quench_s_own_code() {
    common::all(&mut gpu(Codegen::Sass));
}

/// `p[far] = 1.0`: with `far` past every allocation, a store the GPU's memory management
/// unit refuses.
fn wild_store() -> quench_ir::Function {
    use quench_ir::{AddrSpace, Builder, Scalar, Type};
    let mut k = Builder::new("wild_store", 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let far = k.param("far", Type::U32);
    let at = k.ptr_add(p, far);
    let one = k.const_f32(1.0);
    k.store(at, one);
    k.finish().expect("the kernel builds")
}

/// A kernel that faults comes back as an error naming it and the fault; the executor then
/// goes on working on a new channel: the whole contract passes on it afterwards.
#[test]
#[ignore = "needs an NVIDIA GPU and the open kernel module: scripts/device/native-channel.sh"]
fn a_faulting_kernel_is_named_and_the_executor_goes_on() {
    use quench_rt::{Arg, Launch, StreamId};
    let mut ex = gpu(Codegen::Ptx);
    let k = ex.load(&wild_store()).expect("the kernel loads");
    let p = ex.alloc(4096).expect("an allocation");
    // 16 GiB past it, far beyond what this process has mapped.
    let far = Arg::U32(u32::MAX - 16);
    let launched = ex
        .launch(
            k,
            &Launch::linear(1, 32),
            &[Arg::Ptr(p), far],
            StreamId::DEFAULT,
        )
        .and_then(|()| ex.synchronize());
    let message = match launched {
        Err(e) => e.to_string(),
        Ok(()) => panic!("a store 16 GiB past an allocation did not fault"),
    };
    println!("native-fault: {message}");
    assert!(
        message.contains("in kernel wild_store") && message.contains("robust-channel error"),
        "{message}"
    );
    common::all(&mut ex);
    println!("native-fault: the contract passed on the new channel");
}

/// Two executors, each with its own client and channel, on two threads at once: the
/// contract passes on both.
#[test]
#[ignore = "needs an NVIDIA GPU and the open kernel module: scripts/device/native-channel.sh"]
fn two_threads_submit_on_their_own_channels_at_once() {
    let threads: Vec<_> = [Codegen::Ptx, Codegen::Sass]
        .into_iter()
        .map(|codegen| std::thread::spawn(move || common::all(&mut gpu(codegen))))
        .collect();
    for t in threads {
        if t.join().is_err() {
            panic!("the contract failed on one of two threads");
        }
    }
    println!("native-threads: the contract passed on two threads at once");
}

/// `p[tid] = 1` for one warp: a kernel whose cost is its launch.
fn touch() -> quench_ir::Function {
    use quench_ir::{AddrSpace, Builder, Scalar, Type};
    let mut k = Builder::new("touch", 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let tid = k.tid_x();
    let at = k.ptr_add(p, tid);
    let one = k.const_f32(1.0);
    k.store(at, one);
    k.finish().expect("the kernel builds")
}

/// `y[i] = x[i]`, a thread an element (blocks of 256): a kernel whose cost is memory.
fn copy_f32() -> quench_ir::Function {
    use quench_ir::{AddrSpace, Builder, Scalar, Type};
    let mut k = Builder::new("copy_f32", 256);
    let x = k.param("x", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let y = k.param("y", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let block = k.ctaid_x();
    let first = k.mul_const(block, 256);
    let tid = k.tid_x();
    let i = k.add(first, tid);
    let from = k.ptr_add(x, i);
    let v = k.load(Type::F32, from);
    let to = k.ptr_add(y, i);
    k.store(to, v);
    k.finish().expect("the kernel builds")
}

/// [`touch`] through `floats` f32 of shared memory a block: kernels that differ only in
/// the shared memory they ask for.
fn touch_shared(floats: u32) -> quench_ir::Function {
    use quench_ir::{AddrSpace, Builder, Scalar, Type};
    let mut k = Builder::new(&format!("touch_shared_{floats}"), 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let s = k.shared_array("s", Scalar::F32, floats, 16);
    let tid = k.tid_x();
    let mine = k.ptr_add(s, tid);
    let one = k.const_f32(1.0);
    k.store(mine, one);
    let v = k.load(Type::F32, mine);
    let at = k.ptr_add(p, tid);
    k.store(at, v);
    k.finish().expect("the kernel builds")
}

/// Launches a decode step holds, for the graph's row of the table.
const STEP_LAUNCHES: usize = 195;

/// The median of `runs` timings of `f`, in microseconds, after `warm` untimed runs.
fn median_us(warm: usize, runs: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = std::time::Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

/// One backend's rows of the latency table: an almost empty kernel launched and waited
/// for, launched 1,000 times back to back, and a captured graph of [`STEP_LAUNCHES`]
/// launches replayed; two kernels asking for different shared memory launched in turn;
/// then the bandwidth of 256 MiB copies each way and on the device, and of a copy kernel.
fn latency_rows(ex: &mut dyn quench_rt::Executor, backend: &str) {
    use quench_rt::{Arg, Launch, StreamId};
    let row =
        |what: &str, value: String| println!("latency-table: {backend:<6} | {what:<50} | {value}");
    let k = ex.load(&touch()).expect("the kernel loads");
    let p = ex.alloc(128).expect("an allocation");
    ex.copy_to_device(p, &[0u8; 128]).expect("zeroed");
    let args = [Arg::Ptr(p)];
    let one = Launch::linear(1, 32);
    let s = StreamId::DEFAULT;
    let waited = median_us(20, 200, || {
        ex.launch(k, &one, &args, s).expect("a launch");
        ex.synchronize().expect("it finishes");
    });
    let mut out = [0u8; 128];
    ex.copy_to_host(p, &mut out).expect("read back");
    assert!(
        out.chunks_exact(4)
            .all(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) == 1.0),
        "{backend}: the kernel did not write its warp's ones"
    );
    row(
        "one launch, submitted and waited for",
        format!("{waited:.1} µs"),
    );
    // 1,000 launches of `kernels` in turn, then one wait: the time of each.
    let in_turn = |ex: &mut dyn quench_rt::Executor, kernels: &[quench_rt::KernelId]| {
        median_us(1, 5, || {
            for j in 0..1000 {
                ex.launch(kernels[j % kernels.len()], &one, &args, s)
                    .expect("a launch");
            }
            ex.synchronize().expect("they finish");
        }) / 1000.0
    };
    let back_to_back = in_turn(ex, &[k]);
    row(
        "1,000 launches back to back, each",
        format!("{back_to_back:.2} µs"),
    );
    let stream = ex.create_stream().expect("a stream");
    ex.begin_capture(stream).expect("capture begins");
    for _ in 0..STEP_LAUNCHES {
        ex.launch(k, &one, &args, stream)
            .expect("a recorded launch");
    }
    let graph = ex.end_capture(stream).expect("capture ends");
    let replay = median_us(10, 100, || {
        ex.replay(graph, stream).expect("a replay");
        ex.synchronize().expect("it finishes");
    });
    row(
        &format!("graph of {STEP_LAUNCHES} launches, replayed and waited for"),
        format!(
            "{replay:.1} µs ({:.2} µs a launch)",
            replay / STEP_LAUNCHES as f64
        ),
    );
    ex.release_graph(graph).expect("released");
    // Kernels asking for different shared memory one after another, as a decode step's do.
    let small = ex.load(&touch_shared(32)).expect("the kernel loads");
    let large = ex.load(&touch_shared(10240)).expect("the kernel loads");
    let alternating = in_turn(ex, &[small, large]);
    row(
        "1,000 launches of 128 B and 40 KiB of shared, each",
        format!("{alternating:.2} µs"),
    );
    const BYTES: usize = 256 << 20;
    let host = vec![0x5au8; BYTES];
    let mut back = vec![0u8; BYTES];
    let a = ex.alloc(BYTES as u64).expect("256 MiB");
    let b = ex.alloc(BYTES as u64).expect("256 MiB");
    let gbps = |us: f64| format!("{:.1} GB/s", BYTES as f64 / us / 1e3);
    let up = median_us(1, 3, || ex.copy_to_device(a, &host).expect("a copy up"));
    row("copy host to device, 256 MiB", gbps(up));
    let down = median_us(1, 3, || ex.copy_to_host(a, &mut back).expect("a copy down"));
    row("copy device to host, 256 MiB", gbps(down));
    assert!(back == host, "{backend}: the copies changed the bytes");
    let across = median_us(1, 3, || {
        ex.copy_device_to_device(b, a, BYTES as u64)
            .expect("a copy across");
        ex.synchronize().expect("it finishes");
    });
    row(
        "copy device to device, 256 MiB (read + write)",
        gbps(across / 2.0),
    );
    let copy = ex.load(&copy_f32()).expect("the kernel loads");
    let blocks = (BYTES / 4 / 256) as u32;
    let kernel = median_us(2, 5, || {
        ex.launch(
            copy,
            &Launch::linear(blocks, 256),
            &[Arg::Ptr(a), Arg::Ptr(b)],
            s,
        )
        .expect("a launch");
        ex.synchronize().expect("it finishes");
    });
    row("copy kernel, 256 MiB (read + write)", gbps(kernel / 2.0));
    ex.copy_to_host(b, &mut back).expect("a copy down");
    assert!(back == host, "{backend}: the copy kernel changed the bytes");
    for q in [p, a, b] {
        ex.free(q).expect("freed");
    }
}

/// The latency table: the same launches and copies through libcuda and through
/// the native backend, on the same GPU, in one process.
#[test]
#[ignore = "needs an NVIDIA GPU, libcuda and the open kernel module: scripts/device/native-channel.sh"]
fn latency_table_on_the_gpu() {
    let mut cuda = match quench_rt::CudaExecutor::new(0) {
        Ok(ex) => ex,
        Err(e) => panic!("this test needs libcuda and a GPU: {e}"),
    };
    latency_rows(&mut cuda, "cuda");
    drop(cuda);
    latency_rows(&mut gpu(Codegen::Ptx), "native");
}
