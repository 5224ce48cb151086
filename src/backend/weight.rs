//! Weights living in backend buffers: the zero-copy mapping of a GGUF's tensor data (made by
//! the file reader, the `gguf` room) and weights computed on the host at load, realised once.

use super::{DType, Device, MAX_NAME};
use crate::error::Result;
use crate::layout::{self, Layout};
use crate::{bail, err};
use llama_cpp_sys_2 as sys;
use memmap2::Mmap;
use std::collections::HashMap;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

/// Owns the ggml objects behind a set of weights; freed when the last [`Weight`] goes.
pub(crate) struct WeightBuffers {
    ctx: NonNull<sys::ggml_context>,
    buffer: sys::ggml_backend_buffer_t,
    // Keeps the mapping alive under a zero-copy buffer.
    _map: Option<Mmap>,
    // The mapped file, for page-cache hints (`gguf::pagecache`).
    file: Option<std::fs::File>,
}

impl WeightBuffers {
    /// Takes ownership of `ctx`, a context of tensor descriptions (freed on every path from
    /// here); the buffer and the mapping come later ([`WeightBuffers::hold`]).
    pub(crate) fn new(ctx: NonNull<sys::ggml_context>) -> WeightBuffers {
        WeightBuffers {
            ctx,
            buffer: std::ptr::null_mut(),
            _map: None,
            file: None,
        }
    }

    /// The buffer the context's tensors were placed in (freed with these buffers).
    pub(crate) fn set_buffer(&mut self, buffer: sys::ggml_backend_buffer_t) {
        self.buffer = buffer;
    }

    /// Keeps the mapping under a zero-copy buffer alive, and its file for page-cache hints.
    pub(crate) fn hold(&mut self, map: Mmap, file: std::fs::File) {
        self._map = Some(map);
        self.file = Some(file);
    }
}

// Weights are read-only after load; the handles are only freed in Drop.
unsafe impl Send for WeightBuffers {}
unsafe impl Sync for WeightBuffers {}

impl Drop for WeightBuffers {
    fn drop(&mut self) {
        // SAFETY: created once in this module, freed once here (buffer before its mapping).
        unsafe {
            if !self.buffer.is_null() {
                sys::ggml_backend_buffer_free(self.buffer);
            }
            sys::ggml_free(self.ctx.as_ptr());
        }
    }
}

/// A weight tensor living in a backend buffer. Cheap to clone; keeps its buffer alive.
#[derive(Clone)]
pub struct Weight {
    ptr: NonNull<sys::ggml_tensor>,
    name: Arc<str>,
    layout: Layout,
    _owner: Arc<WeightBuffers>,
}

// See WeightBuffers.
unsafe impl Send for Weight {}
unsafe impl Sync for Weight {}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Weight({}, {:?}, {:?}, {})",
            self.name,
            self.shape(),
            self.dtype(),
            self.layout.name()
        )
    }
}

impl Weight {
    /// A weight over tensor `ptr` of `owner`'s context, stored in `layout`.
    pub(crate) fn new(
        ptr: NonNull<sys::ggml_tensor>,
        name: &str,
        layout: Layout,
        owner: Arc<WeightBuffers>,
    ) -> Weight {
        Weight {
            ptr,
            name: name.into(),
            layout,
            _owner: owner,
        }
    }

    /// The same tensor, read as stored in `layout` (the file reader, once it has checked that
    /// the tensor fits it).
    pub(crate) fn set_layout(&mut self, layout: Layout) {
        self.layout = layout;
    }

