//! The CUDA backend. Everywhere, the refusal is checked: without a GPU (as in CI) creating
//! an executor must return `NoGpu` with a reason, not panic. The tests that need a GPU (the
//! whole contract, the kernel cache) are ignored by a plain `cargo test`:
//! scripts/device/gpu-tests.sh runs them with `--ignored` on a GPU machine, where a missing
//! GPU fails them.

mod common;

use std::path::PathBuf;

use quench_rt::{list_devices, CudaExecutor, Executor, RtError, StreamId};

/// CUDA device 0; a test that calls this needs a GPU and fails without one.
fn gpu(cache: Option<PathBuf>) -> CudaExecutor {
    match CudaExecutor::with_cache_dir(0, cache) {
        Ok(ex) => ex,
        Err(RtError::NoGpu { reason }) => panic!("this test needs a GPU: {reason}"),
        Err(other) => {
            panic!("opening CUDA device 0 failed with something other than NoGpu: {other}")
        }
    }
}

fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("quench-rt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn no_gpu_is_an_error_not_a_panic() {
    let opened = std::panic::catch_unwind(|| CudaExecutor::new(0).map(|ex| ex.device_name()));
    match opened {
        Err(_) => panic!("CudaExecutor::new panicked"),
        Ok(Ok(name)) => println!("GPU present: {name}"),
        Ok(Err(RtError::NoGpu { reason })) => println!("no GPU: {reason}"),
        Ok(Err(other)) => panic!("expected NoGpu, got {other}"),
    }
    // A device that does not exist is NoGpu too.
    assert!(matches!(
        CudaExecutor::new(10_000),
        Err(RtError::NoGpu { .. })
    ));
}

#[test]
fn device_listing_agrees_with_opening() {
    match list_devices() {
        Ok(devices) => {
            assert!(!devices.is_empty());
            for (i, d) in devices.iter().enumerate() {
                assert_eq!(d.ordinal, i as u32);
                assert!(
                    d.compute_capability.0 >= 1 && d.total_memory_bytes > 0 && !d.name.is_empty()
                );
                assert!(
                    d.driver_version.starts_with(|c: char| c.is_ascii_digit())
                        && d.driver_version.contains('.')
                );
                println!("{d:?}");
            }
            let ex = gpu(None);
            assert_eq!(ex.info(), &devices[0]);
        }
        Err(RtError::NoGpu { reason }) => {
            println!("no GPU ({reason}): opening device 0 must be refused too");
            assert!(!reason.is_empty());
            assert!(matches!(CudaExecutor::new(0), Err(RtError::NoGpu { .. })));
        }
        Err(other) => panic!("list_devices: {other}"),
    }
}

#[test]
#[ignore = "needs a GPU: scripts/device/gpu-tests.sh runs it"]
fn contract_on_the_gpu() {
    let mut ex = gpu(None);
    common::all(&mut ex);
    let ms = common::events_measure(&mut ex);
    println!("one saxpy launch: {ms} ms");
}

#[test]
#[ignore = "needs a GPU: scripts/device/gpu-tests.sh runs it"]
fn compiled_kernels_are_cached_on_disk() {
    let dir = scratch_dir("cubin-cache");
    let mut first = gpu(Some(dir.clone()));
    let mut rng = common::rng("compiled_kernels_are_cached_on_disk");
    first.load(&common::saxpy()).expect("load");
    assert_eq!(
        (first.cache_stats().misses, first.cache_stats().hits),
        (1, 0)
    );
    assert_eq!(
        first.cache_stats().write_failures,
        0,
        "{:?}",
        first.cache_problem()
    );
    drop(first);

    let mut second = gpu(Some(dir.clone()));
    let k = second.load(&common::saxpy()).expect("load from cache");
    assert_eq!(
        (second.cache_stats().misses, second.cache_stats().hits),
        (0, 1)
    );
    let p = common::Problem::new(&mut second, &mut rng, 999);
    second
        .launch(k, &p.launch(), &p.args(), StreamId::DEFAULT)
        .expect("launch");
    p.check(&mut second, 1, "kernel loaded from the cache");
    drop(second);

    // Damage the cubin: the entry is discarded, the kernel compiled again and re-cached.
    let cubin = std::fs::read_dir(&dir)
        .expect("cache dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "cubin"))
        .expect("a cubin in the cache");
    let mut bytes = std::fs::read(&cubin).expect("read cubin");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&cubin, &bytes).expect("write cubin");
    let mut third = gpu(Some(dir.clone()));
    let k = third.load(&common::saxpy()).expect("load after damage");
    let st = third.cache_stats();
    assert_eq!((st.hits, st.misses, st.discarded), (0, 1, 1));
    let p = common::Problem::new(&mut third, &mut rng, 77);
    third
        .launch(k, &p.launch(), &p.args(), StreamId::DEFAULT)
        .expect("launch");
    p.check(
        &mut third,
        1,
        "kernel compiled again after the damaged entry",
    );
    drop(third);
    let mut fourth = gpu(Some(dir.clone()));
    fourth.load(&common::saxpy()).expect("load");
    assert_eq!(fourth.cache_stats().hits, 1, "the rebuilt entry is used");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "needs a GPU: scripts/device/gpu-tests.sh runs it"]
fn a_cubin_rewrite_is_what_the_loader_sees() {
    let dir = scratch_dir("cubin-rewrite");
    let mut rng = common::rng("a_cubin_rewrite_is_what_the_loader_sees");
    // The JIT's cubin passed through as it is: the kernel runs, and the cache is not used.
    let mut ex = gpu(Some(dir.clone()));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let record = std::sync::Arc::clone(&seen);
    ex.set_cubin_rewrite(Box::new(move |name, cubin| {
        record.lock().expect("the record").push(name.to_string());
        Ok(cubin.to_vec())
    }));
    let k = ex.load(&common::saxpy()).expect("load through the rewrite");
    assert_eq!(seen.lock().expect("the record").len(), 1);
    assert_eq!(
        (ex.cache_stats().hits, ex.cache_stats().misses),
        (0, 0),
        "a rewritten kernel bypasses the cache"
    );
    let p = common::Problem::new(&mut ex, &mut rng, 321);
    ex.launch(k, &p.launch(), &p.args(), StreamId::DEFAULT)
        .expect("launch");
    p.check(&mut ex, 1, "kernel loaded from the rewritten cubin");
    // A rewrite that fails, or returns what the loader refuses, is the load's error.
    ex.set_cubin_rewrite(Box::new(|_, _| Err("no".into())));
    let e = ex.load(&common::saxpy()).expect_err("a failed rewrite");
    assert!(e.to_string().contains("rewriting its cubin: no"), "{e}");
    ex.set_cubin_rewrite(Box::new(|_, cubin| Ok(cubin[..cubin.len() / 3].to_vec())));
    assert!(
        ex.load(&common::saxpy()).is_err(),
        "a truncated cubin loads"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
