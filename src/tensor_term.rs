//! Tensors as Erlang terms: `{binary, {type, dims}}`, the shape EXLA uses for callback arguments
//! and the `:xla` server uses for run arguments and results. `type` is Nx's (`{:f, 32}`,
//! `{:bf, 16}`, `{:pred, 8}`, `{:u, 4}`, `{:f8_e4m3fn, 8}`, ...), `dims` a list of integers,
//! `binary` the row-major little-endian bytes exactly as `Nx.to_binary/1` gives them: for the
//! 2- and 4-bit integers a bitstring of `count * bits` bits, element 0 in the most significant
//! bits (see [`crate::xla::packing`]), which is not a whole number of bytes for some tensors.

use crate::node::term::{as_atom, as_i64, as_list, as_tuple, atom, binary, int, list, tuple};
use crate::xla::{DType, HostTensor, TensorSpec};
use eetf::{BitBinary, Term};

/// `{kind, bits}` for a dtype.
pub fn type_term(dtype: DType) -> Term {
    let (kind, bits) = dtype.to_nx();
    tuple(vec![atom(kind), int(i64::from(bits))])
}

/// `{type, dims}`.
pub fn shape_term(dtype: DType, dims: &[i64]) -> Term {
    tuple(vec![
        type_term(dtype),
        list(dims.iter().map(|&d| int(d)).collect()),
    ])
}

/// `{binary, {type, dims}}`; `data` packed as Nx packs it (see [`data_term`]).
pub fn tensor_term(dtype: DType, dims: &[i64], data: Vec<u8>) -> Term {
    let bits = TensorSpec::new(dtype, dims.to_vec()).bit_size();
    tuple(vec![data_term(data, bits), shape_term(dtype, dims)])
}

/// The first `bits` bits of `data` as a binary, or as a bitstring when `bits` is not a whole
/// number of bytes (the unused low bits of `data`'s last byte are dropped).
pub fn data_term(mut data: Vec<u8>, bits: usize) -> Term {
    let tail = (bits % 8) as u8;
    if tail == 0 {
        return binary(data);
    }
    // eetf holds a bitstring's last bits in the low bits of its last byte.
    if let Some(last) = data.last_mut() {
        *last >>= 8 - tail;
    }
    Term::BitBinary(BitBinary::from((data, tail)))
}

/// The bytes and bit length of a binary or bitstring, the last byte's bits in its high bits
/// (as the BEAM holds them) and its unused bits zero; other terms are given back.
pub fn data_bits(term: Term) -> Result<(Vec<u8>, usize), Term> {
    match term {
        Term::Binary(b) => {
            let bits = b.bytes.len() * 8;
            Ok((b.bytes, bits))
        }
        Term::BitBinary(b) => {
            let mut bytes = b.bytes;
            let tail = b.tail_bits_size.clamp(1, 8);
            let Some(last) = bytes.last_mut() else {
                return Ok((bytes, 0));
            };
            *last <<= 8 - tail;
            let bits = (bytes.len() - 1) * 8 + usize::from(tail);
            Ok((bytes, bits))
        }
        other => Err(other),
    }
}

/// A data size for error texts, in Nx's unit: bits for 2- and 4-bit elements (`in_bits`) and
/// for sizes that are not whole bytes, bytes otherwise.
pub fn size_text(bits: usize, in_bits: bool) -> String {
    if in_bits || !bits.is_multiple_of(8) {
        format!("{bits} bits")
    } else {
        format!("{} bytes", bits / 8)
    }
}

/// Reads `{kind, bits}`.
pub fn parse_type(term: &Term) -> Result<DType, String> {
    let parsed = as_tuple(term, 2).and_then(|e| {
        let kind = as_atom(&e[0])?;
        let bits = u32::try_from(as_i64(&e[1])?).ok()?;
        DType::from_nx(kind, bits)
    });
    parsed.ok_or_else(|| {
        format!("unknown tensor type {term} (expected an Nx type such as {{:f, 32}})")
    })
}

/// Reads `{type, dims}`.
pub fn parse_shape(term: &Term) -> Result<(DType, Vec<i64>), String> {
    let [ty, dims] =
        as_tuple(term, 2).ok_or_else(|| format!("expected {{type, dims}}, got {term}"))?
    else {
        unreachable!("as_tuple checked the arity")
    };
    let dtype = parse_type(ty)?;
    let dims = match dims {
        Term::Tuple(t) => t.elements.clone(), // Nx shapes are tuples; accept them too
        other => {
            as_list(other).ok_or_else(|| format!("dims must be a list of integers, got {other}"))?
        }
    };
    let dims = dims
        .iter()
        .map(|d| {
            as_i64(d)
                .filter(|d| *d >= 0)
                .ok_or_else(|| format!("dims must be non-negative integers, got {d}"))
        })
        .collect::<Result<Vec<i64>, String>>()?;
    Ok((dtype, dims))
}

