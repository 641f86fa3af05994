//! Xid (critical error) events: NVML delivers them through an event set that the
//! monitor registers once and drains, without waiting, before each reading.

use super::ffi::{self, Api, Device, EventSet};

/// Xid events seen on one GPU since registration.
#[derive(Clone, Copy, Debug, Default)]
pub struct XidSummary {
    pub count: u64,
    pub last_code: Option<u64>,
}

pub struct XidWatch {
    set: Option<EventSet>,
    /// Per device: `None` where the driver refused to deliver Xid events for it.
    seen: Vec<Option<XidSummary>>,
}

/// Upper bound on events taken per drain, so a storm cannot stall a refresh.
const MAX_EVENTS_PER_DRAIN: usize = 256;

impl XidWatch {
    pub fn none() -> Self {
        XidWatch {
            set: None,
            seen: Vec::new(),
        }
    }

    /// Registers every device for Xid events where the driver allows it.
    pub fn register(api: &Api, devices: &[Device]) -> Self {
        let (Some(create), Some(register)) = (api.nvmlEventSetCreate, api.nvmlDeviceRegisterEvents)
        else {
            return XidWatch {
                set: None,
                seen: vec![None; devices.len()],
            };
        };
        let mut set: EventSet = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the set is freed in `free`.
        if unsafe { create(&mut set) } != ffi::SUCCESS || set.is_null() {
            return XidWatch {
                set: None,
                seen: vec![None; devices.len()],
            };
        }
        let seen = devices
            .iter()
            .map(|&d| {
                let rc = unsafe { register(d, ffi::EVENT_TYPE_XID_CRITICAL_ERROR, set) };
                (rc == ffi::SUCCESS).then(XidSummary::default)
            })
            .collect();
        XidWatch {
            set: Some(set),
            seen,
        }
    }

    /// Takes the events that are waiting, without blocking.
    pub fn drain(&mut self, api: &Api, devices: &[Device]) {
        let (Some(set), Some(wait)) = (self.set, api.nvmlEventSetWait_v2) else {
            return;
        };
        for _ in 0..MAX_EVENTS_PER_DRAIN {
            let mut data = ffi::EventData {
                device: std::ptr::null_mut(),
                event_type: 0,
                event_data: 0,
                gpu_instance_id: 0,
                compute_instance_id: 0,
            };
            // SAFETY: valid set and out-pointer; timeout 0 returns at once.
            if unsafe { wait(set, &mut data, 0) } != ffi::SUCCESS {
                break; // ERROR_TIMEOUT: nothing waiting (or the wait failed).
            }
            if data.event_type & ffi::EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
                continue;
            }
            let slot = devices
                .iter()
                .position(|&d| d == data.device)
                .and_then(|i| self.seen[i].as_mut());
            if let Some(s) = slot {
                s.count += 1;
                s.last_code = Some(data.event_data);
            }
        }
    }

    pub fn summary(&self, index: usize) -> Option<XidSummary> {
        self.seen.get(index).copied().flatten()
    }

    pub fn free(&mut self, api: &Api) {
        if let (Some(set), Some(free)) = (self.set.take(), api.nvmlEventSetFree) {
            // SAFETY: `set` came from nvmlEventSetCreate and is freed once.
            unsafe { free(set) };
        }
    }
}
