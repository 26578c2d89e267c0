//! Feeds arbitrary bytes to the frame and term decoders: they must return errors, never panic,
//! overflow the stack or allocate from lying length fields.
//! Run with `cargo +nightly fuzz run frame_decoder` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = xla_node::node::frame::decode_stream(data);
    let _ = xla_node::node::term::binary_to_term(data);
});
