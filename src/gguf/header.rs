//! A pure-Rust check of a GGUF file's structure, run before ggml parses it.
//!
//! ggml's reader answers every defect with one null pointer; this walk finds the same defects
//! (and a few more it would let through) and says which field is wrong and at what byte, e.g.
//! `tensor 12 ('encoder.layers.0.norm_out.weight') at byte 40213: 5 dimensions (at most 4)`.
//! Every count and length is checked against the bytes that remain before anything is sized
//! from it, so a hostile header costs no memory.

use std::collections::HashSet;
use std::fmt;

/// The largest tensor name ggml stores (its `GGML_MAX_NAME` less the NUL).
const MAX_NAME: usize = 63;
const MAX_DIMS: usize = 4;
const DEFAULT_ALIGNMENT: u64 = 32;
/// What ggml's CPU backend requires of a buffer's start.
const TENSOR_ALIGNMENT: u64 = 32;

/// What the walk learned, for the caller's own checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderSummary {
    pub version: u32,
    pub n_kv: usize,
    pub n_tensors: usize,
    /// Start of the tensor data section.
    pub data_offset: u64,
    /// End of the last tensor's data.
    pub data_end: u64,
    /// Every tensor, in file order (for readers of a GGUF held in memory).
    pub tensors: Vec<TensorSpan>,
}

/// Where one tensor's data lies in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpan {
    pub name: String,
    /// Elements per dimension, ggml order (`ne[0]` fastest), 1 past the tensor's rank.
    pub ne: [u64; 4],
    /// The ggml type number (0 is f32).
    pub ggml_type: u32,
    /// Byte range of the data in the file.
    pub start: u64,
    pub end: u64,
}

/// A structural defect: the field, where it starts, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderError {
    pub field: String,
    pub offset: u64,
    pub problem: String,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at byte {}: {}",
            self.field, self.offset, self.problem
        )
    }
}

impl std::error::Error for HeaderError {}

