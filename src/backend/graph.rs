//! Safe graph building over a metadata-only ggml context.
//!
//! Every op checks what ggml would `GGML_ASSERT` (shapes, contiguity) and panics with a readable
//! message instead: an abort cannot be caught, a panic can, and a mismatch here is a bug in the
//! model code, not bad user input (inputs are validated before a graph is built).

use super::gguf::{Layout, Weight};
use super::qgemm;
use super::sgemm::{self, Dims, Isa, PANEL};
use super::{Capture, DType, MAX_NAME, vmath};
use anyhow::{Result, bail};
use llama_cpp_sys_2 as sys;
use std::collections::HashMap;
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// A tensor of the graph being built. `'g` ties it to its [`Graph`] (invariant, so tensors of
/// two graphs never mix).
#[derive(Clone, Copy)]
pub struct Tensor<'g> {
    ptr: NonNull<sys::ggml_tensor>,
    _graph: PhantomData<fn(&'g ()) -> &'g ()>,
}

impl<'g> Tensor<'g> {
    fn new(ptr: *mut sys::ggml_tensor, what: &str) -> Tensor<'g> {
        let ptr = NonNull::new(ptr).unwrap_or_else(|| panic!("ggml returned no tensor for {what}"));
        Tensor {
            ptr,
            _graph: PhantomData,
        }
    }

    pub(crate) fn raw(self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    fn t(&self) -> &sys::ggml_tensor {
        // SAFETY: the tensor lives in the graph context for all of 'g.
        unsafe { self.ptr.as_ref() }
    }

    /// Shape in ggml order, `ne0` fastest.
    pub fn shape(self) -> [usize; 4] {
        self.t().ne.map(|n| n as usize)
    }

    pub fn ne(self, i: usize) -> usize {
        self.t().ne[i] as usize
    }

    pub fn dtype(self) -> Option<DType> {
        DType::from_ggml(self.t().type_)
    }

    fn nb(self) -> [usize; 4] {
        self.t().nb
    }

    pub fn elements(self) -> usize {
        self.shape().iter().product()
    }

    pub fn is_contiguous(self) -> bool {
        // SAFETY: reads tensor metadata only.
        unsafe { sys::ggml_is_contiguous(self.raw()) }
    }

    fn rows_contiguous(self) -> bool {
        // SAFETY: reads tensor metadata only.
        unsafe { sys::ggml_is_contiguous_1(self.raw()) }
    }
}

