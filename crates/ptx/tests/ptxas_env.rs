//! `QUENCH_PTXAS` naming a missing file is reported with the install hint. (Alone in
//! its test binary: it sets an environment variable.)

use quench_ptx::{ptxas, PtxError};

#[test]
fn a_missing_ptxas_says_how_to_install_it() {
    std::env::set_var("QUENCH_PTXAS", "/nonexistent/ptxas");
    let err = ptxas::find_ptxas().expect_err("no such file");
    assert!(matches!(err, PtxError::PtxasNotFound { .. }));
    let text = err.to_string();
    assert!(text.contains("/nonexistent/ptxas"), "{text}");
    assert!(
        text.contains("pip install --no-deps nvidia-cuda-nvcc==13.0.88"),
        "{text}"
    );
}
