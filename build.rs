//! Nothing to build: this script exists so that Cargo.toml's `[build-dependencies]` count in
//! feature resolution (they give a plain build the same bindgen, and so the same ggml build,
//! as `cargo test`; see the comment there).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
}
