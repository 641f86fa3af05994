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
