//! Where a model comes from: a GGUF path, a `.nemo` path (converted once into the cache), or a
//! Hugging Face hub id such as `nvidia/parakeet-tdt-0.6b-v2` (downloaded into the hub's standard
//! cache with `hf-hub`, honouring `HF_ENDPOINT`/`HF_HOME`, then converted and cached).

use crate::convert::{OutType, convert_with_progress};
use crate::error::{Context, Result};
use crate::model::{LoadOptions, Model};
use crate::{bail, err};
use std::path::{Path, PathBuf};

/// Our cache of converted models: `$PARAKEET_CACHE`, else `$XDG_CACHE_HOME/parakeet`, else
/// `~/.cache/parakeet`; on Windows `$PARAKEET_CACHE`, else `%LOCALAPPDATA%\parakeet` (where
/// Windows programs keep their caches), else the temp folder.
pub fn cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
    var("PARAKEET_CACHE")
        .or_else(|| platform_cache_dir(var))
        .unwrap_or_else(|| std::env::temp_dir().join("parakeet"))
}

#[cfg(not(windows))]
fn platform_cache_dir(var: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    var("XDG_CACHE_HOME")
        .map(|d| d.join("parakeet"))
        .or_else(|| var("HOME").map(|d| d.join(".cache/parakeet")))
}

#[cfg(windows)]
fn platform_cache_dir(var: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    var("LOCALAPPDATA").map(|d| d.join("parakeet"))
}

/// Extensions of model files: an argument ending in one is a path, never a hub id.
const MODEL_EXTENSIONS: &[&str] = &["gguf", "nemo", "bin", "ckpt", "safetensors"];

/// Whether `spec` is meant as a local path: it names a model file by extension, starts like
/// a path, or its first component is a directory here.
fn looks_like_path(spec: &str) -> bool {
    let path = Path::new(spec);
    let model_ext = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| MODEL_EXTENSIONS.iter().any(|m| m.eq_ignore_ascii_case(e)));
    let owner_is_dir = spec
        .split('/')
        .next()
        .is_some_and(|owner| !owner.is_empty() && Path::new(owner).is_dir());
    model_ext || owner_is_dir || spec.starts_with(['.', '/', '~']) || spec.contains('\\')
}

/// `owner/name` with no file of that name on disk.
fn looks_like_hub_id(spec: &str) -> bool {
    let mut parts = spec.split('/');
    let (Some(owner), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    ok(owner) && ok(name) && !Path::new(spec).exists() && !looks_like_path(spec)
}

/// A GGUF path for `spec`, converting (and for hub ids, downloading) once as needed.
/// `log` receives one line per slow step (download, conversion).
pub fn resolve(spec: &Path, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let text = spec.to_string_lossy();
    if looks_like_hub_id(&text) {
        let nemo = fetch_from_hub(&text, log)?;
        return resolve(&nemo, log);
    }
    if !spec.exists() {
        let hint = if text.matches('/').count() == 1 && !text.starts_with(['.', '/']) {
            " (it looks like a path, so it is not taken for a hub id)"
        } else {
            ""
        };
        // An io::Error underneath, so that callers can tell a missing file from a broken one
        // (the Python package raises FileNotFoundError); the message is the same.
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: no such model file{hint}", spec.display()),
        )
        .into());
    }
    let is_nemo = spec
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("nemo"));
    if !is_nemo {
        return Ok(spec.to_path_buf());
    }
    let cached = cached_gguf_path(spec)?;
    if !cached.exists() {
        std::fs::create_dir_all(cache_dir())
            .with_context(|| format!("{}: cannot create cache", cache_dir().display()))?;
        log(&format!(
            "converting {} (once) -> {}",
            spec.display(),
            cached.display()
        ));
        let report = convert_with_progress(spec, &cached, OutType::F32, |_, _| {})?;
        for w in &report.warnings {
            log(&format!("warning: {w}"));
        }
    }
    Ok(cached)
}

/// The model `spec` names ([`resolve`]), loaded. Errors name `spec` as the user gave it, never
/// the cache's GGUF that a `.nemo` or a hub id was converted into.
pub fn load(spec: &Path, log: &mut dyn FnMut(&str)) -> Result<Model> {
    load_with(spec, log, &LoadOptions::from_env())
}

/// [`load`] with `options`.
pub fn load_with(spec: &Path, log: &mut dyn FnMut(&str), options: &LoadOptions) -> Result<Model> {
    let path = resolve(spec, log)?;
    Model::load_with(&path, &spec.display().to_string(), options)
}

/// Cache entry of a `.nemo`: its stem plus a hash of its canonical path, size and mtime, so an
/// edited or replaced checkpoint is converted again.
fn cached_gguf_path(nemo: &Path) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let meta = std::fs::metadata(nemo)
        .with_context(|| format!("{}: cannot read model", nemo.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let abs = std::fs::canonicalize(nemo)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (abs, meta.len(), mtime).hash(&mut h);
    let stem = nemo.file_stem().unwrap_or_default().to_string_lossy();
    Ok(cache_dir().join(format!("{stem}-{:016x}.gguf", h.finish())))
}

/// Download the repo's `.nemo` (hub cache; reused when present).
fn fetch_from_hub(id: &str, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| err!(Model, "{id}: cannot set up the hub client: {e}"))?;
    let repo = api.model(id.to_string());
    let info = repo.info().map_err(|e| {
        err!(
            Model,
            "{id}: cannot read the model repository from the hub: {e}"
        )
    })?;
    let file = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .find(|f| f.ends_with(".nemo"))
        .ok_or_else(|| err!(Model, "{id}: the repository has no .nemo checkpoint"))?
        .to_string();
    log(&format!("fetching {id}/{file} from the hub (once)"));
    repo.get(&file)
        .map_err(|e| err!(Model, "{id}: downloading {file} failed: {e}"))
}

