//! A `ptxas` that `quench pull ptxas` installed is found when neither `QUENCH_PTXAS` nor
//! `PATH` names one, and the error says where it was looked for when it is absent. (Alone
//! in its test binary: it sets environment variables.)

use quench_ptx::{ptxas, PtxError};

#[test]
fn a_pulled_ptxas_is_found_after_path() {
    let dir = std::env::temp_dir().join(format!("quench-ptxas-pulled-{}", std::process::id()));
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::env::remove_var("QUENCH_PTXAS");
    // No ptxas on PATH, and no python3 to find a wheel with.
    std::env::set_var("PATH", &empty);
    let pulled = dir.join("models").join("ptxas").join("ptxas");
    ptxas::set_pulled_ptxas(pulled.clone());

    let err = ptxas::find_ptxas().expect_err("nothing pulled yet");
    assert!(matches!(err, PtxError::PtxasNotFound { .. }));
    let text = err.to_string();
    assert!(text.contains(&pulled.display().to_string()), "{text}");
    assert!(text.contains("quench pull ptxas"), "{text}");

    std::fs::create_dir_all(pulled.parent().unwrap()).unwrap();
    std::fs::write(&pulled, b"#!/bin/sh\n").unwrap();
    assert_eq!(ptxas::find_ptxas().unwrap(), pulled);
    std::fs::remove_dir_all(&dir).unwrap();
}
