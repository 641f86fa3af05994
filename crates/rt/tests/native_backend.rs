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
