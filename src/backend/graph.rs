//! Safe graph building over a metadata-only ggml context: ggml's built-in ops.
//!
//! Every op checks what ggml would `GGML_ASSERT` (shapes, contiguity) and panics with a readable
//! message instead: an abort cannot be caught, a panic can, and a mismatch here is a bug in the
//! model code, not bad user input (inputs are validated before a graph is built).
//!
//! Our own fused ops (the `kernels` room) are built on the hooks at the end: [`Graph::custom`]
//! for a node running a [`Body`], [`Graph::shared`] for a node that several ops read.

use super::custom::{self, Body, Out};
use super::weight::Weight;
use super::{Capture, DType, Lowering, MAX_NAME};
use crate::bail;
use crate::error::Result;
use crate::layout::Layout;
use llama_cpp_sys_2 as sys;
use std::any::Any;
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
    /// Writes into state tensors ([`Graph::write`]): computed even though no result reads them.
    writes: Vec<NonNull<sys::ggml_tensor>>,
    /// Nodes that several ops read, by what they compute ([`Graph::shared`]): linears reading
    /// the same input (q, k and v) share one quantization or packing of it.
    shared: HashMap<SharedKey, Tensor<'g>>,
    /// The [`Body`] of every custom node, alive until the graph has run (boxed: ggml holds
    /// their addresses, which a growing Vec would move).
    bodies: Vec<Box<dyn Any>>,
    /// How the fused ops built on this graph become nodes.
    lowering: Lowering,
    _graph: PhantomData<fn(&'g ()) -> &'g ()>,
}

