//! Recovering an executable's parameter types.
//!
//! PJRT 0.81 has no "parameter shapes" entry point (only output types and
//! dimensions), yet arguments must be validated *before* calling Execute since
//! XLA CHECK-fails abort the process. Two independent sources are used:
//!
//! 1. For MLIR **text**, the signature of `func.func @main(...)` is parsed
//!    (cheap; no round-trip through XLA).
//! 2. Otherwise (bytecode, or text the parser does not understand), the
//!    optimized program is fetched with `PJRT_Executable_OptimizedProgram`
//!    (a serialized `HloModuleProtoWithConfig`) and the entry computation's
//!    `host_program_shape.parameters` are decoded with the minimal protobuf
//!    reader of `proto.rs` (field numbers from `xla/service/hlo.proto` and
//!    `xla/xla_data.proto`).

use super::dtype::{DType, TensorSpec};
use super::proto::{sub_message, Field, Reader};

/// Parses the parameter types of `@main` from MLIR text.
/// Returns `None` if the text has no recognisable `@main` signature or uses a
/// type this node cannot feed (dynamic dims, tokens, tuples, ...).
pub fn mlir_main_parameters(text: &str) -> Option<Vec<TensorSpec>> {
    let start = find_main(text)?;
    let bytes = text.as_bytes();
    // `start` is the index of '(' after `@main`.
    let mut depth = 0i32;
    let mut i = start;
    let mut in_str = false;
    let mut pieces = Vec::new();
    let mut piece_start = start + 1;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'(' | b'{' | b'[' | b'<' => depth += 1,
            b')' | b'}' | b']' | b'>' => {
                // `->` inside attributes is not a closing bracket.
                if c == b'>' && i > 0 && bytes[i - 1] == b'-' {
                } else {
                    depth -= 1;
                    if depth == 0 {
                        if c != b')' {
                            return None;
                        }
                        pieces.push(&text[piece_start..i]);
                        break;
                    }
                }
            }
            b',' if depth == 1 => {
                pieces.push(&text[piece_start..i]);
                piece_start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if i >= bytes.len() {
        return None;
    }
    let mut out = Vec::new();
    for p in pieces {
        let p = p.trim();
        if p.is_empty() {
            if out.is_empty() {
                continue; // `@main()`
            }
            return None;
        }
        // `%name: type {attrs}` (or `type` alone in a declaration).
        let ty = match p.find(':') {
            Some(k) if p.starts_with('%') => &p[k + 1..],
            _ => p,
        };
        let ty = ty.trim();
        let ty = strip_trailing_attrs(ty);
        out.push(parse_tensor_type(ty)?);
    }
    Some(out)
}

/// Finds the `(` opening the argument list of the `main` function.
fn find_main(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = text[from..].find("@main") {
        let at = from + k;
        let after = &text[at + 5..];
        let trimmed = after.trim_start();
        // Must be a definition: preceded by `func.func` (possibly with
        // visibility) on the same statement.
        let before = &text[..at];
        let line_start = before.rfind('\n').map(|x| x + 1).unwrap_or(0);
        let prefix = &text[line_start..at];
        if trimmed.starts_with('(') && prefix.contains("func") {
            return Some(at + 5 + (after.len() - trimmed.len()));
        }
        from = at + 5;
    }
    None
}

/// Drops a trailing `{...}` attribute dictionary from an argument.
fn strip_trailing_attrs(ty: &str) -> &str {
    let b = ty.as_bytes();
    let mut depth = 0;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' | b')' | b']' => depth -= 1,
            b'{' if depth == 0 => return ty[..i].trim(),
            _ => {}
        }
    }
    ty
}

