//! The resource manager through the real device nodes: every call is an ioctl on
//! `/dev/nvidiactl`; a GPU's `/dev/nvidiaN` is held open while its objects exist.

use std::ffi::c_void;
use std::fs::OpenOptions;
use std::io;
use std::mem::size_of_val;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::error::NativeError;
use super::ioctl::{
    iowr, CardInfo, Nvos00Parameters, Nvos21Parameters, Nvos33Parameters, Nvos33ParametersWithFd,
    Nvos34Parameters, Nvos46Parameters, Nvos47Parameters, Nvos54Parameters, Params, RmApiVersion,
    MAX_DEVICES, NV_ESC_CARD_INFO, NV_ESC_CHECK_VERSION_STR, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL,
    NV_ESC_RM_FREE, NV_ESC_RM_MAP_MEMORY, NV_ESC_RM_MAP_MEMORY_DMA, NV_ESC_RM_UNMAP_MEMORY,
    NV_ESC_RM_UNMAP_MEMORY_DMA, RM_API_VERSION_REPLY_RECOGNIZED,
};
use super::rm::{CallError, CpuMapping, Handle, MapNode, ResourceManager, VersionReply};
use super::status::NvStatus;

/// The NVIDIA driver's control node, open; closed when dropped.
pub struct DeviceFiles {
    ctl: OwnedFd,
    dev_dir: PathBuf,
}

impl DeviceFiles {
    /// Opens `nvidiactl` in `dev_dir` (`/dev`) for reading and writing.
    pub fn open(dev_dir: &Path) -> Result<Self, NativeError> {
        Ok(DeviceFiles {
            ctl: open_node(&dev_dir.join("nvidiactl"))?,
            dev_dir: dev_dir.to_path_buf(),
        })
    }
}

impl ResourceManager for DeviceFiles {
    type GpuNode = OwnedFd;

    fn check_version(&self, version: &str) -> Result<VersionReply, CallError> {
        let mut params = RmApiVersion::strict(version);
        let result = ioctl::<NV_ESC_CHECK_VERSION_STR, _>(&self.ctl, &mut params);
        // A driver that knows the request writes `reply` whether or not the versions
        // match; on a mismatch it also fails the call with EINVAL and writes its own
        // version over ours.
        let recognized = params.reply == RM_API_VERSION_REPLY_RECOGNIZED;
        match result {
            Ok(()) if recognized => Ok(VersionReply::Match),
            Err(libc::EINVAL) if recognized => Ok(VersionReply::Mismatch {
                driver: params.version(),
            }),
            Ok(()) | Err(libc::EINVAL) => Ok(VersionReply::Unrecognized),
            Err(errno) => Err(CallError::Os(errno)),
        }
    }

    fn card_info(&self) -> Result<Vec<CardInfo>, CallError> {
        let mut cards = [CardInfo::default(); MAX_DEVICES];
        ioctl::<NV_ESC_CARD_INFO, _>(&self.ctl, &mut cards).map_err(CallError::Os)?;
        Ok(cards.into_iter().filter(|c| c.valid != 0).collect())
    }

    fn open_gpu(&self, minor: u32) -> Result<OwnedFd, NativeError> {
        open_node(&self.dev_dir.join(format!("nvidia{minor}")))
    }

    fn alloc(
        &self,
        client: Handle,
        parent: Handle,
        class: u32,
        params: Option<&mut dyn Params>,
    ) -> Result<Handle, CallError> {
        let (address, size) = params.map_or((0, 0), address_and_size);
        let mut p = Nvos21Parameters {
            h_root: client,
            h_object_parent: parent,
            h_object_new: 0,
            h_class: class,
            p_alloc_parms: address,
            params_size: size,
            status: 0,
        };
        ioctl::<NV_ESC_RM_ALLOC, _>(&self.ctl, &mut p).map_err(CallError::Os)?;
        status(p.status)?;
        Ok(p.h_object_new)
    }

