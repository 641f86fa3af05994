//! ggml tensor element types: their GGUF ids, names and block layout.

use crate::ModelError;

/// A ggml tensor type. Quantized types store `block_size` elements in `type_size` bytes.
///
/// Every type that GGUF files in the wild use is listed, so that a file can be read and its
/// tensors located whatever they hold; which types can be dequantized is
/// [`crate::dequant::dequantize`]'s business.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
}

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 34] = {
        use GgmlType::*;
        [
            F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
            IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, I8, I16, I32, I64, F64,
            IQ1_M, BF16, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0,
        ]
    };

    /// (name, elements per block, bytes per block).
    fn layout(self) -> (&'static str, u64, u64) {
        use GgmlType::*;
        match self {
            F32 => ("F32", 1, 4),
            F16 => ("F16", 1, 2),
            Q4_0 => ("Q4_0", 32, 18),
            Q4_1 => ("Q4_1", 32, 20),
            Q5_0 => ("Q5_0", 32, 22),
            Q5_1 => ("Q5_1", 32, 24),
            Q8_0 => ("Q8_0", 32, 34),
            Q8_1 => ("Q8_1", 32, 40),
            Q2_K => ("Q2_K", 256, 84),
            Q3_K => ("Q3_K", 256, 110),
            Q4_K => ("Q4_K", 256, 144),
            Q5_K => ("Q5_K", 256, 176),
            Q6_K => ("Q6_K", 256, 210),
            Q8_K => ("Q8_K", 256, 292),
            IQ2_XXS => ("IQ2_XXS", 256, 66),
            IQ2_XS => ("IQ2_XS", 256, 74),
            IQ3_XXS => ("IQ3_XXS", 256, 98),
            IQ1_S => ("IQ1_S", 256, 50),
            IQ4_NL => ("IQ4_NL", 32, 18),
            IQ3_S => ("IQ3_S", 256, 110),
            IQ2_S => ("IQ2_S", 256, 82),
            IQ4_XS => ("IQ4_XS", 256, 136),
            I8 => ("I8", 1, 1),
            I16 => ("I16", 1, 2),
            I32 => ("I32", 1, 4),
            I64 => ("I64", 1, 8),
            F64 => ("F64", 1, 8),
            IQ1_M => ("IQ1_M", 256, 56),
            BF16 => ("BF16", 1, 2),
            TQ1_0 => ("TQ1_0", 256, 54),
            TQ2_0 => ("TQ2_0", 256, 66),
            MXFP4 => ("MXFP4", 32, 17),
            NVFP4 => ("NVFP4", 64, 36),
            Q1_0 => ("Q1_0", 128, 18),
        }
    }

    /// Looks a GGUF type id up; an id that no known ggml version assigns is refused by number.
    pub fn from_id(id: u32) -> Result<GgmlType, ModelError> {
        Self::ALL
            .into_iter()
            .find(|t| t.id() == id)
            .ok_or(ModelError::UnknownGgmlType { id })
    }

    /// Looks a type up by its ggml name (`"Q4_K"`, any case), as written on command lines.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The id GGUF files store.
    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        self.layout().0
    }

    /// Elements per block (1 for plain element types).
    pub fn block_size(self) -> u64 {
        self.layout().1
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.layout().2
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for (i, t) in GgmlType::ALL.into_iter().enumerate() {
            assert!(GgmlType::ALL[i + 1..].iter().all(|u| u.name() != t.name()));
            assert_eq!(GgmlType::from_id(t.id()).unwrap(), t);
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::Q6_K.id(), 14);
        assert_eq!(GgmlType::BF16.id(), 30);
    }

    #[test]
    fn unknown_ids_are_refused_by_number() {
        for id in [4, 5, 31, 36, 1000, u32::MAX] {
            let err = GgmlType::from_id(id).unwrap_err();
            assert!(matches!(err, ModelError::UnknownGgmlType { id: i } if i == id));
            assert!(err.to_string().contains(&id.to_string()));
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
