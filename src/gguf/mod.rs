//! The GGUF file format: reading a model file (metadata, and its weights mapped zero-copy into
//! a backend buffer), our own walk of its header (a named error for each defect), writing one
//! (with the packed weight layouts of [`crate::layout`]), and the page-cache hints for the
//! mapping.

pub mod header;
mod pagecache;
pub mod reader;
pub mod writer;

pub use reader::{GgufFile, MetaValue};
pub use writer::GgufWriter;