enum HostData {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A graph under construction: a `no_alloc` ggml context, the host data to write into its inputs
/// once allocated, and the tensors to read back.
pub struct Graph<'g> {
    ctx: NonNull<sys::ggml_context>,
    max_nodes: usize,
    inputs: Vec<(NonNull<sys::ggml_tensor>, HostData)>,
    captures: Vec<(String, NonNull<sys::ggml_tensor>)>,
    /// Int8-quantized activations by the tensor they quantize: linears reading the same input
    /// (q, k and v) share one quantization.
    quantized: HashMap<(usize, bool), Tensor<'g>>,
    /// Activations packed for the f32 panel GEMM, by the tensor they pack (shared likewise).
    packed: HashMap<(usize, bool), Tensor<'g>>,
    /// One [`sgemm::GemmNode`] (panel counter, fused ReLU) per GEMM node, f32 and int8, alive
    /// until the graph has run (boxed: the nodes hold their addresses, which a growing Vec
    /// would move).
    #[allow(clippy::vec_box)]
    queues: Vec<Box<sgemm::GemmNode>>,
    _graph: PhantomData<fn(&'g ()) -> &'g ()>,
}

pub(super) fn check(cond: bool, msg: impl FnOnce() -> String) {
    if !cond {
        panic!("graph shape error: {}", msg());
    }
}

/// Below this many multiply-adds ggml's own kernel is as fast (and the decoder's matrix-vector
/// products stay on it).
const PACKED_GEMM_MIN_MACS: usize = 1 << 20;

/// Plain f32 matrix products (the encoder's linears) go to the `gemm` crate's packed kernels,
/// about twice ggml's f32 tinyBLAS throughput on this hardware (`examples/gemm_throughput.rs`);
/// quantized weights, batched products and small products stay on `ggml_mul_mat`.
fn use_packed_gemm(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    let (ws, xs) = (w.shape(), x.shape());
    w.dtype() == Some(DType::F32)
        && x.dtype() == Some(DType::F32)
        && w.is_contiguous()
        && x.is_contiguous()
        && ws[2] == 1
        && ws[3] == 1
        && xs[2] == 1
        && xs[3] == 1
        && ws[0] * ws[1] * xs[1] >= PACKED_GEMM_MIN_MACS
        && std::env::var_os("PARAKEET_GGML_MATMUL").is_none()
}

/// ggml custom-op body: `dst[m, n] = w[k, m]^T x[k, n]`, rows of `dst` split over the backend's
/// threads, each running the single-threaded packed GEMM on its rows.
unsafe extern "C" fn packed_gemm_f32(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    _: *mut std::os::raw::c_void,
) {
    // SAFETY: ggml calls this with the tensor built in `matmul`: src[0] = w [k, m] and
    // src[1] = x [k, n], both contiguous f32 and allocated, dst [m, n] contiguous f32.
    unsafe {
        let d = &*dst;
        let (w, x) = (&*d.src[0], &*d.src[1]);
        let (k, m, n) = (w.ne[0] as usize, w.ne[1] as usize, x.ne[1] as usize);
        // Whole 16-row register tiles per thread.
        let tiles = super::thread_share(m.div_ceil(16), ith as usize, nth as usize);
        let (i0, i1) = (tiles.start * 16, (tiles.end * 16).min(m));
        if i0 >= i1 {
            return;
        }
        gemm::gemm(
            i1 - i0,
            n,
            k,
            (d.data as *mut f32).add(i0),
            m as isize, // dst column stride (one time step)
            1,
            false,
            (w.data as *const f32).add(i0 * k),
            1, // lhs = w^T: [i, p] at i * k + p
            k as isize,
            x.data as *const f32,
            k as isize, // rhs = x: [p, j] at j * k + p
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// ggml custom-op body: `x` (src 0, f32 `[k, n...]`, contiguous) packed for the panel GEMM
/// into `dst` (`n * k` values), the blocks split over the backend's threads.
unsafe extern "C" fn pack_activations_f32(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    silu: *mut std::os::raw::c_void,
) {
    // SAFETY: ggml calls this with the tensor built in `linear_panel16`: src[0] = x, dst the
    // same number of f32 values; each thread writes only its own blocks.
    unsafe {
        let d = &*dst;
        let x = &*d.src[0];
        let dims = Dims {
            m: 0,
            k: x.ne[0] as usize,
            n: (x.ne[1] * x.ne[2] * x.ne[3]) as usize,
        };
        sgemm::pack_activations(
            Isa::best(),
            x.data as *const f32,
            dims,
            (ith as usize, nth as usize),
            d.data as *mut f32,
            !silu.is_null(),
        );
    }
}

/// ggml custom-op body: `dst [m, n] = W x` with `W` panel-packed ([`sgemm`]) and `x` packed by
/// [`pack_activations_f32`]; the threads take panels from the node's queue (`userdata`, a
/// [`sgemm::GemmNode`], which also says which sources follow and what the node finishes with).
unsafe extern "C" fn panel16_gemm_f32(
    dst: *mut sys::ggml_tensor,
    _ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    queue: *mut std::os::raw::c_void,
) {
    // SAFETY: ggml calls this with the tensor built in `linear_panel16`: src[0] = W (ne [k, m],
    // panel-packed f32), src[1] = the packed x (n * k values), then the f32 bias [m] and the
    // residual (dst's shape) where the node says it has them; dst [m, n...] contiguous f32, all
    // allocated; `queue` is the node's GemmNode, owned by the graph, its counter zero before
    // the node runs; a claimed panel range is written (and finished) by its claimer only.
    unsafe {
        let d = &*dst;
        let (w, xp) = (&*d.src[0], &*d.src[1]);
        let node = &*(queue as *const sgemm::GemmNode);
        let (bias, residual) = optional_sources(d, node);
        let dims = Dims {
            m: w.ne[1] as usize,
            k: w.ne[0] as usize,
            n: (d.ne[1] * d.ne[2] * d.ne[3]) as usize,
        };
        let queue = sgemm::PanelQueue {
            next: &node.next,
            panels: dims.m / PANEL,
            threads: nth as usize,
        };
        // The next range is claimed before this one is computed, so that its first panels'
        // weights are fetched while this range's last ones compute.
        let mut claimed = queue.claim();
        while let Some(panels) = claimed {
            claimed = queue.claim();
            sgemm::gemm_panels(
                Isa::best(),
                w.data as *const f32,
                xp.data as *const f32,
                bias,
                d.data as *mut f32,
                dims,
                panels.clone(),
                claimed.clone().unwrap_or(0..0),
                node.relu,
            );
            node.finish_panels(
                d.data as *mut f32,
                residual,
                (dims.m, dims.n),
                (panels, PANEL),
            );
        }
    }
}

/// What a linear does besides its product, in its own nodes where its weight is packed.
#[derive(Clone, Copy, Default)]
struct Fused<'g> {
    /// SiLU on the input, where it is packed or quantized.
    silu_input: bool,
    /// ReLU in the store (f32 panel GEMM only).
    relu: bool,
    /// `residual + scale * y` on the output.
    residual: Option<(Tensor<'g>, f32)>,
}

/// A GEMM node's sources: its two operands, then the bias and the residual where it has them
/// (the order [`optional_sources`] reads them in).
fn gemm_sources(
    w: *mut sys::ggml_tensor,
    x: *mut sys::ggml_tensor,
    bias: Option<&Weight>,
    residual: Option<Tensor<'_>>,
) -> Vec<*mut sys::ggml_tensor> {
    let mut sources = vec![w, x];
    sources.extend(bias.map(|b| b.raw()));
    sources.extend(residual.map(|r| r.raw()));
    sources
}

/// A GEMM node's bias and residual data (null where it has none): the sources after its two
/// operands, in that order, as its [`sgemm::GemmNode`] says.
///
/// # Safety
/// `d` is a GEMM node built with `node` as its userdata, its sources allocated.
pub(super) unsafe fn optional_sources(
    d: &sys::ggml_tensor,
    node: &sgemm::GemmNode,
) -> (*const f32, *const f32) {
    let source = |i: usize| {
        // SAFETY: the node has this source (per the GemmNode), allocated.
        unsafe { (*d.src[i]).data as *const f32 }
    };
    let bias = if node.bias {
        source(2)
    } else {
        std::ptr::null()
    };
    let residual = if node.residual.is_some() {
        source(2 + node.bias as usize)
    } else {
        std::ptr::null()
    };
    (bias, residual)
}

/// ggml custom-op body of [`Graph::lstm_pointwise`].
///
/// # Safety
/// Called by ggml on the tensor built there: srcs gx, gh, b_ih, b_hh (f32 [4H]) and
/// c (f32 [H]), dst f32 [H, 2], all contiguous and allocated.
unsafe extern "C" fn lstm_pointwise_op(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    _: *mut std::os::raw::c_void,
) {
    // SAFETY: per the contract; each thread writes only its own units of h1 and c1.
    let (src, c, out) = unsafe {
        let d = &*dst;
        let h = d.ne[0] as usize;
        let src = |i: usize| std::slice::from_raw_parts((*d.src[i]).data as *const f32, 4 * h);
        let c = std::slice::from_raw_parts((*d.src[4]).data as *const f32, h);
        let mine = super::thread_share(h, ith as usize, nth as usize);
        let out = d.data as *mut f32;
        let h1 = std::slice::from_raw_parts_mut(out.add(mine.start), mine.len());
        let c1 = std::slice::from_raw_parts_mut(out.add(h + mine.start), mine.len());
        ([src(0), src(1), src(2), src(3)], c, (mine, h1, c1))
    };
    let [gx, gh, b_ih, b_hh] = src;
    let (mine, h1, c1) = out;
    let h = c.len();
    // The four gates of up to CHUNK of this thread's units, each gate contiguous on the stack,
    // so that the sigmoids and tanh run sixteen lanes at a time (libm's expf and tanhf, a call
    // per value, took ~13 us of a 0.6b decoder step, 10 % of a q8_0 one).
    const CHUNK: usize = 64;
    let mut buf = [0f32; 4 * CHUNK];
    let mut done = 0;
    while done < mine.len() {
        let (j0, u) = (mine.start + done, CHUNK.min(mine.len() - done));
        let gates = &mut buf[..4 * u];
        for (q, slot) in gates.chunks_exact_mut(u).enumerate() {
            for (v, j) in slot.iter_mut().zip(q * h + j0..) {
                *v = (gx[j] + b_ih[j]) + (gh[j] + b_hh[j]);
            }
        }
        let (ifg, o) = gates.split_at_mut(3 * u);
        let (i_f, g) = ifg.split_at_mut(2 * u);
        vmath::sigmoid_in_place(i_f);
        vmath::tanh_in_place(g);
        vmath::sigmoid_in_place(o);
        let (i, f) = i_f.split_at(u);
        let (c1, h1) = (&mut c1[done..done + u], &mut h1[done..done + u]);
        for k in 0..u {
            c1[k] = f[k] * c[j0 + k] + i[k] * g[k];
        }
        h1.copy_from_slice(c1);
        vmath::tanh_in_place(h1);
        for (v, &o) in h1.iter_mut().zip(o.iter()) {
            *v *= o;
        }
        done += u;
    }
}

/// ggml custom-op body of [`Graph::conv1d_depthwise_same`]: this thread's time steps.
///
/// # Safety
/// Called by ggml on the tensor built there: src[0] x (f32 [C, T]), src[1] kernel (f32
/// [K, C]), src[2] null or bias (f32 [C]), dst f32 [C, T]; all contiguous and allocated. A
/// non-null userdata: SiLU after the bias.
unsafe extern "C" fn depthwise_conv_op(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    silu: *mut std::os::raw::c_void,
) {
    let silu = !silu.is_null();
    // SAFETY: per the contract; each thread writes only its own time steps.
    let (x, kernel, bias, out, (c, t, k), mine) = unsafe {
        let d = &*dst;
        let (c, t, k) = (
            d.ne[0] as usize,
            d.ne[1] as usize,
            (*d.src[1]).ne[0] as usize,
        );
        let mine = super::thread_share(t, ith as usize, nth as usize);
        let x = std::slice::from_raw_parts((*d.src[0]).data as *const f32, c * t);
        let kernel = std::slice::from_raw_parts((*d.src[1]).data as *const f32, k * c);
        let bias = (!d.src[2].is_null())
            .then(|| std::slice::from_raw_parts((*d.src[2]).data as *const f32, c));
        let out = std::slice::from_raw_parts_mut(
            (d.data as *mut f32).add(mine.start * c),
            mine.len() * c,
        );
        (x, kernel, bias, out, (c, t, k), mine)
    };
    if mine.is_empty() {
        return;
    }
    // Tap-major kernel ([K][C]) so that the channel loop below runs over contiguous memory.
    let mut taps = vec![0f32; k * c];
    for (ch, w) in kernel.chunks_exact(k).enumerate() {
        for (j, &v) in w.iter().enumerate() {
            taps[j * c + ch] = v;
        }
    }
    let half = k / 2;
    for (ti, row) in mine.zip(out.chunks_exact_mut(c)) {
        row.fill(0.0);
        for (j, tap) in taps.chunks_exact(c).enumerate() {
            // Input step ti + j - half; outside the clip it is the zero padding.
            let Some(src) = (ti + j).checked_sub(half).filter(|&s| s < t) else {
                continue;
            };
            for ((o, &xv), &w) in row.iter_mut().zip(&x[src * c..][..c]).zip(tap) {
                *o += xv * w;
            }
        }
        if let Some(b) = bias {
            for (o, &bv) in row.iter_mut().zip(b) {
                *o += bv;
            }
        }
        if silu {
            super::vmath::silu_in_place(row);
        }
    }
}

/// ggml custom-op body of [`Graph::layer_norm`]: this thread's rows.
///
/// # Safety
/// Called by ggml on the tensor built there: src[0] x `[d, rows...]` (contiguous f32), src[1]
/// the weight and src[2] the bias `[d]`, dst f32 of x's shape, all allocated; `eps` in the
/// userdata pointer's bits.
unsafe extern "C" fn layer_norm_op(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    eps: *mut std::os::raw::c_void,
) {
    let eps = f32::from_bits(eps as usize as u32);
    // SAFETY: per the contract; each thread writes only its own rows.
    let (x, w, b, out, d) = unsafe {
        let t = &*dst;
        let d = t.ne[0] as usize;
        let rows = (t.ne[1] * t.ne[2] * t.ne[3]) as usize;
        let mine = super::thread_share(rows, ith as usize, nth as usize);
        let src =
            |i: usize, n: usize| std::slice::from_raw_parts((*t.src[i]).data as *const f32, n);
        let x = std::slice::from_raw_parts(
            ((*t.src[0]).data as *const f32).add(mine.start * d),
            mine.len() * d,
        );
        let out = std::slice::from_raw_parts_mut(
            (t.data as *mut f32).add(mine.start * d),
            mine.len() * d,
        );
        (x, src(1, d), src(2, d), out, d)
    };
    if d == 0 {
        return;
    }
    for (row, y) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        layer_norm_row(row, w, b, eps, y);
    }
}

/// One row of a LayerNorm in one pass over memory (ggml's `norm`, `mul` and `add` made three):
/// mean and variance as ggml's `norm` forms them (the sums in f64, the mean and the variance
/// rounded to f32, `scale = 1 / sqrt(var + eps)`), then `((x - mean) * scale) * w + b` in f32,
/// the operations of the three nodes in their order. The sums keep eight partial sums (so that
/// they vectorise), which can move the variance by an ulp against ggml's.
fn layer_norm_row(x: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32]) {
    let n = x.len();
    let sum = sum_f64(x, |v| v as f64);
    let mean = (sum as f32) / n as f32;
    let var = sum_f64(x, |v| {
        let d = v - mean;
        (d * d) as f64
    }) / n as f64;
    let scale = 1.0 / ((var as f32) + eps).sqrt();
    for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
        *y = ((x - mean) * scale) * w + b;
    }
}

/// `sum(f(x))` in eight partial sums (lane `i % 8` takes `x[i]`), so that it vectorises.
fn sum_f64(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += f(v);
    }
    acc.iter().sum()
}