    fn free(&self, client: Handle, parent: Handle, object: Handle) -> Result<(), CallError> {
        let mut p = Nvos00Parameters {
            h_root: client,
            h_object_parent: parent,
            h_object_old: object,
            status: 0,
        };
        ioctl::<NV_ESC_RM_FREE, _>(&self.ctl, &mut p).map_err(CallError::Os)?;
        status(p.status)
    }

    fn control(
        &self,
        client: Handle,
        object: Handle,
        cmd: u32,
        params: &mut dyn Params,
    ) -> Result<(), CallError> {
        let (address, size) = address_and_size(params);
        let mut p = Nvos54Parameters {
            h_client: client,
            h_object: object,
            cmd,
            flags: 0,
            params: address,
            params_size: size,
            status: 0,
        };
        ioctl::<NV_ESC_RM_CONTROL, _>(&self.ctl, &mut p).map_err(CallError::Os)?;
        status(p.status)
    }

    fn map_memory(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        node: MapNode,
    ) -> Result<CpuMapping, NativeError> {
        self.map_memory_impl(client, device, memory, length, flags, node)
    }

    fn unmap_memory(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        mapping: CpuMapping,
    ) -> Result<(), CallError> {
        self.unmap_memory_impl(client, device, memory, mapping)
    }

    fn map_memory_dma(
        &self,
        client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
    ) -> Result<u64, CallError> {
        self.map_memory_dma_impl(client, device, dma, memory, length, flags)
    }

    fn unmap_memory_dma(
        &self,
        client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        address: u64,
    ) -> Result<(), CallError> {
        self.unmap_memory_dma_impl(client, device, dma, memory, address)
    }
}

impl DeviceFiles {
    fn unmap_linear(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        linear_address: u64,
    ) -> Result<(), CallError> {
        let mut p = Nvos34Parameters {
            h_client: client,
            h_device: device,
            h_memory: memory,
            p_linear_address: linear_address,
            ..Nvos34Parameters::default()
        };
        ioctl::<NV_ESC_RM_UNMAP_MEMORY, _>(&self.ctl, &mut p).map_err(CallError::Os)?;
        status(p.status)
    }
}

/// The mapping calls of [`ResourceManager`] for the real driver (kept apart from the
/// object calls above for reading).
impl DeviceFiles {
    pub(super) fn map_memory_impl(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        node: MapNode,
    ) -> Result<CpuMapping, NativeError> {
        const CALL: &str = "NV_ESC_RM_MAP_MEMORY";
        let path = match node {
            MapNode::Control => self.dev_dir.join("nvidiactl"),
            MapNode::Gpu(minor) => self.dev_dir.join(format!("nvidia{minor}")),
        };
        // The driver attaches one mapping to one open file: a fresh descriptor each time.
        let fd = open_node(&path)?;
        let mut p = Nvos33ParametersWithFd {
            params: Nvos33Parameters {
                h_client: client,
                h_device: device,
                h_memory: memory,
                offset: 0,
                length,
                p_linear_address: 0,
                status: 0,
                flags,
            },
            fd: fd.as_raw_fd(),
        };
        ioctl::<NV_ESC_RM_MAP_MEMORY, _>(&self.ctl, &mut p)
            .map_err(|e| NativeError::call(CALL, CallError::Os(e)))?;
        status(p.params.status).map_err(|e| NativeError::call(CALL, e))?;
        let linear_address = p.params.p_linear_address;
        let mmap_error = |message: String| NativeError::Mmap {
            node: path.display().to_string(),
            length,
            message,
        };
        let Ok(len) = usize::try_from(length) else {
            let _ = self.unmap_linear(client, device, memory, linear_address);
            return Err(mmap_error("the length does not fit this process".into()));
        };
        // SAFETY: a fresh shared mapping of the driver's file; the kernel chooses the
        // address, so no existing memory is replaced.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            let message = io::Error::last_os_error().to_string();
            let _ = self.unmap_linear(client, device, memory, linear_address);
            return Err(mmap_error(message));
        }
        Ok(CpuMapping {
            address: address.cast(),
            length: len,
            linear_address,
            keep: Box::new(fd),
        })
    }

    pub(super) fn unmap_memory_impl(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        mapping: CpuMapping,
    ) -> Result<(), CallError> {
        // SAFETY: the mapping came from `map_memory_impl` and is unmapped only here, once
        // (it is moved in); nothing in quench keeps its address past this call.
        unsafe { libc::munmap(mapping.address.cast(), mapping.length) };
        let result = self.unmap_linear(client, device, memory, mapping.linear_address);
        drop(mapping.keep);
        result
    }

    pub(super) fn map_memory_dma_impl(
        &self,
        client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
    ) -> Result<u64, CallError> {
        let mut p = Nvos46Parameters {
            h_client: client,
            h_device: device,
            h_dma: dma,
            h_memory: memory,
            offset: 0,
            length,
            flags,
            ..Nvos46Parameters::default()
        };
        ioctl::<NV_ESC_RM_MAP_MEMORY_DMA, _>(&self.ctl, &mut p).map_err(CallError::Os)?;
        status(p.status)?;
        Ok(p.dma_offset)
    }

    pub(super) fn unmap_memory_dma_impl(
        &self,
        client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        address: u64,
    ) -> Result<(), CallError> {
        let mut p = Nvos47Parameters {
            h_client: client,
            h_device: device,
            h_dma: dma,
            h_memory: memory,
            dma_offset: address,
            ..Nvos47Parameters::default()
        };
        ioctl::<NV_ESC_RM_UNMAP_MEMORY_DMA, _>(&self.ctl, &mut p).map_err(CallError::Os)?;
        status(p.status)
    }
}

