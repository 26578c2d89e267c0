//! Replays the fuzz target's seed corpus (fuzz/corpus/frame_decoder) through the same decoders,
//! so every `cargo test` checks that none of those inputs panics, that the well-formed seeds
//! decode to the messages they hold, and that a bad payload behind a sound control message fails
//! that message alone.

use std::path::Path;
use xla_node::node::control::ControlMessage;
use xla_node::node::frame::decode_stream;
use xla_node::node::native_record;
use xla_node::node::term::binary_to_term;

#[test]
fn seed_corpus_decodes_without_panicking() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_decoder");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let frames = decode_stream(&data);
        // What the fuzz target does with what decodes.
        for m in frames.iter().flatten() {
            let _ = ControlMessage::from_term(m.control.clone(), &mut m.payload.clone());
        }
        if let Ok(term) = binary_to_term(&data) {
            let _ = native_record::find(&term);
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match name.as_str() {
            "tick" => assert_eq!(frames.unwrap().len(), 0),
            "pass_through_send"
            | "header_send"
            | "fragments"
            | "fragments_large_binaries"
            | "monitor_p"
            | "record_ext" => {
                let messages = frames.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(messages.len(), 1, "{name}");
                assert!(messages[0].payload_error.is_none(), "{name}");
                assert_eq!(messages[0].native_records, name == "record_ext");
            }
            // ALTACT_SIG_SEND to an alias, to a name with a token, an exit signal to a pid.
            "altact_sig_send" => {
                let messages = frames.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(messages.len(), 3);
                for m in &messages {
                    ControlMessage::from_term(m.control.clone(), &mut None).unwrap();
                }
            }
            // Sound control messages, payloads that cannot be decoded.
            "deep_nesting" | "lying_list_length" | "undecodable_request" => {
                let messages = frames.unwrap_or_else(|e| panic!("{name}: {e}"));
                let failed = messages[0].payload_error.as_ref().expect("a payload error");
                assert_eq!(failed.call.is_some(), name == "undecodable_request");
            }
            // A SEND tuple with one element: decodes, and its parse is an error, not a panic.
            "short_control" => {
                let messages = frames.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(ControlMessage::from_term(messages[0].control.clone(), &mut None).is_err());
            }
            "atom_cache_ref" | "truncated" => {
                assert!(frames.is_err(), "{name} must be rejected")
            }
            _ => {}
        }
        seen += 1;
    }
    assert!(seen >= 15, "expected the seed corpus, found {seen} files");
}
