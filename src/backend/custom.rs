//! Custom ops: a kernel of ours as one node of a ggml graph.
//!
//! A kernel is a [`Body`] value; [`Graph::custom`](super::Graph::custom) boxes it into the graph
//! (alive until the graph has run) and registers with ggml one generic trampoline (instantiated
//! per body type), which calls the body on every compute thread with a [`CustomOp`]: a typed
//! view of the node's sources, its result and the thread's place, instead of each body reading
//! ggml's raw tensor structs.

use llama_cpp_sys_2 as sys;
use std::ops::Range;
use std::os::raw::{c_int, c_void};

/// A custom op's kernel: what each compute thread runs on the node.
///
/// ggml runs the body on all of the backend's threads at once, each with its `ith`; a body
/// reads the sources freely and writes only its own share of the result.
pub trait Body: Send + Sync + 'static {
    /// Thread `op.ith()` of `op.nth()`'s part of the node.
    fn run(&self, op: &CustomOp<'_>);
}

/// The element type of a custom op's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    F32,
    /// Bytes (an int8 tensor for ggml), for a kernel's own packed formats.
    Bytes,
}

impl Out {
    fn to_ggml(self) -> sys::ggml_type {
        match self {
            Out::F32 => sys::GGML_TYPE_F32,
            Out::Bytes => sys::GGML_TYPE_I8,
        }
    }
}

/// One compute thread's view of a custom op while ggml runs it: the sources (allocated,
/// computed, read-only while the node runs), the result, and which thread this is.
pub struct CustomOp<'a> {
    dst: &'a sys::ggml_tensor,
    ith: usize,
    nth: usize,
}

impl CustomOp<'_> {
    /// This thread's index, `0..nth`.
    pub fn ith(&self) -> usize {
        self.ith
    }

    /// Threads running the node.
    pub fn nth(&self) -> usize {
        self.nth
    }

    /// This thread's contiguous share of `units` work items (rows, steps, panels).
    pub fn share(&self, units: usize) -> Range<usize> {
        thread_share(units, self.ith, self.nth)
    }

    /// The result's shape, `ne0` fastest.
    pub fn shape(&self) -> [usize; 4] {
        self.dst.ne.map(|n| n as usize)
    }

    /// Whether the node has a source `i` (an optional source is passed as none).
    pub fn has_src(&self, i: usize) -> bool {
        i < self.dst.src.len() && !self.dst.src[i].is_null()
    }

    fn src(&self, i: usize) -> &sys::ggml_tensor {
        assert!(self.has_src(i), "custom op without source {i}");
        // SAFETY: a non-null source of a node being computed is a live, allocated tensor.
        unsafe { &*self.dst.src[i] }
    }

    /// Source `i`'s shape.
    pub fn src_shape(&self, i: usize) -> [usize; 4] {
        self.src(i).ne.map(|n| n as usize)
    }

    /// Source `i`'s values: a contiguous f32 tensor (as the op's builder checked).
    pub fn src_f32(&self, i: usize) -> &[f32] {
        let t = self.src(i);
        debug_assert_eq!(t.type_, sys::GGML_TYPE_F32);
        let n: usize = t.ne.iter().map(|&n| n as usize).product();
        // SAFETY: a computed f32 tensor of n contiguous values, not written while this node
        // runs (ggml orders its writers before it).
        unsafe { std::slice::from_raw_parts(t.data as *const f32, n) }
    }

    /// Source `i`'s bytes, whatever its type (packed weights, quantized activations).
    pub fn src_bytes(&self, i: usize) -> &[u8] {
        let t = self.src(i);
        // SAFETY: as src_f32; ggml_nbytes is the tensor's extent.
        unsafe { std::slice::from_raw_parts(t.data as *const u8, sys::ggml_nbytes(t)) }
    }

    /// The result's base address, for kernels that write through pointers.
    pub fn dst_ptr<T>(&self) -> *mut T {
        self.dst.data.cast()
    }

    /// Elements `range` of an f32 result (`T` f32) or bytes of a [`Out::Bytes`] one (`T` u8).
    ///
    /// # Safety
    /// No other thread reads or writes these elements while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn dst_mut<T>(&self, range: Range<usize>) -> &mut [T] {
        // SAFETY: the range lies in the result (asserted), exclusive per the contract.
        unsafe {
            assert!(range.end * std::mem::size_of::<T>() <= sys::ggml_nbytes(self.dst));
            std::slice::from_raw_parts_mut(self.dst_ptr::<T>().add(range.start), range.len())
        }
    }
}

/// The contiguous share of `units` work items (rows, panels) that thread `ith` of `nth` takes.
pub fn thread_share(units: usize, ith: usize, nth: usize) -> Range<usize> {
    let chunk = units.div_ceil(nth.max(1));
    let start = (ith * chunk).min(units);
    start..(start + chunk).min(units)
}

/// What ggml calls on each thread: the body behind `userdata` on a view of `dst`.
unsafe extern "C" fn trampoline<B: Body>(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) {
    // SAFETY: `node` registered this function with a `B` at `userdata`, which the graph keeps
    // alive until it has run; `dst` is the node being computed.
    let (body, dst) = unsafe { (&*(userdata as *const B), &*dst) };
    body.run(&CustomOp {
        dst,
        ith: ith as usize,
        nth: nth as usize,
    });
}

/// A custom node of shape `ne` over `sources` (a null source is an absent optional one, read
/// as such by [`CustomOp::has_src`]), running `body` on every thread of the backend.
///
/// # Safety
/// `ctx` is a live context and the sources are its tensors (or weights that outlive its
/// graph); `body` outlives every compute of the graph and is not moved; it is sound for what
/// its builder checked of the sources.
pub unsafe fn node<B: Body>(
    ctx: *mut sys::ggml_context,
    out: Out,
    ne: [usize; 4],
    sources: &[*mut sys::ggml_tensor],
    body: &B,
) -> *mut sys::ggml_tensor {
    let mut args = sources.to_vec();
    // A trailing absent source is just not passed (ggml counts the ones it gets).
    while args.last().is_some_and(|s| s.is_null()) {
        args.pop();
    }
    // SAFETY: per the contract.
    unsafe {
        sys::ggml_custom_4d(
            ctx,
            out.to_ggml(),
            ne[0] as i64,
            ne[1] as i64,
            ne[2] as i64,
            ne[3] as i64,
            args.as_mut_ptr(),
            args.len() as c_int,
            Some(trampoline::<B>),
            -1, // every thread of the backend
            body as *const B as *mut c_void,
        )
    }
}
