//! The chip a GPU is built on, as `NV2080_CTRL_CMD_MC_GET_ARCH_INFO` reports it: an
//! architecture id and an implementation within it
//! (src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080mc.h).

use std::fmt;

use serde::{Serialize, Serializer};

/// `NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_GH100`: Hopper (H100, H200).
pub const ARCHITECTURE_GH100: u32 = 0x180;

/// Architecture ids and their family names (`NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_*`).
const FAMILIES: &[(u32, &str)] = &[
    (0x160, "Turing"),
    (0x170, "Ampere"),
    (ARCHITECTURE_GH100, "Hopper"),
    (0x190, "Ada"),
    (0x1A0, "Blackwell"),
    (0x1B0, "Blackwell"),
];

/// (architecture, implementation) → chip (`NV2080_CTRL_MC_ARCH_INFO_IMPLEMENTATION_*`).
const CHIPS: &[(u32, u32, &str)] = &[
    (0x160, 0x2, "TU102"),
    (0x160, 0x4, "TU104"),
    (0x160, 0x6, "TU106"),
    (0x160, 0x7, "TU117"),
    (0x160, 0x8, "TU116"),
    (0x170, 0x0, "GA100"),
    (0x170, 0x2, "GA102"),
    (0x170, 0x3, "GA103"),
    (0x170, 0x4, "GA104"),
    (0x170, 0x6, "GA106"),
    (0x170, 0x7, "GA107"),
    (0x170, 0xB, "GA10B"),
    (ARCHITECTURE_GH100, 0x0, "GH100"),
    (0x190, 0x2, "AD102"),
    (0x190, 0x3, "AD103"),
    (0x190, 0x4, "AD104"),
    (0x190, 0x6, "AD106"),
    (0x190, 0x7, "AD107"),
    (0x1A0, 0x0, "GB100"),
    (0x1A0, 0x2, "GB102"),
    (0x1B0, 0x2, "GB202"),
    (0x1B0, 0x3, "GB203"),
    (0x1B0, 0x5, "GB205"),
    (0x1B0, 0x6, "GB206"),
    (0x1B0, 0x7, "GB207"),
];

/// A GPU's architecture as the resource manager reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Architecture {
    /// `NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_*`, e.g. 0x180 for Hopper.
    pub id: u32,
    /// `NV2080_CTRL_MC_ARCH_INFO_IMPLEMENTATION_*` within it, e.g. 0 for GH100.
    pub implementation: u32,
    /// The mask revision the chip was made with.
    pub revision: u32,
}

impl Architecture {
    /// "Hopper", "Ampere", ...; `None` for an id quench does not know.
    pub fn family(&self) -> Option<&'static str> {
        FAMILIES
            .iter()
            .find(|(id, _)| *id == self.id)
            .map(|(_, name)| *name)
    }

    /// "GH100", "GA102", ...; `None` for a chip quench does not know.
    pub fn chip(&self) -> Option<&'static str> {
        CHIPS
            .iter()
            .find(|(id, imp, _)| *id == self.id && *imp == self.implementation)
            .map(|(_, _, name)| *name)
    }

    /// A Hopper GPU (sm_90), the one quench generates code for.
    pub fn is_hopper(&self) -> bool {
        self.id == ARCHITECTURE_GH100
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.family(), self.chip()) {
            (Some(family), Some(chip)) => write!(f, "{family} {chip}"),
            (Some(family), None) => {
                write!(f, "{family} (implementation {:#x})", self.implementation)
            }
            _ => write!(
                f,
                "architecture {:#x} (implementation {:#x})",
                self.id, self.implementation
            ),
        }
    }
}

/// JSON carries the ids and the names quench gives them.
impl Serialize for Architecture {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Json {
            id: u32,
            implementation: u32,
            revision: u32,
            family: Option<&'static str>,
            chip: Option<&'static str>,
            hopper: bool,
        }
        Json {
            id: self.id,
            implementation: self.implementation,
            revision: self.revision,
            family: self.family(),
            chip: self.chip(),
            hopper: self.is_hopper(),
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(id: u32, implementation: u32) -> Architecture {
        Architecture {
            id,
            implementation,
            revision: 0xa1,
        }
    }

    #[test]
    fn hopper_is_recognised() {
        let h = arch(0x180, 0);
        assert!(h.is_hopper());
        assert_eq!(h.to_string(), "Hopper GH100");
        assert!(!arch(0x170, 0).is_hopper());
        assert_eq!(arch(0x170, 2).to_string(), "Ampere GA102");
    }

    #[test]
    fn unknown_chips_show_the_ids() {
        assert_eq!(arch(0x180, 9).to_string(), "Hopper (implementation 0x9)");
        assert_eq!(
            arch(0x1c0, 2).to_string(),
            "architecture 0x1c0 (implementation 0x2)"
        );
    }

    #[test]
    fn json_names_family_and_chip() {
        let v = serde_json::to_value(arch(0x180, 0)).unwrap();
        assert_eq!(v["family"], "Hopper");
        assert_eq!(v["chip"], "GH100");
        assert_eq!(v["hopper"], true);
        assert_eq!(v["id"], 0x180);
    }
}
