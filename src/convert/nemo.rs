//! Reading NeMo `.nemo` archives.
//!
//! A `.nemo` is an uncompressed tar holding `model_config.yaml`, `model_weights.ckpt` (a torch
//! zip: `<prefix>/data.pkl` plus one raw little-endian file per storage, `<prefix>/data/<key>`)
//! and tokenizer files. The tar is walked once with seeks over entry data; the checkpoint zip is
//! then read in place through a window onto the tar file, so nothing is extracted or read twice.
//! [`NemoArchive`] loads tensors one at a time, which lets the converter stream.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Context, Error, Fault, Result};
use crate::{bail, ensure, err};
use zip::ZipArchive;

use super::pickle::{self, DType, TensorDesc};

/// One checkpoint tensor, converted to f32.
#[derive(Clone, Debug, PartialEq)]
pub struct NemoTensor {
    pub name: String,
    /// PyTorch order (outermost first).
    pub shape: Vec<usize>,
    /// Row-major (C-contiguous) in `shape`.
    pub data: Vec<f32>,
}

/// A whole `.nemo`, loaded into memory.
#[derive(Clone, Debug)]
pub struct NemoModel {
    pub config: serde_yaml::Value,
    /// State-dict order, without `*.num_batches_tracked`.
    pub tensors: Vec<NemoTensor>,
}

impl NemoModel {
    pub fn tensor(&self, name: &str) -> Option<&NemoTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Reads every tensor of a `.nemo` into memory (as f32).
pub fn read_nemo(path: &Path) -> Result<NemoModel> {
    let archive = NemoArchive::open(path)?;
    let tensors = archive
        .tensors()
        .iter()
        .map(|t| {
            let data = archive.load(t)?;
            Ok(NemoTensor {
                name: t.name.clone(),
                shape: t.desc.shape.clone(),
                data,
            })
        })
        .collect::<Result<_>>()?;
    Ok(NemoModel {
        config: archive.config().clone(),
        tensors,
    })
}

/// A tensor listed in the checkpoint, not yet loaded.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub name: String,
    pub(crate) desc: TensorDesc,
}

impl TensorEntry {
    pub fn shape(&self) -> &[usize] {
        &self.desc.shape
    }
}

/// An open `.nemo`: config and tensor list parsed, tensor data loaded on demand.
pub struct NemoArchive {
    path: PathBuf,
    config: serde_yaml::Value,
    /// The SentencePiece `*tokenizer.vocab` file, if the archive has one.
    tokenizer_vocab: Option<String>,
    /// The SentencePiece `*tokenizer.model` file (the one `tokenizer.model_path` names when the
    /// archive has several), if the archive has one.
    tokenizer_model: Option<Vec<u8>>,
    /// How many `*tokenizer.model` members the archive has (several, none named by the
    /// config, leave `tokenizer_model` empty).
    tokenizer_models_found: usize,
    zip: RefCell<ZipArchive<BufReader<FileWindow>>>,
    /// Directory of `data.pkl` inside the zip (`model_weights/`, `archive/`, ...).
    prefix: String,
    tensors: Vec<TensorEntry>,
}

const CONFIG_NAME: &str = "model_config.yaml";
const WEIGHTS_NAME: &str = "model_weights.ckpt";
/// Metadata members (config, vocab, data.pkl) are read into memory; one this large means a
/// corrupt archive.
const MAX_TEXT_MEMBER: u64 = 64 << 20;

