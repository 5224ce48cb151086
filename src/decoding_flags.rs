//! The decoding flags `transcribe` and `serve` share (confidence, phrase boosting, beam
//! search), parsed into a [`DecodeRequest`]'s parts; [`DecodeOptions::new`] checks them
//! against the model, before any audio is read: a bad flag is one clear error and nothing is
//! written. Python's keyword arguments fill in the same structs.
//!
//! [`DecodeRequest`]: crate::session::DecodeRequest
//! [`DecodeOptions::new`]: crate::session::DecodeOptions::new

use crate::decoder::beam::BeamStrategy;
use crate::decoder::boosting::BoostingConfig;
use crate::decoder::confidence::{Aggregation, ConfidenceConfig, Measure};
use crate::error::{Error, Result};
use crate::session::BeamRequest;
use std::io::Read;
use std::path::{Path, PathBuf};

/// `--confidence-alpha` and `--confidence-aggregation` when not given: NeMo's defaults.
pub const DEFAULT_CONFIDENCE_ALPHA: f64 = 0.33;
pub const DEFAULT_CONFIDENCE_AGGREGATION: &str = "min";

/// Confidence flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ConfidenceArgs {
    /// Token and word confidence (JSON `tokens[].confidence` / `words[].confidence`, the TSV's
    /// fourth column, the server's verbose_json `words[].probability`), as NeMo computes it:
    /// `max_prob`, `entropy_<gibbs|tsallis|renyi>_<lin|exp>`, or `none`. Default: NeMo's
    /// `entropy_tsallis_exp`, computed when an output shows it.
    #[arg(long, value_name = "METHOD")]
    pub confidence: Option<String>,
    /// The confidence method's alpha (NeMo's default 0.33): 0.01 to 10, and for the Gibbs
    /// entropies NeMo's bound for the vocabulary (about 0.12 to 1.14 for 1024 pieces).
    #[arg(long, value_name = "A", default_value_t = DEFAULT_CONFIDENCE_ALPHA)]
    pub confidence_alpha: f64,
    /// How token confidences make a word's: mean, min (NeMo's default), max, prod.
    #[arg(long, value_name = "HOW", default_value = DEFAULT_CONFIDENCE_AGGREGATION)]
    pub confidence_aggregation: String,
    /// Count blank steps into token confidence (NeMo's `exclude_blank: false`).
    #[arg(long)]
    pub confidence_with_blanks: bool,
    /// TDT: aggregate each step's duration confidence with its label's (NeMo's
    /// `tdt_include_duration`).
    #[arg(long)]
    pub confidence_with_durations: bool,
}

/// The flags' defaults (as clap fills them in): for callers that build the flags in code.
impl Default for ConfidenceArgs {
    fn default() -> Self {
        ConfidenceArgs {
            confidence: None,
            confidence_alpha: DEFAULT_CONFIDENCE_ALPHA,
            confidence_aggregation: DEFAULT_CONFIDENCE_AGGREGATION.to_owned(),
            confidence_with_blanks: false,
            confidence_with_durations: false,
        }
    }
}

impl ConfidenceArgs {
    /// The confidence to compute, given whether an output shows it (`wanted`): `None` when
    /// off. Errors name the flag.
    pub fn resolve(&self, wanted: bool) -> Result<Option<ConfidenceConfig>> {
        let measure = match self.confidence.as_deref() {
            Some("none") => None,
            Some(name) => Some(
                name.parse::<Measure>()
                    .map_err(|e| Error::Options(format!("--confidence: {e}")))?,
            ),
            // A confidence flag given explicitly asks for confidence even where the output
            // would not show it, so that it is checked against the model and never ignored.
            None => (wanted || self.confidence_with_blanks || self.confidence_with_durations)
                .then(|| ConfidenceConfig::default().measure),
        };
        let aggregation: Aggregation = self
            .confidence_aggregation
            .parse()
            .map_err(|e| Error::Options(format!("--confidence-aggregation: {e}")))?;
        Ok(measure.map(|measure| ConfidenceConfig {
            measure,
            alpha: self.confidence_alpha,
            aggregation,
            exclude_blank: !self.confidence_with_blanks,
            tdt_include_duration: self.confidence_with_durations,
        }))
    }
}

/// `--boost-alpha` when not given. NeMo's `boosting_tree_alpha` defaults to 0, which turns
/// boosting off; someone who lists phrases wants them boosted, so the default is a moderate
/// weight (a phrase's first piece gains `context_score` = 1 logit).
pub const DEFAULT_BOOST_ALPHA: f32 = 1.0;

