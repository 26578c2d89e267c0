//! Feeds arbitrary bytes to the frame and term decoders, and what they decode to the control
//! message parser: they must return errors, never panic, overflow the stack or allocate from
//! lying length fields. The frames go through `frame::read_frame`, the connection reader's own
//! path.
//! Run with `cargo +nightly fuzz run frame_decoder` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(messages) = xla_node::node::frame::decode_stream(data) {
        for mut m in messages {
            let _ = xla_node::node::control::ControlMessage::from_term(m.control, &mut m.payload);
        }
    }
    if let Ok(term) = xla_node::node::term::binary_to_term(data) {
        let _ = xla_node::node::native_record::find(&term);
    }
});
