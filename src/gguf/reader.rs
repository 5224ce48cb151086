//! GGUF reading: metadata, and weights realised ONCE into a backend buffer.
//!
//! The file is memory-mapped and the CPU backend wraps the mapping as its buffer, so the weights
//! are never copied (the kernel pages them in at load, with 2 MiB pages where it can:
//! [`super::pagecache`]). Every tensor's extent is checked against the file size before any
//! tensor is touched, so a truncated file is an error, not a segfault.

use crate::backend::DType;
use crate::backend::weight::{Weight, WeightBuffers};
use crate::error::{Context, Error, Result};
use crate::layout::{Layout, PANEL16_KEY, Q4_0X8_KEY, Q8_0X8_KEY};
use crate::{bail, err};
use llama_cpp_sys_2 as sys;
use memmap2::Mmap;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

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
    /// How errors name the file: what the user gave.
    shown: String,
    meta: HashMap<String, MetaValue>,
    weights: HashMap<String, Weight>,
    /// Tensor names in file order.
    order: Vec<String>,
}

impl GgufFile {
    /// Open and validate a GGUF: header, metadata, and every tensor's type and extent.
    pub fn open(path: &Path) -> Result<GgufFile> {
        GgufFile::open_as(path, &path.display().to_string())
    }

    /// [`GgufFile::open`], naming the file `shown` in every error (what the user gave, e.g.
    /// the `.nemo` a cached GGUF was converted from).
    pub fn open_as(path: &Path, shown: &str) -> Result<GgufFile> {
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
                    Model,
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
        let header = super::header::check_header(&map)
            .map_err(|e| err!(Model, "{shown}: malformed GGUF: {e}"))?;
        // With no tensors there is no data section to wrap (and its start need not be aligned).
        if header.n_tensors == 0 {
            bail!(Model, "{shown}: the GGUF holds no tensors: not a model");
        }

        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| err!(Model, "{shown}: path contains a NUL byte"))?;
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
            bail!(
                Model,
                "{shown}: malformed GGUF header (rejected by ggml's reader)"
            );
        }
        let guard = GgufGuard(gguf);
        let ctx = NonNull::new(meta_ctx).expect("checked above");
        // From here `owner` frees the ggml context on every path.
        let mut owner = WeightBuffers::new(ctx);
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
                bail!(Model, "{shown}: tensor '{name}' listed but not described");
            };
            // SAFETY: metadata of a live tensor.
            let (ty, nbytes) = unsafe { (t.as_ref().type_, sys::ggml_nbytes(t.as_ptr())) };
            if DType::from_ggml(ty).is_none() {
                bail!(
                    Model,
                    "{shown}: tensor '{name}' has unsupported type {ty} (f32, f16, q8_0, q4_0 only)"
                );
            }
            let start = data_offset + offset;
            let end = start.saturating_add(nbytes);
            if end as u64 > len {
                bail!(
                    Model,
                    "{shown}: truncated: tensor '{name}' needs bytes {start}..{end}, file has {len}"
                );
            }
            data_end = data_end.max(end);
            infos.push((name, t, start));
        }

        if !(map.as_ptr() as usize + data_offset).is_multiple_of(32) {
            bail!(
                Model,
                "{shown}: the tensor data at byte {data_offset} is not 32-byte aligned"
            );
        }
        // SAFETY: [data_offset, data_end) lies inside the mapping (checked per tensor); the
        // mapping is page-aligned and the data section 32-byte aligned (checked above).
        unsafe {
            let base = map.as_ptr().add(data_offset) as *mut std::ffi::c_void;
            let size = (data_end - data_offset).max(1);
            let buffer = sys::ggml_backend_cpu_buffer_from_ptr(base, size);
            if buffer.is_null() {
                bail!(
                    Internal,
                    "{shown}: could not wrap the weights in a backend buffer"
                );
            }
            owner.set_buffer(buffer);
            sys::ggml_backend_buffer_set_usage(buffer, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            for (name, t, start) in &infos {
                let addr = map.as_ptr().add(*start) as *mut std::ffi::c_void;
                if !(addr as usize).is_multiple_of(32) {
                    bail!(Model, "{shown}: tensor '{name}' is misaligned in the file");
                }
                if !t.as_ref().buffer.is_null() {
                    bail!(Model, "{shown}: tensor '{name}' is listed twice");
                }
                let st = sys::ggml_backend_tensor_alloc(buffer, t.as_ptr(), addr);
                if st != sys::GGML_STATUS_SUCCESS {
                    bail!(Internal, "{shown}: could not place tensor '{name}'");
                }
            }
        }
        owner.hold(map, file);
        let owner = Arc::new(owner);
        let order: Vec<String> = infos.iter().map(|(n, _, _)| n.clone()).collect();
        let packed = panel16_names(&meta, shown)?;
        let mut weights: HashMap<String, Weight> = infos
            .into_iter()
            .map(|(name, t, _)| {
                let layout = if packed.contains(&name) {
                    Layout::Panel16
                } else {
                    Layout::Plain
                };
                let w = Weight::new(t, &name, layout, owner.clone());
                (name, w)
            })
            .collect();
        for name in &packed {
            let w = weights.get(name).ok_or_else(|| {
                err!(
                    Model,
                    "{shown}: {PANEL16_KEY} names '{name}', which is not a tensor"
                )
            })?;
            if !Layout::Panel16.fits(w.dtype().elem(), &trim(w.shape())) {
                bail!(
                    Model,
                    "{shown}: tensor '{name}' is listed as panel-packed but is {} {:?} \
                     (needs a 2-D f32 matrix with a multiple of 16 rows)",
                    w.dtype().name(),
                    trim(w.shape())
                );
            }
        }
        mark_repacked(shown, &meta, &mut weights)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            shown: shown.to_string(),
            meta,
            weights,
            order,
        })
    }

    /// Maps every page of the weights now (the file into the page cache and our page tables),
    /// so that the first utterance does not fault them in one by one (about 6 % of the first
    /// f32 0.6b transcription, moved into the model load), with 2 MiB pages where the kernel
    /// can give them ([`super::pagecache`]: 2.5x the 1-thread 0.6b encoder on a VM). A hint
    /// only: errors are ignored, and the pages then come in on first use.
    pub fn populate(&self) {
        if let Some((map, file)) = self.weights.values().find_map(|w| w.mapping()) {
            super::pagecache::populate(map, file);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every weight copied once into `device`'s memory, in one buffer
    /// ([`crate::backend::weights_on`]); the mapping stays, unread from here on. A model too
    /// large for the device is an error naming it and the sizes.
    pub fn place_on(&mut self, device: crate::backend::Device) -> Result<()> {
        if device.is_cpu() {
            return Ok(());
        }
        let mut names: Vec<String> = self.weights.keys().cloned().collect();
        names.sort();
        let here: Vec<Weight> = names.iter().map(|n| self.weights[n].clone()).collect();
        let there = crate::backend::weights_on(device, &here)?;
        self.weights.extend(names.into_iter().zip(there));
        Ok(())
    }

    /// Bytes of this file's weights held in `device`'s memory.
    pub fn device_bytes(&self, device: crate::backend::Device) -> usize {
        crate::backend::device_bytes(device, self.weights.values())
    }

    /// How errors name the file: what the user gave (a `.nemo` for a cached conversion).
    pub fn shown(&self) -> &str {
        &self.shown
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

    fn missing(&self, key: &str) -> Error {
        err!(Model, "{}: metadata key '{key}' is missing", self.shown)
    }

    fn wrong(&self, key: &str, want: &str, got: &MetaValue) -> Error {
        err!(
            Model,
            "{}: metadata key '{key}' should be {want}, found {got:?}",
            self.shown
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
            .ok_or_else(|| err!(Model, "{}: tensor '{name}' is missing", self.shown))?;
        let mut want = [1usize; 4];
        want[..shape.len()].copy_from_slice(shape);
        if w.shape() != want {
            bail!(
                Model,
                "{}: tensor '{name}' has shape {:?}, expected {:?}",
                self.shown,
                trim(w.shape()),
                shape
            );
        }
        if !types.contains(&w.dtype()) {
            bail!(
                Model,
                "{}: tensor '{name}' has type {}, expected one of {:?}",
                self.shown,
                w.dtype().name(),
                types.iter().map(|t| t.name()).collect::<Vec<_>>()
            );
        }
        Ok(w.clone())
    }

    /// Every weight stored in one of our packed layouts replaced by its plain form, realised
    /// once ([`crate::backend::plain_weights`]): what ggml's built-in ops read. The file's
    /// packed pages stay mapped but unread.
    pub fn unpack_layouts(&mut self) -> Result<()> {
        let mut names: Vec<&String> = self
            .weights
            .iter()
            .filter(|(_, w)| w.layout() != Layout::Plain)
            .map(|(n, _)| n)
            .collect();
        names.sort();
        let names: Vec<String> = names.into_iter().cloned().collect();
        let packed: Vec<Weight> = names.iter().map(|n| self.weights[n].clone()).collect();
        let plain = crate::backend::plain_weights(&packed)?;
        self.weights.extend(names.into_iter().zip(plain));
        Ok(())
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
    shown: &str,
) -> Result<std::collections::HashSet<String>> {
    match meta.get(PANEL16_KEY) {
        None => Ok(Default::default()),
        Some(MetaValue::StrArray(names)) => Ok(names.iter().cloned().collect()),
        Some(_) => bail!(
            Model,
            "{shown}: metadata key '{PANEL16_KEY}' must be an array of tensor names"
        ),
    }
}

/// Flags the tensors that [`Q8_0X8_KEY`] and [`Q4_0X8_KEY`] list as stored in those layouts,
/// after checking that each exists and is a matrix of the right type that the layout can hold.
fn mark_repacked(
    shown: &str,
    meta: &HashMap<String, MetaValue>,
    weights: &mut HashMap<String, Weight>,
) -> Result<()> {
    for (layout, key) in [(Layout::Q8_0x8, Q8_0X8_KEY), (Layout::Q4_0x8, Q4_0X8_KEY)] {
        let names = match meta.get(key) {
            None => continue,
            Some(MetaValue::StrArray(v)) => v,
            Some(v) => bail!(
                Model,
                "{shown}: metadata key '{key}' should be a string array, found {v:?}"
            ),
        };
        let ty = layout.name().trim_end_matches("x8");
        for name in names {
            let Some(w) = weights.get_mut(name) else {
                bail!(
                    Model,
                    "{shown}: '{key}' lists tensor '{name}', which is missing"
                );
            };
            if !layout.fits(w.dtype().elem(), &trim(w.shape())) {
                bail!(
                    Model,
                    "{shown}: tensor '{name}' cannot be in the {} layout: it is {} {:?} ({ty} [k, m] with k % 32 == 0 and m % 8 == 0 needed)",
                    layout.name(),
                    w.dtype().name(),
                    trim(w.shape())
                );
            }
            w.set_layout(layout);
        }
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
