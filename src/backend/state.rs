//! Tensors that keep their values from one compute to the next (a stream's caches), in a
//! backend buffer of their own: graphs read them as leaves and write rows of them in place
//! ([`Graph::state`](super::Graph::state), [`Graph::write`](super::Graph::write)), so nothing
//! goes through the host between chunks.

use super::DType;
use crate::bail;
use crate::error::Result;
use llama_cpp_sys_2 as sys;
use std::ptr::NonNull;

/// A set of 2-D f32 tensors `[width, rows]` (`ne0` = width), zero-filled at creation, living
/// in one backend buffer until dropped.
pub struct StateTensors {
    ctx: NonNull<sys::ggml_context>,
    buffer: sys::ggml_backend_buffer_t,
    tensors: Vec<NonNull<sys::ggml_tensor>>,
}

// The handles are only touched through &self / &mut self; no compute is in flight while a
// method runs (computes are synchronous and borrow the graph that reads these tensors).
unsafe impl Send for StateTensors {}

impl std::fmt::Debug for StateTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shapes: Vec<[usize; 2]> = (0..self.len()).map(|i| self.shape(i)).collect();
        write!(f, "StateTensors {shapes:?}")
    }
}

impl StateTensors {
    /// Tensors of the given `[width, rows]` shapes in a buffer of `buft`, zero-filled.
    pub(super) fn new(
        buft: sys::ggml_backend_buffer_type_t,
        shapes: &[[usize; 2]],
    ) -> Result<Self> {
        if shapes.is_empty() || shapes.iter().any(|s| s[0] == 0 || s[1] == 0) {
            bail!(
                Internal,
                "internal: state tensors need non-empty shapes, got {shapes:?}"
            );
        }
        // SAFETY: a metadata-only context sized for the tensors; the buffer allocates their
        // data; null results are checked and everything made is freed on every path (Drop).
        unsafe {
            let ctx = sys::ggml_init(sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * (shapes.len() + 1),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            });
            let Some(ctx) = NonNull::new(ctx) else {
                bail!(
                    Internal,
                    "ggml: could not create a context for stream state"
                );
            };
            let mut state = StateTensors {
                ctx,
                buffer: std::ptr::null_mut(),
                tensors: Vec::with_capacity(shapes.len()),
            };
            for s in shapes {
                let t = sys::ggml_new_tensor_2d(
                    ctx.as_ptr(),
                    DType::F32.to_ggml(),
                    s[0] as i64,
                    s[1] as i64,
                );
                let Some(t) = NonNull::new(t) else {
                    bail!(Internal, "ggml: could not describe a stream state tensor");
                };
                state.tensors.push(t);
            }
            state.buffer = sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buft);
            if state.buffer.is_null() {
                bail!(
                    Internal,
                    "ggml: could not allocate stream state (out of memory?)"
                );
            }
            sys::ggml_backend_buffer_clear(state.buffer, 0);
            Ok(state)
        }
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Tensor `i`'s `[width, rows]`.
    pub fn shape(&self, i: usize) -> [usize; 2] {
        // SAFETY: a live tensor of this set.
        let t = unsafe { self.tensors[i].as_ref() };
        [t.ne[0] as usize, t.ne[1] as usize]
    }

    pub(super) fn raw(&self, i: usize) -> *mut sys::ggml_tensor {
        self.tensors[i].as_ptr()
    }

    fn check_rows(&self, i: usize, start: usize, len: usize) {
        let [_, rows] = self.shape(i);
        assert!(
            start + len <= rows,
            "stream state: rows {start}..{} of a tensor of {rows}",
            start + len
        );
    }

    /// Rows `start..start + len` of tensor `i`, `[len][width]` row-major.
    pub fn read_rows(&self, i: usize, start: usize, len: usize) -> Vec<f32> {
        self.check_rows(i, start, len);
        let width = self.shape(i)[0];
        let mut out = vec![0f32; len * width];
        // SAFETY: in bounds (checked); the buffer is host-readable through ggml's API and no
        // compute writes it now.
        unsafe {
            sys::ggml_backend_tensor_get(
                self.raw(i),
                out.as_mut_ptr().cast(),
                start * width * 4,
                out.len() * 4,
            )
        };
        out
    }

    /// Writes `data` (whole rows) into tensor `i` from row `start` on.
    pub fn write_rows(&mut self, i: usize, start: usize, data: &[f32]) {
        let width = self.shape(i)[0];
        assert!(
            data.len().is_multiple_of(width),
            "stream state: {} values are not rows of {width}",
            data.len()
        );
        self.check_rows(i, start, data.len() / width);
        // SAFETY: in bounds (checked); no compute reads or writes the buffer now (&mut self).
        unsafe {
            sys::ggml_backend_tensor_set(
                self.raw(i),
                data.as_ptr().cast(),
                start * width * 4,
                data.len() * 4,
            )
        };
    }

    /// Bytes of the buffer.
    pub fn bytes(&self) -> usize {
        // SAFETY: a live buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.buffer) }
    }
}

impl Drop for StateTensors {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once here.
        unsafe {
            if !self.buffer.is_null() {
                sys::ggml_backend_buffer_free(self.buffer);
            }
            sys::ggml_free(self.ctx.as_ptr());
        }
    }
}