/// What a shared node computes: its kind, the tensor it reads, and a flag of the kind's.
pub(crate) type SharedKey = (&'static str, usize, bool);

/// Panics with a graph shape error unless `cond` (a bug in the caller, see the module doc).
pub(crate) fn check(cond: bool, msg: impl FnOnce() -> String) {
    if !cond {
        panic!("graph shape error: {}", msg());
    }
}

/// What a matrix product `w^T x` needs of its operands, whichever kernel computes it.
pub(crate) fn check_mul_mat(w: Tensor<'_>, x: Tensor<'_>) {
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
}

fn can_repeat(small: [usize; 4], big: [usize; 4]) -> bool {
    (0..4).all(|i| small[i] != 0 && big[i].is_multiple_of(small[i]))
}

impl<'g> Graph<'g> {
    pub(super) fn new(max_nodes: usize, lowering: Lowering) -> Result<Graph<'g>> {
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
            bail!(Internal, "ggml: could not create a graph context");
        };
        Ok(Graph {
            ctx,
            max_nodes,
            inputs: Vec::new(),
            captures: Vec::new(),
            writes: Vec::new(),
            shared: HashMap::new(),
            bodies: Vec::new(),
            lowering,
            _graph: PhantomData,
        })
    }

    /// How fused ops are lowered in this graph (the backend's choice).
    pub fn lowering(&self) -> Lowering {
        self.lowering
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

    /// Tensor `i` of `state` as a leaf of this graph (read in place; see [`Graph::write`]).
    pub fn state(&mut self, state: &super::StateTensors, i: usize) -> Tensor<'g> {
        self.wrap(state.raw(i), "state")
    }

    /// Writes `src` into `dst`, a view of a state tensor ([`Graph::state`]), when the graph
    /// runs. The returned node is the write: an op that reads the written rows must run after
    /// it, so it takes the node as a source (ggml orders nodes by their sources only).
    pub fn write(&mut self, src: Tensor<'g>, dst: Tensor<'g>) -> Tensor<'g> {
        check(
            src.elements() == dst.elements()
                && src.dtype() == Some(DType::F32)
                && dst.dtype() == Some(DType::F32),
            || format!("write {:?} into {:?}", src.shape(), dst.shape()),
        );
        // SAFETY: equal element counts of f32 tensors (checked).
        let p = unsafe { sys::ggml_cpy(self.ctx(), src.raw(), dst.raw()) };
        let t = self.wrap(p, "state_write");
        self.writes.push(t.ptr);
        t
    }

    /// `new` ([n, t]) written into the `t` rows of the state tensor `ring` after its rows
    /// `start..start + keep` (for the next compute), and those `keep + t` rows as this graph
    /// reads them: with [`Lowering::Kernels`] a view of `ring` itself, whose readers must run
    /// after the returned write (a custom op takes it as a source); with [`Lowering::Builtin`]
    /// the cached rows and `new` concatenated, which reads no row being written (ggml's ops
    /// have no way to order a read after a write they do not consume).
    pub fn append_rows(
        &mut self,
        ring: Tensor<'g>,
        (start, keep): (usize, usize),
        new: Tensor<'g>,
    ) -> (Tensor<'g>, Tensor<'g>) {
        let t = new.ne(1);
        let dst = self.rows(ring, start + keep, t);
        let write = self.write(new, dst);
        let rows = match (self.lowering, keep) {
            (Lowering::Kernels, _) => self.rows(ring, start, keep + t),
            (Lowering::Builtin, 0) => new,
            (Lowering::Builtin, _) => {
                let cached = self.rows(ring, start, keep);
                self.concat(cached, new, 1)
            }
        };
        (rows, write)
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
    /// ggml's own kernel for every shape and type; `FusedOps::matmul` (the `kernels` room)
    /// picks a faster one where it can.
    pub fn mul_mat(&mut self, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
        check_mul_mat(w, x);
        // SAFETY: shapes checked.
        let p = unsafe { sys::ggml_mul_mat(self.ctx(), w.raw(), x.raw()) };
        self.wrap(p, "matmul")
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

    pub fn sqrt(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        self.unary(a, "sqrt", sys::ggml_sqrt)
    }

    /// LayerNorm over `ne0` without affine parameters.
    pub fn norm(&mut self, a: Tensor<'g>, eps: f32) -> Tensor<'g> {
        // SAFETY: any f32 tensor.
        let p = unsafe { sys::ggml_norm(self.ctx(), a.raw(), eps) };
        self.wrap(p, "norm")
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

    /// `softmax(a * scale + mask)` over `ne0`: `mask` a contiguous f32 `[ne0, >= ne1]` (0 to
    /// keep a value, `-inf` to give it zero weight), the same for every `ne2` and `ne3`.
    pub fn softmax_masked(&mut self, a: Tensor<'g>, mask: Tensor<'g>, scale: f32) -> Tensor<'g> {
        check(
            mask.dtype() == Some(DType::F32)
                && a.dtype() == Some(DType::F32)
                && mask.is_contiguous()
                && mask.ne(0) == a.ne(0)
                && mask.ne(1) >= a.ne(1)
                && mask.ne(2) == 1
                && mask.ne(3) == 1,
            || format!("softmax: mask {:?} for {:?}", mask.shape(), a.shape()),
        );
        let a = if a.is_contiguous() { a } else { self.cont(a) };
        // SAFETY: contiguous f32 input, an f32 mask of its row length (checked).
        let p = unsafe { sys::ggml_soft_max_ext(self.ctx(), a.raw(), mask.raw(), scale, 0.0) };
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
        let total: usize = parts.iter().map(|p| p.ne(1)).sum();
        // Its memory taken when the first part is done (a fresh leaf would hold it from the
        // start of the graph).
        let dst = self.reserve(parts[0].ne(0), total, parts[0]);
        let mut stack = RowStack { dst, at: 0, total };
        for &part in parts {
            self.set_rows(&mut stack, part);
        }
        self.finish_rows(stack)
    }

    /// A `[n, total]` result written part by part ([`Graph::push_rows`]), its memory taken
    /// now, in the order of the graph, after `after` (a tensor it follows but does not read):
    /// before the first part's intermediates, which would otherwise split the free block it
    /// fits in (a 60-minute file's stacks then needed 882 MiB where 4 of them take 704).
    pub fn row_stack(&mut self, n: usize, total: usize, after: Tensor<'g>) -> RowStack<'g> {
        let dst = self.reserve(n, total, after);
        self.writes.push(dst.ptr);
        RowStack { dst, at: 0, total }
    }

    /// An f32 `[n, total]` node that computes nothing (the parts' writes fill every row),
    /// allocated after `after`.
    fn reserve(&mut self, n: usize, total: usize, after: Tensor<'g>) -> Tensor<'g> {
        if self.lowering == Lowering::Builtin {
            // ggml's own ops only: one value of `after` zero-padded to the shape, a node whose
            // memory the allocator takes when it runs and frees after its last reader, as the
            // custom node's (a leaf, the fallback, holds it for the whole graph); the parts'
            // writes fill every row.
            if after.dtype() != Some(DType::F32) {
                return self.new_tensor(DType::F32, &[n, total]);
            }
            let one = self.view(after, &[1], &[], 0);
            return self.pad(one, [(0, n - 1), (0, total - 1), (0, 0), (0, 0)]);
        }
        // SAFETY: a result the body leaves to the parts' writes; the source is only ordered
        // before it.
        unsafe { self.custom(Out::F32, [n, total, 1, 1], &[after], Reserve, "stack_rows") }
    }

    /// Writes the 2-D f32 `part` into `stack`'s next rows, scheduled now: before any node built
    /// later, so that the part's intermediates die before the next slice's are made (the graph
    /// otherwise runs a node's sources in the order its consumers were built: the parts of
    /// several stacks built slice by slice would each be made for every slice, all held).
    pub fn push_rows(&mut self, stack: &mut RowStack<'g>, part: Tensor<'g>) {
        let w = self.set_rows(stack, part);
        self.writes.push(w.ptr);
    }

    fn set_rows(&mut self, stack: &mut RowStack<'g>, part: Tensor<'g>) -> Tensor<'g> {
        let len = part.ne(1);
        check(
            part.ne(2) == 1
                && part.ne(3) == 1
                && part.dtype() == Some(DType::F32)
                && stack.dst.ne(0) == part.ne(0)
                && stack.at + len <= stack.total,
            || {
                format!(
                    "stack_rows: part {:?} at row {} of {}",
                    part.shape(),
                    stack.at,
                    stack.total
                )
            },
        );
        let row_bytes = stack.dst.nb()[1];
        // SAFETY: part fits in dst at row `at` (checked above).
        let p = unsafe {
            sys::ggml_set_2d_inplace(
                self.ctx(),
                stack.dst.raw(),
                part.raw(),
                row_bytes,
                stack.at * row_bytes,
            )
        };
        stack.dst = self.wrap(p, "stack_rows");
        stack.at += len;
        stack.dst
    }

    /// The stacked result, once every row is written.
    pub fn finish_rows(&mut self, stack: RowStack<'g>) -> Tensor<'g> {
        check(stack.at == stack.total, || {
            format!("stack_rows: {} of {} rows written", stack.at, stack.total)
        });
        stack.dst
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

    /// im2col for a 2-D convolution in f32: `kernel` [KW, KH, Cin, Cout] (for its shape), `x`
    /// [W, H, Cin, N] -> [KW*KH*Cin, W', H', N]. (ggml_conv_2d would round it through f16.)
    pub fn im2col(
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
        self.wrap(cols, "im2col")
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

    // ---- hooks for our own ops (the `kernels` room) -------------------------------------

    /// A weight of any layout as a custom op's source (only its kernel reads a packed one).
    pub(crate) fn weight_source(&mut self, w: &Weight) -> Tensor<'g> {
        self.wrap(w.raw(), "weight")
    }

    /// A node of `out` elements and shape `ne` over `sources` that runs `body` on every thread
    /// of the backend, named `what` (profiles).
    ///
    /// # Safety
    /// `body` is sound for the sources as they are: their shapes, types and contiguity are
    /// what it reads (the builder's checks), and the result is what it writes.
    pub(crate) unsafe fn custom<B: Body>(
        &mut self,
        out: Out,
        ne: [usize; 4],
        sources: &[Tensor<'g>],
        body: B,
        what: &str,
    ) -> Tensor<'g> {
        let body = Box::new(body);
        let raw: Vec<_> = sources.iter().map(|t| t.raw()).collect();
        // SAFETY: the sources are this graph's tensors or weights outliving it; the body is
        // boxed into the graph, so it stays put and alive through the compute; the rest is
        // the caller's contract.
        let p = unsafe { custom::node(self.ctx(), out, ne, &raw, &*body) };
        self.bodies.push(body);
        self.wrap(p, what)
    }

    /// The node `key` names if this graph has it, else the one `build` makes (remembered under
    /// `key`): one quantization of an input for every linear that reads it, say.
    pub(crate) fn shared(
        &mut self,
        key: SharedKey,
        build: impl FnOnce(&mut Graph<'g>) -> Tensor<'g>,
    ) -> Tensor<'g> {
        if let Some(&t) = self.shared.get(&key) {
            return t;
        }
        let t = build(self);
        self.shared.insert(key, t);
        t
    }

    // ---- finishing ----------------------------------------------------------------------

    /// Expand the graph from `out`, every capture and every write.
    ///
    /// # Safety
    /// Called once, before allocation.
    pub(super) unsafe fn finish(&mut self, out: Tensor<'g>) -> *mut sys::ggml_cgraph {
        // SAFETY: ctx has room for max_nodes nodes (sized in `new`).
        unsafe {
            let gf = sys::ggml_new_graph_custom(self.ctx(), self.max_nodes, false);
            for t in self.captures.iter().map(|c| &c.1).chain(&self.writes) {
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

/// A stacked result being written part by part ([`Graph::row_stack`]).
pub struct RowStack<'g> {
    /// The stack as of its last write (a part's write is a node of its own).
    dst: Tensor<'g>,
    at: usize,
    total: usize,
}

/// The node that holds a stack's memory ([`Graph::stack_rows`], [`Graph::row_stack`]): nothing
/// to compute, the parts' writes fill every row.
struct Reserve;

impl Body for Reserve {
    fn run(&self, _: &custom::CustomOp<'_>) {}
}
