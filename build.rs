//! Link directives for the Windows (MinGW) build only; every other target gets none.
//!
//! llama-cpp-sys-2 links the `lib*.a` archives of its CMake build, but for MinGW ggml's CMake
//! names them `ggml.a`, `ggml-cpu.a` and `ggml-base.a` (no prefix), and it links no C++
//! runtime for this target. Named here as this crate's libraries, they come on the link line
//! after our objects and before the C runtime and Windows' import libraries, which they use.
//! `.cargo/config.toml` links the runtime statically (`-static`).
//!
//! The script also makes Cargo.toml's `[build-dependencies]` count in feature resolution: they
//! give a plain build the same bindgen, and so the same ggml build, as `cargo test` (see the
//! comment there).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "windows" && env == "gnu" {
        for archive in ["ggml.a", "ggml-cpu.a", "ggml-base.a"] {
            println!("cargo:rustc-link-lib=static:-bundle,+verbatim={archive}");
        }
        for lib in ["stdc++", "winpthread"] {
            println!("cargo:rustc-link-lib=static:-bundle={lib}");
        }
    }
}
