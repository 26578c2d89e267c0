//! Replays the fuzz target's seed corpus (fuzz/corpus/frame_decoder) through the same decoders,
//! so every `cargo test` checks that none of those inputs panics, and that the well-formed seeds
//! decode to the messages they hold.

use std::path::Path;
use xla_node::node::frame::decode_stream;
use xla_node::node::term::binary_to_term;

#[test]
fn seed_corpus_decodes_without_panicking() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_decoder");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let frames = decode_stream(&data);
        let _ = binary_to_term(&data);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match name.as_str() {
            "tick" => assert_eq!(frames.unwrap().len(), 0),
            "pass_through_send"
            | "header_send"
            | "fragments"
            | "fragments_large_binaries"
            | "monitor_p" => {
                assert_eq!(
                    frames.unwrap_or_else(|e| panic!("{name}: {e}")).len(),
                    1,
                    "{name}"
                )
            }
            "deep_nesting" | "lying_list_length" | "atom_cache_ref" | "truncated" => {
                assert!(frames.is_err(), "{name} must be rejected")
            }
            _ => {}
        }
        seen += 1;
    }
    assert!(seen >= 10, "expected the seed corpus, found {seen} files");
}
