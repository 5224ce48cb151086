//! Where a model comes from: a GGUF path, a `.nemo` path (converted once into the cache), or a
//! Hugging Face hub id such as `nvidia/parakeet-tdt-0.6b-v2` (downloaded into the hub's standard
//! cache with `hf-hub`, honouring `HF_ENDPOINT`/`HF_HOME`, then converted and cached).

use crate::convert::{OutType, convert_with_progress};
use crate::error::{Context, Result};
use crate::model::Model;
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
    let path = resolve(spec, log)?;
    Model::load_as(&path, &spec.display().to_string())
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

/// A converted model in the cache.
#[derive(Debug, Clone)]
pub struct CachedModel {
    pub path: PathBuf,
    pub bytes: u64,
}

/// Every GGUF in our cache.
pub fn list_cached() -> Result<Vec<CachedModel>> {
    let dir = cache_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => bail!(Model, "{}: {e}", dir.display()),
    };
    let mut out: Vec<CachedModel> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        .map(|e| CachedModel {
            bytes: e.metadata().map(|m| m.len()).unwrap_or(0),
            path: e.path(),
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
