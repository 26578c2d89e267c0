//! Builds src/xla/catch.cc, the C++ frame through which the node calls the PJRT plugin's C
//! entry points: an exception thrown by XLA's C++ code stops there instead of unwinding into
//! Rust frames, which would abort the process (see src/xla/catch.rs). It needs a C++ compiler
//! (`g++`, which scripts/setup.sh installs where it is missing).

fn main() {
    println!("cargo:rerun-if-changed=src/xla/catch.cc");
    cc::Build::new()
        .cpp(true)
        .file("src/xla/catch.cc")
        .flag_if_supported("-std=c++17")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("xla_node_catch");
}
