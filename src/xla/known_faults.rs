//! Programs that XLA's CPU backend is known to mishandle, refused with a compile error instead.
//!
//! With the 2-bit integer types (`s2`, `u2`; MLIR `i2`, `ui2`), the CPU plugin's XLA
//! * fails a `CHECK` while compiling a `concatenate` (`ir_array.cc`: `bit_offset != nullptr`),
//!   which aborts the whole process, and
//! * computes a `sort` wrongly, writing outside its buffers: wrong results, then a corrupted heap.
//!
//! Other operations on them (elementwise arithmetic and bitwise ops, converts, shape ops,
//! slices, pads, gathers, scatters, reductions, windows, loops) compute what they should, as
//! compared with a reference on tensors of 1 to 17 elements; `dot_general` and `convolution`
//! are compile errors of XLA's own. The 4-bit and 8-bit float types have neither fault, sorts
//! and dot products included.
//!
//! So a program that concatenates or sorts 2-bit integers is refused: MLIR text is read before
//! it reaches XLA ([`check_text`]); the optimized HLO, after compiling and before the executable
//! is handed out ([`check_hlo`]), catches sorts in bytecode programs and those XLA introduces
//! itself. A concatenate in a bytecode program cannot be seen before XLA compiles it, and
//! aborts.
//!
//! One more fault needs no check here: on 2- and 4-bit integers, XLA's compiler throws a C++
//! exception (`absl::BadStatusOrAccess`, from `CopyThunk`) building the copy it makes of a
//! transpose (one result among several, or one XLA adds around a gather or scatter). Every call
//! into the plugin runs inside the C++ frame of `catch` (src/xla/catch.cc), so that throw comes
//! back as a compile error saying XLA threw, whether the program is text or bytecode.

use super::dtype::DType;
use super::proto::{sub_message, sub_messages, varint_field};

/// The operations refused on 2-bit integers, with why (concatenate, then sort).
const FAULTS: [(&str, &str); 2] = [
    (
        "concatenate",
        "XLA's CPU compiler fails an internal check on it, which would abort the node",
    ),
    (
        "sort",
        "XLA's CPU backend sorts them wrongly and writes outside its buffers",
    ),
];

/// Refuses MLIR text that concatenates or sorts 2-bit integers.
pub fn check_text(text: &str) -> Result<(), String> {
    if !mentions_two_bit(text) {
        return Ok(());
    }
    for (op, why) in FAULTS {
        for dialect in ["stablehlo.", "mhlo."] {
            let name = format!("{dialect}{op}");
            let mut from = 0;
            while let Some(k) = text[from..].find(&name) {
                let at = from + k;
                from = at + name.len();
                let boundary = text[from..]
                    .chars()
                    .next()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                if boundary && mentions_two_bit(statement(text, at)) {
                    return Err(refusal(op, why));
                }
            }
        }
    }
    Ok(())
}

/// Refuses an optimized program (a serialized `HloModuleProto`) that sorts 2-bit integers.
pub fn check_hlo(module: &[u8]) -> Result<(), String> {
    // HloModuleProto.computations = 3; HloComputationProto.instructions = 2;
    // HloInstructionProto.opcode = 2, .shape = 3.
    for computation in sub_messages(module, 3) {
        for instruction in sub_messages(computation, 2) {
            // A concatenate that compiled is computed right; only a sort does harm later.
            let (op, why) = FAULTS[1];
            if sub_message(instruction, 2) == Some(op.as_bytes())
                && sub_message(instruction, 3).is_some_and(shape_has_two_bit)
            {
                return Err(refusal(op, why));
            }
        }
    }
    Ok(())
}

fn refusal(op: &str, why: &str) -> String {
    format!(
        "the program has a {op} of 2-bit integers (s2/u2), which this node refuses: {why}; \
         convert them to s8/u8 first"
    )
}

/// Whether an `xla.ShapeProto` (element_type = 2, tuple_shapes = 4) is or holds a 2-bit
/// integer array.
fn shape_has_two_bit(shape: &[u8]) -> bool {
    let two_bit = [DType::S2.to_xla(), DType::U2.to_xla()];
    varint_field(shape, 2).is_some_and(|t| two_bit.iter().any(|&x| u64::from(x) == t))
        || sub_messages(shape, 4).any(shape_has_two_bit)
}

/// The text of the operation whose name starts at `at`: up to the end of the line on which
/// its brackets (operands, regions, attributes) are all closed.
fn statement(text: &str, at: usize) -> &str {
    let mut depth = 0i32;
    for (i, c) in text[at..].char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            '\n' if depth <= 0 => return &text[at..at + i],
            _ => {}
        }
    }
    &text[at..]
}

