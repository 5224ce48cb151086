//! The ggml runtime and our CPU kernels against f64 references and ggml's own ops.

#[path = "../common/mod.rs"]
mod common;

mod backend;
mod sgemm;
