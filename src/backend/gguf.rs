//! GGUF reading: metadata, and weights realised ONCE into a backend buffer.
//!
//! The file is memory-mapped and the CPU backend wraps the mapping as its buffer, so the weights
//! are never copied (the kernel pages them in at load, with 2 MiB pages where it can:
//! `backend::pagecache`). Every tensor's extent is checked against the file size before any
//! tensor is touched, so a truncated file is an error, not a segfault.

use super::qgemm;
use super::{DType, MAX_NAME};
use anyhow::{Context, Result, anyhow, bail};
use llama_cpp_sys_2 as sys;
use memmap2::Mmap;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

/// Owns the ggml objects behind a set of weights; freed when the last [`Weight`] goes.
struct WeightBuffers {
    ctx: NonNull<sys::ggml_context>,
    buffer: sys::ggml_backend_buffer_t,
    // Keeps the mapping alive under a zero-copy buffer.
    _map: Option<Mmap>,
    // The mapped file, for page-cache hints (`backend::pagecache`).
    file: Option<std::fs::File>,
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

/// How a weight's elements are ordered in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// ggml's own order (`ne0` fastest); every ggml op can read it.
    Plain,
    /// An f32 matrix packed in 16-row panels for the encoder's GEMM ([`super::sgemm`]); only
    /// `Graph::linear` reads it.
    Panel16,
    /// q8_0 blocks repacked into 8-row panels for the int8 kernel ([`super::qgemm`]); only
    /// `Graph::linear` reads it.
    Q8_0x8,
}