/// Whether `text` names a 2-bit integer element type: `i2`, `si2` or `ui2` as a tensor's
/// element type (`tensor<4xi2>`, `tensor<ui2>`).
pub fn mentions_two_bit(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(k) = text[from..].find("i2") {
        let at = from + k;
        from = at + 2;
        let after = bytes.get(at + 2);
        if !matches!(after, Some(b'>') | Some(b',')) {
            continue;
        }
        let before = match at.checked_sub(1).map(|p| bytes[p]) {
            Some(b's') | Some(b'u') => at.checked_sub(2).map(|p| bytes[p]),
            other => other,
        };
        if matches!(before, Some(b'x') | Some(b'<')) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_two_bit_element_types() {
        assert!(mentions_two_bit("tensor<4xi2>"));
        assert!(mentions_two_bit("tensor<ui2>"));
        assert!(mentions_two_bit("tensor<2x3xsi2>"));
        assert!(!mentions_two_bit("tensor<4xi32>"));
        assert!(!mentions_two_bit("tensor<4xui4> %i2"));
        assert!(!mentions_two_bit("%xi2 = stablehlo.add"));
    }

    #[test]
    fn refuses_concatenate_and_sort_of_two_bit_integers() {
        let concat = "func.func @main(%a: tensor<4xi2>) -> tensor<8xi2> {\n  %0 = stablehlo.concatenate %a, %a, dim = 0 : (tensor<4xi2>, tensor<4xi2>) -> tensor<8xi2>\n  return %0 : tensor<8xi2>\n}\n";
        assert!(check_text(concat).unwrap_err().contains("concatenate"));
        let generic = concat.replace(
            "stablehlo.concatenate %a, %a, dim = 0",
            "\"stablehlo.concatenate\"(%a, %a) {dimension = 0 : i64}",
        );
        assert!(check_text(&generic).unwrap_err().contains("concatenate"));
        let sort = "func.func @main(%a: tensor<4xui2>) -> tensor<4xui2> {\n  %0 = \"stablehlo.sort\"(%a) ({\n  ^bb0(%x: tensor<ui2>, %y: tensor<ui2>):\n    %c = stablehlo.compare LT, %x, %y : (tensor<ui2>, tensor<ui2>) -> tensor<i1>\n    stablehlo.return %c : tensor<i1>\n  }) {dimension = 0 : i64} : (tensor<4xui2>) -> tensor<4xui2>\n  return %0 : tensor<4xui2>\n}\n";
        assert!(check_text(sort).unwrap_err().contains("sort"));
        // Other types, and other ops on 2-bit integers, pass.
        assert!(check_text(&concat.replace("i2>", "i4>")).is_ok());
        assert!(check_text(&sort.replace("ui2>", "ui4>")).is_ok());
        let add = "func.func @main(%a: tensor<4xi2>) -> tensor<4xi2> {\n  %0 = stablehlo.add %a, %a : tensor<4xi2>\n  %1 = stablehlo.convert %0 : (tensor<4xi2>) -> tensor<4xf32>\n  %2 = stablehlo.concatenate %1, %1, dim = 0 : (tensor<4xf32>, tensor<4xf32>) -> tensor<8xf32>\n  return %0 : tensor<4xi2>\n}\n";
        assert!(check_text(add).is_ok());
    }

    #[test]
    fn refuses_hlo_sorts_of_two_bit_integers() {
        fn message(fields: &[(u8, &[u8])]) -> Vec<u8> {
            let mut out = Vec::new();
            for (num, bytes) in fields {
                out.push(num << 3 | 2);
                out.push(bytes.len() as u8);
                out.extend_from_slice(bytes);
            }
            out
        }
        let module = |opcode: &[u8], element_type: u8| {
            // ShapeProto{tuple_shapes: [ShapeProto{element_type, dimensions: [4]}]}
            let array = [0x10, element_type, 0x18, 4];
            let shape = message(&[(4, &array)]);
            let instruction = message(&[(2, opcode), (3, &shape)]);
            let computation = message(&[(2, &instruction)]);
            message(&[(3, &computation)])
        };
        let s2 = DType::S2.to_xla() as u8;
        assert!(check_hlo(&module(b"sort", s2)).is_err());
        assert!(check_hlo(&module(b"sort", DType::S4.to_xla() as u8)).is_ok());
        assert!(check_hlo(&module(b"add", s2)).is_ok());
        assert!(check_hlo(&[0xff]).is_ok());
    }
}
