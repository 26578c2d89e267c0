//! How an SPMD program's partitions are launched.
//!
//! XLA's own launch of a program over several devices (one `Execute` with one argument list per
//! device) hands each partition's launch to a thread of its pool and waits until all are
//! launched, and gang-schedules them: partitions that exchange data (all-reduce, all-gather,
//! collective-permute, ...) must all run at once, each waiting for the others inside the
//! collective. Partitions that exchange nothing need neither: each can be launched from the
//! calling thread on its device (`Execute` with `execute_device`), where XLA queues it for its
//! threads as it does a single-device program, so that the partitions compute side by side
//! without the hand-offs. [`communicates`] tells the two kinds apart, from the program XLA
//! compiled.

use super::proto::{sub_message, sub_messages};

/// Whether a compiled SPMD program (its optimized `HloModuleProto`) has an instruction through
/// which partitions exchange data or wait for one another: a collective, or a send or receive.
pub fn communicates(module: &[u8]) -> bool {
    // HloModuleProto.computations = 3; HloComputationProto.instructions = 2;
    // HloInstructionProto.opcode = 2. Every computation: fusions, loop bodies and branches too.
    sub_messages(module, 3)
        .flat_map(|computation| sub_messages(computation, 2))
        .filter_map(|instruction| sub_message(instruction, 2))
        .any(|opcode| std::str::from_utf8(opcode).is_ok_and(is_communication))
}

/// HLO opcodes through which partitions communicate: `all-reduce`, `all-gather`, `all-to-all`
/// (and their `-start`/`-done` halves), `ragged-all-to-all`, `collective-permute`,
/// `collective-broadcast`, `reduce-scatter`, `send`, `recv` (and their `-done`s).
fn is_communication(opcode: &str) -> bool {
    opcode.starts_with("all-")
        || opcode.starts_with("collective-")
        || opcode.starts_with("ragged-all-")
        || opcode == "reduce-scatter"
        || matches!(opcode, "send" | "send-done" | "recv" | "recv-done")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length-delimited protobuf field.
    fn field(num: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(num << 3) | 2, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    /// A module of one computation with instructions of these opcodes.
    fn module(opcodes: &[&str]) -> Vec<u8> {
        let instructions: Vec<u8> = opcodes
            .iter()
            .flat_map(|op| field(2, &field(2, op.as_bytes())))
            .collect();
        field(3, &instructions)
    }

    #[test]
    fn collectives_and_transfers_communicate() {
        for op in [
            "all-reduce",
            "all-gather-start",
            "all-to-all",
            "collective-permute",
            "reduce-scatter",
            "ragged-all-to-all",
            "recv-done",
        ] {
            assert!(
                communicates(&module(&["parameter", "dot", op])),
                "{op} communicates"
            );
        }
    }

    #[test]
    fn local_computation_does_not() {
        let local = module(&[
            "parameter",
            "dot",
            "tanh",
            "fusion",
            "partition-id",
            "tuple",
        ]);
        assert!(!communicates(&local));
        assert!(!communicates(&[]));
    }
}