/// The address and size the resource manager copies a parameter struct from and back
/// to; the caller's exclusive borrow keeps the struct alive and unaliased until the
/// ioctl that carries them returns.
fn address_and_size(params: &mut dyn Params) -> (u64, u32) {
    let size = size_of_val(params) as u32;
    let address = (params as *mut dyn Params).cast::<u8>() as usize as u64;
    (address, size)
}

fn status(code: u32) -> Result<(), CallError> {
    match NvStatus(code) {
        NvStatus::OK => Ok(()),
        failed => Err(CallError::Status(failed)),
    }
}

/// `ioctl(fd, _IOWR('F', NR, sizeof(T)), arg)`, retried when a signal interrupts it;
/// `Err(errno)` when it fails.
fn ioctl<const NR: u8, T: Params>(fd: &OwnedFd, arg: &mut T) -> Result<(), i32> {
    let request = const { iowr(NR, size_of::<T>()) };
    loop {
        // SAFETY: `arg` is a live, exclusive borrow of a `Params` struct of exactly the
        // size the request encodes, so the driver reads and writes only memory we own.
        // Pointers inside it (NVOS21/NVOS54) come from borrows that outlive this call.
        let ret = unsafe {
            libc::ioctl(
                fd.as_raw_fd(),
                request as libc::Ioctl,
                (arg as *mut T).cast::<c_void>(),
            )
        };
        if ret != -1 {
            return Ok(());
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(errno) => return Err(errno),
            None => return Err(libc::EIO),
        }
    }
}

/// Opens a device node for reading and writing (close-on-exec, as std opens files).
fn open_node(path: &Path) -> Result<OwnedFd, NativeError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| node_error(path, &e))
}

/// What failing to open `path` means for the user.
fn node_error(path: &Path, err: &io::Error) -> NativeError {
    let node = path.display().to_string();
    match err.kind() {
        io::ErrorKind::NotFound => NativeError::NodeMissing { node },
        io::ErrorKind::PermissionDenied => NativeError::NodePermission {
            detail: describe_node(path),
            node,
        },
        _ => NativeError::NodeOpen {
            node,
            message: err.to_string(),
        },
    }
}

/// "character device crw-rw---- owned by uid 0, gid 195", from the node's metadata.
fn describe_node(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(meta) => {
            let kind = if meta.file_type().is_char_device() {
                "character device"
            } else {
                "file"
            };
            format!(
                "{kind} {} owned by uid {}, gid {}",
                mode_string(meta.mode()),
                meta.uid(),
                meta.gid()
            )
        }
        Err(e) => format!("its mode cannot be read: {e}"),
    }
}

