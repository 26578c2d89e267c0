//! Who a callback goes to: reading operand 0 of a callback custom call.
//!
//! EXLA's modules carry a `u8[8]` in operand 0 (its parameter 0), which EXLA fills with raw local
//! pid bytes that mean nothing outside its VM. The node accepts two things there instead:
//!
//! * a **run handle** (exactly 8 bytes, from [`RunHandle::tensor`]): the target is
//!   the run's `callback_server` option, and the run is known (its requester is watched, its
//!   timeout applies). Handles start with the bytes `0xE5 'X'`, so they never look like
//!   `term_to_binary` output (which starts with 131), like EXLA's "no callbacks" value (eight
//!   zero bytes), or like a raw local `ErlNifPid` (whose low byte has the nibble 3).
//! * **`:erlang.term_to_binary(target)`** as a `u8[N]` tensor (first byte 131), for modules that
//!   carry their target themselves: a pid (of any node) or `{name, node}` is complete. The run is
//!   unknown then (an FFI call has no run identity), so a *bare atom* is resolved on **this**
//!   node, the default timeout applies, and no requester is watched.

use super::inspect;
use super::run::RunState;
use crate::node::term::binary_to_term;
use crate::node::Dest;
use crate::xla::{DType, HostTensor, TensorRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// First two bytes of every run handle.
pub(crate) const HANDLE_MAGIC: [u8; 2] = [0xE5, b'X'];

/// The error for a run without a callback target.
pub(crate) const NO_SERVER: &str = "no callback server: pass the run option callback_server";

/// Run handles are numbered process-wide, so no two dispatchers (or runs) ever share one.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// A run's handle. It is taken before the run opens, so that it can be part of the run's
/// arguments when they are checked (as EXLA's `u8[8]` parameter 0), and it is opened with
/// [`super::Dispatcher::open_run`] on the thread that executes the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunHandle(u64);

impl RunHandle {
    /// A handle no run has had.
    pub fn next() -> RunHandle {
        RunHandle(NEXT_HANDLE.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn number(self) -> u64 {
        self.0
    }

    /// The `u8[8]` tensor the program's callback operand receives.
    pub fn tensor(self) -> HostTensor {
        HostTensor::new(DType::U8, vec![8], handle_bytes(self.0).to_vec())
    }
}

/// The 8 bytes of handle number `n` (48 bits are used).
fn handle_bytes(n: u64) -> [u8; 8] {
    let b = n.to_be_bytes();
    [
        HANDLE_MAGIC[0],
        HANDLE_MAGIC[1],
        b[2],
        b[3],
        b[4],
        b[5],
        b[6],
        b[7],
    ]
}

/// The handle number in `bytes`, if they are a run handle.
pub(crate) fn parse_handle(bytes: &[u8]) -> Option<u64> {
    if bytes.len() != 8 || bytes[..2] != HANDLE_MAGIC {
        return None;
    }
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(&bytes[2..]);
    Some(u64::from_be_bytes(b))
}

/// What operand 0 named.
pub(crate) enum Operand0 {
    /// A run handle (the table lookup is the caller's).
    Handle(u64),
    /// A term-encoded target; no run.
    Term(Dest),
}

/// Reads operand 0 of a callback.
pub(crate) fn read_operand0(arg: Option<&TensorRef<'_>>) -> Result<Operand0, String> {
    let Some(arg) = arg else {
        return Err(format!(
            "{NO_SERVER} (the custom call has no operand 0 naming its target)"
        ));
    };
    if arg.dtype != Some(DType::U8) {
        return Err(format!(
            "operand 0 of a callback must be a u8 tensor naming the target (a run handle or \
             :erlang.term_to_binary(target)), got element type {}",
            arg.dtype
                .map_or_else(|| format!("#{}", arg.xla_type), |d| d.to_string())
        ));
    }
    let bytes = arg.data;
    if let Some(n) = parse_handle(bytes) {
        return Ok(Operand0::Handle(n));
    }
    if bytes.len() == 8 && bytes.iter().all(|&b| b == 0) {
        return Err(format!(
            "{NO_SERVER} (the program's callback operand holds eight zero bytes, EXLA's \
             \"no callbacks\" value)"
        ));
    }
    if bytes.first() == Some(&131) {
        let term = binary_to_term(bytes).map_err(|e| {
            format!("operand 0 of a callback starts like :erlang.term_to_binary/1 output but is not a valid term: {e}")
        })?;
        return Dest::from_term(&term).map(Operand0::Term).ok_or_else(|| {
            format!(
                "operand 0 of a callback decodes to {}, which is not a process: expected a pid, \
                 a registered name or {{name, node}}",
                inspect::inspect(&term)
            )
        });
    }
    Err(format!(
        "{NO_SERVER} (operand 0 of the callback holds {} bytes that are neither a run handle \
         nor :erlang.term_to_binary(target); raw EXLA pid bytes mean nothing outside their VM)",
        bytes.len()
    ))
}

/// A resolved callback destination, with its run when the operand was a handle.
pub(crate) struct Resolved {
    pub dest: Dest,
    pub run: Option<Arc<RunState>>,
}