impl NemoArchive {
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_inner(path).with_context(|| format!("reading {}", path.display()))
    }

    fn open_inner(path: &Path) -> Result<Self> {
        let members = scan_tar(path)?;
        let config_text = members
            .config
            .with_fault(Error::Model, || format!("no {CONFIG_NAME} in the archive"))?;
        let config = parse_config(&config_text)?;
        let (start, len) = members
            .weights
            .with_fault(Error::Model, || format!("no {WEIGHTS_NAME} in the archive"))?;
        let window = FileWindow::new(File::open(path)?, start, len);
        let mut zip = ZipArchive::new(BufReader::new(window)).with_fault(Error::Model, || {
            format!("{WEIGHTS_NAME} is not a valid torch zip archive")
        })?;
        let (prefix, tensors) =
            read_tensor_index(&mut zip).with_context(|| format!("reading {WEIGHTS_NAME}"))?;
        let tokenizer_models_found = members.tokenizer_models.len();
        let tokenizer_model = tokenizer_model(&config, members.tokenizer_models);
        Ok(Self {
            path: path.to_owned(),
            config,
            tokenizer_vocab: members.tokenizer_vocab,
            tokenizer_model,
            tokenizer_models_found,
            zip: RefCell::new(zip),
            prefix,
            tensors,
        })
    }

    pub fn config(&self) -> &serde_yaml::Value {
        &self.config
    }

    pub fn tokenizer_vocab(&self) -> Option<&str> {
        self.tokenizer_vocab.as_deref()
    }

    pub fn tokenizer_model(&self) -> Option<&[u8]> {
        self.tokenizer_model.as_deref()
    }

    /// Why the archive gives no SentencePiece model (`None` when it gives one).
    pub fn tokenizer_model_missing(&self) -> Option<String> {
        if self.tokenizer_model.is_some() {
            return None;
        }
        Some(match self.tokenizer_models_found {
            0 => "the archive holds no *tokenizer.model member".to_string(),
            n => format!(
                "the archive holds {n} *tokenizer.model members and its config's \
                 tokenizer.model_path names none of them"
            ),
        })
    }

    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads one tensor's storage and returns its elements as contiguous f32.
    pub fn load(&self, entry: &TensorEntry) -> Result<Vec<f32>> {
        self.load_inner(&entry.desc)
            .with_context(|| format!("reading tensor {} from {}", entry.name, self.path.display()))
    }

    fn load_inner(&self, desc: &TensorDesc) -> Result<Vec<f32>> {
        load_tensor(&mut self.zip.borrow_mut(), &self.prefix, desc)
    }
}

/// Reads one tensor's storage from the checkpoint zip and returns its elements as contiguous
/// f32.
pub(crate) fn load_tensor<R: Read + Seek>(
    zip: &mut ZipArchive<R>,
    prefix: &str,
    desc: &TensorDesc,
) -> Result<Vec<f32>> {
    let storage = &desc.storage;
    let elem = storage
        .dtype
        .size()
        .fault(Error::Model, "unsupported dtype")?;
    let member = format!("{prefix}data/{}", storage.key);
    let mut file = zip
        .by_name(&member)
        .with_fault(Error::Model, || format!("missing storage {member}"))?;
    let want = storage
        .numel
        .checked_mul(elem)
        .fault(Error::Model, "storage size overflows")?;
    ensure!(
        file.size() >= want as u64,
        Model,
        "storage {member} has {} bytes, expected {want}",
        file.size()
    );
    // Only the prefix the view can reach is needed; most views cover the whole storage.
    let reach = view_reach(desc)?;
    ensure!(
        reach <= storage.numel,
        Model,
        "tensor view runs past its storage ({reach} > {})",
        storage.numel
    );
    // A view with more elements than the storage it reaches repeats elements (stride 0): a
    // checkpoint never needs one, and its size would be unbounded by the file.
    let numel = desc
        .shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .fault(Error::Model, "tensor view size overflows")?;
    ensure!(
        numel <= reach,
        Model,
        "tensor view of {numel} elements repeats storage elements (only {reach} reached)"
    );
    let mut bytes = vec![0u8; reach * elem];
    file.read_exact(&mut bytes)
        .with_context(|| format!("reading storage {member}"))?;
    let values = decode(&storage.dtype, &bytes)?;
    drop(bytes);
    Ok(gather(values, desc))
}

/// Real configs are about 20 KB and nest fewer than 10 levels deep; the bounds keep a hostile
/// one (100,000 levels took the YAML parser 77 s to refuse) from costing more than a moment.
const MAX_CONFIG_BYTES: usize = 4 << 20;
const MAX_CONFIG_DEPTH: usize = 64;
/// Indentation columns allowed: block nesting needs at least one column per level.
const MAX_CONFIG_INDENT: usize = 512;

/// `model_config.yaml`, its size and nesting bounded before the YAML parser sees it.
pub fn parse_config(text: &str) -> Result<serde_yaml::Value> {
    check_config_shape(text)?;
    serde_yaml::from_str(text).with_fault(Error::Model, || format!("parsing {CONFIG_NAME}"))
}

