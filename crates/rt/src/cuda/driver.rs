//! Reaching the NVIDIA driver: loading libcuda without ever panicking, turning driver
//! results into [`RtError`]s, and the JIT linker that compiles PTX to a cubin.
//!
//! cudarc (with dynamic loading) resolves libcuda on the first call of any driver
//! function and panics when the library or one of its symbols is missing. So before
//! the first such call we open the library ourselves, check that the driver is new
//! enough for the API version quench is built against, and only then let cudarc bind
//! it, with the panic caught in case a symbol is still missing.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUjitInputType, CUjit_option, CUresult};
use cudarc::driver::DriverError;

use crate::error::RtError;

/// quench binds the CUDA 13.0 driver API.
pub(crate) const MIN_DRIVER_VERSION: i32 = 13000;

#[cfg(windows)]
const LIBRARY_NAMES: &[&str] = &["nvcuda.dll"];
#[cfg(not(windows))]
const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// Load and initialize the driver once per process; returns its version
/// (`cuDriverGetVersion`, e.g. 13000).
pub(crate) fn driver() -> Result<i32, RtError> {
    static STATE: OnceLock<Result<i32, RtError>> = OnceLock::new();
    STATE.get_or_init(open).clone()
}

/// "13.0" for 13000.
pub(crate) fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn open() -> Result<i32, RtError> {
    let version = probe_version()?;
    if version < MIN_DRIVER_VERSION {
        return Err(RtError::NoGpu {
            reason: format!(
                "the NVIDIA driver supports CUDA {}, quench needs a driver for CUDA {} or newer",
                version_string(version),
                version_string(MIN_DRIVER_VERSION)
            ),
        });
    }
    let bound = std::panic::catch_unwind(|| {
        // SAFETY: only loads the library and resolves symbols.
        unsafe {
            sys::culib();
        }
    });
    if let Err(panic) = bound {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown reason".into());
        return Err(RtError::NoGpu {
            reason: format!("the NVIDIA driver library could not be bound: {what}"),
        });
    }
    // SAFETY: cuInit takes no pointers.
    match unsafe { sys::cuInit(0) } {
        CUresult::CUDA_SUCCESS => Ok(version),
        CUresult::CUDA_ERROR_NO_DEVICE => Err(RtError::NoGpu {
            reason: "the NVIDIA driver is installed but reports no CUDA device".into(),
        }),
        other => Err(drv("cuInit")(DriverError(other))),
    }
}

/// Open libcuda with our own loader and ask it for its version.
fn probe_version() -> Result<i32, RtError> {
    type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    let mut failures = vec![];
    for name in LIBRARY_NAMES {
        // SAFETY: loading libcuda runs its initializers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                failures.push(e.to_string());
                continue;
            }
        };
        // SAFETY: the symbol has this signature in every driver version.
        let get: libloading::Symbol<GetVersion> = unsafe { lib.get(b"cuDriverGetVersion\0") }
            .map_err(|e| RtError::NoGpu {
                reason: format!("{name} has no cuDriverGetVersion: {e}"),
            })?;
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        let rc = unsafe { get(&mut version) };
        if rc != 0 {
            return Err(RtError::NoGpu {
                reason: format!("cuDriverGetVersion in {name} failed with code {rc}"),
            });
        }
        return Ok(version);
    }
    Err(RtError::NoGpu {
        reason: format!("no NVIDIA driver found ({})", failures.join("; ")),
    })
}

/// Map a driver error of `call` to an [`RtError`].
pub(crate) fn drv(call: &'static str) -> impl Fn(DriverError) -> RtError {
    move |e| RtError::Driver {
        call,
        name: format!("{:?}", e.0),
        message: e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "no description".into()),
    }
}

const LOG_BYTES: usize = 64 * 1024;

/// Destroys a JIT link state when dropped.
struct LinkState(sys::CUlinkState);

impl Drop for LinkState {
    fn drop(&mut self) {
        // SAFETY: created by cuLinkCreate and destroyed only here.
        unsafe {
            sys::cuLinkDestroy(self.0);
        }
    }
}

/// Compile PTX for the current context's device with the driver's JIT linker and
/// return the cubin. A rejected PTX gives [`RtError::Jit`] with the driver's log.
/// The current context must be set.
pub(crate) fn compile_ptx(ptx: &str, kernel: &str) -> Result<Vec<u8>, RtError> {
    let source = CString::new(ptx).map_err(|_| RtError::Ptx {
        kernel: kernel.to_string(),
        message: "the PTX text contains a NUL byte".into(),
    })?;
    let name =
        CString::new(format!("{}.ptx", kernel.replace('\0', ""))).map_err(|_| RtError::Ptx {
            kernel: kernel.to_string(),
            message: "bad kernel name".into(),
        })?;
    let mut error_log = vec![0u8; LOG_BYTES];
    let mut info_log = vec![0u8; LOG_BYTES];
    let mut options = [
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
    ];
    // Option values travel in pointer-sized slots; sizes are integers cast into them.
    let mut values: [*mut c_void; 4] = [
        error_log.as_mut_ptr().cast(),
        LOG_BYTES as *mut c_void,
        info_log.as_mut_ptr().cast(),
        LOG_BYTES as *mut c_void,
    ];
    let mut raw = std::ptr::null_mut();
    // SAFETY: options and values have the same length and outlive the link state
    // (declared before it, so dropped after it).
    unsafe {
        sys::cuLinkCreate_v2(
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &mut raw,
        )
    }
    .result()
    .map_err(drv("cuLinkCreate"))?;
    let state = LinkState(raw);
    let jit_error = |rc: CUresult, log: &[u8]| {
        let text = log_text(log);
        RtError::Jit {
            kernel: kernel.to_string(),
            log: if text.is_empty() {
                format!("{rc:?} (the driver left no log)")
            } else {
                text
            },
        }
    };
    // SAFETY: `source` is NUL-terminated and its length includes the NUL, as the PTX
    // input requires; no per-input options.
    let rc = unsafe {
        sys::cuLinkAddData_v2(
            state.0,
            CUjitInputType::CU_JIT_INPUT_PTX,
            source.as_ptr() as *mut c_void,
            source.as_bytes_with_nul().len(),
            name.as_ptr() as *const c_char,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if rc != CUresult::CUDA_SUCCESS {
        return Err(jit_error(rc, &error_log));
    }
    let mut cubin: *mut c_void = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to locals.
    let rc = unsafe { sys::cuLinkComplete(state.0, &mut cubin, &mut size) };
    if rc != CUresult::CUDA_SUCCESS || cubin.is_null() {
        return Err(jit_error(rc, &error_log));
    }
    // SAFETY: the driver owns `size` bytes at `cubin` until the link state is destroyed;
    // we copy them out before that.
    let bytes = unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec();
    drop(state);
    Ok(bytes)
}

/// The NUL-terminated text the driver wrote into a log buffer.
fn log_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

/// Load a module from a cubin image. The current context must be set.
pub(crate) fn load_cubin(image: &[u8]) -> Result<sys::CUmodule, DriverError> {
    let mut module = std::ptr::null_mut();
    // SAFETY: `image` is readable; the driver validates it as an ELF image and copies
    // what it needs before returning.
    unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) }.result()?;
    Ok(module)
}