/// Reads `{binary, {type, dims}}`, taking the binary without copying, and checks its size: a
/// tensor's data is exactly `count * bits` bits, as `Nx.to_binary/1` gives it.
pub fn parse_tensor(term: Term) -> Result<HostTensor, String> {
    let Term::Tuple(t) = term else {
        return Err(format!(
            "expected a tensor {{binary, {{type, dims}}}}, got {term}"
        ));
    };
    let mut elements = t.elements;
    if elements.len() != 2 {
        return Err(format!(
            "expected a tensor {{binary, {{type, dims}}}}, got a {}-tuple",
            elements.len()
        ));
    }
    let (dtype, dims) = parse_shape(&elements[1])?;
    let (data, bits) = data_bits(elements.swap_remove(0))
        .map_err(|other| format!("tensor data must be a binary, got {other}"))?;
    let expected = dims
        .iter()
        .try_fold(dtype.bits() as usize, |acc, &d| acc.checked_mul(d as usize));
    if expected != Some(bits) {
        let in_bits = dtype.is_sub_byte();
        return Err(format!(
            "{} given for {} ({} expected)",
            size_text(bits, in_bits),
            TensorSpec::new(dtype, dims),
            expected.map_or("too many".to_string(), |e| size_text(e, in_bits))
        ));
    }
    Ok(HostTensor::new(dtype, dims, data))
}

/// `{binary, {type, dims}}` for a host tensor.
pub fn host_tensor_term(t: HostTensor) -> Term {
    tensor_term(t.dtype, &t.dims, t.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::{binary_to_term, term_to_binary};

    #[test]
    fn sub_byte_tensors_are_bitstrings_as_the_beam_sends_them() {
        // :erlang.term_to_binary({<<0x12, 0x3::4>>, {{:u, 4}, [3]}}), as OTP writes it.
        let wire = [
            131, 104, 2, 77, 0, 0, 0, 2, 4, 0x12, 0x30, 104, 2, 104, 2, 100, 0, 1, b'u', 97, 4,
            107, 0, 1, 3,
        ];
        let t = parse_tensor(binary_to_term(&wire).unwrap()).unwrap();
        assert_eq!((t.dtype, t.dims.clone()), (DType::U4, vec![3]));
        assert_eq!(t.data, vec![0x12, 0x30]);
        let back = term_to_binary(&host_tensor_term(t));
        assert_eq!(
            binary_to_term(&back).unwrap(),
            binary_to_term(&wire).unwrap()
        );
        assert_eq!(&back[3..11], &wire[3..11], "the same BIT_BINARY_EXT");

        // A whole number of bytes is a plain binary: u2 [1, 2, 3, 0].
        let t = HostTensor::new(DType::U2, vec![4], vec![0x6c]);
        let Term::Tuple(tuple) = host_tensor_term(t) else {
            panic!("a tuple")
        };
        assert_eq!(tuple.elements[0], binary(vec![0x6c]));
        assert_eq!(
            tuple.elements[1],
            shape_term(DType::U2, &[4]),
            "{{{{:u, 2}}, [4]}}"
        );
    }

    #[test]
    fn sizes_are_checked_in_nx_units() {
        let tensor = |data: Term, kind: &str, bits: i64, dims: &[i64]| {
            tuple(vec![
                data,
                tuple(vec![
                    tuple(vec![atom(kind), int(bits)]),
                    list(dims.iter().map(|&d| int(d)).collect()),
                ]),
            ])
        };
        // s4 [3] is 12 bits: two whole bytes are not Nx's binary.
        let err = parse_tensor(tensor(binary(vec![0, 0]), "s", 4, &[3])).unwrap_err();
        assert_eq!(err, "16 bits given for s4[3] (12 bits expected)");
        let err = parse_tensor(tensor(binary(vec![0; 3]), "f", 32, &[1])).unwrap_err();
        assert_eq!(err, "3 bytes given for f32[1] (4 bytes expected)");
        let bits = Term::BitBinary(BitBinary::from((vec![0x3], 4)));
        let err = parse_tensor(tensor(bits, "u", 8, &[1])).unwrap_err();
        assert_eq!(err, "4 bits given for u8[1] (1 bytes expected)");
        // The 8-bit floats take one byte per element.
        let t = parse_tensor(tensor(binary(vec![0x3c, 0x7c]), "f", 8, &[2])).unwrap();
        assert_eq!(t.dtype, DType::F8E5M2);
        let t = parse_tensor(tensor(binary(vec![0x7f]), "f8_e4m3fn", 8, &[])).unwrap();
        assert_eq!(t.dtype, DType::F8E4M3FN);
        let err = parse_tensor(tensor(binary(vec![]), "f", 4, &[])).unwrap_err();
        assert!(err.starts_with("unknown tensor type"), "{err}");
    }
}