/// Phrase boosting flags (NeMo's boosting tree).
#[derive(clap::Args, Debug, Clone)]
pub struct BoostArgs {
    /// Boost a phrase: names, jargon, product words the model should prefer when it hears
    /// them (repeatable). Tokenised with the model's own SentencePiece model, as NeMo does.
    #[arg(long = "boost", value_name = "PHRASE")]
    pub phrases: Vec<String>,
    /// Boost every phrase of a UTF-8 text file, one a line (blank lines are skipped;
    /// repeatable).
    #[arg(long, value_name = "FILE")]
    pub boost_file: Vec<PathBuf>,
    /// Weight of the boost against the model's scores (NeMo's `boosting_tree_alpha`; its
    /// default 0 would boost nothing).
    #[arg(long, value_name = "A", default_value_t = DEFAULT_BOOST_ALPHA)]
    pub boost_alpha: f32,
    /// Bonus of a phrase's first piece (NeMo's `context_score`).
    #[arg(long, value_name = "S", default_value_t = BoostingConfig::default().context_score)]
    pub boost_context_score: f32,
    /// Scale of the bonus of a phrase's later pieces (NeMo's `depth_scaling`).
    #[arg(long, value_name = "D", default_value_t = BoostingConfig::default().depth_scaling)]
    pub boost_depth_scaling: f32,
}

impl Default for BoostArgs {
    fn default() -> Self {
        BoostArgs {
            phrases: Vec::new(),
            boost_file: Vec::new(),
            boost_alpha: DEFAULT_BOOST_ALPHA,
            boost_context_score: BoostingConfig::default().context_score,
            boost_depth_scaling: BoostingConfig::default().depth_scaling,
        }
    }
}

impl BoostArgs {
    /// The phrases of `--boost` and `--boost-file`, in order (each file read by
    /// [`read_phrase_file`]).
    pub fn phrases(&self) -> Result<Vec<String>> {
        let mut out = self.phrases.clone();
        for path in &self.boost_file {
            out.extend(read_phrase_file(path, "--boost-file")?);
        }
        Ok(out)
    }

    /// Whether any phrase is given (files not read).
    pub fn any(&self) -> bool {
        !self.phrases.is_empty() || !self.boost_file.is_empty()
    }

    /// The settings for `phrases` (from [`phrases`](Self::phrases), plus a server
    /// request's), or `None` when there are none.
    pub fn config(&self, phrases: Vec<String>) -> Option<BoostingConfig> {
        (!phrases.is_empty()).then(|| BoostingConfig {
            phrases,
            alpha: self.boost_alpha,
            context_score: self.boost_context_score,
            depth_scaling: self.boost_depth_scaling,
            ..BoostingConfig::default()
        })
    }
}

/// The largest phrase file read: about a million phrases, far more than any list a person
/// keeps, and small enough that `/dev/zero` named by mistake is refused at once instead of
/// being read until memory runs out.
pub const MAX_PHRASE_FILE_BYTES: u64 = 16 << 20;

/// The phrases of a UTF-8 text file, one a line: a leading byte-order mark is dropped, lines
/// end in LF, CRLF or a lone CR (old Mac files), blank lines are skipped. A file that is
/// missing, unreadable, larger than [`MAX_PHRASE_FILE_BYTES`] or not UTF-8 is an error naming
/// it as `flag` names it (and the line). The command line, the server and Python read phrase
/// files through this one function.
pub fn read_phrase_file(path: &Path, flag: &str) -> Result<Vec<String>> {
    let shown = || format!("{flag} {}", path.display());
    let cannot_read = |e: std::io::Error| Error::io(format!("{}: cannot read it", shown()), &e);
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(cannot_read)?
        .take(MAX_PHRASE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() as u64 > MAX_PHRASE_FILE_BYTES {
        return Err(Error::Options(format!(
            "{}: larger than {} MiB; a phrase file holds one phrase a line (is it the right file?)",
            shown(),
            MAX_PHRASE_FILE_BYTES >> 20
        )));
    }
    if bytes.starts_with(&[0xff, 0xfe]) || bytes.starts_with(&[0xfe, 0xff]) {
        return Err(Error::Options(format!(
            "{}: is UTF-16 text; save it as UTF-8",
            shown()
        )));
    }
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&bytes);
    let mut phrases = Vec::new();
    for (i, line) in lines(text).enumerate() {
        let line = std::str::from_utf8(line).map_err(|_| {
            Error::Options(format!("{}: line {} is not UTF-8 text", shown(), i + 1))
        })?;
        if !line.trim().is_empty() {
            phrases.push(line.to_owned());
        }
    }
    Ok(phrases)
}

