//! GGUF writing over ggml's `gguf_*` API.
//!
//! ggml lays out the header (metadata and tensor infos, with every tensor's offset); the tensor
//! bytes are streamed by [`GgufWriter::write`], one tensor at a time, from a caller-supplied
//! source. So a converter holds at most one tensor beyond what it already has, never a second
//! copy of the model. The file appears under its final name only once complete.

use crate::backend::{DType, MAX_NAME, quantize_rows};
use crate::error::{Context, Result};
use crate::layout::{self, Layout};
use crate::{bail, ensure, err};
use llama_cpp_sys_2 as sys;
use std::collections::HashSet;
use std::ffi::{CString, c_char};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// A GGUF file being assembled: metadata is set directly, tensors are declared with
/// [`add_tensor`](Self::add_tensor) and their data supplied at [`write`](Self::write) time.
pub struct GgufWriter {
    ctx: NonNull<sys::gguf_context>,
    tensors: Vec<PlannedTensor>,
    names: HashSet<String>,
}

struct PlannedTensor {
    name: String,
    ne: Vec<usize>,
    ty: DType,
    layout: Layout,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        // SAFETY: created by gguf_init_empty, freed once.
        unsafe { sys::gguf_free(self.ctx.as_ptr()) };
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        // SAFETY: plain constructor (C++ `new`; it never returns null).
        let ctx = unsafe { sys::gguf_init_empty() };
        let ctx = NonNull::new(ctx).expect("gguf_init_empty returned null");
        Self {
            ctx,
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    pub fn set_str(&mut self, key: &str, value: &str) -> Result<()> {
        let (k, v) = (c_key(key)?, c_text(key, value)?);
        // SAFETY: ctx is live; both strings are NUL-terminated and copied by ggml.
        unsafe { sys::gguf_set_val_str(self.ctx.as_ptr(), k.as_ptr(), v.as_ptr()) };
        Ok(())
    }

    pub fn set_u32(&mut self, key: &str, value: u32) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: ctx is live; c_key rejects the reserved alignment key.
        unsafe { sys::gguf_set_val_u32(self.ctx.as_ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_i32(&mut self, key: &str, value: i32) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: as above.
        unsafe { sys::gguf_set_val_i32(self.ctx.as_ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_f32(&mut self, key: &str, value: f32) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: as above.
        unsafe { sys::gguf_set_val_f32(self.ctx.as_ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_bool(&mut self, key: &str, value: bool) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: as above.
        unsafe { sys::gguf_set_val_bool(self.ctx.as_ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_i32_array(&mut self, key: &str, values: &[i32]) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: ggml copies `values.len()` elements of 4 bytes from the slice.
        unsafe {
            sys::gguf_set_arr_data(
                self.ctx.as_ptr(),
                k.as_ptr(),
                sys::GGUF_TYPE_INT32,
                values.as_ptr().cast(),
                values.len(),
            )
        };
        Ok(())
    }

    pub fn set_str_array(&mut self, key: &str, values: &[String]) -> Result<()> {
        let k = c_key(key)?;
        let owned = values
            .iter()
            .map(|v| c_text(key, v))
            .collect::<Result<Vec<_>>>()?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: `ptrs` holds `values.len()` NUL-terminated strings that outlive the call;
        // ggml copies them.
        unsafe {
            sys::gguf_set_arr_str(
                self.ctx.as_ptr(),
                k.as_ptr(),
                ptrs.as_ptr().cast_mut(),
                ptrs.len(),
            )
        };
        Ok(())
    }

    /// Declares a tensor: `ne` in ggml order (`ne[0]` is the row length, fastest), stored as
    /// `ty` (f32, f16 or q8_0). Its f32 data is asked for by [`write`](Self::write).
    pub fn add_tensor(&mut self, name: &str, ne: &[usize], ty: DType) -> Result<()> {
        self.add_tensor_with_layout(name, ne, ty, Layout::Plain)
    }

    /// [`add_tensor`](Self::add_tensor), its bytes arranged in `layout` (chosen by
    /// [`layout::choose`]): [`write`](Self::write) packs them and lists the tensor under the
    /// layout's key ([`Layout::key`]).
    pub fn add_tensor_with_layout(
        &mut self,
        name: &str,
        ne: &[usize],
        ty: DType,
        layout: Layout,
    ) -> Result<()> {
        validate_tensor(name, ne, ty)?;
        ensure!(
            layout.fits(ty.elem(), ne),
            Model,
            "tensor {name}: {} {ne:?} cannot be stored in the {} layout",
            ty.name(),
            layout.name()
        );
        ensure!(
            !self.names.contains(name),
            Model,
            "duplicate tensor name {name}"
        );
        let cname = CString::new(name).expect("validated: no NUL");
        let ne64: Vec<i64> = ne.iter().map(|&n| n as i64).collect();
        // SAFETY: a metadata-only context sized for one tensor; gguf_add_tensor copies the
        // tensor struct (name, type, ne), so the context can be freed right after. The name is
        // unique (checked above; ggml would abort) and fits GGML_MAX_NAME.
        unsafe {
            let ctx = sys::ggml_init(sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead(),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            });
            let ctx =
                NonNull::new(ctx).ok_or_else(|| err!(Internal, "ggml: cannot create a context"))?;
            let t =
                sys::ggml_new_tensor(ctx.as_ptr(), ty.to_ggml(), ne64.len() as i32, ne64.as_ptr());
            if t.is_null() {
                sys::ggml_free(ctx.as_ptr());
                bail!(Internal, "ggml: cannot describe tensor {name}");
            }
            sys::ggml_set_name(t, cname.as_ptr());
            sys::gguf_add_tensor(self.ctx.as_ptr(), t);
            sys::ggml_free(ctx.as_ptr());
        }
        self.names.insert(name.to_owned());
        self.tensors.push(PlannedTensor {
            name: name.to_owned(),
            ne: ne.to_vec(),
            ty,
            layout,
        });
        Ok(())
    }

    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Writes the file. `source(i)` returns tensor `i`'s values (declaration order) as f32 in
    /// row-major order; each is converted to its declared type, written, and dropped before the
    /// next is requested. The file is written next to `path` and renamed over it at the end, so
    /// `path` is never left half-written. Returns the file size.
    pub fn write(
        mut self,
        path: &Path,
        mut source: impl FnMut(usize) -> Result<Vec<f32>>,
    ) -> Result<u64> {
        self.list_layouts()?;
        let partial = PartialFile::create(path)?;
        let mut out = BufWriter::with_capacity(1 << 20, &partial.file);
        let meta = self.meta_bytes();
        out.write_all(&meta)?;
        let mut pos = meta.len() as u64;
        // SAFETY: ctx is live.
        let align = unsafe { sys::gguf_get_alignment(self.ctx.as_ptr()) } as u64;
        for (i, t) in self.tensors.iter().enumerate() {
            // SAFETY: i < number of tensors added.
            let (offset, size) = unsafe {
                (
                    sys::gguf_get_tensor_offset(self.ctx.as_ptr(), i as i64) as u64,
                    sys::gguf_get_tensor_size(self.ctx.as_ptr(), i as i64),
                )
            };
            ensure!(
                pos == meta.len() as u64 + offset,
                Internal,
                "internal: tensor {} misplaced",
                t.name
            );
            let bytes = encode(t, source(i)?)?;
            ensure!(
                bytes.len() == size,
                Internal,
                "internal: tensor {} is {} bytes, expected {size}",
                t.name,
                bytes.len()
            );
            out.write_all(&bytes)?;
            let padded = (bytes.len() as u64).next_multiple_of(align);
            out.write_all(&vec![0u8; (padded - bytes.len() as u64) as usize])?;
            pos += padded;
        }
        out.flush()?;
        drop(out);
        partial.commit().map(|()| pos)
    }

    /// The metadata keys naming the tensors stored in each packed layout, in declaration order
    /// (none for a layout no tensor uses).
    fn list_layouts(&mut self) -> Result<()> {
        for (layout, key) in Layout::ALL.iter().filter_map(|&l| Some((l, l.key()?))) {
            let names: Vec<String> = self
                .tensors
                .iter()
                .filter(|t| t.layout == layout)
                .map(|t| t.name.clone())
                .collect();
            if !names.is_empty() {
                self.set_str_array(key, &names)?;
            }
        }
        Ok(())
    }

    /// Header, metadata and tensor infos, padded to the data alignment.
    fn meta_bytes(&self) -> Vec<u8> {
        // SAFETY: ctx is live; the buffer has exactly gguf_get_meta_size bytes.
        unsafe {
            let mut meta = vec![0u8; sys::gguf_get_meta_size(self.ctx.as_ptr())];
            sys::gguf_get_meta_data(self.ctx.as_ptr(), meta.as_mut_ptr().cast());
            meta
        }
    }

    pub fn set_f32_array(&mut self, key: &str, values: &[f32]) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: ggml copies `values.len()` elements of 4 bytes from the slice.
        unsafe {
            sys::gguf_set_arr_data(
                self.ctx.as_ptr(),
                k.as_ptr(),
                sys::GGUF_TYPE_FLOAT32,
                values.as_ptr().cast(),
                values.len(),
            )
        };
        Ok(())
    }

    /// A u8 array.
    pub fn set_bytes(&mut self, key: &str, values: &[u8]) -> Result<()> {
        let k = c_key(key)?;
        // SAFETY: ggml copies `values.len()` bytes from the slice.
        unsafe {
            sys::gguf_set_arr_data(
                self.ctx.as_ptr(),
                k.as_ptr(),
                sys::GGUF_TYPE_UINT8,
                values.as_ptr().cast(),
                values.len(),
            )
        };
        Ok(())
    }
}

fn validate_tensor(name: &str, ne: &[usize], ty: DType) -> Result<()> {
    ensure!(
        !name.is_empty() && name.len() <= MAX_NAME,
        Model,
        "tensor name {name:?} must be 1 to {MAX_NAME} bytes"
    );
    ensure!(
        !name.contains('\0'),
        Model,
        "tensor name {name:?} contains a NUL byte"
    );
    ensure!(
        (1..=4).contains(&ne.len()),
        Model,
        "tensor {name}: {} dimensions (1 to 4 supported)",
        ne.len()
    );
    ensure!(
        ne.iter().all(|&n| n > 0 && n <= i64::MAX as usize),
        Model,
        "tensor {name}: bad shape {ne:?}"
    );
    ensure!(
        matches!(ty, DType::F32 | DType::F16 | DType::Q8_0 | DType::Q4_0),
        Model,
        "tensor {name}: cannot store as {}",
        ty.name()
    );
    ensure!(
        ne[0].is_multiple_of(ty.block_size()),
        Model,
        "tensor {name}: rows of {} don't split into {} blocks of {}",
        ne[0],
        ty.name(),
        ty.block_size()
    );
    Ok(())
}

fn encode(t: &PlannedTensor, data: Vec<f32>) -> Result<Vec<u8>> {
    let numel: usize = t.ne.iter().product();
    ensure!(
        data.len() == numel,
        Model,
        "tensor {}: got {} values for shape {:?}",
        t.name,
        data.len(),
        t.ne
    );
    // ggml [k, m] is torch [m, k]: m rows of k.
    let data = match t.layout {
        Layout::Panel16 => layout::pack_panels(&data, t.ne[1], t.ne[0]),
        Layout::Plain | Layout::Q8_0x8 | Layout::Q4_0x8 => data,
    };
    let bytes =
        quantize_rows(&data, t.ne[0], t.ty).with_context(|| format!("tensor {}", t.name))?;
    Ok(match t.layout {
        Layout::Q8_0x8 => layout::repack_q8_0x8(&bytes, t.ne[0], t.ne[1]),
        Layout::Q4_0x8 => layout::repack_q4_0x8(&bytes, t.ne[0], t.ne[1]),
        Layout::Plain | Layout::Panel16 => bytes,
    })
}

fn c_key(key: &str) -> Result<CString> {
    // ggml aborts on a mistyped alignment key; we always use the default alignment.
    ensure!(
        key != "general.alignment",
        Model,
        "general.alignment is managed by the writer"
    );
    CString::new(key).map_err(|_| err!(Model, "metadata key {key:?} contains a NUL byte"))
}

fn c_text(key: &str, value: &str) -> Result<CString> {
    CString::new(value)
        .map_err(|_| err!(Model, "metadata {key}: value {value:?} contains a NUL byte"))
}

/// The output file while it's written: `.parakeet-<pid>-<n>.partial` in the destination directory
/// (same filesystem, so the final rename is atomic; short, so a long destination name still
/// leaves room for it); removed unless committed. A FIFO or device (`/dev/null`) is written
/// directly instead: a rename would replace it with a regular file.
struct PartialFile {
    file: File,
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
    direct: bool,
}

impl PartialFile {
    fn create(dest: &Path) -> Result<Self> {
        let special = std::fs::metadata(dest).is_ok_and(|m| !m.is_file() && !m.is_dir());
        if special {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(dest)
                .with_context(|| format!("opening {}", dest.display()))?;
            return Ok(Self {
                file,
                tmp: dest.to_owned(),
                dest: dest.to_owned(),
                committed: false,
                direct: true,
            });
        }
        dest.file_name()
            .ok_or_else(|| err!(Options, "{}: not a file path", dest.display()))?;
        let dir = dest
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // Unique per writer: one process may convert several models into one directory.
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".parakeet-{}-{n}.partial", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            file,
            tmp,
            dest: dest.to_owned(),
            committed: false,
            direct: false,
        })
    }

    fn commit(mut self) -> Result<()> {
        if self.direct {
            self.committed = true;
            return Ok(());
        }
        self.file
            .sync_all()
            .with_context(|| format!("writing {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.dest).with_context(|| {
            format!("renaming {} to {}", self.tmp.display(), self.dest.display())
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if !self.committed && !self.direct {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, MetaValue};

    fn tmp_dir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("parakeet-gguf-writer-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn round_trips_metadata_and_tensors() {
        let dir = tmp_dir("roundtrip");
        let path = dir.join("t.gguf");
        let mut w = GgufWriter::new();
        w.set_str("general.architecture", "parakeet").unwrap();
        w.set_u32("a.u32", 7).unwrap();
        w.set_i32("a.i32", -7).unwrap();
        w.set_f32("a.f32", 0.5).unwrap();
        w.set_bool("a.bool", true).unwrap();
        w.set_i32_array("a.ints", &[0, 1, 2]).unwrap();
        w.set_str_array("a.strs", &["▁a".into(), "'".into()])
            .unwrap();
        let a: Vec<f32> = (0..6).map(|i| i as f32 * 0.25).collect();
        let b: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
        w.add_tensor("a", &[3, 2], DType::F32).unwrap();
        w.add_tensor("b.q", &[32, 2], DType::Q8_0).unwrap();
        w.add_tensor("b.h", &[64], DType::F16).unwrap();
        let data = [a.clone(), b.clone(), b.clone()];
        let size = w.write(&path, |i| Ok(data[i].clone())).unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());

        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.str("general.architecture").unwrap(), "parakeet");
        assert_eq!(g.u32("a.u32").unwrap(), 7);
        assert_eq!(g.get("a.i32"), Some(&MetaValue::Int(-7)));
        assert_eq!(g.f32("a.f32").unwrap(), 0.5);
        assert!(g.bool("a.bool").unwrap());
        assert_eq!(g.int_array("a.ints").unwrap(), [0, 1, 2]);
        assert_eq!(g.str_array("a.strs").unwrap(), ["▁a", "'"]);
        assert_eq!(g.tensor_names(), ["a", "b.q", "b.h"]);
        assert_eq!(
            g.weight("a", &[3, 2], &[DType::F32]).unwrap().to_host_f32(),
            a
        );
        let q = g
            .weight("b.q", &[32, 2], &[DType::Q8_0])
            .unwrap()
            .to_host_f32();
        assert!(
            q.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 4.0 / 127.0),
            "{q:?}"
        );
        // Multiples of 1/8 below 4 are exact in f16.
        assert_eq!(
            g.weight("b.h", &[64], &[DType::F16]).unwrap().to_host_f32(),
            b
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_bad_declarations() {
        let mut w = GgufWriter::new();
        w.add_tensor("x", &[32], DType::F32).unwrap();
        assert!(w.add_tensor("x", &[32], DType::F32).is_err(), "duplicate");
        assert!(
            w.add_tensor("y", &[33], DType::Q8_0).is_err(),
            "row not a block multiple"
        );
        assert!(w.add_tensor("z", &[], DType::F32).is_err(), "no dims");
        assert!(
            w.add_tensor("z", &[1, 1, 1, 1, 1], DType::F32).is_err(),
            "5 dims"
        );
        assert!(w.add_tensor("z", &[0], DType::F32).is_err(), "empty");
        assert!(
            w.add_tensor(&"n".repeat(64), &[1], DType::F32).is_err(),
            "long name"
        );
        assert!(w.add_tensor("z", &[1], DType::I32).is_err(), "i32");
        assert!(w.set_u32("general.alignment", 64).is_err());
        assert!(w.set_str("k", "nul\0").is_err());
        assert_eq!(w.tensor_count(), 1);
    }

    #[test]
    fn failed_write_leaves_nothing_behind() {
        let dir = tmp_dir("fail");
        let path = dir.join("t.gguf");
        let mut w = GgufWriter::new();
        w.add_tensor("x", &[4], DType::F32).unwrap();
        w.add_tensor("y", &[4], DType::F32).unwrap();
        let err = w.write(&path, |i| {
            if i == 0 {
                Ok(vec![0.0; 4])
            } else {
                bail!(Model, "source failed")
            }
        });
        assert!(format!("{:#}", err.unwrap_err()).contains("source failed"));
        let mut w = GgufWriter::new();
        w.add_tensor("x", &[4], DType::F32).unwrap();
        let err = w.write(&path, |_| Ok(vec![0.0; 3])).unwrap_err();
        assert!(format!("{err:#}").contains("got 3 values"), "{err:#}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no partial or final file"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