/// `ls -l`'s permission string: "crw-rw-rw-".
fn mode_string(mode: u32) -> String {
    let mut text = String::from(match mode & libc::S_IFMT {
        libc::S_IFCHR => 'c',
        libc::S_IFDIR => 'd',
        _ => '-',
    });
    for (i, letter) in "rwxrwxrwx".chars().enumerate() {
        let set = mode & (0o400 >> i) != 0;
        text.push(if set { letter } else { '-' });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// An empty folder of its own under the system's temporary folder, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("quench-native-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_missing_control_node_is_named() {
        let dir = TempDir::new("no-ctl");
        let err = DeviceFiles::open(&dir.0).err().unwrap();
        let node = dir.0.join("nvidiactl").display().to_string();
        assert_eq!(err, NativeError::NodeMissing { node: node.clone() });
        assert!(err
            .to_string()
            .starts_with(&format!("{node} does not exist")));
    }

    #[test]
    fn a_missing_gpu_node_is_named() {
        let dir = TempDir::new("no-gpu");
        std::fs::write(dir.0.join("nvidiactl"), b"").unwrap();
        let files = DeviceFiles::open(&dir.0).unwrap();
        let err = files.open_gpu(0).err().unwrap();
        let node = dir.0.join("nvidia0").display().to_string();
        assert_eq!(err, NativeError::NodeMissing { node });
    }

    #[test]
    fn permission_denied_names_the_node_and_the_access() {
        let dir = TempDir::new("perm");
        let path = dir.0.join("nvidiactl");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = node_error(&path, &io::Error::from(io::ErrorKind::PermissionDenied));
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("read and write access"), "{text}");
        assert!(text.contains("file -rw-r-----"), "{text}");
    }

    #[test]
    fn other_open_failures_keep_the_os_message() {
        let err = node_error(
            Path::new("/dev/nvidia3"),
            &io::Error::from_raw_os_error(libc::ENXIO),
        );
        let NativeError::NodeOpen { node, message } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(node, "/dev/nvidia3");
        assert!(message.contains("No such device or address"), "{message}");
    }

    #[test]
    fn mode_strings_read_like_ls() {
        assert_eq!(mode_string(libc::S_IFCHR | 0o666), "crw-rw-rw-");
        assert_eq!(mode_string(libc::S_IFCHR | 0o660), "crw-rw----");
        assert_eq!(mode_string(libc::S_IFREG | 0o755), "-rwxr-xr-x");
    }

    #[test]
    fn an_ioctl_on_a_file_that_is_not_the_driver_fails_with_its_errno() {
        let dir = TempDir::new("not-driver");
        std::fs::write(dir.0.join("nvidiactl"), b"").unwrap();
        let files = DeviceFiles::open(&dir.0).unwrap();
        assert_eq!(files.card_info(), Err(CallError::Os(libc::ENOTTY)));
        assert_eq!(
            files.check_version("580.142"),
            Err(CallError::Os(libc::ENOTTY))
        );
    }

    #[test]
    fn mapping_calls_on_a_file_that_is_not_the_driver_name_the_escape() {
        let dir = TempDir::new("not-driver-map");
        std::fs::write(dir.0.join("nvidiactl"), b"").unwrap();
        let files = DeviceFiles::open(&dir.0).unwrap();
        let err = files
            .map_memory(1, 2, 3, 4096, 0, MapNode::Control)
            .err()
            .unwrap();
        assert_eq!(
            err,
            NativeError::call("NV_ESC_RM_MAP_MEMORY", CallError::Os(libc::ENOTTY))
        );
        // The GPU's node is opened first, for the mapping to go through.
        let err = files
            .map_memory(1, 2, 3, 4096, 0, MapNode::Gpu(0))
            .err()
            .unwrap();
        let node = dir.0.join("nvidia0").display().to_string();
        assert_eq!(err, NativeError::NodeMissing { node });
        assert_eq!(
            files.map_memory_dma(1, 2, 3, 4, 4096, 0),
            Err(CallError::Os(libc::ENOTTY))
        );
        assert_eq!(
            files.unmap_memory_dma(1, 2, 3, 4, 0x1000),
            Err(CallError::Os(libc::ENOTTY))
        );
    }
}
