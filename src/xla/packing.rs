//! The three layouts of 2- and 4-bit integers (`s2`, `s4`, `u2`, `u4`), and conversions between
//! them. Every other type is laid out the same way everywhere.
//!
//! * **Nx** (what the node's tensors hold and what crosses the wire): a bitstring of
//!   `count * bits` bits, element 0 in the *most* significant bits of byte 0, the way Erlang
//!   builds `<<x::4, y::4>>`; the last byte's unused low bits are zero. `u4 [1, 2, 3]` is
//!   `<<0x12, 0x3::4>>`, held here as `[0x12, 0x30]`.
//! * **XLA host buffers** (what `PJRT_Client_BufferFromHostBuffer` takes and
//!   `PJRT_Buffer_ToHostBuffer` gives): one element per byte, in its low bits. The plugin ignores
//!   the high bits of what it is given and returns them zero (not sign-extended).
//! * **XLA device memory** (what a custom call's operand and result buffers hold on the CPU):
//!   packed like Nx, `ceil(count * bits / 8)` bytes, but element 0 in the *least* significant
//!   bits of byte 0: `u4 [1, 2, 3]` is `[0x21, 0x03]`.
//!
//! Nx and device memory therefore differ only in the order of the elements within each byte, a
//! reversal that is its own inverse ([`swap_device_order`]).

use std::borrow::Cow;

use super::dtype::DType;

/// Nx's bytes of `count` elements as an XLA host buffer: one byte per element for the 2- and
/// 4-bit integers, the bytes themselves for every other type. `nx` holds the packed size of
/// `count` elements (checked by the caller).
pub fn to_host_buffer(dtype: DType, count: usize, nx: &[u8]) -> Cow<'_, [u8]> {
    if !dtype.is_sub_byte() {
        return Cow::Borrowed(nx);
    }
    let bits = dtype.bits() as usize;
    let per_byte = 8 / bits;
    let mask = (1u8 << bits) - 1;
    Cow::Owned(
        (0..count)
            .map(|i| {
                let shift = 8 - bits * (i % per_byte + 1);
                (nx[i / per_byte] >> shift) & mask
            })
            .collect(),
    )
}

/// An XLA host buffer's bytes (one element per byte for the 2- and 4-bit integers) as Nx's.
pub fn from_host_buffer(dtype: DType, host: Vec<u8>) -> Vec<u8> {
    if !dtype.is_sub_byte() {
        return host;
    }
    let bits = dtype.bits() as usize;
    let per_byte = 8 / bits;
    let mask = (1u8 << bits) - 1;
    let mut nx = vec![0u8; host.len().div_ceil(per_byte)];
    for (i, element) in host.iter().enumerate() {
        let shift = 8 - bits * (i % per_byte + 1);
        nx[i / per_byte] |= (element & mask) << shift;
    }
    nx
}

/// Turns Nx's packed bytes into XLA's device-memory packing, or back: reverses the order of the
/// elements within each byte (a no-op for types of 8 bits or more).
pub fn swap_device_order(dtype: DType, bytes: &mut [u8]) {
    match dtype.bits() {
        4 => bytes.iter_mut().for_each(|b| *b = b.rotate_left(4)),
        2 => bytes.iter_mut().for_each(|b| {
            *b = (*b >> 6) | ((*b >> 2) & 0b1100) | ((*b << 2) & 0b11_0000) | (*b << 6)
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_hold_one_element_per_byte() {
        // u4 [1, 2, 3]: Nx <<0x12, 0x3::4>>.
        let nx = [0x12, 0x30];
        assert_eq!(&*to_host_buffer(DType::U4, 3, &nx), &[1, 2, 3]);
        assert_eq!(from_host_buffer(DType::U4, vec![1, 2, 3]), nx);
        // s2 [-1, 1, -2, 0, 1]: Nx <<0b11_01_10_00, 0b01::2>>.
        let nx = [0b1101_1000, 0b0100_0000];
        assert_eq!(&*to_host_buffer(DType::S2, 5, &nx), &[3, 1, 2, 0, 1]);
        assert_eq!(from_host_buffer(DType::S2, vec![3, 1, 2, 0, 1]), nx);
        // High bits of a host element (a sign extension) are dropped.
        assert_eq!(from_host_buffer(DType::S4, vec![0xff, 0xf8]), [0xf8]);
        assert_eq!(
            &*to_host_buffer(DType::F32, 1, &[1, 2, 3, 4]),
            &[1, 2, 3, 4]
        );
        assert_eq!(from_host_buffer(DType::U8, vec![7, 9]), [7, 9]);
    }

    #[test]
    fn device_order_reverses_elements_within_bytes() {
        let mut u4 = [0x12, 0x30];
        swap_device_order(DType::U4, &mut u4);
        assert_eq!(u4, [0x21, 0x03]);
        swap_device_order(DType::U4, &mut u4);
        assert_eq!(u4, [0x12, 0x30]);
        // Nx 0b11_01_10_00 (elements 3, 1, 2, 0) is 0b00_10_01_11 in device memory.
        let mut u2 = [0b1101_1000, 0b0100_0000];
        swap_device_order(DType::U2, &mut u2);
        assert_eq!(u2, [0b0010_0111, 0b0000_0001]);
        let mut f8 = [0x12, 0x34];
        swap_device_order(DType::F8E5M2, &mut f8);
        assert_eq!(f8, [0x12, 0x34]);
    }
}
