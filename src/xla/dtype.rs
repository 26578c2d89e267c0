//! Element types.
//!
//! [`DType`] covers every Nx tensor type and converts between the three
//! numberings in play: Nx's `{kind, bits}` form, `PJRT_Buffer_Type` (used by
//! the PJRT C API), and `xla::PrimitiveType` (used by `XLA_FFI_DataType` in
//! custom-call frames and by HLO protos). The last two are *not* the same
//! numbering (e.g. BF16 is 13 in PJRT and 16 in XLA), hence separate
//! conversions.

use std::fmt;

/// An element type supported by this node (the Nx type set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl DType {
    /// All supported types.
    pub const ALL: [DType; 15] = [
        DType::Pred,
        DType::S8,
        DType::S16,
        DType::S32,
        DType::S64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// Size of one element in bytes (pred is stored as one byte).
    pub fn byte_size(self) -> usize {
        match self {
            DType::Pred | DType::S8 | DType::U8 => 1,
            DType::S16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::S32 | DType::U32 | DType::F32 => 4,
            DType::S64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// `PJRT_Buffer_Type` value.
    pub fn to_pjrt(self) -> u32 {
        match self {
            DType::Pred => 1,
            DType::S8 => 2,
            DType::S16 => 3,
            DType::S32 => 4,
            DType::S64 => 5,
            DType::U8 => 6,
            DType::U16 => 7,
            DType::U32 => 8,
            DType::U64 => 9,
            DType::F16 => 10,
            DType::F32 => 11,
            DType::F64 => 12,
            DType::BF16 => 13,
            DType::C64 => 14,
            DType::C128 => 15,
        }
    }

    /// From a `PJRT_Buffer_Type` value.
    pub fn from_pjrt(v: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.to_pjrt() == v)
    }

    /// `xla::PrimitiveType` / `XLA_FFI_DataType` value.
    pub fn to_xla(self) -> u32 {
        match self {
            DType::BF16 => 16,
            DType::C64 => 15,
            DType::C128 => 18,
            other => other.to_pjrt(),
        }
    }

    /// From an `xla::PrimitiveType` / `XLA_FFI_DataType` value.
    pub fn from_xla(v: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.to_xla() == v)
    }

    /// From Nx's `{kind, bits}` form: kinds "s", "u", "f", "bf", "c", "pred".
    pub fn from_nx(kind: &str, bits: u32) -> Option<DType> {
        Some(match (kind, bits) {
            ("pred", 8) | ("pred", 1) => DType::Pred,
            ("s", 8) => DType::S8,
            ("s", 16) => DType::S16,
            ("s", 32) => DType::S32,
            ("s", 64) => DType::S64,
            ("u", 8) => DType::U8,
            ("u", 16) => DType::U16,
            ("u", 32) => DType::U32,
            ("u", 64) => DType::U64,
            ("f", 16) => DType::F16,
            ("f", 32) => DType::F32,
            ("f", 64) => DType::F64,
            ("bf", 16) => DType::BF16,
            ("c", 64) => DType::C64,
            ("c", 128) => DType::C128,
            _ => return None,
        })
    }

    /// Nx's `{kind, bits}` form.
    pub fn to_nx(self) -> (&'static str, u32) {
        match self {
            DType::Pred => ("pred", 8),
            DType::S8 => ("s", 8),
            DType::S16 => ("s", 16),
            DType::S32 => ("s", 32),
            DType::S64 => ("s", 64),
            DType::U8 => ("u", 8),
            DType::U16 => ("u", 16),
            DType::U32 => ("u", 32),
            DType::U64 => ("u", 64),
            DType::F16 => ("f", 16),
            DType::F32 => ("f", 32),
            DType::F64 => ("f", 64),
            DType::BF16 => ("bf", 16),
            DType::C64 => ("c", 64),
            DType::C128 => ("c", 128),
        }
    }

    /// Short lower-case name as used by XLA (`f32`, `bf16`, `pred`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::S8 => "s8",
            DType::S16 => "s16",
            DType::S32 => "s32",
            DType::S64 => "s64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "c64",
            DType::C128 => "c128",
        }
    }

    /// From an MLIR element type (`f32`, `bf16`, `i1`, `i32`, `ui8`,
    /// `complex<f32>`, ...).
    pub fn from_mlir(s: &str) -> Option<DType> {
        Some(match s.trim() {
            "i1" => DType::Pred,
            "i8" | "si8" => DType::S8,
            "i16" | "si16" => DType::S16,
            "i32" | "si32" => DType::S32,
            "i64" | "si64" => DType::S64,
            "ui8" => DType::U8,
            "ui16" => DType::U16,
            "ui32" => DType::U32,
            "ui64" => DType::U64,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "f32" => DType::F32,
            "f64" => DType::F64,
            "complex<f32>" => DType::C64,
            "complex<f64>" => DType::C128,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor type: element type plus dimensions (row-major).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    pub dtype: DType,
    pub dims: Vec<i64>,
}

impl TensorSpec {
    pub fn new(dtype: DType, dims: Vec<i64>) -> Self {
        TensorSpec { dtype, dims }
    }

    /// Number of elements (1 for a scalar).
    pub fn element_count(&self) -> usize {
        element_count(&self.dims)
    }

    /// Dense size in bytes.
    pub fn byte_size(&self) -> usize {
        self.element_count() * self.dtype.byte_size()
    }
}

impl fmt::Display for TensorSpec {
    /// XLA-style shape, e.g. `f32[2,3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Product of dimensions; negative dimensions count as 0.
pub fn element_count(dims: &[i64]) -> usize {
    dims.iter().map(|&d| d.max(0) as usize).product()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for d in DType::ALL {
            assert_eq!(DType::from_pjrt(d.to_pjrt()), Some(d));
            assert_eq!(DType::from_xla(d.to_xla()), Some(d));
            let (k, b) = d.to_nx();
            assert_eq!(DType::from_nx(k, b), Some(d));
        }
        assert_eq!(DType::from_nx("f", 8), None);
        assert_eq!(DType::BF16.to_pjrt(), 13);
        assert_eq!(DType::BF16.to_xla(), 16);
        assert_eq!(
            TensorSpec::new(DType::F32, vec![2, 3]).to_string(),
            "f32[2,3]"
        );
    }
}
