//! The verifier: rejects ill-formed kernels and names what it rejected.
//! (Checks are being filled in; see `VerifyError` for what is reported.)

use crate::func::Function;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    #[error("kernel `{kernel}`: {msg}")]
    Invalid { kernel: String, msg: String },
}

pub fn verify(_f: &Function) -> Result<(), VerifyError> {
    Ok(())
}
