//! Errors of the native backend: each says what is missing or which driver call failed,
//! and how.

use super::launch::LaunchError;
use super::pushbuf::PushError;
use super::qmd::QmdError;
use super::rm::CallError;

/// Why the native backend cannot reach the GPUs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NativeError {
    /// `/proc/driver/nvidia/version` does not exist: no nvidia module is loaded.
    #[error(
        "the NVIDIA kernel module is not loaded ({path} does not exist); load it \
         (`modprobe nvidia`) or install the driver"
    )]
    ModuleNotLoaded { path: String },

    /// The version file exists but could not be read.
    #[error("cannot read {path}: {message}")]
    VersionUnreadable { path: String, message: String },

    /// The version file does not say which module is loaded.
    #[error("{path} does not name an NVIDIA kernel module and its version; it reads: {excerpt:?}")]
    VersionUnrecognized { path: String, excerpt: String },

    /// NVIDIA's proprietary (closed) kernel module is loaded.
    #[error(
        "quench's native backend needs NVIDIA's open kernel module, but the proprietary \
         module {version} is loaded; install the open module of the same driver (the \
         `-open` packages, or the installer's `--kernel-module-type=open`), or use \
         `--backend cuda`"
    )]
    ProprietaryModule { version: String },

    /// A driver branch whose resource-manager structures quench has not been checked
    /// against.
    #[error(
        "quench's native backend speaks the resource-manager interface of driver branches \
         {known}, but the loaded module is {version}; use a driver from one of those \
         branches, or `--backend cuda`"
    )]
    UnsupportedDriver { version: String, known: String },

    /// A device node does not exist.
    #[error(
        "{node} does not exist: the NVIDIA driver has not created it (no GPU with that \
         number, or the nodes were never made: `nvidia-modprobe` or `nvidia-smi` as root \
         creates them)"
    )]
    NodeMissing { node: String },

    /// The process may not open a device node for reading and writing.
    #[error(
        "permission denied: quench needs read and write access to {node} ({detail}); \
         run as a user in the node's group, or ask an administrator to grant access"
    )]
    NodePermission { node: String, detail: String },

    /// A device node could not be opened for another reason.
    #[error("cannot open {node}: {message}")]
    NodeOpen { node: String, message: String },

    /// The driver's resource manager rejected the version quench announced.
    #[error(
        "version handshake failed: quench announced driver version {announced} (read from \
         /proc/driver/nvidia/version), but the resource manager behind /dev/nvidiactl is \
         {driver}; the two should be one module: reload the NVIDIA module or reboot"
    )]
    VersionMismatch { announced: String, driver: String },

    /// The driver did not understand the version handshake at all.
    #[error(
        "the NVIDIA driver did not recognise quench's version handshake \
         (NV_ESC_CHECK_VERSION_STR); it is too old or not NVIDIA's driver"
    )]
    HandshakeUnrecognized,

    /// An allocation of no bytes, or of more than the GPU has.
    #[error("cannot allocate {size} bytes of {placement}: {reason}")]
    AllocationSize {
        size: u64,
        placement: &'static str,
        reason: String,
    },

    /// The process has fewer GPUs than the one asked for.
    #[error("there is no GPU {ordinal}: this process can open {count}")]
    NoSuchGpu { ordinal: usize, count: usize },

    /// `mmap` of a device node failed after the resource manager prepared the mapping.
    #[error("mmap of {length} bytes through {node} failed: {message}")]
    Mmap {
        node: String,
        length: u64,
        message: String,
    },

    /// A channel's ring has no free entry: the GPU has not yet fetched earlier work.
    #[error(
        "the channel's GPFIFO ring of {entries} entries is full (GP_PUT {put}, GP_GET \
         {get}): wait for the GPU to fetch earlier work"
    )]
    RingFull { entries: u32, put: u32, get: u32 },

    /// An access outside an allocation.
    #[error(
        "{what} of {length} bytes at offset {offset:#x} is outside the {size}-byte allocation"
    )]
    OutOfBounds {
        what: &'static str,
        offset: u64,
        length: u64,
        size: u64,
    },

    /// A channel's parameters that the hardware cannot take.
    #[error("a channel of {entries} GPFIFO entries cannot be made: {reason}")]
    ChannelShape { entries: u32, reason: &'static str },

    /// A cubin that cannot be read, or that has nothing to run.
    #[error("cannot load the cubin: {0}")]
    Cubin(String),

    /// Code that would need relocating before it runs.
    #[error(
        "kernel {kernel} needs its code relocated ({count} relocation entries: calls to \
         functions in other sections, or global symbols), which the native backend does not \
         do yet"
    )]
    Relocations { kernel: String, count: usize },

    /// A figure the driver was asked for and did not give.
    #[error("the driver did not report {0}")]
    Unreported(String),

    /// A launch that cannot be made as asked.
    #[error(transparent)]
    Launch(#[from] LaunchError),

    /// A launch descriptor that cannot be encoded.
    #[error(transparent)]
    Qmd(#[from] QmdError),

    /// Methods that cannot be encoded.
    #[error(transparent)]
    Push(#[from] PushError),

    /// Submitted work that did not finish in time.
    #[error(
        "{what} did not finish within {seconds} s (the channel had fetched up to GPFIFO \
         entry {gp_get}); the GPU may be hung or the work faulted"
    )]
    Timeout {
        what: String,
        seconds: f64,
        gp_get: u32,
    },

    /// The resource manager stopped the channel on an error (a kernel that faulted, most
    /// often); the channel takes no more work.
    #[error(
        "the GPU stopped the channel's work{}: {} (robust-channel error {code}); quench \
         was waiting for {what}",
        kernel.as_ref().map(|k| format!(" in kernel {k}")).unwrap_or_default(),
        robust_channel_error(*code)
    )]
    ChannelFault {
        code: u32,
        kernel: Option<String>,
        what: String,
    },

    /// A call to the driver failed.
    #[error("{call} failed: {error}")]
    Call { call: String, error: CallError },
}

impl NativeError {
    pub(crate) fn call(call: impl Into<String>, error: CallError) -> Self {
        NativeError::Call {
            call: call.into(),
            error,
        }
    }
}

/// What a robust-channel error code (`ROBUST_CHANNEL_*`, the Xid, in
/// src/common/sdk/nvidia/inc/nverror.h) means, for the ones a compute channel meets.
pub fn robust_channel_error(code: u32) -> &'static str {
    match code {
        13 => {
            "an exception in the graphics and compute engine (in a kernel: an illegal \
               instruction, a misaligned or out-of-range address, a trap)"
        }
        31 => "a GPU memory page fault (an address not mapped for the GPU)",
        32 => "a push buffer the GPU could not fetch or parse",
        43 => "the channel was reset",
        45 => "the channel was removed (the process's work was preempted)",
        48 => "an uncorrectable (double-bit) ECC error",
        69 => "a method the compute class rejected",
        79 => "the GPU has fallen off the bus",
        94 => "a contained memory error",
        95 => "an uncontained memory error",
        _ => "an error the resource manager reported",
    }
}
