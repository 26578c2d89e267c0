//! Tensors as Erlang terms: `{binary, {type, dims}}`, the shape EXLA uses for callback arguments
//! and the `:xla` server uses for run arguments and results. `type` is Nx's (`{:f, 32}`,
//! `{:bf, 16}`, `{:pred, 8}`, ...), `dims` a list of integers, `binary` the row-major
//! little-endian bytes.

use crate::node::term::{as_atom, as_i64, as_list, as_tuple, atom, binary, int, list, tuple};
use crate::xla::{DType, HostTensor};
use eetf::Term;

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

/// `{binary, {type, dims}}`.
pub fn tensor_term(dtype: DType, dims: &[i64], data: Vec<u8>) -> Term {
    tuple(vec![binary(data), shape_term(dtype, dims)])
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

/// Reads `{binary, {type, dims}}`, taking the binary without copying, and checks its size.
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
    let data = match elements.swap_remove(0) {
        Term::Binary(b) => b.bytes,
        other => return Err(format!("tensor data must be a binary, got {other}")),
    };
    let expected = dims
        .iter()
        .try_fold(dtype.byte_size(), |acc, &d| acc.checked_mul(d as usize));
    if expected != Some(data.len()) {
        return Err(format!(
            "{} bytes given for {}{:?} ({} bytes expected)",
            data.len(),
            dtype.name(),
            dims,
            expected.map_or("too many".to_string(), |e| e.to_string())
        ));
    }
    Ok(HostTensor::new(dtype, dims, data))
}

pub fn host_tensor_term(t: HostTensor) -> Term {
    tensor_term(t.dtype, &t.dims, t.data)
}