fn check_config_shape(text: &str) -> Result<()> {
    ensure!(
        text.len() <= MAX_CONFIG_BYTES,
        Model,
        "{CONFIG_NAME} is {} bytes, more than the {MAX_CONFIG_BYTES} a model config can need",
        text.len()
    );
    let mut flow = 0usize;
    for (n, line) in text.lines().enumerate() {
        let too_deep = |what: &str| {
            err!(
                Model,
                "{CONFIG_NAME} line {}: {what} nests deeper than {MAX_CONFIG_DEPTH} levels \
                 (indentation up to {MAX_CONFIG_INDENT} columns)",
                n + 1
            )
        };
        let body = line.trim_start_matches([' ', '\t']);
        if line.len() - body.len() > MAX_CONFIG_INDENT {
            return Err(too_deep("indentation"));
        }
        // `- - - x`: each block-sequence indicator on one line opens a level.
        let mut dashes = 0;
        let mut rest = body;
        while let Some(r) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("? ")) {
            dashes += 1;
            rest = r.trim_start();
        }
        if dashes > MAX_CONFIG_DEPTH {
            return Err(too_deep("a block sequence"));
        }
        // Flow collections, outside quotes and comments.
        let mut quote = None;
        for c in rest.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => flow += 1,
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
            if flow > MAX_CONFIG_DEPTH {
                return Err(too_deep("a flow collection"));
            }
        }
    }
    Ok(())
}

/// Members of interest found while walking the tar.
#[derive(Default)]
struct TarMembers {
    config: Option<String>,
    tokenizer_vocab: Option<String>,
    /// `*tokenizer.model` members: (name, bytes).
    tokenizer_models: Vec<(String, Vec<u8>)>,
    /// Byte range of `model_weights.ckpt` inside the tar file.
    weights: Option<(u64, u64)>,
}

fn scan_tar(path: &Path) -> Result<TarMembers> {
    let mut file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut magic = [0u8; 2];
    if file.read(&mut magic)? == 2 && magic == [0x1f, 0x8b] {
        bail!(
            Model,
            "gzip-compressed archive: decompress it first (gunzip < in.nemo > out.nemo)"
        );
    }
    file.rewind()?;
    let mut tar = tar::Archive::new(file);
    let mut members = TarMembers::default();
    // A bad first header means this isn't a tar at all; a bad later one, a damaged tar. The tar
    // crate's own message is left out: it quotes the (garbage) header bytes.
    let bad_header = |i: usize| match i {
        0 => err!(
            Model,
            "not a .nemo (tar) archive: no valid tar header at the start"
        ),
        _ => err!(
            Model,
            "damaged or truncated .nemo (tar) archive: bad header for member {}",
            i + 1
        ),
    };
    let entries = tar.entries_with_seek().map_err(|_| bad_header(0))?;
    for (i, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|_| bad_header(i))?;
        let (start, size) = (entry.raw_file_position(), entry.size());
        let name = member_name(&entry.path().map_err(|_| bad_header(i))?);
        // Seeking past entry data never fails, so truncation must be checked explicitly.
        ensure!(
            start.saturating_add(size) <= file_len,
            Model,
            "truncated archive: member {name} ends at byte {} but the file has {file_len} bytes",
            start.saturating_add(size)
        );
        if name == CONFIG_NAME {
            members.config = Some(read_text(&mut entry, size, &name)?);
        } else if name.ends_with("tokenizer.vocab") && members.tokenizer_vocab.is_none() {
            members.tokenizer_vocab = Some(read_text(&mut entry, size, &name)?);
        } else if name.ends_with("tokenizer.model") {
            let model = read_bytes(&mut entry, size, &name)?;
            members.tokenizer_models.push((name, model));
        } else if name == WEIGHTS_NAME {
            members.weights = Some((start, size));
        }
    }
    Ok(members)
}

/// The member's file name (NeMo writes `./model_config.yaml`; nesting is irrelevant).
fn member_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The SentencePiece model the config's `tokenizer.model_path` (`nemo:<member>`) names, or the
/// archive's only one.
fn tokenizer_model(
    config: &serde_yaml::Value,
    mut models: Vec<(String, Vec<u8>)>,
) -> Option<Vec<u8>> {
    let named = config
        .get("tokenizer")
        .and_then(|t| t.get("model_path"))
        .and_then(|p| p.as_str())
        .map(|p| p.strip_prefix("nemo:").unwrap_or(p));
    if let Some(named) = named
        && let Some(i) = models.iter().position(|(name, _)| name == named)
    {
        return Some(models.swap_remove(i).1);
    }
    match models.len() {
        1 => models.pop().map(|(_, model)| model),
        _ => None,
    }
}

