//! The element types of tensors and weights, and converting f32 values to them with ggml's own
//! routines.

use crate::bail;
use crate::error::Result;
use crate::layout::Elem;
use llama_cpp_sys_2 as sys;

/// Element types the rest of the crate needs to name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Q8_0,
    Q4_0,
    I32,
}

impl DType {
    pub(crate) fn to_ggml(self) -> sys::ggml_type {
        match self {
            DType::F32 => sys::GGML_TYPE_F32,
            DType::F16 => sys::GGML_TYPE_F16,
            DType::Q8_0 => sys::GGML_TYPE_Q8_0,
            DType::Q4_0 => sys::GGML_TYPE_Q4_0,
            DType::I32 => sys::GGML_TYPE_I32,
        }
    }

    pub(crate) fn from_ggml(t: sys::ggml_type) -> Option<DType> {
        match t {
            sys::GGML_TYPE_F32 => Some(DType::F32),
            sys::GGML_TYPE_F16 => Some(DType::F16),
            sys::GGML_TYPE_Q8_0 => Some(DType::Q8_0),
            sys::GGML_TYPE_Q4_0 => Some(DType::Q4_0),
            sys::GGML_TYPE_I32 => Some(DType::I32),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::I32 => "i32",
        }
    }

    /// Bytes of a row of `n` elements (n must be a multiple of the block size for q8_0).
    pub fn row_bytes(self, n: usize) -> usize {
        // SAFETY: pure function of its arguments.
        unsafe { sys::ggml_row_size(self.to_ggml(), n as i64) }
    }

    /// The element type as [`crate::layout`] sees it.
    pub fn elem(self) -> Elem {
        match self {
            DType::F32 => Elem::F32,
            DType::Q8_0 => Elem::Q8_0,
            DType::Q4_0 => Elem::Q4_0,
            _ => Elem::Other,
        }
    }

    /// Elements per quantization block (1 for plain types).
    pub fn block_size(self) -> usize {
        // SAFETY: pure function of its argument.
        unsafe { sys::ggml_blck_size(self.to_ggml()) as usize }
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
            Internal,
            "cannot store {} values in rows of {n_per_row} as {}",
            data.len(),
            ty.name()
        );
    }
    let rows = data.len() / n_per_row;
    match ty {
        DType::F32 => Ok(data.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I32 => bail!(Internal, "i32 is not a weight storage type"),
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