/// The lines of `text`, each without its end: LF, CRLF or a lone CR.
fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match t.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(i) => {
                let end = if t[i] == b'\r' && t.get(i + 1) == Some(&b'\n') {
                    i + 2
                } else {
                    i + 1
                };
                rest = Some(&t[end..]);
                Some(&t[..i])
            }
            None => {
                rest = None;
                Some(t)
            }
        }
    })
}

/// Beam search flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BeamArgs {
    /// Beam search keeping N hypotheses instead of greedy decoding: 1 to 256 (`maes`: 8, and
    /// both maes within the vocabulary), which keeps every step's graph within its capacity.
    #[arg(long, value_name = "N")]
    pub beam: Option<usize>,
    /// NeMo's beam search: TDT `malsd_batch` (default), `beam`, `maes`; RNN-T also `tsd`,
    /// `alsd`, `maes_batch`; CTC `beam_batch` (default). Boosting runs inside `malsd_batch`,
    /// `maes_batch` and `beam_batch` only, as in NeMo.
    #[arg(long, value_name = "NAME")]
    pub beam_strategy: Option<String>,
    /// Keep the K best hypotheses as JSON `alternatives` (text, tokens, score; best first);
    /// at most the beam size.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub nbest: usize,
}

impl BeamArgs {
    /// Whether a beam search was asked for.
    pub fn any(&self) -> bool {
        self.beam.is_some()
    }

    /// The beam search asked for (`None`: greedy). The checks that need no model: flags that
    /// need `--beam`, the strategy's name, the sizes' bounds ([`BeamRequest::check`]); the
    /// rest is checked with the model's options.
    pub fn request(&self) -> Result<Option<BeamRequest>> {
        let strategy = match &self.beam_strategy {
            Some(name) => Some(
                name.parse::<BeamStrategy>()
                    .map_err(|e| Error::Options(format!("--beam-strategy: {e}")))?,
            ),
            None => None,
        };
        if self.nbest == 0 {
            return Err(Error::Options(
                "--nbest 0: keeps at least 1 hypothesis (1 to the beam size)".into(),
            ));
        }
        let Some(size) = self.beam else {
            if self.beam_strategy.is_some() {
                return Err(Error::Options("--beam-strategy needs --beam N".into()));
            }
            if self.nbest != 1 {
                return Err(Error::Options(format!(
                    "--nbest {}: alternatives come from a beam search; give --beam N (N >= {})",
                    self.nbest, self.nbest
                )));
            }
            return Ok(None);
        };
        let request = BeamRequest {
            strategy,
            nbest: self.nbest,
            ..BeamRequest::new(size)
        };
        request.check()?;
        Ok(Some(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        confidence: ConfidenceArgs,
        #[command(flatten)]
        boost: BoostArgs,
    }

    #[test]
    fn the_defaults_in_code_are_the_flags_defaults() {
        let flags = Flags::parse_from(["parakeet"]);
        let debug = |x: &dyn std::fmt::Debug| format!("{x:?}");
        assert_eq!(debug(&flags.confidence), debug(&ConfidenceArgs::default()));
        assert_eq!(debug(&flags.boost), debug(&BoostArgs::default()));
    }

    #[test]
    fn phrase_files_split_on_any_line_end_without_a_byte_order_mark() {
        let dir = std::env::temp_dir().join(format!("parakeet-phrases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("phrases.txt");
        let read = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            read_phrase_file(&path, "--boost-file")
        };
        let want = ["Nemo", "cuDNN", "Parakeet TDT"];
        for bytes in [
            &b"\xef\xbb\xbfNemo\ncuDNN\nParakeet TDT\n"[..],
            b"Nemo\rcuDNN\rParakeet TDT",
            b"\xef\xbb\xbfNemo\r\ncuDNN\r\n\r\nParakeet TDT\r\n",
            b"Nemo\r\n\rcuDNN\n\nParakeet TDT",
        ] {
            assert_eq!(read(bytes).unwrap(), want, "{bytes:?}");
        }
        // Lines are counted with every kind of end.
        let e = read(b"a\rb\r\n\xff\n").unwrap_err().to_string();
        assert!(e.ends_with("phrases.txt: line 3 is not UTF-8 text"), "{e}");
        let e = read(b"\xff\xfea\x00").unwrap_err().to_string();
        assert!(
            e.ends_with("phrases.txt: is UTF-16 text; save it as UTF-8"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
