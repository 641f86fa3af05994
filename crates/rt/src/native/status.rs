//! `NV_STATUS`: the resource manager's result codes
//! (src/common/sdk/nvidia/inc/nvstatuscodes.h), shown by name where quench knows it.

use std::fmt;

/// A status the resource manager returned; 0 is `NV_OK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvStatus(pub u32);

impl NvStatus {
    pub const OK: NvStatus = NvStatus(0);

    /// The code's name in nvstatuscodes.h, for the codes a caller is likely to meet.
    pub fn name(self) -> Option<&'static str> {
        NAMES
            .iter()
            .find(|(code, _)| *code == self.0)
            .map(|(_, name)| *name)
    }
}

impl fmt::Display for NvStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({:#x})", self.0),
            None => write!(f, "status {:#x}", self.0),
        }
    }
}

/// The common codes of nvstatuscodes.h.
const NAMES: &[(u32, &str)] = &[
    (0x0000_0000, "NV_OK"),
    (0x0000_FFFF, "NV_ERR_GENERIC"),
    (0x0000_0002, "NV_ERR_BUFFER_TOO_SMALL"),
    (0x0000_0003, "NV_ERR_BUSY_RETRY"),
    (0x0000_0005, "NV_ERR_CARD_NOT_PRESENT"),
    (0x0000_000B, "NV_ERR_ECC_ERROR"),
    (0x0000_000F, "NV_ERR_GPU_IS_LOST"),
    (0x0000_0010, "NV_ERR_GPU_IN_FULLCHIP_RESET"),
    (0x0000_0011, "NV_ERR_GPU_NOT_FULL_POWER"),
    (0x0000_0012, "NV_ERR_GPU_UUID_NOT_FOUND"),
    (0x0000_0016, "NV_ERR_ILLEGAL_ACTION"),
    (0x0000_0017, "NV_ERR_IN_USE"),
    (0x0000_001A, "NV_ERR_INSUFFICIENT_RESOURCES"),
    (0x0000_001B, "NV_ERR_INSUFFICIENT_PERMISSIONS"),
    (0x0000_001D, "NV_ERR_INVALID_ACCESS_TYPE"),
    (0x0000_001E, "NV_ERR_INVALID_ADDRESS"),
    (0x0000_001F, "NV_ERR_INVALID_ARGUMENT"),
    (0x0000_0022, "NV_ERR_INVALID_CLASS"),
    (0x0000_0023, "NV_ERR_INVALID_CLIENT"),
    (0x0000_0024, "NV_ERR_INVALID_COMMAND"),
    (0x0000_0025, "NV_ERR_INVALID_DATA"),
    (0x0000_0026, "NV_ERR_INVALID_DEVICE"),
    (0x0000_0029, "NV_ERR_INVALID_FLAGS"),
    (0x0000_002C, "NV_ERR_INVALID_INDEX"),
    (0x0000_002E, "NV_ERR_INVALID_LIMIT"),
    (0x0000_002F, "NV_ERR_INVALID_LOCK_STATE"),
    (0x0000_0031, "NV_ERR_INVALID_OBJECT"),
    (0x0000_0033, "NV_ERR_INVALID_OBJECT_HANDLE"),
    (0x0000_0034, "NV_ERR_INVALID_OBJECT_NEW"),
    (0x0000_0035, "NV_ERR_INVALID_OBJECT_OLD"),
    (0x0000_0036, "NV_ERR_INVALID_OBJECT_PARENT"),
    (0x0000_0038, "NV_ERR_INVALID_OPERATION"),
    (0x0000_003A, "NV_ERR_INVALID_PARAM_STRUCT"),
    (0x0000_003B, "NV_ERR_INVALID_PARAMETER"),
    (0x0000_003D, "NV_ERR_INVALID_POINTER"),
    (0x0000_003F, "NV_ERR_INVALID_REQUEST"),
    (0x0000_0040, "NV_ERR_INVALID_STATE"),
    (0x0000_0051, "NV_ERR_NO_MEMORY"),
    (0x0000_0055, "NV_ERR_NOT_READY"),
    (0x0000_0056, "NV_ERR_NOT_SUPPORTED"),
    (0x0000_0057, "NV_ERR_OBJECT_NOT_FOUND"),
    (0x0000_0059, "NV_ERR_OPERATING_SYSTEM"),
    (0x0000_005B, "NV_ERR_OUT_OF_RANGE"),
    (0x0000_0062, "NV_ERR_RESET_REQUIRED"),
    (0x0000_0065, "NV_ERR_TIMEOUT"),
    (0x0000_0066, "NV_ERR_TIMEOUT_RETRY"),
    (0x0000_0069, "NV_ERR_MAX_SESSION_LIMIT_REACHED"),
    (0x0000_006A, "NV_ERR_LIB_RM_VERSION_MISMATCH"),
    (0x0000_006D, "NV_ERR_FEATURE_NOT_ENABLED"),
    (0x0000_006E, "NV_ERR_RESOURCE_LOST"),
    (0x0000_0071, "NV_ERR_FATAL_ERROR"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_show_their_names() {
        assert_eq!(NvStatus(0x56).to_string(), "NV_ERR_NOT_SUPPORTED (0x56)");
        assert_eq!(
            NvStatus(0x1b).to_string(),
            "NV_ERR_INSUFFICIENT_PERMISSIONS (0x1b)"
        );
        assert_eq!(NvStatus(0x3a).name(), Some("NV_ERR_INVALID_PARAM_STRUCT"));
        assert_eq!(NvStatus::OK.name(), Some("NV_OK"));
    }

    #[test]
    fn unknown_codes_show_the_number() {
        assert_eq!(NvStatus(0x1234_5678).to_string(), "status 0x12345678");
    }

    #[test]
    fn every_code_has_one_name() {
        for (i, (code, _)) in NAMES.iter().enumerate() {
            assert!(
                NAMES[i + 1..].iter().all(|(c, _)| c != code),
                "{code:#x} twice"
            );
        }
    }
}
