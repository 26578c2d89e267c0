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
    S2,
    S4,
    S8,
    S16,
    S32,
    S64,
    U2,
    U4,
    U8,
    U16,
    U32,
    U64,
    /// 8-bit float, 5 exponent and 2 mantissa bits, with infinities (Nx's `{:f, 8}`).
    F8E5M2,
    /// 8-bit float, 4 exponent and 3 mantissa bits, finite only (Nx's `{:f8_e4m3fn, 8}`).
    F8E4M3FN,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl DType {
    /// All supported types.
    pub const ALL: [DType; 21] = [
        DType::Pred,
        DType::S2,
        DType::S4,
        DType::S8,
        DType::S16,
        DType::S32,
        DType::S64,
        DType::U2,
        DType::U4,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F8E5M2,
        DType::F8E4M3FN,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// Bits per element, as Nx counts them (the `bits` of `{kind, bits}`; pred takes 8). Nx
    /// packs the 2- and 4-bit integers without padding, and so does XLA in device memory, in
    /// another order; see [`crate::xla::packing`].
    pub fn bits(self) -> u32 {
        match self {
            DType::S2 | DType::U2 => 2,
            DType::S4 | DType::U4 => 4,
            DType::Pred | DType::S8 | DType::U8 | DType::F8E5M2 | DType::F8E4M3FN => 8,
            DType::S16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::S32 | DType::U32 | DType::F32 => 32,
            DType::S64 | DType::U64 | DType::F64 | DType::C64 => 64,
            DType::C128 => 128,
        }
    }

    /// Bytes that `count` elements take packed (Nx's binaries, XLA's device memory): a whole
    /// number of bytes, the last one padded for 2- and 4-bit elements.
    pub fn packed_bytes(self, count: usize) -> usize {
        (count * self.bits() as usize).div_ceil(8)
    }

    /// Whether elements are narrower than a byte: the 2- and 4-bit integers, whose layout
    /// differs between Nx and XLA (see [`crate::xla::packing`]).
    pub fn is_sub_byte(self) -> bool {
        self.bits() < 8
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
            DType::F8E5M2 => 16,
            DType::F8E4M3FN => 17,
            DType::S4 => 21,
            DType::U4 => 22,
            DType::S2 => 24,
            DType::U2 => 25,
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
            DType::F8E5M2 => 19,
            DType::F8E4M3FN => 20,
            DType::S2 => 26,
            DType::U2 => 27,
            other => other.to_pjrt(),
        }
    }

    /// From an `xla::PrimitiveType` / `XLA_FFI_DataType` value.
    pub fn from_xla(v: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.to_xla() == v)
    }

    /// From Nx's `{kind, bits}` form: kinds "s", "u", "f", "bf", "c", "pred", "f8_e4m3fn".
    pub fn from_nx(kind: &str, bits: u32) -> Option<DType> {
        if (kind, bits) == ("pred", 1) {
            return Some(DType::Pred);
        }
        DType::ALL.into_iter().find(|d| d.to_nx() == (kind, bits))
    }

    /// Nx's `{kind, bits}` form.
    pub fn to_nx(self) -> (&'static str, u32) {
        let kind = match self {
            DType::Pred => "pred",
            DType::S2 | DType::S4 | DType::S8 | DType::S16 | DType::S32 | DType::S64 => "s",
            DType::U2 | DType::U4 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => "u",
            DType::F8E5M2 | DType::F16 | DType::F32 | DType::F64 => "f",
            DType::F8E4M3FN => "f8_e4m3fn",
            DType::BF16 => "bf",
            DType::C64 | DType::C128 => "c",
        };
        (kind, self.bits())
    }

    /// Short lower-case name as used by XLA (`f32`, `bf16`, `pred`, `s4`, `f8e5m2`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::S2 => "s2",
            DType::S4 => "s4",
            DType::S8 => "s8",
            DType::S16 => "s16",
            DType::S32 => "s32",
            DType::S64 => "s64",
            DType::U2 => "u2",
            DType::U4 => "u4",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "c64",
            DType::C128 => "c128",
        }
    }

    /// The MLIR element type (`i1`, `i4`, `ui8`, `f8E5M2`, `complex<f32>`, ...).
    pub fn mlir(self) -> &'static str {
        match self {
            DType::Pred => "i1",
            DType::S2 => "i2",
            DType::S4 => "i4",
            DType::S8 => "i8",
            DType::S16 => "i16",
            DType::S32 => "i32",
            DType::S64 => "i64",
            DType::U2 => "ui2",
            DType::U4 => "ui4",
            DType::U8 => "ui8",
            DType::U16 => "ui16",
            DType::U32 => "ui32",
            DType::U64 => "ui64",
            DType::F8E5M2 => "f8E5M2",
            DType::F8E4M3FN => "f8E4M3FN",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "complex<f32>",
            DType::C128 => "complex<f64>",
        }
    }

    /// From an MLIR element type (`f32`, `bf16`, `i1`, `i32`, `si4`, `ui8`, `f8E4M3FN`,
    /// `complex<f32>`, ...).
    pub fn from_mlir(s: &str) -> Option<DType> {
        let s = s.trim();
        let signless = s.strip_prefix('s').filter(|rest| rest.starts_with('i'));
        DType::ALL
            .into_iter()
            .find(|d| d.mlir() == s || signless.is_some_and(|i| d.mlir() == i && *d != DType::Pred))
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

    /// Size in bytes, packed as Nx packs it (2- and 4-bit elements share bytes).
    pub fn byte_size(&self) -> usize {
        self.dtype.packed_bytes(self.element_count())
    }

    /// Size in bits, as Nx counts it: `element_count * bits` (not a whole number of bytes for
    /// some tensors of 2- and 4-bit elements).
    pub fn bit_size(&self) -> usize {
        self.element_count() * self.dtype.bits() as usize
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
        assert_eq!(DType::from_nx("f", 8), Some(DType::F8E5M2));
        assert_eq!(DType::from_nx("f8_e4m3fn", 8), Some(DType::F8E4M3FN));
        assert_eq!(DType::from_nx("u", 4), Some(DType::U4));
        assert_eq!(DType::from_nx("s", 2), Some(DType::S2));
        assert_eq!(DType::from_nx("pred", 1), Some(DType::Pred));
        assert_eq!(DType::from_nx("f", 4), None);
        assert_eq!(DType::from_nx("u", 1), None);
        assert_eq!(DType::BF16.to_pjrt(), 13);
        assert_eq!(DType::BF16.to_xla(), 16);
        assert_eq!(
            TensorSpec::new(DType::F32, vec![2, 3]).to_string(),
            "f32[2,3]"
        );
    }
}
