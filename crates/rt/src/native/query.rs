//! The version handshake and the device query, over any [`ResourceManager`].
//!
//! For each GPU the driver reports: open its device node, ask the root client for the
//! GPU's device instance, allocate a device and a subdevice, and ask the subdevice for
//! its name, multiprocessors, memory and architecture. Every object is an [`Object`]
//! that frees itself when dropped, and each borrows its parent, so children are always
//! freed before parents, and all before the node is closed.

use serde::Serialize;

use super::arch::Architecture;
use super::controls::{
    Control, FbGetInfoV2Params, GpuGetIdInfoV2Params, GpuGetNameStringParams,
    GrGetSmToGpcTpcMappingsParams, McGetArchInfoParams, FB_INFO_INDEX_HEAP_SIZE,
    FB_INFO_INDEX_TOTAL_RAM_SIZE, FB_INFO_INDEX_USABLE_RAM_SIZE,
};
use super::error::NativeError;
use super::ioctl::{CardInfo, Params};
use super::objects::{
    Class, Nv0080AllocParameters, Nv2080AllocParameters, NV01_DEVICE_0, NV01_ROOT_CLIENT,
    NV20_SUBDEVICE_0,
};
use super::rm::{Handle, ResourceManager, VersionReply};

/// One GPU as the resource manager describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NativeDeviceInfo {
    /// Position in the list of GPUs this process can open.
    pub ordinal: u32,
    /// N of the GPU's device node `/dev/nvidiaN`.
    pub minor: u32,
    /// "0000:18:00.0".
    pub pci_bus_id: String,
    /// The PCI device id, e.g. 0x2335 for an H200 SXM.
    pub pci_device_id: u16,
    pub name: String,
    /// Streaming multiprocessors enabled (132 on an H100 SXM or H200).
    pub multiprocessors: u32,
    pub architecture: Architecture,
    /// Memory for use with the GPU (`NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE`).
    pub memory_bytes: u64,
    /// Usable memory physically present (`..._USABLE_RAM_SIZE`).
    pub usable_memory_bytes: u64,
    /// Memory available for allocations, less the driver's reservations
    /// (`..._HEAP_SIZE`).
    pub heap_bytes: u64,
    /// The kernel module's version, e.g. "580.159.04".
    pub driver_version: String,
}