fn read_bytes(entry: &mut impl Read, size: u64, name: &str) -> Result<Vec<u8>> {
    ensure!(
        size <= MAX_TEXT_MEMBER,
        Model,
        "member {name} is implausibly large ({size} bytes)"
    );
    let mut bytes = Vec::with_capacity(size as usize);
    entry
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading member {name}"))?;
    Ok(bytes)
}

fn read_text(entry: &mut impl Read, size: u64, name: &str) -> Result<String> {
    String::from_utf8(read_bytes(entry, size, name)?).with_fault(Error::Model, || {
        format!("reading member {name}: not UTF-8 text")
    })
}

/// Parses `<prefix>/data.pkl` into the list of tensors to load.
pub(crate) fn read_tensor_index<R: Read + Seek>(
    zip: &mut ZipArchive<R>,
) -> Result<(String, Vec<TensorEntry>)> {
    if let Some(name) = member_with_name(zip, "byteorder") {
        let mut order = String::new();
        zip.by_name(&name)
            .map_err(Error::model)?
            .read_to_string(&mut order)?;
        ensure!(
            order.trim() == "little",
            Model,
            "big-endian checkpoints are not supported"
        );
    }
    let pkl_name = member_with_name(zip, "data.pkl").fault(
        Error::Model,
        "no data.pkl in the checkpoint (not a torch zip checkpoint?)",
    )?;
    let prefix = pkl_name
        .strip_suffix("data.pkl")
        .expect("matched by name")
        .to_owned();
    // Real ones are well under 1 MB; the cap keeps a corrupt size field from exhausting memory.
    let mut pkl = Vec::new();
    zip.by_name(&pkl_name)
        .map_err(Error::model)?
        .take(MAX_TEXT_MEMBER + 1)
        .read_to_end(&mut pkl)
        .context("reading data.pkl")?;
    ensure!(
        pkl.len() as u64 <= MAX_TEXT_MEMBER,
        Model,
        "data.pkl is implausibly large"
    );
    let root = pickle::load(&pkl).context("parsing data.pkl")?;
    let mut tensors = Vec::new();
    for (name, desc) in pickle::state_dict_tensors(&root)? {
        match &desc.storage.dtype {
            DType::F32 | DType::F16 | DType::BF16 => tensors.push(TensorEntry { name, desc }),
            // BatchNorm's step counter; inference never needs it.
            DType::I64 if name.ends_with(".num_batches_tracked") => {}
            DType::I64 => bail!(Model, "tensor {name}: int64 tensors are not supported"),
            DType::Other(class) => bail!(Model, "tensor {name}: unsupported storage type {class}"),
        }
    }
    Ok((prefix, tensors))
}

/// The full name of the zip member called `name` at any depth (torch nests everything in one
/// top-level directory named after the original file).
fn member_with_name<R: Read + Seek>(zip: &ZipArchive<R>, name: &str) -> Option<String> {
    zip.file_names()
        .filter_map(|n| n.ok())
        .find(|n| n.rsplit('/').next() == Some(name))
        .map(|n| n.into_owned())
}

/// One past the largest storage element the view touches (0 for an empty tensor).
fn view_reach(desc: &TensorDesc) -> Result<usize> {
    if desc.shape.contains(&0) {
        return Ok(0);
    }
    let span = desc
        .shape
        .iter()
        .zip(&desc.stride)
        .try_fold(0usize, |acc, (&n, &s)| {
            (n - 1).checked_mul(s).and_then(|d| acc.checked_add(d))
        });
    span.and_then(|s| s.checked_add(desc.offset + 1))
        .fault(Error::Model, "tensor view size overflows")
}

fn decode(dtype: &DType, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::I64 | DType::Other(_) => bail!(Model, "dtype {dtype:?} cannot be converted to f32"),
    })
}