/// ggml custom-op body of [`Graph::glu`]: this thread's time steps.
///
/// # Safety
/// Called by ggml on the tensor built there: src[0] f32 [2D, T], dst f32 [D, T]; both
/// contiguous and allocated.
unsafe extern "C" fn glu_op(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    _: *mut std::os::raw::c_void,
) {
    // SAFETY: per the contract; each thread writes only its own time steps.
    let (y, out, dd) = unsafe {
        let d = &*dst;
        let (dd, t) = (d.ne[0] as usize, d.ne[1] as usize);
        let mine = super::thread_share(t, ith as usize, nth as usize);
        let y = std::slice::from_raw_parts(
            ((*d.src[0]).data as *const f32).add(mine.start * 2 * dd),
            mine.len() * 2 * dd,
        );
        let out = std::slice::from_raw_parts_mut(
            (d.data as *mut f32).add(mine.start * dd),
            mine.len() * dd,
        );
        (y, out, dd)
    };
    if dd == 0 {
        return;
    }
    for (row, o) in y.chunks_exact(2 * dd).zip(out.chunks_exact_mut(dd)) {
        let (a, gate) = row.split_at(dd);
        super::vmath::glu(a, gate, o);
    }
}

fn can_repeat(small: [usize; 4], big: [usize; 4]) -> bool {
    (0..4).all(|i| small[i] != 0 && big[i].is_multiple_of(small[i]))
}

impl<'g> Graph<'g> {
    pub(super) fn new(max_nodes: usize) -> Result<Graph<'g>> {
        // SAFETY: size queries, then a metadata-only context (no tensor data is allocated here).
        let ctx = unsafe {
            let mem_size = sys::ggml_tensor_overhead() * max_nodes * 2
                + sys::ggml_graph_overhead_custom(max_nodes, false);
            sys::ggml_init(sys::ggml_init_params {
                mem_size,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        let Some(ctx) = NonNull::new(ctx) else {
            bail!("ggml: could not create a graph context");
        };
        Ok(Graph {
            ctx,
            max_nodes,
            inputs: Vec::new(),
            captures: Vec::new(),
            quantized: HashMap::new(),
            packed: HashMap::new(),
            queues: Vec::new(),
            _graph: PhantomData,
        })
    }

    /// A fresh [`sgemm::GemmNode`] for one GEMM node (its `userdata`), alive as long as this
    /// graph (so through its compute); boxed, so the address stays put.
    fn gemm_node(
        &mut self,
        relu: bool,
        bias: bool,
        residual: Option<f32>,
    ) -> *mut std::ffi::c_void {
        let node = Box::new(sgemm::GemmNode {
            relu,
            bias,
            residual,
            ..Default::default()
        });
        let ptr = &*node as *const sgemm::GemmNode as *mut std::ffi::c_void;
        self.queues.push(node);
        ptr
    }

    pub(super) fn ctx(&self) -> *mut sys::ggml_context {
        self.ctx.as_ptr()
    }

    /// Tensors made in this graph's context so far (ops, views, inputs).
    pub(super) fn tensors_made(&self) -> usize {
        let mut n = 0;
        // SAFETY: walks the live context's own tensor list.
        unsafe {
            let mut t = sys::ggml_get_first_tensor(self.ctx());
            while !t.is_null() {
                n += 1;
                t = sys::ggml_get_next_tensor(self.ctx(), t);
            }
        }
        n
    }

    pub(super) fn wrap(&self, ptr: *mut sys::ggml_tensor, what: &str) -> Tensor<'g> {
        // An op's result is named for what it is (a custom op is otherwise just "CUSTOM" in
        // profiles). Never a leaf: weights are shared (between threads, too) and stay as loaded.
        // SAFETY: a non-null tensor pointer from ggml is live; `op` is plain metadata.
        if !ptr.is_null()
            && unsafe { (*ptr).op } != sys::GGML_OP_NONE
            && let Ok(c) = std::ffi::CString::new(what)
        {
            // SAFETY: an op result lives in this graph's own context; ggml copies (and
            // truncates) the name.
            unsafe { sys::ggml_set_name(ptr, c.as_ptr()) };
        }
        Tensor::new(ptr, what)
    }

    // ---- leaves -------------------------------------------------------------------------

    fn new_tensor(&mut self, ty: DType, shape: &[usize]) -> Tensor<'g> {
        check((1..=4).contains(&shape.len()), || {
            format!("tensor rank {}", shape.len())
        });
        let ne: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
        // SAFETY: ctx is live; ne has shape.len() entries.
        let p = unsafe {
            sys::ggml_new_tensor(self.ctx(), ty.to_ggml(), shape.len() as i32, ne.as_ptr())
        };
        self.wrap(p, "new tensor")
    }