/// Parses `tensor<2x3xf32>` / `tensor<f32>` / `tensor<4xcomplex<f32>>`.
pub fn parse_tensor_type(ty: &str) -> Option<TensorSpec> {
    let inner = ty.strip_prefix("tensor<")?.strip_suffix('>')?;
    // An encoding (`tensor<4xf32, #enc>`) is not supported.
    if inner.contains(',') {
        return None;
    }
    let mut dims = Vec::new();
    let mut rest = inner;
    loop {
        let digits = rest.bytes().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 && rest[digits..].starts_with('x') {
            dims.push(rest[..digits].parse::<i64>().ok()?);
            rest = &rest[digits + 1..];
        } else {
            break;
        }
    }
    let dtype = DType::from_mlir(rest)?;
    Some(TensorSpec::new(dtype, dims))
}

/// Decodes an `xla.ShapeProto` holding an array (not a tuple).
fn decode_array_shape(msg: &[u8]) -> Option<TensorSpec> {
    let mut r = Reader::new(msg);
    let mut element_type = None;
    let mut dims = Vec::new();
    while let Some(f) = r.next() {
        match f.ok()? {
            (2, Field::Varint(v)) => element_type = Some(v as u32),
            // dimensions: packed or unpacked int64.
            (3, Field::Varint(v)) => dims.push(v as i64),
            (3, Field::Bytes(b)) => {
                let mut pr = Reader::new(b);
                while !pr.at_end() {
                    dims.push(pr.varint()? as i64);
                }
            }
            _ => {}
        }
    }
    let dtype = DType::from_xla(element_type?)?;
    Some(TensorSpec::new(dtype, dims))
}

/// Parameter types from a serialized `HloModuleProto`.
pub fn hlo_parameters(module: &[u8]) -> Option<Vec<TensorSpec>> {
    // HloModuleProto.host_program_shape = 4; ProgramShapeProto.parameters = 1.
    let program_shape = sub_message(module, 4)?;
    let mut r = Reader::new(program_shape);
    let mut params = Vec::new();
    while let Some(f) = r.next() {
        if let (1, Field::Bytes(b)) = f.ok()? {
            params.push(decode_array_shape(b)?);
        }
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_main_signature() {
        let text = r#"module @jit_f attributes {mhlo.num_partitions = 1 : i32} {
  func.func private @helper(%x: tensor<1xf32>) -> tensor<1xf32> { return %x : tensor<1xf32> }
  func.func public @main(%arg0: tensor<2x3xf32> {mhlo.sharding = "{replicated}", jax.x = ["a,b"]}, %arg1: tensor<bf16>, %arg2: tensor<4xcomplex<f64>>, %arg3: tensor<0x2xi1>) -> (tensor<2x3xf32> {jax.result_info = "x"}) {
    return %arg0 : tensor<2x3xf32>
  }
}"#;
        let p = mlir_main_parameters(text).unwrap();
        assert_eq!(
            p,
            vec![
                TensorSpec::new(DType::F32, vec![2, 3]),
                TensorSpec::new(DType::BF16, vec![]),
                TensorSpec::new(DType::C128, vec![4]),
                TensorSpec::new(DType::Pred, vec![0, 2]),
            ]
        );
        assert_eq!(
            mlir_main_parameters("func.func @main() -> tensor<f32> {").unwrap(),
            vec![]
        );
        assert!(mlir_main_parameters("func.func @main(%a: tensor<?xf32>) {").is_none());
        assert!(mlir_main_parameters("func.func @main(%a: !stablehlo.token) {").is_none());
        assert!(mlir_main_parameters("garbage").is_none());
    }

    #[test]
    fn decodes_shape_proto() {
        // ProgramShapeProto{parameters: [ShapeProto{element_type: F32(11), dimensions: [2, 3]}]}
        let shape = [0x10, 11, 0x1a, 2, 2, 3];
        let mut ps = vec![0x0a, shape.len() as u8];
        ps.extend_from_slice(&shape);
        let mut module = vec![0x22, ps.len() as u8];
        module.extend_from_slice(&ps);
        assert_eq!(
            hlo_parameters(&module).unwrap(),
            vec![TensorSpec::new(DType::F32, vec![2, 3])]
        );
    }
}