/// Checks the header, metadata and tensor infos of the GGUF in `bytes` (the whole file), and
/// that every tensor's data lies inside it.
pub fn check_header(bytes: &[u8]) -> Result<HeaderSummary, HeaderError> {
    let mut r = Reader {
        bytes,
        pos: 0,
        field: "header".into(),
    };
    r.field = "magic".into();
    if r.take(4)? != b"GGUF" {
        return Err(r.fail_at(0, "not 'GGUF'"));
    }
    r.field = "version".into();
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(r.fail_at(4, format!("{version} (versions 2 and 3 are supported)")));
    }
    r.field = "tensor count".into();
    let n_tensors = r.count(MIN_TENSOR_INFO)?;
    r.field = "metadata count".into();
    let n_kv = r.count(MIN_KV)?;

    let mut alignment = DEFAULT_ALIGNMENT;
    let mut keys = HashSet::new();
    for i in 0..n_kv {
        let at = r.pos as u64;
        r.field = format!("metadata key {i}");
        let key = r.string()?;
        if key.is_empty() {
            return Err(r.fail_at(at, "empty key"));
        }
        r.field = format!("metadata key {i} ('{key}')");
        if !keys.insert(key.clone()) {
            return Err(r.fail_at(at, "duplicate key"));
        }
        let type_at = r.pos as u64;
        let ty = r.u32()?;
        let value_at = r.pos as u64;
        r.value(ty, true)?;
        if key == "general.alignment" {
            if ty != TYPE_U32 {
                return Err(r.fail_at(type_at, format!("type {ty}, must be u32")));
            }
            let a = u32::from_le_bytes(bytes[value_at as usize..][..4].try_into().expect("4"));
            if !a.is_power_of_two() {
                return Err(r.fail_at(value_at, format!("{a} is not a power of 2")));
            }
            alignment = u64::from(a);
        }
    }

    let mut names = HashSet::new();
    let mut expected_offset = 0u64;
    let mut sizes = Vec::new();
    for i in 0..n_tensors {
        let at = r.pos as u64;
        r.field = format!("tensor {i}");
        let name = r.string()?;
        r.field = format!("tensor {i} ('{name}')");
        if name.len() > MAX_NAME {
            return Err(r.fail_at(
                at,
                format!("name of {} bytes (at most {MAX_NAME})", name.len()),
            ));
        }
        // ggml reads names as C strings: "a\0x" and "a\0y" would be one tensor, placed twice.
        if name.is_empty() || name.contains('\0') {
            return Err(r.fail_at(at, "empty name or a NUL byte in the name"));
        }
        if !names.insert(name.clone()) {
            return Err(r.fail_at(at, "duplicate tensor name"));
        }
        let dims_at = r.pos as u64;
        let n_dims = r.u32()? as usize;
        if n_dims > MAX_DIMS {
            return Err(r.fail_at(dims_at, format!("{n_dims} dimensions (at most {MAX_DIMS})")));
        }
        let mut ne = [1u64; MAX_DIMS];
        for d in ne.iter_mut().take(n_dims) {
            let v = r.i64()?;
            if v < 0 {
                return Err(r.fail_at(r.pos as u64 - 8, format!("dimension of {v} elements")));
            }
            *d = v as u64;
        }
        let type_at = r.pos as u64;
        let ty = r.u32()?;
        let Some((name_of, block, block_bytes)) = tensor_type(ty) else {
            return Err(r.fail_at(
                type_at,
                format!("ggml tensor type {ty} is not one this build reads"),
            ));
        };
        if ne.iter().any(|&n| n > bytes.len() as u64) {
            return Err(r.fail_at(
                dims_at,
                format!("shape {ne:?} is larger than the whole file"),
            ));
        }
        if ne[0] % block != 0 {
            return Err(r.fail_at(
                dims_at,
                format!(
                    "rows of {} elements do not split into {name_of} blocks of {block}",
                    ne[0]
                ),
            ));
        }
        let size = ne[1..]
            .iter()
            .try_fold((ne[0] / block) * block_bytes, |acc, &n| acc.checked_mul(n))
            .filter(|&s| s <= bytes.len() as u64)
            .ok_or_else(|| {
                r.fail_at(
                    dims_at,
                    format!("shape {ne:?} is larger than the whole file"),
                )
            })?;
        let offset_at = r.pos as u64;
        let offset = r.u64()?;
        if offset != expected_offset {
            return Err(r.fail_at(
                offset_at,
                format!("data offset {offset}, expected {expected_offset} (tensors are stored in order, each padded to {alignment} bytes)"),
            ));
        }
        expected_offset = offset
            .checked_add(size.next_multiple_of(alignment))
            .ok_or_else(|| r.fail_at(offset_at, "data offset overflows"))?;
        sizes.push((i, name, offset, size, ne, ty));
    }

    let data_offset = if n_tensors > 0 {
        (r.pos as u64).next_multiple_of(alignment)
    } else {
        r.pos as u64
    };
    // ggml's CPU buffers (and its SIMD kernels) need 32-byte aligned data; a smaller
    // `general.alignment` could leave it short of that.
    if n_tensors > 0 && data_offset % TENSOR_ALIGNMENT != 0 {
        return Err(HeaderError {
            field: "general.alignment".into(),
            offset: data_offset,
            problem: format!(
                "{alignment} puts the tensor data at byte {data_offset}, not a multiple of \
                 {TENSOR_ALIGNMENT}"
            ),
        });
    }
    let mut data_end = data_offset;
    let mut tensors = Vec::with_capacity(sizes.len());
    for (i, name, offset, size, ne, ggml_type) in sizes {
        let start = data_offset + offset;
        let end = start + size;
        if end > bytes.len() as u64 {
            return Err(HeaderError {
                field: format!("tensor {i} ('{name}') data"),
                offset: start,
                problem: format!(
                    "needs bytes {start}..{end}, the file has {} (truncated?)",
                    bytes.len()
                ),
            });
        }
        data_end = end;
        tensors.push(TensorSpan {
            name,
            ne,
            ggml_type,
            start,
            end,
        });
    }
    Ok(HeaderSummary {
        version,
        n_kv,
        n_tensors,
        data_offset,
        data_end,
        tensors,
    })
}

