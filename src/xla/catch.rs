//! C++ exceptions thrown by the plugin, stopped at the boundary.
//!
//! XLA's C API reports failures as error values, but parts of XLA's C++ code throw instead (the
//! CPU compiler, for one, throws `absl::BadStatusOrAccess` building a copy of 2- or 4-bit
//! integers). An exception that unwinds into Rust frames aborts the process: "Rust cannot catch
//! foreign exceptions". So every call into the plugin's C entry points (and into native
//! kernels) goes through [`call_catching`], which runs it inside the C++ frame of
//! `catch.cc`: a throw comes back as [`Thrown`], with the exception's type and text.
//!
//! After a throw nothing the call was to produce can be trusted: its outputs may be unset or
//! half-written, so callers use none of them and free none of them (a leak at worst). What XLA
//! had built inside the call was destroyed by the unwinding. An exception thrown on one of
//! XLA's own threads, or out of a function XLA declares `noexcept`, never reaches this frame:
//! C++ ends the process (`std::terminate`), which no caller can prevent.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::mem::MaybeUninit;

extern "C" {
    /// `catch.cc`: calls `entry(args)`; 0 and `*result` set when it returned, 1 and `what`
    /// filled (NUL-terminated) when it threw.
    fn xla_node_call_catching(
        entry: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
        args: *mut c_void,
        result: *mut *mut c_void,
        what: *mut c_char,
        what_size: usize,
    ) -> c_int;
}

/// What a C++ exception said: its type and `what()` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Thrown(pub String);

impl fmt::Display for Thrown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XLA threw a C++ exception ({})", self.0)
    }
}

/// Longest exception text kept (the rest is cut).
const WHAT_SIZE: usize = 4096;

/// Calls the C entry point `entry` with `args`, turning a C++ exception it throws into
/// [`Thrown`].
///
/// # Safety
/// Calling `entry(args)` directly must be sound: `args` is what `entry` expects, valid as long
/// as it requires.
pub(crate) unsafe fn call_catching<A, R>(
    entry: unsafe extern "C" fn(*mut A) -> *mut R,
    args: *mut A,
) -> Result<*mut R, Thrown> {
    // SAFETY: function pointers whose argument and result are both thin raw pointers are
    // ABI-compatible (the Rust reference, "Function pointer ABI compatibility"), so `entry` may
    // be called through the erased type.
    let erased: unsafe extern "C" fn(*mut c_void) -> *mut c_void =
        unsafe { std::mem::transmute(entry) };
    let mut result = std::ptr::null_mut();
    // Only written, and only read, when the call threw.
    let mut what = [const { MaybeUninit::<c_char>::uninit() }; WHAT_SIZE];
    // SAFETY: `erased(args)` is sound (the caller's contract); `result` and `what` are writable
    // for the sizes passed, and `catch.cc` NUL-terminates `what`.
    let threw = unsafe {
        xla_node_call_catching(
            erased,
            args.cast(),
            &mut result,
            what.as_mut_ptr().cast(),
            what.len(),
        )
    };
    if threw == 0 {
        return Ok(result.cast());
    }
    // SAFETY: on a throw `catch.cc` wrote a NUL-terminated string into `what` (see above).
    let text = unsafe { CStr::from_ptr(what.as_ptr().cast()) };
    Err(Thrown(text.to_string_lossy().into_owned()))
}