/// Checks that the driver runs `driver_version` (the version the loaded module reports)
/// and describes every GPU it drives whose device node exists; if none has one, the
/// error names the first missing node.
pub fn query_devices<R: ResourceManager>(
    rm: &R,
    driver_version: &str,
) -> Result<Vec<NativeDeviceInfo>, NativeError> {
    handshake(rm, driver_version)?;
    let cards = rm
        .card_info()
        .map_err(|e| NativeError::call("NV_ESC_CARD_INFO", e))?;
    if cards.is_empty() {
        return Ok(vec![]);
    }
    let client = Object::root_client(rm)?;
    let mut devices = vec![];
    let mut missing = None;
    for card in &cards {
        match query_gpu(&client, card, devices.len() as u32, driver_version) {
            Ok(device) => devices.push(device),
            // The driver lists every GPU of the machine, but a container holds only the
            // nodes of the GPUs it was given: those are the GPUs this process has.
            Err(e @ NativeError::NodeMissing { .. }) => {
                missing.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match missing {
        Some(e) if devices.is_empty() => Err(e),
        _ => Ok(devices),
    }
}

/// `NV_ESC_CHECK_VERSION_STR`, strict, before any other call: the structures quench
/// passes are right only for the driver they were checked against.
pub(super) fn handshake<R: ResourceManager>(rm: &R, version: &str) -> Result<(), NativeError> {
    match rm.check_version(version) {
        Ok(VersionReply::Match) => Ok(()),
        Ok(VersionReply::Mismatch { driver }) => Err(NativeError::VersionMismatch {
            announced: version.to_string(),
            driver,
        }),
        Ok(VersionReply::Unrecognized) => Err(NativeError::HandshakeUnrecognized),
        Err(e) => Err(NativeError::call("NV_ESC_CHECK_VERSION_STR", e)),
    }
}

fn query_gpu<R: ResourceManager>(
    client: &Object<'_, R>,
    card: &CardInfo,
    ordinal: u32,
    driver_version: &str,
) -> Result<NativeDeviceInfo, NativeError> {
    // Declared first, so closed last: after the device and subdevice are freed.
    let _node = client.rm.open_gpu(card.minor_number)?;
    let ids = client.control(GpuGetIdInfoV2Params::new(card.gpu_id))?;
    let device = client.child(
        NV01_DEVICE_0,
        &mut Nv0080AllocParameters::new(ids.device_instance, client.handle),
    )?;
    let subdevice = device.child(
        NV20_SUBDEVICE_0,
        &mut Nv2080AllocParameters { sub_device_id: 0 },
    )?;

    let name = subdevice.control(GpuGetNameStringParams::ascii())?.name();
    let sms = subdevice.control(GrGetSmToGpcTpcMappingsParams::default())?;
    let memory = [
        FB_INFO_INDEX_TOTAL_RAM_SIZE,
        FB_INFO_INDEX_USABLE_RAM_SIZE,
        FB_INFO_INDEX_HEAP_SIZE,
    ];
    let fb = subdevice.control(FbGetInfoV2Params::request(&memory))?;
    // The resource manager answers in KiB.
    let bytes = |index| fb.value(index).map_or(0, |kib| u64::from(kib) * 1024);
    let arch = subdevice.control(McGetArchInfoParams::default())?;

    Ok(NativeDeviceInfo {
        ordinal,
        minor: card.minor_number,
        pci_bus_id: card.pci_bus_id(),
        pci_device_id: card.pci_info.device_id,
        name,
        multiprocessors: sms.sm_count,
        architecture: Architecture {
            id: arch.architecture,
            implementation: arch.implementation,
            revision: arch.revision,
        },
        memory_bytes: bytes(FB_INFO_INDEX_TOTAL_RAM_SIZE),
        usable_memory_bytes: bytes(FB_INFO_INDEX_USABLE_RAM_SIZE),
        heap_bytes: bytes(FB_INFO_INDEX_HEAP_SIZE),
        driver_version: driver_version.to_string(),
    })
}

/// A resource-manager object, freed when dropped.
struct Object<'a, R: ResourceManager> {
    rm: &'a R,
    client: Handle,
    parent: Handle,
    handle: Handle,
}

impl<'a, R: ResourceManager> Object<'a, R> {
    /// A new root client: the object every other one lives under.
    fn root_client(rm: &'a R) -> Result<Self, NativeError> {
        let handle = rm
            .alloc(0, 0, NV01_ROOT_CLIENT.id, None)
            .map_err(|e| NativeError::call(alloc_call(NV01_ROOT_CLIENT), e))?;
        Ok(Object {
            rm,
            client: handle,
            parent: 0,
            handle,
        })
    }

    /// An object of `class` under this one; it borrows this one, so it is freed first.
    fn child(&self, class: Class, params: &mut dyn Params) -> Result<Object<'_, R>, NativeError> {
        let handle = self
            .rm
            .alloc(self.client, self.handle, class.id, Some(params))
            .map_err(|e| NativeError::call(alloc_call(class), e))?;
        Ok(Object {
            rm: self.rm,
            client: self.client,
            parent: self.handle,
            handle,
        })
    }

    /// Runs control `P` on this object and returns the parameters as the resource
    /// manager left them.
    fn control<P: Control>(&self, mut params: P) -> Result<P, NativeError> {
        self.rm
            .control(self.client, self.handle, P::CMD, &mut params)
            .map_err(|e| NativeError::call(format!("{} ({:#x})", P::NAME, P::CMD), e))?;
        Ok(params)
    }
}

fn alloc_call(class: Class) -> String {
    format!("allocating {} (class {:#x})", class.name, class.id)
}

impl<R: ResourceManager> Drop for Object<'_, R> {
    fn drop(&mut self) {
        // A failed free cannot be reported from here, and leaks nothing for long: the
        // driver frees a client's objects with the client, and the client when the
        // control node is closed.
        let _ = self.rm.free(self.client, self.parent, self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::super::controls::FbGetInfoV2Params;
    use super::super::fake::{Call, FakeGpu, FakeRm, H200};
    use super::super::rm::CallError;
    use super::super::status::NvStatus;
    use super::*;

    const DRIVER: &str = "580.159.04";

    #[test]
    fn an_h200_is_described_and_everything_is_freed_in_reverse_order() {
        let rm = FakeRm::new(DRIVER, vec![H200]);
        let devices = query_devices(&rm, DRIVER).unwrap();
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(d.name, "NVIDIA H200");
        assert_eq!(d.multiprocessors, 132);
        assert!(d.architecture.is_hopper());
        assert_eq!(d.architecture.to_string(), "Hopper GH100");
        assert_eq!(d.memory_bytes, H200.total_kib as u64 * 1024);
        assert_eq!(d.usable_memory_bytes, H200.usable_kib as u64 * 1024);
        assert_eq!(d.heap_bytes, H200.heap_kib as u64 * 1024);
        assert_eq!(d.pci_bus_id, "0000:18:00.0");
        assert_eq!(d.minor, 0);
        assert_eq!(d.driver_version, DRIVER);

        let (client, device, subdevice) = (1, 2, 3);
        assert_eq!(
            rm.calls(),
            vec![
                Call::CheckVersion(DRIVER.into()),
                Call::CardInfo,
                Call::Alloc {
                    class: 0x41,
                    parent: 0,
                    handle: client
                },
                Call::OpenGpu(0),
                Call::Control {
                    object: client,
                    cmd: GpuGetIdInfoV2Params::CMD
                },
                Call::Alloc {
                    class: 0x80,
                    parent: client,
                    handle: device
                },
                Call::Alloc {
                    class: 0x2080,
                    parent: device,
                    handle: subdevice
                },
                Call::Control {
                    object: subdevice,
                    cmd: GpuGetNameStringParams::CMD
                },
                Call::Control {
                    object: subdevice,
                    cmd: GrGetSmToGpcTpcMappingsParams::CMD
                },
                Call::Control {
                    object: subdevice,
                    cmd: FbGetInfoV2Params::CMD
                },
                Call::Control {
                    object: subdevice,
                    cmd: McGetArchInfoParams::CMD
                },
                Call::Free {
                    parent: device,
                    handle: subdevice
                },
                Call::Free {
                    parent: client,
                    handle: device
                },
                Call::CloseGpu(0),
                Call::Free {
                    parent: 0,
                    handle: client
                },
            ]
        );
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn every_gpu_is_listed_in_the_drivers_order() {
        let second = FakeGpu {
            gpu_id: 0x1900,
            minor: 1,
            bus: 0x19,
            name: "NVIDIA H100 80GB HBM3",
            ..H200
        };
        let rm = FakeRm::new(DRIVER, vec![H200, second]);
        let devices = query_devices(&rm, DRIVER).unwrap();
        let names: Vec<_> = devices
            .iter()
            .map(|d| (d.ordinal, d.minor, d.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [(0, 0, "NVIDIA H200"), (1, 1, "NVIDIA H100 80GB HBM3")]
        );
        assert_eq!(devices[1].pci_bus_id, "0000:19:00.0");
        // The first GPU's objects are gone before the second's are made.
        let calls = rm.calls();
        let closed0 = calls.iter().position(|c| *c == Call::CloseGpu(0)).unwrap();
        let opened1 = calls.iter().position(|c| *c == Call::OpenGpu(1)).unwrap();
        assert!(closed0 < opened1);
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn no_gpus_is_an_empty_list_and_no_client() {
        let rm = FakeRm::new(DRIVER, vec![]);
        assert_eq!(query_devices(&rm, DRIVER).unwrap(), vec![]);
        assert_eq!(
            rm.calls(),
            vec![Call::CheckVersion(DRIVER.into()), Call::CardInfo]
        );
    }

    #[test]
    fn a_version_mismatch_names_both_versions_and_goes_no_further() {
        let rm = FakeRm::new("580.142", vec![H200]);
        let err = query_devices(&rm, DRIVER).unwrap_err();
        assert_eq!(
            err,
            NativeError::VersionMismatch {
                announced: DRIVER.into(),
                driver: "580.142".into()
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("580.159.04") && text.contains("580.142"),
            "{text}"
        );
        assert_eq!(rm.calls(), vec![Call::CheckVersion(DRIVER.into())]);
    }

    #[test]
    fn an_unrecognised_handshake_is_an_error() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.version_unrecognized = true;
        let err = query_devices(&rm, DRIVER).unwrap_err();
        assert_eq!(err, NativeError::HandshakeUnrecognized);
        assert!(err.to_string().contains("NV_ESC_CHECK_VERSION_STR"));
    }

    #[test]
    fn a_failed_ioctl_names_the_escape_and_the_os_error() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.card_info_errno = Some(libc::EIO);
        let err = query_devices(&rm, DRIVER).unwrap_err();
        assert_eq!(
            err,
            NativeError::call("NV_ESC_CARD_INFO", CallError::Os(libc::EIO))
        );
        let text = err.to_string();
        assert!(
            text.starts_with("NV_ESC_CARD_INFO failed: the driver refused the ioctl"),
            "{text}"
        );
        assert!(text.contains("Input/output error"), "{text}");
    }

    #[test]
    fn a_failed_control_names_the_command_and_status_and_frees_everything() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.fail_control = Some((FbGetInfoV2Params::CMD, NvStatus(0x56)));
        let err = query_devices(&rm, DRIVER).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NV2080_CTRL_CMD_FB_GET_INFO_V2 (0x20801303) failed: the resource manager \
             returned NV_ERR_NOT_SUPPORTED (0x56)"
        );
        let calls = rm.calls();
        assert_eq!(
            calls[calls.len() - 4..],
            [
                Call::Free {
                    parent: 2,
                    handle: 3
                },
                Call::Free {
                    parent: 1,
                    handle: 2
                },
                Call::CloseGpu(0),
                Call::Free {
                    parent: 0,
                    handle: 1
                },
            ]
        );
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn an_unknown_status_is_shown_as_a_number() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.fail_control = Some((GpuGetNameStringParams::CMD, NvStatus(0xabcd)));
        let text = query_devices(&rm, DRIVER).unwrap_err().to_string();
        assert!(
            text.contains("NV2080_CTRL_CMD_GPU_GET_NAME_STRING (0x20800110)"),
            "{text}"
        );
        assert!(text.ends_with("status 0xabcd"), "{text}");
    }

    #[test]
    fn a_failed_alloc_names_the_class_and_frees_what_was_made() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.fail_alloc = Some((NV20_SUBDEVICE_0.id, NvStatus(0x1a)));
        let err = query_devices(&rm, DRIVER).unwrap_err();
        assert_eq!(
            err.to_string(),
            "allocating NV20_SUBDEVICE_0 (class 0x2080) failed: the resource manager \
             returned NV_ERR_INSUFFICIENT_RESOURCES (0x1a)"
        );
        let calls = rm.calls();
        assert_eq!(
            calls[calls.len() - 3..],
            [
                Call::Free {
                    parent: 1,
                    handle: 2
                },
                Call::CloseGpu(0),
                Call::Free {
                    parent: 0,
                    handle: 1
                },
            ]
        );
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn a_missing_gpu_node_is_named_and_the_client_freed() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.missing_nodes = vec![0];
        let err = query_devices(&rm, DRIVER).unwrap_err();
        assert_eq!(
            err,
            NativeError::NodeMissing {
                node: "/dev/nvidia0".into()
            }
        );
        assert_eq!(
            rm.calls().last(),
            Some(&Call::Free {
                parent: 0,
                handle: 1
            })
        );
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn gpus_without_a_node_are_left_out_while_others_remain() {
        let second = FakeGpu {
            gpu_id: 0x1900,
            minor: 1,
            bus: 0x19,
            ..H200
        };
        let mut rm = FakeRm::new(DRIVER, vec![H200, second]);
        rm.missing_nodes = vec![0];
        let devices = query_devices(&rm, DRIVER).unwrap();
        let listed: Vec<_> = devices.iter().map(|d| (d.ordinal, d.minor)).collect();
        assert_eq!(listed, [(0, 1)]);
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn a_failed_root_client_names_the_class() {
        let mut rm = FakeRm::new(DRIVER, vec![H200]);
        rm.fail_alloc = Some((NV01_ROOT_CLIENT.id, NvStatus(0x1b)));
        let text = query_devices(&rm, DRIVER).unwrap_err().to_string();
        assert_eq!(
            text,
            "allocating NV01_ROOT_CLIENT (class 0x41) failed: the resource manager returned \
             NV_ERR_INSUFFICIENT_PERMISSIONS (0x1b)"
        );
    }

    #[test]
    fn json_carries_every_field() {
        let rm = FakeRm::new(DRIVER, vec![H200]);
        let v = serde_json::to_value(&query_devices(&rm, DRIVER).unwrap()[0]).unwrap();
        for key in [
            "ordinal",
            "minor",
            "pci_bus_id",
            "pci_device_id",
            "name",
            "multiprocessors",
            "architecture",
            "memory_bytes",
            "usable_memory_bytes",
            "heap_bytes",
            "driver_version",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {v}");
        }
        assert_eq!(v["architecture"]["family"], "Hopper");
    }
}