/// The strided view `desc` of `storage`, in row-major order. A contiguous view (the usual case)
/// reuses the storage's allocation.
fn gather(mut storage: Vec<f32>, desc: &TensorDesc) -> Vec<f32> {
    let numel: usize = desc.shape.iter().product();
    if numel == 0 {
        return Vec::new();
    }
    if is_contiguous(&desc.shape, &desc.stride) {
        storage.truncate(desc.offset + numel);
        storage.drain(..desc.offset);
        return storage;
    }
    let mut out = Vec::with_capacity(numel);
    let mut index = vec![0usize; desc.shape.len()];
    for _ in 0..numel {
        let at = desc.offset
            + index
                .iter()
                .zip(&desc.stride)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        out.push(storage[at]);
        // Odometer increment, last dimension fastest.
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < desc.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// Row-major contiguity; strides of size-1 dimensions don't matter.
fn is_contiguous(shape: &[usize], stride: &[usize]) -> bool {
    let mut expected = 1;
    for (&n, &s) in shape.iter().zip(stride).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected *= n;
    }
    true
}

/// A read-only window `[start, start + len)` onto a file, so the zip reader sees the
/// checkpoint member of the tar as if it were a file of its own.
struct FileWindow {
    file: File,
    start: u64,
    len: u64,
    pos: u64,
}

impl FileWindow {
    fn new(file: File, start: u64, len: u64) -> Self {
        Self {
            file,
            start,
            len,
            pos: 0,
        }
    }
}

impl Read for FileWindow {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        self.file.seek(SeekFrom::Start(self.start + self.pos))?;
        let got = self.file.read(&mut buf[..n])?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for FileWindow {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the checkpoint",
            )
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::pickle::StorageRef;

    fn desc(offset: usize, shape: &[usize], stride: &[usize]) -> TensorDesc {
        TensorDesc {
            storage: StorageRef {
                dtype: DType::F32,
                key: "0".into(),
                numel: 100,
            },
            offset,
            shape: shape.to_vec(),
            stride: stride.to_vec(),
        }
    }

    #[test]
    fn gathers_transposed_views() {
        let storage: Vec<f32> = (0..6).map(|i| i as f32).collect();
        // A [3, 2] transpose of a contiguous [2, 3] matrix.
        let d = desc(0, &[3, 2], &[1, 3]);
        assert!(!is_contiguous(&d.shape, &d.stride));
        assert_eq!(gather(storage.clone(), &d), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(view_reach(&d).unwrap(), 6);
    }

    #[test]
    fn gathers_offset_and_slices() {
        let storage: Vec<f32> = (0..12).map(|i| i as f32).collect();
        // Column 1 of a [4, 3] matrix.
        let d = desc(1, &[4], &[3]);
        assert_eq!(gather(storage.clone(), &d), [1.0, 4.0, 7.0, 10.0]);
        assert_eq!(view_reach(&d).unwrap(), 11);
        // Contiguous with a size-1 dimension whose stride is arbitrary.
        let d = desc(2, &[1, 3], &[99, 1]);
        assert!(is_contiguous(&d.shape, &d.stride));
        assert_eq!(gather(storage.clone(), &d), [2.0, 3.0, 4.0]);
        // Scalars and empty tensors.
        assert_eq!(gather(storage.clone(), &desc(5, &[], &[])), [5.0]);
        assert_eq!(view_reach(&desc(0, &[0, 3], &[3, 1])).unwrap(), 0);
        assert!(gather(Vec::new(), &desc(5, &[0], &[1])).is_empty());
    }

    #[test]
    fn decodes_half_types() {
        let f16 = half::f16::from_f32(1.5).to_le_bytes();
        let bf16 = half::bf16::from_f32(-2.0).to_le_bytes();
        assert_eq!(decode(&DType::F16, &f16).unwrap(), [1.5]);
        assert_eq!(decode(&DType::BF16, &bf16).unwrap(), [-2.0]);
        assert_eq!(decode(&DType::F32, &0.25f32.to_le_bytes()).unwrap(), [0.25]);
        assert!(decode(&DType::I64, &[0; 8]).is_err());
    }

    #[test]
    fn window_reads_and_seeks_within_bounds() {
        let dir = std::env::temp_dir().join(format!("parakeet-window-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789").unwrap();
        let mut w = FileWindow::new(File::open(&dir).unwrap(), 3, 4);
        let mut s = String::new();
        w.read_to_string(&mut s).unwrap();
        assert_eq!(s, "3456");
        assert_eq!(w.seek(SeekFrom::End(-1)).unwrap(), 3);
        let mut b = [0u8; 8];
        assert_eq!(w.read(&mut b).unwrap(), 1);
        assert_eq!(b[0], b'6');
        assert!(w.seek(SeekFrom::Current(-10)).is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}