const TYPE_U32: u32 = 4;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
/// Smallest encodings: a key-value pair (empty key, u8 value) and a tensor info (1-byte name,
/// 0 dimensions), so that counts can be bounded by the bytes left.
const MIN_KV: u64 = 8 + 4 + 1;
const MIN_TENSOR_INFO: u64 = 8 + 1 + 4 + 4 + 8;

/// Size in bytes of a metadata scalar type; `None` for strings, arrays and unknown types.
fn scalar_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1, // u8, i8, bool
        2 | 3 => 2,     // u16, i16
        4..=6 => 4,     // u32, i32, f32
        10..=12 => 8,   // u64, i64, f64
        _ => return None,
    })
}

/// (name, block size, bytes per block) of a tensor type the runtime reads.
fn tensor_type(ty: u32) -> Option<(&'static str, u64, u64)> {
    let t = crate::backend::DType::from_ggml(ty as _)?;
    let block = t.block_size();
    Some((t.name(), block as u64, t.row_bytes(block) as u64))
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    field: String,
}

impl Reader<'_> {
    fn fail_at(&self, offset: u64, problem: impl Into<String>) -> HeaderError {
        HeaderError {
            field: self.field.clone(),
            offset,
            problem: problem.into(),
        }
    }

    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&[u8], HeaderError> {
        if n > self.left() {
            return Err(self.fail_at(
                self.pos as u64,
                format!("needs {n} bytes, the file ends after {}", self.left()),
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn u32(&mut self) -> Result<u32, HeaderError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, HeaderError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64, HeaderError> {
        Ok(self.u64()? as i64)
    }

    /// A u64 count of items of at least `min_size` bytes each, bounded by the bytes left.
    fn count(&mut self, min_size: u64) -> Result<usize, HeaderError> {
        let at = self.pos as u64;
        let n = self.u64()?;
        if n > self.left() / min_size {
            return Err(self.fail_at(
                at,
                format!("{n} does not fit in the {} bytes that follow", self.left()),
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, HeaderError> {
        let at = self.pos as u64;
        let len = self.u64()?;
        if len > self.left() {
            return Err(self.fail_at(
                at,
                format!("string of {len} bytes, the file ends after {}", self.left()),
            ));
        }
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }

    /// Skips a metadata value of type `ty`, checking it; arrays only at the top level.
    fn value(&mut self, ty: u32, top: bool) -> Result<(), HeaderError> {
        let at = self.pos as u64;
        if let Some(size) = scalar_size(ty) {
            let first = self.take(size)?[0];
            if ty == 7 && first > 1 {
                return Err(self.fail_at(at, format!("bool value {first}, must be 0 or 1")));
            }
            return Ok(());
        }
        match ty {
            TYPE_STRING => self.string().map(drop),
            TYPE_ARRAY if top => {
                let elem_at = self.pos as u64;
                let elem = self.u32()?;
                let min = match (scalar_size(elem), elem) {
                    (Some(s), _) => s,
                    (None, TYPE_STRING) => 8,
                    _ => {
                        return Err(self.fail_at(
                            elem_at,
                            format!("array of type {elem} (arrays hold scalars or strings)"),
                        ));
                    }
                };
                let n = self.count(min)?;
                if let Some(size) = scalar_size(elem).filter(|_| elem != 7) {
                    self.take(size * n as u64)?;
                } else {
                    for _ in 0..n {
                        self.value(elem, false)?;
                    }
                }
                Ok(())
            }
            _ => Err(self.fail_at(at - 4, format!("value type {ty} is not a GGUF type"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GGUF: one u32 key and one f32 tensor of `n` elements.
    fn tiny(n: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(1u64.to_le_bytes()); // kv
        b.extend(5u64.to_le_bytes());
        b.extend(b"a.key");
        b.extend(TYPE_U32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(b"t");
        b.extend(1u32.to_le_bytes());
        b.extend(n.to_le_bytes());
        b.extend(0u32.to_le_bytes()); // f32
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().next_multiple_of(32), 0);
        b.extend(vec![0u8; 4 * n as usize]);
        b
    }

    #[test]
    fn accepts_a_well_formed_file() {
        let b = tiny(8);
        let s = check_header(&b).unwrap();
        assert_eq!((s.n_kv, s.n_tensors), (1, 1));
        assert_eq!(s.data_end, b.len() as u64);
    }

    #[test]
    fn names_the_field_and_offset() {
        let mut b = tiny(8);
        b[4] = 9; // version
        assert_eq!(
            check_header(&b).unwrap_err().to_string(),
            "version at byte 4: 9 (versions 2 and 3 are supported)"
        );
        let mut b = tiny(8);
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = check_header(&b).unwrap_err();
        assert_eq!((e.field.as_str(), e.offset), ("tensor count", 8));
        let mut b = tiny(8);
        let ty_at = 24 + 8 + 5;
        b[ty_at..ty_at + 4].copy_from_slice(&99u32.to_le_bytes());
        assert_eq!(
            check_header(&b).unwrap_err().to_string(),
            format!("metadata key 0 ('a.key') at byte {ty_at}: value type 99 is not a GGUF type")
        );
        // Truncated data: the tensor needs 32 bytes.
        let b = tiny(8);
        let e = check_header(&b[..b.len() - 1]).unwrap_err();
        assert_eq!(e.field, "tensor 0 ('t') data");
        assert!(e.problem.contains("truncated"), "{e}");
        // A tensor of 5 dimensions.
        let mut b = tiny(8);
        let dims_at = 24 + 8 + 5 + 8 + 9;
        b[dims_at..dims_at + 4].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(
            check_header(&b).unwrap_err().to_string(),
            format!("tensor 0 ('t') at byte {dims_at}: 5 dimensions (at most 4)")
        );
        // A ggml type the runtime does not read (q4_1).
        let mut b = tiny(8);
        let type_at = dims_at + 4 + 8;
        b[type_at..type_at + 4].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            check_header(&b).unwrap_err().to_string(),
            format!(
                "tensor 0 ('t') at byte {type_at}: ggml tensor type 3 is not one this build reads"
            )
        );
        // An offset out of order.
        let mut b = tiny(8);
        b[type_at + 4..type_at + 12].copy_from_slice(&64u64.to_le_bytes());
        let e = check_header(&b).unwrap_err();
        assert_eq!(e.offset, type_at as u64 + 4);
        assert!(e.problem.starts_with("data offset 64, expected 0"), "{e}");
    }

    #[test]
    fn a_small_alignment_must_still_align_the_data() {
        // One key, general.alignment = 8, and one tensor: the data lands on an 8-byte but not a
        // 32-byte boundary, which ggml's CPU buffer asserts on.
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(17u64.to_le_bytes());
        b.extend(b"general.alignment");
        b.extend(TYPE_U32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(8u64.to_le_bytes());
        b.extend(b"tensor_8");
        b.extend(1u32.to_le_bytes());
        b.extend(8u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        assert_eq!(b.len(), 97);
        b.resize(104, 0);
        b.extend([0u8; 32]);
        let e = check_header(&b).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.offset),
            ("general.alignment", 104),
            "{e}"
        );
        assert!(e.problem.contains("not a multiple of 32"), "{e}");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let b = tiny(8);
        for n in 0..b.len() {
            assert!(check_header(&b[..n]).is_err(), "{n} bytes");
        }
    }
}