    /// The file mapping this weight lives in, and its file (none for host-made weights).
    pub(crate) fn mapping(&self) -> Option<(&Mmap, &std::fs::File)> {
        match (&self._owner._map, &self._owner.file) {
            (Some(map), Some(file)) => Some((map, file)),
            _ => None,
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    fn t(&self) -> &sys::ggml_tensor {
        // SAFETY: kept alive by _owner.
        unsafe { self.ptr.as_ref() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Shape in ggml order (`ne0` fastest), trailing 1s included.
    pub fn shape(&self) -> [usize; 4] {
        self.t().ne.map(|n| n as usize)
    }

    pub fn dtype(&self) -> DType {
        DType::from_ggml(self.t().type_).expect("weights are validated on load")
    }

    pub fn elements(&self) -> usize {
        self.shape().iter().product()
    }

    pub fn bytes(&self) -> usize {
        // SAFETY: metadata only.
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    /// The weight's bytes as stored (its layout's order), on the host.
    fn stored_bytes(&self) -> Vec<u8> {
        let mut raw = vec![0u8; self.bytes()];
        // SAFETY: the tensor is allocated; raw has exactly its size.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), raw.as_mut_ptr().cast(), 0, raw.len()) };
        raw
    }

    /// The weight's values as f32 on the host (dequantised), ggml order. For load-time
    /// precomputation (folding BatchNorm, say), never per graph.
    pub fn to_host_f32(&self) -> Vec<f32> {
        let n = self.elements();
        if self.layout == Layout::Panel16 {
            let [k, m, ..] = self.shape();
            let plain = Weight {
                layout: Layout::Plain,
                ..self.clone()
            };
            return layout::unpack_panels(&plain.to_host_f32(), m, k);
        }
        let mut raw = self.stored_bytes();
        let [k, m, ..] = self.shape();
        match self.layout {
            Layout::Q8_0x8 => raw = layout::unpack_q8_0x8(&raw, k, m),
            Layout::Q4_0x8 => raw = layout::unpack_q4_0x8(&raw, k, m),
            Layout::Plain | Layout::Panel16 => {}
        }
        match self.dtype() {
            DType::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::I32 => raw
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
                .collect(),
            ty => {
                let mut out = vec![0f32; n];
                // SAFETY: type traits are static; to_float converts n elements of `ty`.
                unsafe {
                    let traits = sys::ggml_get_type_traits(ty.to_ggml());
                    let to_float = (*traits).to_float.expect("ggml type without to_float");
                    to_float(raw.as_ptr().cast(), out.as_mut_ptr(), n as i64);
                }
                out
            }
        }
    }
}

/// Every weight of `weights` in its plain form ([`Layout::Plain`]: ggml's own type and element
/// order), what ggml's built-in ops read: a `panel16` f32 matrix unpacked to f32, a `q8_0x8` /
/// `q4_0x8` one to ggml's q8_0 / q4_0 blocks (the same bytes in ggml's order); plain weights as
/// they are. The unpacked ones are realised once, into one backend buffer, under their own
/// names. The one place a packed weight becomes a plain one.
pub fn plain_weights(weights: &[Weight]) -> Result<Vec<Weight>> {
    let mut host = HostWeights::new();
    let slots: Vec<Option<Slot>> = weights
        .iter()
        .map(|w| (w.layout() != Layout::Plain).then(|| host.push_plain(w)))
        .collect();
    let realised = host.realize_slots()?;
    Ok(weights
        .iter()
        .zip(slots)
        .map(|(w, slot)| slot.map_or_else(|| w.clone(), |s| realised.get(s)))
        .collect())
}

/// Weights computed on the host at load time (e.g. BatchNorm folded into a conv), realised once
/// into their own backend buffer. Each queued tensor's [`Slot`] finds it among the realised
/// ones ([`HostWeights::realize_slots`]): a typed handle, not a name looked up at run time.
#[derive(Default)]
pub struct HostWeights {
    pending: Vec<(String, Vec<usize>, Data)>,
    panel16: std::collections::HashSet<String>,
    /// The device whose memory they are realised in (none: the CPU's).
    device: Option<Device>,
}

/// A queued tensor's contents.
enum Data {
    F32(Vec<f32>),
    /// Blocks of `DType` stored in `Layout` (an int8 GEMM's panels, or ggml's plain order).
    Packed(DType, Layout, Vec<u8>),
}

/// Where a queued tensor is among the weights [`HostWeights::realize_slots`] gives (in the
/// order they were queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot(usize);

/// The realised weights of one [`HostWeights`], found by the [`Slot`]s its queueing returned.
pub struct Realised(Vec<Weight>);

impl Realised {
    /// The weight queued at `slot` (a slot of this set's own [`HostWeights`]: every slot it
    /// returned is in range).
    pub fn get(&self, slot: Slot) -> Weight {
        self.0[slot.0].clone()
    }
}

/// The slots of a Linear queued by [`HostWeights::push_int8_padded`].
#[derive(Clone, Copy, Debug)]
pub struct PaddedLinear {
    pub weight: Slot,
    pub bias: Option<Slot>,
    /// Rows after padding.
    pub rows: usize,
}

impl HostWeights {
    pub fn new() -> HostWeights {
        HostWeights::default()
    }

    /// Weights to realise in `device`'s memory (the CPU's for the CPU device).
    pub fn on(device: Device) -> HostWeights {
        HostWeights {
            device: (!device.is_cpu()).then_some(device),
            ..HostWeights::default()
        }
    }

    /// Queue `w` as it is stored (type, layout and bytes), under its name: a copy for another
    /// device.
    fn push_copy(&mut self, w: &Weight) -> Slot {
        let mut bytes = vec![0u8; w.bytes()];
        // SAFETY: the tensor is allocated; `bytes` has exactly its size.
        unsafe { sys::ggml_backend_tensor_get(w.raw(), bytes.as_mut_ptr().cast(), 0, bytes.len()) };
        self.pending.push((
            w.name().to_string(),
            w.shape().to_vec(),
            Data::Packed(w.dtype(), w.layout(), bytes),
        ));
        Slot(self.pending.len() - 1)
    }

    /// Queue an f32 tensor (`shape` in ggml order).
    pub fn push(&mut self, name: &str, shape: &[usize], data: Vec<f32>) -> Slot {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "{name}: shape/data mismatch"
        );
        assert!(
            (1..=4).contains(&shape.len()),
            "{name}: rank {}",
            shape.len()
        );
        self.pending
            .push((name.to_string(), shape.to_vec(), Data::F32(data)));
        Slot(self.pending.len() - 1)
    }

    /// Queue a tensor of `dtype` blocks in ggml's own order (`shape` in ggml order), e.g. from
    /// [`super::quantize_rows`].
    pub fn push_blocks(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        bytes: Vec<u8>,
    ) -> Slot {
        self.pending.push((
            name.to_string(),
            shape.to_vec(),
            Data::Packed(dtype, Layout::Plain, bytes),
        ));
        Slot(self.pending.len() - 1)
    }

    /// Queue `w`'s plain form (see [`plain_weights`]), under its name.
    fn push_plain(&mut self, w: &Weight) -> Slot {
        let shape = w.shape();
        let [k, m, ..] = shape;
        let bytes = match w.layout() {
            Layout::Plain => w.stored_bytes(),
            Layout::Panel16 => return self.push(w.name(), &shape, w.to_host_f32()),
            Layout::Q8_0x8 => layout::unpack_q8_0x8(&w.stored_bytes(), k, m),
            Layout::Q4_0x8 => layout::unpack_q4_0x8(&w.stored_bytes(), k, m),
        };
        self.pending.push((
            w.name().to_string(),
            shape.to_vec(),
            Data::Packed(w.dtype(), Layout::Plain, bytes),
        ));
        Slot(self.pending.len() - 1)
    }

    /// Queue a plain q8_0 or q4_0 Linear weight `w` (`[k, m]`) in the int8 GEMM's layout
    /// (`q8_0x8`, `q4_0x8`), with zero rows appended up to the panels' height of 8, and its
    /// f32 bias (if any) with zeros after it likewise: `[k, m']` and `[m']`. For matrices whose
    /// row count the converter could not repack (the joint's output layer: vocabulary, blank
    /// and durations rows), which ggml would multiply with code compiled for the build's
    /// baseline. Returns the slots and `m'`, or `None` (nothing queued) for any other weight.
    pub fn push_int8_padded(
        &mut self,
        name: &str,
        w: &Weight,
        bias: Option<&Weight>,
    ) -> Option<PaddedLinear> {
        let [k, m, one, one2] = w.shape();
        let rows = m.next_multiple_of(layout::Q8_0X8_ROWS);
        let (layout, block_bytes) = match w.dtype() {
            DType::Q8_0 => (Layout::Q8_0x8, layout::Q8_0_BLOCK_BYTES),
            DType::Q4_0 => (Layout::Q4_0x8, layout::Q4_0_BLOCK_BYTES),
            _ => return None,
        };
        if w.layout() != Layout::Plain || one * one2 != 1 || !layout::can_repack(&[k, rows]) {
            return None;
        }
        let mut plain = w.stored_bytes();
        // A zero block is a zero scale and zero quants: its row's products are 0.
        plain.resize(rows * (k / layout::Q8_0_BLOCK) * block_bytes, 0);
        let packed = match layout {
            Layout::Q8_0x8 => layout::repack_q8_0x8(&plain, k, rows),
            _ => layout::repack_q4_0x8(&plain, k, rows),
        };
        self.pending.push((
            name.to_string(),
            vec![k, rows],
            Data::Packed(w.dtype(), layout, packed),
        ));
        let weight = Slot(self.pending.len() - 1);
        let bias = bias.map(|b| {
            let mut values = b.to_host_f32();
            values.resize(rows, 0.0);
            self.push(&format!("{name}.bias"), &[rows], values)
        });
        Some(PaddedLinear { weight, bias, rows })
    }

    /// Queue a torch Linear weight `w [m][k]` (row-major), stored panel-packed as the
    /// converter stores the encoder's linears. `m` must be a multiple of 16.
    pub fn push_panel16(&mut self, name: &str, m: usize, k: usize, w: &[f32]) -> Slot {
        let packed = layout::pack_panels(w, m, k);
        self.panel16.insert(name.to_string());
        self.push(name, &[k, m], packed)
    }

    /// [`realize_slots`](Self::realize_slots), each weight under the name it was queued with.
    pub fn realize(self) -> Result<HashMap<String, Weight>> {
        let names: Vec<String> = self.pending.iter().map(|(n, ..)| n.clone()).collect();
        let Realised(weights) = self.realize_slots()?;
        Ok(names.into_iter().zip(weights).collect())
    }

    /// Allocate one buffer (the CPU's, or the device's of [`HostWeights::on`]) for everything
    /// queued and upload it.
    pub fn realize_slots(self) -> Result<Realised> {
        if self.pending.is_empty() {
            return Ok(Realised(Vec::new()));
        }
        let n = self.pending.len();
        // SAFETY: metadata-only context sized for n tensors; one buffer allocated for all of
        // them; each upload writes exactly the tensor's byte size.
        unsafe {
            let ctx = sys::ggml_init(sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * (n + 1),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            });
            let ctx =
                NonNull::new(ctx).ok_or_else(|| err!(Internal, "ggml: cannot create a context"))?;
            let mut owner = WeightBuffers::new(ctx);
            let mut tensors = Vec::with_capacity(n);
            for (name, shape, data) in &self.pending {
                let ne: Vec<i64> = shape.iter().map(|&v| v as i64).collect();
                let dtype = match data {
                    Data::F32(_) => DType::F32,
                    Data::Packed(dtype, ..) => *dtype,
                };
                let t = sys::ggml_new_tensor(
                    ctx.as_ptr(),
                    dtype.to_ggml(),
                    ne.len() as i32,
                    ne.as_ptr(),
                );
                let t =
                    NonNull::new(t).ok_or_else(|| err!(Internal, "ggml: cannot create {name}"))?;
                let short: String = name.chars().take(MAX_NAME).collect();
                let c = CString::new(short).unwrap_or_default();
                sys::ggml_set_name(t.as_ptr(), c.as_ptr());
                tensors.push(t);
            }
            let buft = match self.device {
                None => sys::ggml_backend_cpu_buffer_type(),
                Some(d) => sys::ggml_backend_dev_buffer_type(d.raw()),
            };
            let buffer = sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buft);
            if buffer.is_null() {
                if let Some(d) = self.device {
                    let bytes: usize = tensors.iter().map(|t| sys::ggml_nbytes(t.as_ptr())).sum();
                    let (free, total) = d.memory();
                    bail!(
                        Options,
                        "--device {}: the model's {n} weights need {} of its memory, and it has \
                         {} free of {}; try a smaller type (`parakeet convert --type f16` or \
                         q8_0) or --device cpu",
                        d.describe(),
                        super::device::mib(bytes),
                        super::device::mib(free),
                        super::device::mib(total)
                    );
                }
                bail!(Internal, "ggml: cannot allocate {n} derived weights");
            }
            owner.buffer = buffer;
            sys::ggml_backend_buffer_set_usage(buffer, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            for (t, (_, _, data)) in tensors.iter().zip(&self.pending) {
                let (bytes, len) = match data {
                    Data::F32(v) => (v.as_ptr().cast::<u8>(), v.len() * 4),
                    Data::Packed(.., v) => (v.as_ptr(), v.len()),
                };
                debug_assert_eq!(len, sys::ggml_nbytes(t.as_ptr()));
                sys::ggml_backend_tensor_set(t.as_ptr(), bytes.cast(), 0, len);
            }
            let owner = Arc::new(owner);
            Ok(Realised(
                self.pending
                    .into_iter()
                    .zip(tensors)
                    .map(|((name, _, data), t)| {
                        let layout = match data {
                            Data::Packed(_, layout, _) => layout,
                            Data::F32(_) if self.panel16.contains(&name) => Layout::Panel16,
                            Data::F32(_) => Layout::Plain,
                        };
                        Weight {
                            ptr: t,
                            name: name.as_str().into(),
                            layout,
                            _owner: owner.clone(),
                        }
                    })
                    .collect(),
            ))
        }
    }
}

/// Copies of `weights` in `device`'s memory, in one buffer, realised once (a model's weights
/// for a GPU: one pass at load, nothing copied per compute). Each keeps its name, type and
/// layout; the CPU device gets the same weights back.
pub fn weights_on(device: Device, weights: &[Weight]) -> Result<Vec<Weight>> {
    if device.is_cpu() {
        return Ok(weights.to_vec());
    }
    let mut host = HostWeights::on(device);
    let slots: Vec<Slot> = weights.iter().map(|w| host.push_copy(w)).collect();
    let realised = host.realize_slots()?;
    Ok(slots.into_iter().map(|s| realised.get(s)).collect())
}

/// Bytes of the buffers under `weights` that live in `device`'s memory (each buffer once).
pub fn device_bytes<'a>(device: Device, weights: impl IntoIterator<Item = &'a Weight>) -> usize {
    let mut seen = std::collections::HashSet::new();
    weights
        .into_iter()
        .filter(|w| {
            let buffer = w._owner.buffer;
            // SAFETY: a live buffer of a live weight; its type is static.
            !buffer.is_null()
                && unsafe {
                    sys::ggml_backend_buft_get_device(sys::ggml_backend_buffer_get_type(buffer))
                        == device.raw()
                }
                && seen.insert(buffer as usize)
        })
        // SAFETY: as above.
        .map(|w| unsafe { sys::ggml_backend_buffer_get_size(w._owner.buffer) })
        .sum()
}