/// GGUF key listing the tensors stored in the [`Layout::Panel16`] order.
pub const PANEL16_KEY: &str = "parakeet.layout.panel16";

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Plain => "plain",
            Layout::Panel16 => "panel16",
            Layout::Q8_0x8 => "q8_0x8",
        }
    }
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
            return super::sgemm::unpack_panels(&plain.to_host_f32(), m, k);
        }
        let mut raw = vec![0u8; self.bytes()];
        // SAFETY: the tensor is allocated; raw has exactly its size.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), raw.as_mut_ptr().cast(), 0, raw.len()) };
        if self.layout == Layout::Q8_0x8 {
            let [k, m, ..] = self.shape();
            raw = qgemm::unpack_q8_0x8(&raw, k, m);
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

/// Converts elements to a type's bytes with ggml's own routines (f16 rounding, q8_0 blocks).
/// `n_per_row` must be a multiple of the type's block size.
pub fn quantize_rows(data: &[f32], n_per_row: usize, ty: DType) -> Result<Vec<u8>> {
    if n_per_row == 0
        || !data.len().is_multiple_of(n_per_row)
        || !n_per_row.is_multiple_of(ty.block_size())
    {
        bail!(
            "cannot store {} values in rows of {n_per_row} as {}",
            data.len(),
            ty.name()
        );
    }
    let rows = data.len() / n_per_row;
    match ty {
        DType::F32 => Ok(data.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I32 => bail!("i32 is not a weight storage type"),
        _ => {
            let mut out = vec![0u8; ty.row_bytes(n_per_row) * rows];
            // SAFETY: out holds rows * row_size bytes; data holds rows * n_per_row floats.
            let written = unsafe {
                sys::ggml_quantize_chunk(
                    ty.to_ggml(),
                    data.as_ptr(),
                    out.as_mut_ptr().cast(),
                    0,
                    rows as i64,
                    n_per_row as i64,
                    std::ptr::null(),
                )
            };
            debug_assert_eq!(written, out.len());
            Ok(out)
        }
    }
}

/// A metadata value, as far as the runtime needs them.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    IntArray(Vec<i64>),
    StrArray(Vec<String>),
    Other(&'static str),
    FloatArray(Vec<f32>),
    /// A u8 array (e.g. the tokenizer's normalisation table).
    Bytes(Vec<u8>),
}

/// An open GGUF file: its metadata and its weights (zero-copy over the mapping).
pub struct GgufFile {
    path: PathBuf,
    meta: HashMap<String, MetaValue>,
    weights: HashMap<String, Weight>,
    /// Tensor names in file order.
    order: Vec<String>,
}

impl GgufFile {
    /// Open and validate a GGUF: header, metadata, and every tensor's type and extent.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let shown = path.display();
        let file = std::fs::File::open(path)
            .with_context(|| format!("{shown}: cannot open model file"))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        // GGUF magic before handing the file to ggml, so a random file gets a plain answer.
        let mut magic = [0u8; 4];
        {
            use std::io::Read;
            let mut f = &file;
            if len < 24 || f.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
                bail!(
                    "{shown}: not a GGUF model file (bad magic); convert a .nemo with `parakeet convert`"
                );
            }
        }
        // SAFETY: the file is opened read-only and we never write through the mapping; the
        // mapping must not change underneath us (documented limitation, as for every mmap loader).
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("{shown}: cannot memory-map model file"))?;
        // Before any page is touched, so that pages read in from the file come in 2 MiB folios.
        super::pagecache::advise_huge(&map);
        // Our own walk first: it names the defective field and its offset, where ggml's
        // reader only fails.
        let header = super::gguf_header::check_header(&map)
            .map_err(|e| anyhow!("{shown}: malformed GGUF: {e}"))?;
        // With no tensors there is no data section to wrap (and its start need not be aligned).
        if header.n_tensors == 0 {
            bail!("{shown}: the GGUF holds no tensors: not a model");
        }

        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| anyhow!("{shown}: path contains a NUL byte"))?;
        let mut meta_ctx: *mut sys::ggml_context = std::ptr::null_mut();
        // SAFETY: ggml parses the header and tensor infos (no data: no_alloc) and returns null
        // on malformed input.
        let gguf = unsafe {
            sys::gguf_init_from_file(
                cpath.as_ptr(),
                sys::gguf_init_params {
                    no_alloc: true,
                    ctx: &mut meta_ctx,
                },
            )
        };
        if gguf.is_null() || meta_ctx.is_null() {
            bail!("{shown}: malformed GGUF header (rejected by ggml's reader)");
        }
        let guard = GgufGuard(gguf);
        let ctx = NonNull::new(meta_ctx).expect("checked above");
        // From here `owner` frees the ggml context on every path.
        let mut owner = WeightBuffers {
            ctx,
            buffer: std::ptr::null_mut(),
            _map: None,
            file: None,
        };
        let meta = read_metadata(guard.0);
        // SAFETY: gguf is live.
        let data_offset = unsafe { sys::gguf_get_data_offset(guard.0) };
        // SAFETY: gguf is live.
        let n_tensors = unsafe { sys::gguf_get_n_tensors(guard.0) };

        let mut infos = Vec::with_capacity(n_tensors.max(0) as usize);
        let mut data_end = data_offset;
        for i in 0..n_tensors {
            // SAFETY: i < n_tensors.
            let (name, offset) = unsafe {
                (
                    CStr::from_ptr(sys::gguf_get_tensor_name(guard.0, i))
                        .to_string_lossy()
                        .into_owned(),
                    sys::gguf_get_tensor_offset(guard.0, i),
                )
            };
            let cname = CString::new(name.clone()).expect("from a C string");
            // SAFETY: lookup by name in the metadata context.
            let t = unsafe { sys::ggml_get_tensor(ctx.as_ptr(), cname.as_ptr()) };
            let Some(t) = NonNull::new(t) else {
                bail!("{shown}: tensor '{name}' listed but not described");
            };
            // SAFETY: metadata of a live tensor.
            let (ty, nbytes) = unsafe { (t.as_ref().type_, sys::ggml_nbytes(t.as_ptr())) };
            if DType::from_ggml(ty).is_none() {
                bail!(
                    "{shown}: tensor '{name}' has unsupported type {ty} (f32, f16, q8_0, q4_0 only)"
                );
            }
            let start = data_offset + offset;
            let end = start.saturating_add(nbytes);
            if end as u64 > len {
                bail!(
                    "{shown}: truncated: tensor '{name}' needs bytes {start}..{end}, file has {len}"
                );
            }
            data_end = data_end.max(end);
            infos.push((name, t, start));
        }

        if !(map.as_ptr() as usize + data_offset).is_multiple_of(32) {
            bail!("{shown}: the tensor data at byte {data_offset} is not 32-byte aligned");
        }
        // SAFETY: [data_offset, data_end) lies inside the mapping (checked per tensor); the
        // mapping is page-aligned and the data section 32-byte aligned (checked above).
        unsafe {
            let base = map.as_ptr().add(data_offset) as *mut std::ffi::c_void;
            let size = (data_end - data_offset).max(1);
            let buffer = sys::ggml_backend_cpu_buffer_from_ptr(base, size);
            if buffer.is_null() {
                bail!("{shown}: could not wrap the weights in a backend buffer");
            }
            owner.buffer = buffer;
            sys::ggml_backend_buffer_set_usage(buffer, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            for (name, t, start) in &infos {
                let addr = map.as_ptr().add(*start) as *mut std::ffi::c_void;
                if !(addr as usize).is_multiple_of(32) {
                    bail!("{shown}: tensor '{name}' is misaligned in the file");
                }
                if !t.as_ref().buffer.is_null() {
                    bail!("{shown}: tensor '{name}' is listed twice");
                }
                let st = sys::ggml_backend_tensor_alloc(buffer, t.as_ptr(), addr);
                if st != sys::GGML_STATUS_SUCCESS {
                    bail!("{shown}: could not place tensor '{name}'");
                }
            }
        }
        owner._map = Some(map);
        owner.file = Some(file);
        let owner = Arc::new(owner);
        let order: Vec<String> = infos.iter().map(|(n, _, _)| n.clone()).collect();
        let packed = panel16_names(&meta, path)?;
        let mut weights: HashMap<String, Weight> = infos
            .into_iter()
            .map(|(name, t, _)| {
                let layout = if packed.contains(&name) {
                    Layout::Panel16
                } else {
                    Layout::Plain
                };
                let w = Weight {
                    ptr: t,
                    name: name.as_str().into(),
                    layout,
                    _owner: owner.clone(),
                };
                (name, w)
            })
            .collect();
        for name in &packed {
            let w = weights.get(name).ok_or_else(|| {
                anyhow!("{shown}: {PANEL16_KEY} names '{name}', which is not a tensor")
            })?;
            let [_, m, a, b] = w.shape();
            if w.dtype() != DType::F32 || !m.is_multiple_of(super::sgemm::PANEL) || a * b != 1 {
                bail!(
                    "{shown}: tensor '{name}' is listed as panel-packed but is {} {:?} \
                     (needs a 2-D f32 matrix with a multiple of 16 rows)",
                    w.dtype().name(),
                    trim(w.shape())
                );
            }
        }
        mark_repacked(path, &meta, &mut weights)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            meta,
            weights,
            order,
        })
    }

    /// Maps every page of the weights now (the file into the page cache and our page tables),
    /// so that the first utterance does not fault them in one by one (about 6 % of the first
    /// f32 0.6b transcription, moved into the model load), with 2 MiB pages where the kernel
    /// can give them (`backend::pagecache`: 2.5x the 1-thread 0.6b encoder on a VM). A hint
    /// only: errors are ignored, and the pages then come in on first use.
    pub fn populate(&self) {
        if let Some(owner) = self.weights.values().next().map(|w| &w._owner)
            && let (Some(map), Some(file)) = (&owner._map, &owner.file)
        {
            super::pagecache::populate(map, file);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, MetaValue> {
        &self.meta
    }

    pub fn tensor_names(&self) -> &[String] {
        &self.order
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta.get(key)
    }

    fn missing(&self, key: &str) -> anyhow::Error {
        anyhow!("{}: metadata key '{key}' is missing", self.path.display())
    }

    fn wrong(&self, key: &str, want: &str, got: &MetaValue) -> anyhow::Error {
        anyhow!(
            "{}: metadata key '{key}' should be {want}, found {got:?}",
            self.path.display()
        )
    }

    pub fn str(&self, key: &str) -> Result<String> {
        match self.get(key) {
            Some(MetaValue::Str(s)) => Ok(s.clone()),
            Some(v) => Err(self.wrong(key, "a string", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn u32(&self, key: &str) -> Result<u32> {
        match self.get(key) {
            Some(MetaValue::Int(v)) if (0..=u32::MAX as i64).contains(v) => Ok(*v as u32),
            Some(v) => Err(self.wrong(key, "an unsigned integer", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        match self.get(key) {
            Some(MetaValue::Float(v)) => Ok(*v as f32),
            Some(MetaValue::Int(v)) => Ok(*v as f32),
            Some(v) => Err(self.wrong(key, "a number", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.get(key) {
            Some(MetaValue::Bool(v)) => Ok(*v),
            Some(v) => Err(self.wrong(key, "a bool", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn int_array(&self, key: &str) -> Result<Vec<i64>> {
        match self.get(key) {
            Some(MetaValue::IntArray(v)) => Ok(v.clone()),
            Some(v) => Err(self.wrong(key, "an integer array", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn str_array(&self, key: &str) -> Result<Vec<String>> {
        match self.get(key) {
            Some(MetaValue::StrArray(v)) => Ok(v.clone()),
            Some(v) => Err(self.wrong(key, "a string array", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.weights.contains_key(name)
    }

    /// The weight `name`, checked against `shape` (ggml order, trailing 1s may be omitted) and
    /// the allowed types. Errors name the file and the tensor.
    pub fn weight(&self, name: &str, shape: &[usize], types: &[DType]) -> Result<Weight> {
        let w = self
            .weights
            .get(name)
            .ok_or_else(|| anyhow!("{}: tensor '{name}' is missing", self.path.display()))?;
        let mut want = [1usize; 4];
        want[..shape.len()].copy_from_slice(shape);
        if w.shape() != want {
            bail!(
                "{}: tensor '{name}' has shape {:?}, expected {:?}",
                self.path.display(),
                trim(w.shape()),
                shape
            );
        }
        if !types.contains(&w.dtype()) {
            bail!(
                "{}: tensor '{name}' has type {}, expected one of {:?}",
                self.path.display(),
                w.dtype().name(),
                types.iter().map(|t| t.name()).collect::<Vec<_>>()
            );
        }
        Ok(w.clone())
    }

    /// A weight of any shape/type (for `info`-style listings).
    pub fn any_weight(&self, name: &str) -> Option<&Weight> {
        self.weights.get(name)
    }

    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>> {
        match self.get(key) {
            Some(MetaValue::FloatArray(v)) => Ok(v.clone()),
            Some(v) => Err(self.wrong(key, "an f32 array", v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn bytes(&self, key: &str) -> Result<Vec<u8>> {
        match self.get(key) {
            Some(MetaValue::Bytes(v)) => Ok(v.clone()),
            Some(v) => Err(self.wrong(key, "a u8 array", v)),
            None => Err(self.missing(key)),
        }
    }
}

/// The tensors the file stores panel-packed (none for files written before the layout).
fn panel16_names(
    meta: &HashMap<String, MetaValue>,
    path: &Path,
) -> Result<std::collections::HashSet<String>> {
    match meta.get(PANEL16_KEY) {
        None => Ok(Default::default()),
        Some(MetaValue::StrArray(names)) => Ok(names.iter().cloned().collect()),
        Some(_) => bail!(
            "{}: metadata key '{PANEL16_KEY}' must be an array of tensor names",
            path.display()
        ),
    }
}

/// Flags the tensors that [`qgemm::Q8_0X8_KEY`] lists as stored in the `q8_0x8` layout, after
/// checking that each exists and is a q8_0 matrix that layout can hold.
fn mark_repacked(
    path: &Path,
    meta: &HashMap<String, MetaValue>,
    weights: &mut HashMap<String, Weight>,
) -> Result<()> {
    let shown = path.display();
    let names = match meta.get(qgemm::Q8_0X8_KEY) {
        None => return Ok(()),
        Some(MetaValue::StrArray(v)) => v,
        Some(v) => bail!(
            "{shown}: metadata key '{}' should be a string array, found {v:?}",
            qgemm::Q8_0X8_KEY
        ),
    };
    for name in names {
        let Some(w) = weights.get_mut(name) else {
            bail!(
                "{shown}: '{}' lists tensor '{name}', which is missing",
                qgemm::Q8_0X8_KEY
            );
        };
        if w.dtype() != DType::Q8_0 || !qgemm::can_repack(&trim(w.shape())) {
            bail!(
                "{shown}: tensor '{name}' cannot be in the q8_0x8 layout: it is {} {:?} (q8_0 [k, m] with k % 32 == 0 and m % 8 == 0 needed)",
                w.dtype().name(),
                trim(w.shape())
            );
        }
        w.layout = Layout::Q8_0x8;
    }
    Ok(())
}

fn trim(s: [usize; 4]) -> Vec<usize> {
    let n = s.iter().rposition(|&v| v != 1).map_or(1, |i| i + 1);
    s[..n].to_vec()
}

struct GgufGuard(*mut sys::gguf_context);

impl Drop for GgufGuard {
    fn drop(&mut self) {
        // SAFETY: created by gguf_init_from_file, freed once.
        unsafe { sys::gguf_free(self.0) };
    }
}

fn read_metadata(gguf: *mut sys::gguf_context) -> HashMap<String, MetaValue> {
    let mut out = HashMap::new();
    // SAFETY: every index is < n_kv and each getter is called only for its own type (ggml
    // asserts the type otherwise).
    unsafe {
        for i in 0..sys::gguf_get_n_kv(gguf) {
            let key = CStr::from_ptr(sys::gguf_get_key(gguf, i))
                .to_string_lossy()
                .into_owned();
            let v = match sys::gguf_get_kv_type(gguf, i) {
                sys::GGUF_TYPE_UINT8 => MetaValue::Int(sys::gguf_get_val_u8(gguf, i) as i64),
                sys::GGUF_TYPE_INT8 => MetaValue::Int(sys::gguf_get_val_i8(gguf, i) as i64),
                sys::GGUF_TYPE_UINT16 => MetaValue::Int(sys::gguf_get_val_u16(gguf, i) as i64),
                sys::GGUF_TYPE_INT16 => MetaValue::Int(sys::gguf_get_val_i16(gguf, i) as i64),
                sys::GGUF_TYPE_UINT32 => MetaValue::Int(sys::gguf_get_val_u32(gguf, i) as i64),
                sys::GGUF_TYPE_INT32 => MetaValue::Int(sys::gguf_get_val_i32(gguf, i) as i64),
                sys::GGUF_TYPE_UINT64 => MetaValue::Int(sys::gguf_get_val_u64(gguf, i) as i64),
                sys::GGUF_TYPE_INT64 => MetaValue::Int(sys::gguf_get_val_i64(gguf, i)),
                sys::GGUF_TYPE_FLOAT32 => MetaValue::Float(sys::gguf_get_val_f32(gguf, i) as f64),
                sys::GGUF_TYPE_FLOAT64 => MetaValue::Float(sys::gguf_get_val_f64(gguf, i)),
                sys::GGUF_TYPE_BOOL => MetaValue::Bool(sys::gguf_get_val_bool(gguf, i)),
                sys::GGUF_TYPE_STRING => MetaValue::Str(
                    CStr::from_ptr(sys::gguf_get_val_str(gguf, i))
                        .to_string_lossy()
                        .into_owned(),
                ),
                sys::GGUF_TYPE_ARRAY => read_array(gguf, i),
                _ => MetaValue::Other("unknown"),
            };
            out.insert(key, v);
        }
    }
    out
}

/// # Safety
/// `i` is the index of an array-typed key of `gguf`.
unsafe fn read_array(gguf: *mut sys::gguf_context, i: i64) -> MetaValue {
    // SAFETY: per the contract; element reads stay below gguf_get_arr_n.
    unsafe {
        let n = sys::gguf_get_arr_n(gguf, i);
        // gguf_get_arr_data asserts on string arrays: only called for numeric ones.
        macro_rules! ints {
            ($t:ty) => {{
                let data = sys::gguf_get_arr_data(gguf, i);
                let s = std::slice::from_raw_parts(data as *const $t, n);
                MetaValue::IntArray(s.iter().map(|&v| v as i64).collect())
            }};
        }
        match sys::gguf_get_arr_type(gguf, i) {
            sys::GGUF_TYPE_STRING => MetaValue::StrArray(
                (0..n)
                    .map(|j| {
                        CStr::from_ptr(sys::gguf_get_arr_str(gguf, i, j))
                            .to_string_lossy()
                            .into_owned()
                    })
                    .collect(),
            ),
            sys::GGUF_TYPE_INT32 => ints!(i32),
            sys::GGUF_TYPE_UINT32 => ints!(u32),
            sys::GGUF_TYPE_INT64 => ints!(i64),
            sys::GGUF_TYPE_UINT64 => ints!(u64),
            sys::GGUF_TYPE_INT16 => ints!(i16),
            sys::GGUF_TYPE_UINT16 => ints!(u16),
            sys::GGUF_TYPE_INT8 => ints!(i8),
            // An empty array's data pointer may be null, which no slice may hold.
            sys::GGUF_TYPE_UINT8 if n == 0 => MetaValue::Bytes(Vec::new()),
            sys::GGUF_TYPE_UINT8 => {
                let data = sys::gguf_get_arr_data(gguf, i) as *const u8;
                MetaValue::Bytes(std::slice::from_raw_parts(data, n).to_vec())
            }
            sys::GGUF_TYPE_FLOAT32 if n == 0 => MetaValue::FloatArray(Vec::new()),
            sys::GGUF_TYPE_FLOAT32 => {
                let data = sys::gguf_get_arr_data(gguf, i) as *const f32;
                MetaValue::FloatArray(std::slice::from_raw_parts(data, n).to_vec())
            }
            _ => MetaValue::Other("array"),
        }
    }
}

/// Weights computed on the host at load time (e.g. BatchNorm folded into a conv), realised once
/// into their own backend buffer.
#[derive(Default)]
pub struct HostWeights {
    pending: Vec<(String, Vec<usize>, Vec<f32>)>,
    panel16: std::collections::HashSet<String>,
}

impl HostWeights {
    pub fn new() -> HostWeights {
        HostWeights::default()
    }

    /// Queue an f32 tensor (`shape` in ggml order).
    pub fn push(&mut self, name: &str, shape: &[usize], data: Vec<f32>) {
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
        self.pending.push((name.to_string(), shape.to_vec(), data));
    }

    /// Queue a torch Linear weight `w [m][k]` (row-major), stored panel-packed as the
    /// converter stores the encoder's linears. `m` must be a multiple of 16.
    pub fn push_panel16(&mut self, name: &str, m: usize, k: usize, w: &[f32]) {
        let packed = super::sgemm::pack_panels(w, m, k);
        self.push(name, &[k, m], packed);
        self.panel16.insert(name.to_string());
    }

    /// Allocate one CPU buffer for everything queued and upload it.
    pub fn realize(self) -> Result<HashMap<String, Weight>> {
        if self.pending.is_empty() {
            return Ok(HashMap::new());
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
            let ctx = NonNull::new(ctx).ok_or_else(|| anyhow!("ggml: cannot create a context"))?;
            let mut owner = WeightBuffers {
                ctx,
                buffer: std::ptr::null_mut(),
                _map: None,
                file: None,
            };
            let mut tensors = Vec::with_capacity(n);
            for (name, shape, _) in &self.pending {
                let ne: Vec<i64> = shape.iter().map(|&v| v as i64).collect();
                let t = sys::ggml_new_tensor(
                    ctx.as_ptr(),
                    sys::GGML_TYPE_F32,
                    ne.len() as i32,
                    ne.as_ptr(),
                );
                let t = NonNull::new(t).ok_or_else(|| anyhow!("ggml: cannot create {name}"))?;
                let short: String = name.chars().take(MAX_NAME).collect();
                let c = CString::new(short).unwrap_or_default();
                sys::ggml_set_name(t.as_ptr(), c.as_ptr());
                tensors.push(t);
            }
            let buft = sys::ggml_backend_cpu_buffer_type();
            let buffer = sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buft);
            if buffer.is_null() {
                bail!("ggml: cannot allocate {n} derived weights");
            }
            owner.buffer = buffer;
            sys::ggml_backend_buffer_set_usage(buffer, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            for (t, (_, _, data)) in tensors.iter().zip(&self.pending) {
                sys::ggml_backend_tensor_set(t.as_ptr(), data.as_ptr().cast(), 0, data.len() * 4);
            }
            let owner = Arc::new(owner);
            Ok(self
                .pending
                .into_iter()
                .zip(tensors)
                .map(|((name, _, _), t)| {
                    let layout = if self.panel16.contains(&name) {
                        Layout::Panel16
                    } else {
                        Layout::Plain
                    };
                    let w = Weight {
                        ptr: t,
                        name: name.as_str().into(),
                        layout,
                        _owner: owner.clone(),
                    };
                    (name, w)
                })
                .collect())
        }
    }
}