/// A converted model in the cache: one file, and the other files of the cache with the same
/// bytes (one checkpoint converted from two places, e.g. two clones of a repository: the
/// cache's key is the checkpoint's path).
#[derive(Debug, Clone)]
pub struct CachedModel {
    pub path: PathBuf,
    pub bytes: u64,
    pub copies: Vec<PathBuf>,
}

impl CachedModel {
    /// The model's name in the cache: its file's stem without the key after it
    /// (`tiny_tdt-0123456789abcdef.gguf` -> `tiny_tdt`).
    pub fn name(&self) -> String {
        model_name(&self.path)
    }
}

/// `stem-<16 hex digits>.gguf` -> `stem` (any other file: its stem).
fn model_name(path: &Path) -> String {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    match stem.rsplit_once('-') {
        Some((name, key)) if key.len() == 16 && key.chars().all(|c| c.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => stem.into_owned(),
    }
}

/// Whether two files hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Every GGUF in our cache, each model once (copies with the same bytes listed with it).
pub fn list_cached() -> Result<Vec<CachedModel>> {
    let dir = cache_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => bail!(Model, "{}: {e}", dir.display()),
    };
    let mut files: Vec<(PathBuf, u64)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
        .collect();
    files.sort();
    let mut out: Vec<CachedModel> = Vec::new();
    for (path, bytes) in files {
        // Only a file of the same name and size can be a copy: compared byte for byte.
        let copy_of = out.iter_mut().find(|m| {
            m.bytes == bytes
                && model_name(&m.path) == model_name(&path)
                && same_bytes(&m.path, &path).unwrap_or(false)
        });
        match copy_of {
            Some(m) => m.copies.push(path),
            None => out.push(CachedModel {
                path,
                bytes,
                copies: Vec::new(),
            }),
        }
    }
    Ok(out)
}

/// Removes the cache's files of the model `name` (a name as [`CachedModel::name`] gives it,
/// which removes every file of that model, or one file's name); returns the files removed.
/// A name the cache does not hold is the user's error, naming what it holds.
pub fn remove_cached(name: &str) -> Result<Vec<PathBuf>> {
    let models = list_cached()?;
    let doomed: Vec<PathBuf> = models
        .iter()
        .flat_map(|m| std::iter::once(&m.path).chain(&m.copies))
        .filter(|p| model_name(p) == name || p.file_name().is_some_and(|f| f == name))
        .cloned()
        .collect();
    if doomed.is_empty() {
        let held: Vec<String> = models.iter().map(CachedModel::name).collect();
        bail!(
            Options,
            "--remove {name}: no such model in the cache {} (it holds: {})",
            cache_dir().display(),
            if held.is_empty() {
                "nothing".to_string()
            } else {
                held.join(", ")
            }
        );
    }
    remove_files(&doomed)?;
    Ok(doomed)
}

/// Removes the copies (the same bytes under another key) the cache holds of each model,
/// keeping one; returns the files removed.
pub fn prune_cached() -> Result<Vec<PathBuf>> {
    let doomed: Vec<PathBuf> = list_cached()?.into_iter().flat_map(|m| m.copies).collect();
    remove_files(&doomed)?;
    Ok(doomed)
}

fn remove_files(paths: &[PathBuf]) -> Result<()> {
    for p in paths {
        std::fs::remove_file(p).with_context(|| format!("{}: cannot remove", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_names_drop_the_key() {
        assert_eq!(
            model_name(Path::new("c/tiny_tdt-0123456789abcdef.gguf")),
            "tiny_tdt"
        );
        assert_eq!(model_name(Path::new("c/a-b-0123456789abcdef.gguf")), "a-b");
        assert_eq!(model_name(Path::new("c/my-model.gguf")), "my-model");
    }

    #[test]
    fn hub_ids_are_owner_slash_name() {
        assert!(looks_like_hub_id("nvidia/parakeet-tdt-0.6b-v2"));
        assert!(looks_like_hub_id("nvidia/parakeet-tdt_ctc-110m"));
        assert!(!looks_like_hub_id("model.gguf"));
        assert!(!looks_like_hub_id("models/sub/model.gguf"));
        assert!(!looks_like_hub_id("./model"));
        assert!(!looks_like_hub_id("/abs"));
        // Mistyped local paths are paths, not hub ids.
        assert!(!looks_like_hub_id("models/tdt.gguf"));
        assert!(!looks_like_hub_id("models/tdt-0.6b.nemo"));
        assert!(!looks_like_hub_id("src/nonexistent")); // src/ is a directory here
    }

    #[test]
    fn a_missing_path_is_no_such_file() {
        let err = resolve(Path::new("models/tdt.gguf"), &mut |_| {}).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("models/tdt.gguf: no such model file"), "{msg}");
        assert!(msg.contains("not taken for a hub id"), "{msg}");
        assert!(err.is_not_found(), "{err:?}");
    }
}