    /// A graph input holding `data` (ggml order: `shape[0]` fastest). Written after allocation.
    pub fn input_f32(&mut self, data: &[f32], shape: &[usize]) -> Tensor<'g> {
        check(shape.iter().product::<usize>() == data.len(), || {
            format!("input of {} values for shape {shape:?}", data.len())
        });
        let t = self.new_tensor(DType::F32, shape);
        self.register_input(t, HostData::F32(data.to_vec()));
        t
    }

    /// [`Graph::input_f32`] taking ownership of the data (no copy of a large input).
    pub fn input_f32_owned(&mut self, data: Vec<f32>, shape: &[usize]) -> Tensor<'g> {
        check(shape.iter().product::<usize>() == data.len(), || {
            format!("input of {} values for shape {shape:?}", data.len())
        });
        let t = self.new_tensor(DType::F32, shape);
        self.register_input(t, HostData::F32(data));
        t
    }

    pub fn input_i32(&mut self, data: &[i32], shape: &[usize]) -> Tensor<'g> {
        check(shape.iter().product::<usize>() == data.len(), || {
            format!("input of {} values for shape {shape:?}", data.len())
        });
        let t = self.new_tensor(DType::I32, shape);
        self.register_input(t, HostData::I32(data.to_vec()));
        t
    }

    fn register_input(&mut self, t: Tensor<'g>, data: HostData) {
        // SAFETY: t belongs to this context.
        unsafe { sys::ggml_set_input(t.raw()) };
        self.inputs.push((t.ptr, data));
    }

    /// A loader weight used in place as a graph leaf: no copy, its buffer is the model's.
    pub fn weight(&mut self, w: &Weight) -> Tensor<'g> {
        check(w.layout() == Layout::Plain, || {
            format!("{}: a panel-packed weight is only read by linear", w.name())
        });
        self.wrap(w.raw(), "weight")
    }

    /// Read `t` back after the compute (several results from one graph); the handle reads it
    /// from the [`Computed`](super::Computed) result. `name` labels it (layer dumps, errors).
    pub fn capture(&mut self, name: &str, t: Tensor<'g>) -> super::CaptureId {
        let t = if t.is_contiguous() { t } else { self.cont(t) };
        // SAFETY: t belongs to this graph; outputs are never overwritten by the allocator.
        unsafe { sys::ggml_set_output(t.raw()) };
        self.captures.push((name.to_string(), t.ptr));
        super::CaptureId(self.captures.len() - 1)
    }

    /// Mark `t` as the graph's result; returns the (contiguous) tensor to read back.
    pub(super) fn mark_output(&mut self, t: Tensor<'g>) -> Tensor<'g> {
        let t = if t.is_contiguous() { t } else { self.cont(t) };
        // SAFETY: as above.
        unsafe { sys::ggml_set_output(t.raw()) };
        t
    }

    pub fn set_name(&mut self, t: Tensor<'g>, name: &str) {
        let name: String = name.chars().take(MAX_NAME).collect();
        let c = CString::new(name).unwrap_or_default();
        // SAFETY: ggml copies the name (at most 63 bytes).
        unsafe { sys::ggml_set_name(t.raw(), c.as_ptr()) };
    }

    // ---- arithmetic ---------------------------------------------------------------------

    fn binary(
        &mut self,
        a: Tensor<'g>,
        b: Tensor<'g>,
        what: &str,
        f: unsafe extern "C" fn(
            *mut sys::ggml_context,
            *mut sys::ggml_tensor,
            *mut sys::ggml_tensor,
        ) -> *mut sys::ggml_tensor,
    ) -> Tensor<'g> {
        check(can_repeat(b.shape(), a.shape()), || {
            format!(
                "{what}: {:?} does not broadcast into {:?}",
                b.shape(),
                a.shape()
            )
        });
        check(
            a.dtype() == Some(DType::F32) && b.dtype() == Some(DType::F32),
            || format!("{what} needs f32 operands"),
        );
        // SAFETY: shapes checked above.
        let p = unsafe { f(self.ctx(), a.raw(), b.raw()) };
        self.wrap(p, what)
    }

    /// `a + b`, `b` broadcast over `a`.
    pub fn add(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.binary(a, b, "add", sys::ggml_add)
    }

    pub fn sub(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.binary(a, b, "sub", sys::ggml_sub)
    }

    /// Elementwise `a * b`, `b` broadcast over `a`.
    pub fn mul(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.binary(a, b, "mul", sys::ggml_mul)
    }

    pub fn scale(&mut self, a: Tensor<'g>, s: f32) -> Tensor<'g> {
        // SAFETY: any f32 tensor.
        let p = unsafe { sys::ggml_scale(self.ctx(), a.raw(), s) };
        self.wrap(p, "scale")
    }

    /// `w^T x` over `ne0`: `w` [k, m], `x` [k, n, ...] -> [m, n, ...]. With `w` a torch Linear
    /// weight ([out, in] in torch = ne [in, out]) this is `x @ W^T`.
    pub fn matmul(&mut self, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (ws, xs) = (w.shape(), x.shape());
        check(ws[0] == xs[0], || {
            format!("matmul: inner dims {ws:?} x {xs:?}")
        });
        check(xs[2] % ws[2] == 0 && xs[3] % ws[3] == 0, || {
            format!("matmul: batch dims {ws:?} x {xs:?}")
        });
        // SAFETY: ggml_is_transposed reads metadata only.
        check(!unsafe { sys::ggml_is_transposed(w.raw()) }, || {
            "matmul: transposed left operand".into()
        });
        if use_packed_gemm(w, x) {
            let mut args = [w.raw(), x.raw()];
            // SAFETY: an [m, n] f32 result whose srcs are w and x (kept alive and ordered by the
            // graph); the callback only reads them and writes its own rows of the result.
            let p = unsafe {
                sys::ggml_custom_4d(
                    self.ctx(),
                    sys::GGML_TYPE_F32,
                    ws[1] as i64,
                    xs[1] as i64,
                    1,
                    1,
                    args.as_mut_ptr(),
                    2,
                    Some(packed_gemm_f32),
                    -1, // every thread of the backend
                    std::ptr::null_mut(),
                )
            };
            return self.wrap(p, "matmul (packed gemm)");
        }
        // SAFETY: shapes checked.
        let p = unsafe { sys::ggml_mul_mat(self.ctx(), w.raw(), x.raw()) };
        self.wrap(p, "matmul")
    }

    /// `relu(x @ W^T + b)`: with a panel-packed weight the bias and the ReLU are applied in
    /// the GEMM's store (the same values as [`linear`](Self::linear) then [`relu`](Self::relu)).
    pub fn linear_relu(&mut self, x: Tensor<'g>, w: &Weight, b: Option<&Weight>) -> Tensor<'g> {
        if w.layout() == Layout::Panel16 {
            let relu = Fused {
                relu: true,
                ..Fused::default()
            };
            return self.linear_panel16(x, w, b, relu);
        }
        let y = self.linear(x, w, b);
        self.relu(y)
    }

    /// A torch `Linear`: `x @ W^T + b` over `x` [in, n, ...], weight [in, out].
    pub fn linear(&mut self, x: Tensor<'g>, w: &Weight, b: Option<&Weight>) -> Tensor<'g> {
        self.linear_fused(x, w, b, Fused::default())
    }

    /// `residual + scale * (x @ W^T + b)`, a residual connection around a block that ends in a
    /// linear; with a packed weight done in the GEMM node, on each range of rows as soon as it
    /// is computed (the same values as [`scale`](Self::scale) and [`add`](Self::add) nodes).
    pub fn linear_residual(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        residual: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        let fused = Fused {
            residual: Some((residual, scale)),
            ..Fused::default()
        };
        self.linear_fused(x, w, b, fused)
    }

    /// `silu(x) @ W^T + b`, plus `residual * scale` if given: with a packed weight the SiLU is
    /// applied where the input is packed or quantized for the GEMM (no pass of its own), within
    /// 3e-7 of f64 (`vmath`).
    pub fn silu_linear(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        residual: Option<(Tensor<'g>, f32)>,
    ) -> Tensor<'g> {
        let fused = Fused {
            silu_input: true,
            residual,
            ..Fused::default()
        };
        self.linear_fused(x, w, b, fused)
    }

    /// [`linear`](Self::linear) with `fused` done in its nodes where the weight is packed and
    /// the residual (if any) is a contiguous f32 of the output's 2-D shape; as separate nodes
    /// otherwise.
    fn linear_fused(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        fused: Fused<'g>,
    ) -> Tensor<'g> {
        let m = w.shape()[1];
        let fusable = fused.residual.is_none_or(|(r, _)| {
            let [_, n, c, d] = x.shape();
            r.shape() == [m, n, 1, 1]
                && c * d == 1
                && r.is_contiguous()
                && r.dtype() == Some(DType::F32)
        });
        match w.layout() {
            Layout::Q8_0x8 if fusable => return self.linear_q8_0x8(x, w, b, fused),
            Layout::Panel16 if fusable => return self.linear_panel16(x, w, b, fused),
            Layout::Q8_0x8 | Layout::Panel16 => {
                // Separate nodes around the packed product.
                let x = if fused.silu_input { self.silu(x) } else { x };
                let y = self.linear_fused(x, w, b, Fused::default());
                return self.add_scaled_residual(y, fused.residual);
            }
            Layout::Plain => {}
        }
        let x = if fused.silu_input { self.silu(x) } else { x };
        let w = self.weight(w);
        let y = self.matmul(w, x);
        let y = match b {
            Some(b) => {
                let b = self.weight(b);
                self.add(y, b)
            }
            None => y,
        };
        self.add_scaled_residual(y, fused.residual)
    }

    /// `r + scale * y` as `scale` and `add` nodes (`y` alone without a residual).
    fn add_scaled_residual(
        &mut self,
        y: Tensor<'g>,
        residual: Option<(Tensor<'g>, f32)>,
    ) -> Tensor<'g> {
        match residual {
            Some((r, scale)) => {
                let y = if scale == 1.0 {
                    y
                } else {
                    self.scale(y, scale)
                };
                self.add(r, y)
            }
            None => y,
        }
    }

    /// `x @ W^T (+ b)` with `W` panel-packed: the packed-weight GEMM as a custom op, the bias
    /// added in its store.
    fn linear_panel16(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        fused: Fused<'g>,
    ) -> Tensor<'g> {
        let [k, m, ..] = w.shape();
        check(x.ne(0) == k && x.dtype() == Some(DType::F32), || {
            format!("linear {}: {:?} x {:?}", w.name(), w.shape(), x.shape())
        });
        if let Some(b) = b {
            check(
                b.shape() == [m, 1, 1, 1] && b.dtype() == DType::F32 && b.layout() == Layout::Plain,
                || format!("linear {}: bias {:?}", w.name(), b.shape()),
            );
        }
        let x = if x.is_contiguous() { x } else { self.cont(x) };
        let xs = x.shape();
        let key = (x.raw() as usize, fused.silu_input);
        let xp = match self.packed.get(&key) {
            Some(&xp) => xp,
            None => {
                let mut src = [x.raw()];
                // SAFETY: an f32 result of x's size whose source is the contiguous f32 x; the
                // callback writes its own blocks of it.
                let p = unsafe {
                    sys::ggml_custom_4d(
                        self.ctx(),
                        sys::GGML_TYPE_F32,
                        (xs[0] * xs[1] * xs[2] * xs[3]) as i64,
                        1,
                        1,
                        1,
                        src.as_mut_ptr(),
                        1,
                        Some(pack_activations_f32),
                        -1, // every thread of the backend
                        super::flag(fused.silu_input),
                    )
                };
                let xp = self.wrap(p, "pack activations (panel16 gemm)");
                self.packed.insert(key, xp);
                xp
            }
        };
        let queue_ptr = self.gemm_node(fused.relu, b.is_some(), fused.residual.map(|r| r.1));
        let mut args = gemm_sources(w.raw(), xp.raw(), b, fused.residual.map(|r| r.0));
        // SAFETY: an [m, n...] f32 result whose srcs are W (packed [k, m]), the packed x, the
        // optional bias and residual (the caller checked its shape), kept alive and ordered by
        // the graph; the queue outlives the compute (owned by this graph); each thread writes
        // only the panels it claims.
        let p = unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                m as i64,
                xs[1] as i64,
                xs[2] as i64,
                xs[3] as i64,
                args.as_mut_ptr(),
                args.len() as std::os::raw::c_int,
                Some(panel16_gemm_f32),
                -1, // every thread of the backend
                queue_ptr,
            )
        };
        self.wrap(p, "linear (panel16 gemm)")
    }

    /// [`linear`](Self::linear) on a `q8_0x8` weight: the input quantized by one custom op
    /// (shared by every linear reading it), then our int8 kernel as another, the bias added in
    /// its store.
    fn linear_q8_0x8(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        fused: Fused<'g>,
    ) -> Tensor<'g> {
        let [k, m, ..] = w.shape();
        let xs = x.shape();
        check(xs[0] == k && x.dtype() == Some(DType::F32), || {
            format!("linear {}: input {xs:?} for weight [{k}, {m}]", w.name())
        });
        if let Some(b) = b {
            check(b.shape() == [m, 1, 1, 1] && b.dtype() == DType::F32, || {
                format!("linear {}: bias {:?}", w.name(), b.shape())
            });
        }
        let n = xs[1] * xs[2] * xs[3];
        let key = (x.raw() as usize, fused.silu_input);
        let xq = match self.quantized.get(&key) {
            Some(&xq) => xq,
            None => {
                let xc = if x.is_contiguous() { x } else { self.cont(x) };
                let x2 = self.reshape(xc, &[k, n]);
                // SAFETY: x2 is a contiguous f32 [k, n] of this context, k % 32 == 0 (the
                // weight's rows are whole q8_0 blocks).
                let p = unsafe { qgemm::quantize_node(self.ctx(), x2.raw(), fused.silu_input) };
                let xq = self.wrap(p, "quantize (q8_0)");
                self.quantized.insert(key, xq);
                xq
            }
        };
        check(!fused.relu, || {
            format!("linear {}: no fused ReLU on int8", w.name())
        });
        let queue = self.gemm_node(false, b.is_some(), fused.residual.map(|r| r.1));
        let mut args = gemm_sources(w.raw(), xq.raw(), b, fused.residual.map(|r| r.0));
        // SAFETY: a q8_0x8 weight [k, m], the quantized [k, n] input, the optional f32 bias [m]
        // and residual [m, n] (all checked above or by the caller), as `linear_node` requires;
        // the queue's GemmNode says which of the optional ones are there.
        let p = unsafe { qgemm::linear_node(self.ctx(), &mut args, n, queue) };
        let y = self.wrap(p, "linear (q8_0x8)");
        if xs[2] * xs[3] == 1 {
            y
        } else {
            self.reshape(y, &[m, xs[1], xs[2], xs[3]])
        }
    }

    // ---- unary --------------------------------------------------------------------------

    fn unary(
        &mut self,
        a: Tensor<'g>,
        what: &str,
        f: unsafe extern "C" fn(
            *mut sys::ggml_context,
            *mut sys::ggml_tensor,
        ) -> *mut sys::ggml_tensor,
    ) -> Tensor<'g> {
        let a = if a.rows_contiguous() { a } else { self.cont(a) };
        // SAFETY: rows are contiguous as ggml's unary kernels require.
        let p = unsafe { f(self.ctx(), a.raw()) };
        self.wrap(p, what)
    }

    pub fn relu(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        self.unary(a, "relu", sys::ggml_relu)
    }

    /// Swish / SiLU: `x * sigmoid(x)`.
    pub fn silu(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        self.unary(a, "silu", sys::ggml_silu)
    }

    pub fn sigmoid(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        self.unary(a, "sigmoid", sys::ggml_sigmoid)
    }

    pub fn tanh(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        self.unary(a, "tanh", sys::ggml_tanh)
    }

    /// LayerNorm over `ne0` without affine parameters.
    pub fn norm(&mut self, a: Tensor<'g>, eps: f32) -> Tensor<'g> {
        // SAFETY: any f32 tensor.
        let p = unsafe { sys::ggml_norm(self.ctx(), a.raw(), eps) };
        self.wrap(p, "norm")
    }

    /// The pointwise part of one PyTorch LSTM cell step (gate order i, f, g, o) as one node:
    /// from the gate products `gx = W_ih x` and `gh = W_hh h` ([4H, 1] each), their biases and
    /// the cell `c` ([H, 1]), `[h1 | c1]` ([H, 2]) with `gates = (gx + b_ih) + (gh + b_hh)`,
    /// `c1 = σ(f) c + σ(i) tanh(g)`, `h1 = σ(o) tanh(c1)`: one node for what took ten ggml
    /// nodes (each a barrier of the decoder's per-step graph), σ and tanh from `vmath`'s
    /// vectorised `e^x` (within 2e-7 of the exact functions).
    pub fn lstm_pointwise(
        &mut self,
        gx: Tensor<'g>,
        gh: Tensor<'g>,
        (b_ih, b_hh): (&Weight, &Weight),
        c: Tensor<'g>,
    ) -> Tensor<'g> {
        let h = c.ne(0);
        let gates = [h * 4, 1, 1, 1];
        check(
            c.shape() == [h, 1, 1, 1]
                && gx.shape() == gates
                && gh.shape() == gates
                && b_ih.shape() == gates
                && b_hh.shape() == gates
                && [gx, gh, c]
                    .iter()
                    .all(|t| t.dtype() == Some(DType::F32) && t.is_contiguous())
                && [b_ih, b_hh].iter().all(|b| b.dtype() == DType::F32),
            || {
                format!(
                    "lstm_pointwise: gates {:?} {:?}, cell {:?}",
                    gx.shape(),
                    gh.shape(),
                    c.shape()
                )
            },
        );
        let mut args = [gx.raw(), gh.raw(), b_ih.raw(), b_hh.raw(), c.raw()];
        // SAFETY: an f32 [H, 2] result whose five srcs are the contiguous f32 tensors checked
        // above, as `lstm_pointwise_op` requires.
        let p = unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                h as i64,
                2,
                1,
                1,
                args.as_mut_ptr(),
                args.len() as i32,
                Some(lstm_pointwise_op),
                -1, // libm's tanhf is slow enough (~50 us for 640 units) to split
                std::ptr::null_mut(),
            )
        };
        self.wrap(p, "lstm_pointwise")
    }

    /// A torch `LayerNorm` over `ne0`.
    pub fn layer_norm(&mut self, x: Tensor<'g>, w: &Weight, b: &Weight, eps: f32) -> Tensor<'g> {
        let d = x.ne(0);
        check(
            x.dtype() == Some(DType::F32)
                && [w, b].iter().all(|p| {
                    p.shape() == [d, 1, 1, 1]
                        && p.dtype() == DType::F32
                        && p.layout() == Layout::Plain
                }),
            || {
                format!(
                    "layer_norm: {:?} with {:?}, {:?}",
                    x.shape(),
                    w.shape(),
                    b.shape()
                )
            },
        );
        let x = if x.is_contiguous() { x } else { self.cont(x) };
        let xs = x.shape();
        let (w, b) = (self.weight(w), self.weight(b));
        let mut args = [x.raw(), w.raw(), b.raw()];
        // SAFETY: an f32 result of x's shape over the contiguous f32 x and the [d] weight and
        // bias, as `layer_norm_op` requires; eps travels in the userdata pointer's bits.
        let p = unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                xs[0] as i64,
                xs[1] as i64,
                xs[2] as i64,
                xs[3] as i64,
                args.as_mut_ptr(),
                3,
                Some(layer_norm_op),
                -1,
                eps.to_bits() as usize as *mut std::ffi::c_void,
            )
        };
        self.wrap(p, "layer_norm")
    }

    /// `softmax(a * scale)` over `ne0`.
    pub fn softmax(&mut self, a: Tensor<'g>, scale: f32) -> Tensor<'g> {
        let a = if a.is_contiguous() { a } else { self.cont(a) };
        // SAFETY: contiguous f32 input, no mask.
        let p = unsafe {
            sys::ggml_soft_max_ext(self.ctx(), a.raw(), std::ptr::null_mut(), scale, 0.0)
        };
        self.wrap(p, "softmax")
    }

    /// Rows of `table` ([n, rows]) picked by the i32 `ids`.
    pub fn get_rows(&mut self, table: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        check(ids.dtype() == Some(DType::I32), || {
            "get_rows: ids must be i32".into()
        });
        check(ids.ne(2) == 1 && ids.ne(3) == 1 && table.ne(2) == 1, || {
            "get_rows: 2-D table and 1-D ids only".into()
        });
        // SAFETY: checked above.
        let p = unsafe { sys::ggml_get_rows(self.ctx(), table.raw(), ids.raw()) };
        self.wrap(p, "get_rows")
    }

    // ---- layout -------------------------------------------------------------------------

    pub fn cont(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        // SAFETY: any tensor.
        let p = unsafe { sys::ggml_cont(self.ctx(), a.raw()) };
        self.wrap(p, "cont")
    }

    /// Reshape (copies first when `a` is not contiguous).
    pub fn reshape(&mut self, a: Tensor<'g>, shape: &[usize]) -> Tensor<'g> {
        check(shape.iter().product::<usize>() == a.elements(), || {
            format!("reshape {:?} -> {shape:?}", a.shape())
        });
        let a = if a.is_contiguous() { a } else { self.cont(a) };
        let n: Vec<i64> = shape.iter().map(|&v| v as i64).collect();
        // SAFETY: contiguous, same element count.
        let p = unsafe {
            match n.len() {
                1 => sys::ggml_reshape_1d(self.ctx(), a.raw(), n[0]),
                2 => sys::ggml_reshape_2d(self.ctx(), a.raw(), n[0], n[1]),
                3 => sys::ggml_reshape_3d(self.ctx(), a.raw(), n[0], n[1], n[2]),
                4 => sys::ggml_reshape_4d(self.ctx(), a.raw(), n[0], n[1], n[2], n[3]),
                r => panic!("graph shape error: reshape to rank {r}"),
            }
        };
        self.wrap(p, "reshape")
    }

    /// ggml's permute: axis `i` of `a` becomes axis `axes[i]` of the result.
    pub fn permute(&mut self, a: Tensor<'g>, axes: [usize; 4]) -> Tensor<'g> {
        let mut seen = [false; 4];
        axes.iter().for_each(|&x| seen[x.min(3)] = true);
        check(
            seen.iter().all(|&s| s) && axes.iter().all(|&x| x < 4),
            || format!("permute axes {axes:?}"),
        );
        // SAFETY: a valid permutation.
        let p = unsafe {
            sys::ggml_permute(
                self.ctx(),
                a.raw(),
                axes[0] as i32,
                axes[1] as i32,
                axes[2] as i32,
                axes[3] as i32,
            )
        };
        self.wrap(p, "permute")
    }

    /// Swap `ne0` and `ne1` (a view).
    pub fn transpose(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        // SAFETY: any tensor.
        let p = unsafe { sys::ggml_transpose(self.ctx(), a.raw()) };
        self.wrap(p, "transpose")
    }

    /// A strided view: `shape` elements, byte strides `strides` for axes 1.., starting `offset`
    /// bytes into `a`. Bounds are checked against `a`'s data.
    pub fn view(
        &mut self,
        a: Tensor<'g>,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Tensor<'g> {
        check(
            (1..=4).contains(&shape.len()) && strides.len() + 1 == shape.len(),
            || format!("view shape {shape:?} strides {strides:?}"),
        );
        let elem = a.nb()[0];
        let last = offset
            + (shape[0].max(1) - 1) * elem
            + shape[1..]
                .iter()
                .zip(strides)
                .map(|(&n, &s)| (n.max(1) - 1) * s)
                .sum::<usize>();
        // SAFETY: metadata only.
        let bytes = unsafe { sys::ggml_nbytes(a.raw()) };
        check(last + elem <= bytes, || {
            format!(
                "view {shape:?}/{strides:?}+{offset} past the end of {:?}",
                a.shape()
            )
        });
        let ne: Vec<i64> = shape.iter().map(|&v| v as i64).collect();
        // SAFETY: bounds checked above.
        let p = unsafe {
            match ne.len() {
                1 => sys::ggml_view_1d(self.ctx(), a.raw(), ne[0], offset),
                2 => sys::ggml_view_2d(self.ctx(), a.raw(), ne[0], ne[1], strides[0], offset),
                3 => sys::ggml_view_3d(
                    self.ctx(),
                    a.raw(),
                    ne[0],
                    ne[1],
                    ne[2],
                    strides[0],
                    strides[1],
                    offset,
                ),
                _ => sys::ggml_view_4d(
                    self.ctx(),
                    a.raw(),
                    ne[0],
                    ne[1],
                    ne[2],
                    ne[3],
                    strides[0],
                    strides[1],
                    strides[2],
                    offset,
                ),
            }
        };
        self.wrap(p, "view")
    }

    /// Rows `start..start + len` along `ne1` of a 2-D tensor (a view).
    pub fn rows(&mut self, a: Tensor<'g>, start: usize, len: usize) -> Tensor<'g> {
        check(start + len <= a.ne(1) && a.ne(2) == 1, || {
            format!("rows {start}..{} of {:?}", start + len, a.shape())
        });
        let nb = a.nb();
        self.view(a, &[a.ne(0), len], &[nb[1]], start * nb[1])
    }

    /// Elements `start..start + len` along `ne0`, all other axes kept (a view).
    pub fn cols(&mut self, a: Tensor<'g>, start: usize, len: usize) -> Tensor<'g> {
        check(start + len <= a.ne(0), || {
            format!("cols {start}..{} of {:?}", start + len, a.shape())
        });
        let s = a.shape();
        let nb = a.nb();
        self.view(a, &[len, s[1], s[2], s[3]], &nb[1..], start * nb[0])
    }

    /// Concatenate along `dim`.
    pub fn concat(&mut self, a: Tensor<'g>, b: Tensor<'g>, dim: usize) -> Tensor<'g> {
        let (sa, sb) = (a.shape(), b.shape());
        check(
            dim < 4 && (0..4).all(|i| i == dim || sa[i] == sb[i]),
            || format!("concat {sa:?} + {sb:?} on {dim}"),
        );
        // SAFETY: checked.
        let p = unsafe { sys::ggml_concat(self.ctx(), a.raw(), b.raw(), dim as i32) };
        self.wrap(p, "concat")
    }

    /// Stack 2-D `[n, len_i]` parts along `ne1` into one `[n, sum len_i]` tensor. Each part
    /// is written in place into the result right after it is computed, so the intermediates of
    /// one part are dead (and their memory reusable) before the next part is built.
    pub fn stack_rows(&mut self, parts: &[Tensor<'g>]) -> Tensor<'g> {
        check(!parts.is_empty(), || "stack_rows: no parts".into());
        let n = parts[0].ne(0);
        check(
            parts.iter().all(|p| {
                p.ne(0) == n && p.ne(2) == 1 && p.ne(3) == 1 && p.dtype() == Some(DType::F32)
            }),
            || "stack_rows: parts must be 2-D f32 with equal rows".into(),
        );
        let total: usize = parts.iter().map(|p| p.ne(1)).sum();
        // The first part padded to the full length (a node, allocated when it is computed; a
        // fresh leaf would hold its memory from the start of the graph).
        let first = parts[0];
        let mut dst = self.pad(first, [(0, 0), (0, total - first.ne(1)), (0, 0), (0, 0)]);
        let row_bytes = dst.nb()[1];
        let mut at = first.ne(1);
        for &part in &parts[1..] {
            // SAFETY: part fits in dst at row `at` (shapes checked, rows counted above).
            let p = unsafe {
                sys::ggml_set_2d_inplace(
                    self.ctx(),
                    dst.raw(),
                    part.raw(),
                    row_bytes,
                    at * row_bytes,
                )
            };
            dst = self.wrap(p, "stack_rows");
            at += part.ne(1);
        }
        dst
    }

    /// Zero padding: `(before, after)` per axis.
    pub fn pad(&mut self, a: Tensor<'g>, pads: [(usize, usize); 4]) -> Tensor<'g> {
        let a = if a.is_contiguous() { a } else { self.cont(a) };
        let p = pads.map(|(l, r)| (l as i32, r as i32));
        // SAFETY: contiguous f32.
        let t = unsafe {
            sys::ggml_pad_ext(
                self.ctx(),
                a.raw(),
                p[0].0,
                p[0].1,
                p[1].0,
                p[1].1,
                p[2].0,
                p[2].1,
                p[3].0,
                p[3].1,
            )
        };
        self.wrap(t, "pad")
    }

    // ---- convolutions -------------------------------------------------------------------

    /// 2-D convolution in f32, torch semantics, channels-fastest output.
    /// `kernel` [KW, KH, Cin, Cout] (a torch Conv2d weight), `x` [W, H, Cin, N] ->
    /// [Cout, W', H', N]. (ggml_conv_2d would round its im2col through f16.)
    pub fn conv2d(
        &mut self,
        kernel: Tensor<'g>,
        x: Tensor<'g>,
        stride: usize,
        pad: usize,
    ) -> Tensor<'g> {
        check(kernel.ne(2) == x.ne(2) && kernel.is_contiguous(), || {
            format!(
                "conv2d: kernel {:?} for input {:?}",
                kernel.shape(),
                x.shape()
            )
        });
        let (s, p) = (stride as i32, pad as i32);
        // SAFETY: channel counts checked; im2col gives [KW*KH*Cin, W', H', N].
        let cols = unsafe {
            sys::ggml_im2col(
                self.ctx(),
                kernel.raw(),
                x.raw(),
                s,
                s,
                p,
                p,
                1,
                1,
                true,
                sys::GGML_TYPE_F32,
            )
        };
        let cols = self.wrap(cols, "im2col");
        let [k, w, h, n] = cols.shape();
        let flat = self.reshape(cols, &[k, w * h * n]);
        let kern = self.reshape(kernel, &[k, kernel.ne(3)]);
        let y = self.matmul(kern, flat);
        self.reshape(y, &[kernel.ne(3), w, h, n])
    }

    /// Depthwise 2-D convolution in f32. `kernel` [KW, KH, 1, C], `x` [W, H, C, N].
    pub fn conv2d_depthwise(
        &mut self,
        kernel: Tensor<'g>,
        x: Tensor<'g>,
        stride: usize,
        pad: usize,
    ) -> Tensor<'g> {
        check(kernel.ne(2) == 1 && kernel.ne(3) == x.ne(2), || {
            format!(
                "conv2d_dw: kernel {:?} for input {:?}",
                kernel.shape(),
                x.shape()
            )
        });
        // ggml runs two layouts: WHCN contiguous, or channels-contiguous (CWHN) input with a
        // kernel laid out the same way.
        let (xn, kn) = (x.nb(), kernel.nb());
        let cwhn = xn[0] > xn[2] && xn[1] > xn[0] && xn[2] == 4;
        check(
            x.is_contiguous() || (cwhn && kn[0] >= kn[2] && kn[1] >= kn[0]),
            || format!("conv2d_dw: unsupported layouts {xn:?} / {kn:?}"),
        );
        let (s, p) = (stride as i32, pad as i32);
        // SAFETY: shapes checked.
        let t = unsafe {
            sys::ggml_conv_2d_dw_direct(self.ctx(), kernel.raw(), x.raw(), s, s, p, p, 1, 1)
        };
        self.wrap(t, "conv2d_dw")
    }

    /// Depthwise 1-D convolution over time in f32 ('same' padding, odd kernel), plus an
    /// optional per-channel bias. `x` [C, T] (channels fastest), `kernel` [K, C], `bias` [C] ->
    /// [C, T]. One custom op: each thread slides the kernel over its own time steps, all
    /// channels at once, with the padding implied (no padded or transposed copy of `x`); the
    /// taps are summed in kernel order from zero, then the bias added, as ggml's `ssm_conv`
    /// followed by an add would.
    pub fn conv1d_depthwise_same(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        self.conv1d_depthwise(x, kernel, bias, false)
    }

    /// [`conv1d_depthwise_same`](Self::conv1d_depthwise_same) then SiLU on each step as it is
    /// computed (the conformer conv module's depthwise conv and activation, one pass).
    pub fn conv1d_depthwise_same_silu(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        self.conv1d_depthwise(x, kernel, bias, true)
    }

    fn conv1d_depthwise(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
        silu: bool,
    ) -> Tensor<'g> {
        let (k, c, t) = (kernel.ne(0), x.ne(0), x.ne(1));
        check(
            kernel.shape() == [k, c, 1, 1]
                && k % 2 == 1
                && x.shape() == [c, t, 1, 1]
                && bias.is_none_or(|b| b.shape() == [c, 1, 1, 1])
                && [Some(x), Some(kernel), bias]
                    .iter()
                    .flatten()
                    .all(|t| t.dtype() == Some(DType::F32)),
            || {
                format!(
                    "conv1d_dw: kernel {:?} for input {:?}",
                    kernel.shape(),
                    x.shape()
                )
            },
        );
        let x = if x.is_contiguous() { x } else { self.cont(x) };
        let kernel = if kernel.is_contiguous() {
            kernel
        } else {
            self.cont(kernel)
        };
        let mut args = [
            x.raw(),
            kernel.raw(),
            bias.map_or(std::ptr::null_mut(), |b| b.raw()),
        ];
        // SAFETY: an f32 [C, T] result over the contiguous f32 srcs checked above (the bias,
        // when given, a contiguous [C] weight or node), as `depthwise_conv_op` requires.
        let p = unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                c as i64,
                t as i64,
                1,
                1,
                args.as_mut_ptr(),
                if bias.is_some() { 3 } else { 2 },
                Some(depthwise_conv_op),
                -1,
                super::flag(silu),
            )
        };
        self.wrap(
            p,
            if silu {
                "conv1d_dw + silu"
            } else {
                "conv1d_dw"
            },
        )
    }

    /// Gated linear unit over `ne0`: `y` [2D, T] -> `y[..D] * sigmoid(y[D..])` [D, T], as one
    /// pass, the sigmoid from our vectorised `e^x` (within 3e-7 of f64; libm's `expf` kept the
    /// loop scalar).
    pub fn glu(&mut self, y: Tensor<'g>) -> Tensor<'g> {
        let (d2, t) = (y.ne(0), y.ne(1));
        check(
            d2 % 2 == 0 && y.shape() == [d2, t, 1, 1] && y.dtype() == Some(DType::F32),
            || format!("glu: input {:?}", y.shape()),
        );
        let y = if y.is_contiguous() { y } else { self.cont(y) };
        let mut args = [y.raw()];
        // SAFETY: an f32 [D, T] result over a contiguous f32 [2D, T], as `glu_op` requires.
        let p = unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                (d2 / 2) as i64,
                t as i64,
                1,
                1,
                args.as_mut_ptr(),
                1,
                Some(glu_op),
                -1,
                std::ptr::null_mut(),
            )
        };
        self.wrap(p, "glu")
    }

    // ---- finishing ----------------------------------------------------------------------

    /// Expand the graph from `out` and every capture.
    ///
    /// # Safety
    /// Called once, before allocation.
    pub(super) unsafe fn finish(&mut self, out: Tensor<'g>) -> *mut sys::ggml_cgraph {
        // SAFETY: ctx has room for max_nodes nodes (sized in `new`).
        unsafe {
            let gf = sys::ggml_new_graph_custom(self.ctx(), self.max_nodes, false);
            for (_, t) in &self.captures {
                sys::ggml_build_forward_expand(gf, t.as_ptr());
            }
            sys::ggml_build_forward_expand(gf, out.raw());
            gf
        }
    }

    /// Copy host data into the allocated input tensors.
    ///
    /// # Safety
    /// The graph has been allocated.
    pub(super) unsafe fn upload_inputs(&mut self) {
        // Drained: a long file's feature image is hundreds of MB, not needed once it is in the
        // compute buffer.
        for (t, data) in std::mem::take(&mut self.inputs) {
            // An input the result does not depend on is not in the graph, so the gallocr gave
            // it no memory: writing it would trip ggml's "tensor buffer not set" abort.
            // SAFETY: reads the tensor's metadata.
            if unsafe { t.as_ref().buffer.is_null() } {
                continue;
            }
            let (ptr, bytes) = match &data {
                HostData::F32(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
                HostData::I32(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            };
            // SAFETY: sizes match by construction (checked in input_*); the tensor is allocated.
            unsafe { sys::ggml_backend_tensor_set(t.as_ptr(), ptr, 0, bytes) };
        }
    }

    /// # Safety
    /// The graph has been computed.
    pub(super) unsafe fn read_captures(&self) -> Vec<Capture> {
        self.captures
            .iter()
            .map(|(name, t)| {
                // SAFETY: computed tensor of this graph.
                let (data, shape) = unsafe { read_f32(t.as_ptr()) };
                Capture {
                    name: name.clone(),
                    data,
                    shape,
                }
            })
            .collect()
    }
}

/// Copy a contiguous f32 tensor to the host, ggml order.
///
/// # Safety
/// `t` is an allocated, computed f32 tensor.
pub(super) unsafe fn read_f32(t: *mut sys::ggml_tensor) -> (Vec<f32>, [usize; 4]) {
    // SAFETY: per the contract.
    unsafe {
        let tr = &*t;
        assert_eq!(
            tr.type_,
            sys::GGML_TYPE_F32,
            "read back of a non-f32 tensor"
        );
        let shape = tr.ne.map(|n| n as usize);
        let n: usize = shape.iter().product();
        let mut out = vec![0f32; n];
        assert!(sys::ggml_is_contiguous(t), "read back of a strided tensor");
        sys::ggml_backend_tensor_get(t, out.as_mut_ptr().cast(), 0, n * 4);
        (out, shape)
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        // SAFETY: the context was created in `new` and is freed once; computed data lives in the
        // gallocr's buffer, not here.
        unsafe { sys::ggml_free(self.ctx()) };
    }
}
