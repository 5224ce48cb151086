//! Beam search with N-best lists, each strategy NeMo 3.0 runs, equal to NeMo's hypotheses:
//! the batched label-looping search `malsd_batch` for TDT and RNN-T (`malsd`), `maes` for
//! TDT and RNN-T (`maes`), RNN-T's `maes_batch` (`maes_batch`), `tsd` and `alsd`
//! (`rnnt_sync`), the frame-by-frame `beam` of TDT (`tdt_default`) and RNN-T
//! (`rnnt_default`), and CTC's batched `beam_batch` (`ctc`). Phrase boosting fuses into
//! the strategies NeMo fuses it into (`malsd_batch`, `maes_batch`, `beam_batch`).
//!
//! Every strategy keeps its hypotheses in one candidate type and shares its choosing,
//! merging and ranking (`toolkit`); each holds only its own search, behind one trait.
//! The searches step their hypotheses through the [`Nets`] together: one
//! joint graph and one prediction graph per step serve the whole beam (NeMo's `beam` expands
//! one hypothesis at a time by design, so it runs one graph per expansion). A hypothesis
//! keeps only its decoder state, its score and its tokens; the tokens of a beam share their
//! common prefix (`TokenPath`), so a fork copies nothing and an hour of audio holds one
//! transcript per live hypothesis.

mod ctc;
mod maes;
mod maes_batch;
mod malsd;
mod path;
mod rnnt_default;
mod rnnt_sync;
mod tdt_default;
mod toolkit;

pub use ctc::ctc_beam;

use crate::backend::Backend;
use crate::decoder::boosting::BoostingTree;
use crate::decoder::nets::{InputGates, Nets};
use crate::hparams::ModelType;
use crate::model::Model;
use crate::tokenizer::Token;
use anyhow::{Result, bail};
use std::fmt;
use std::str::FromStr;

/// The largest beam. A beam step's graph holds a few tensors per hypothesis (its prediction
/// input, its state columns, its joint row), and a graph holds 16,384 nodes with 4,096 kept for
/// weights: 256 hypotheses stay far inside that for every strategy and model, and a beam search
/// allocates and compares per hypothesis per frame, so a larger beam only costs time. NeMo's
/// own configurations use 2 to 16 hypotheses.
pub const MAX_BEAM_SIZE: usize = 256;

/// The largest beam of NeMo's `maes`: each round expands every hypothesis by up to the beam
/// plus 2 candidates and feeds them all in one graph, so its graphs grow with the square of
/// the beam (measured on the tiny RNN-T model: 16 hypotheses fill 90 % of a graph, 20 exceed
/// it). 8 keeps a quarter of that; NeMo's examples use 4 to 8.
pub const MAX_MAES_BEAM_SIZE: usize = 8;

/// One transducer beam strategy: its own search over the shared nets, from the start
/// hypothesis to NeMo's N-best list, best first.
trait TransducerSearch: Sync {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>>;
}

/// What a transducer search runs on. `boost` is `None` unless the strategy boosts
/// ([`BeamStrategy::boosts`]).
struct SearchRun<'a, 'm> {
    backend: &'a mut Backend,
    nets: Nets<'m>,
    input: Projection<'a>,
    cfg: &'a BeamConfig,
    boost: Option<&'a BoostingTree>,
}

/// A run's backend, nets, input, settings and boosting tree.
type RunParts<'a, 'm> = (
    &'a mut Backend,
    Nets<'m>,
    Projection<'a>,
    &'a BeamConfig,
    Option<&'a BoostingTree>,
);

impl<'a, 'm> SearchRun<'a, 'm> {
    fn parts(self) -> RunParts<'a, 'm> {
        (self.backend, self.nets, self.input, self.cfg, self.boost)
    }
}

/// A beam search, by NeMo's name for it (`decoding.strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BeamStrategy {
    /// NeMo's `beam` (search_type `default`): one hypothesis expanded at a time, frame by
    /// frame (TDT and RNN-T).
    Beam,
    /// Time-synchronous decoding (RNN-T).
    Tsd,
    /// Alignment-length synchronous decoding (RNN-T).
    Alsd,
    /// Modified adaptive expansion search (TDT and RNN-T).
    Maes,
    /// Batched modified ALSD, NeMo's recommended transducer beam (TDT and RNN-T).
    MalsdBatch,
    /// Batched modified adaptive expansion search (RNN-T).
    MaesBatch,
    /// Batched CTC beam search without a language model.
    BeamBatch,
}

/// Which decoder a beam search runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeamHead {
    Tdt,
    Rnnt,
    Ctc,
}

impl BeamHead {
    /// The transducer of a model (TDT or RNN-T), or `None` for a CTC-only model.
    pub fn transducer_of(model_type: ModelType) -> Option<BeamHead> {
        match model_type {
            ModelType::Tdt | ModelType::TdtCtc => Some(BeamHead::Tdt),
            ModelType::Rnnt | ModelType::RnntCtc => Some(BeamHead::Rnnt),
            ModelType::Ctc | ModelType::Sortformer => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BeamHead::Tdt => "TDT",
            BeamHead::Rnnt => "RNN-T",
            BeamHead::Ctc => "CTC",
        }
    }
}

const STRATEGY_NAMES: [(BeamStrategy, &str); 7] = [
    (BeamStrategy::Beam, "beam"),
    (BeamStrategy::Tsd, "tsd"),
    (BeamStrategy::Alsd, "alsd"),
    (BeamStrategy::Maes, "maes"),
    (BeamStrategy::MalsdBatch, "malsd_batch"),
    (BeamStrategy::MaesBatch, "maes_batch"),
    (BeamStrategy::BeamBatch, "beam_batch"),
];

impl BeamStrategy {
    /// What NeMo runs when only a beam size is given: `malsd_batch` for transducers (the
    /// strategy NeMo recommends and picks for its batched beam), `beam_batch` for CTC.
    pub fn default_for(head: BeamHead) -> BeamStrategy {
        match head {
            BeamHead::Tdt | BeamHead::Rnnt => BeamStrategy::MalsdBatch,
            BeamHead::Ctc => BeamStrategy::BeamBatch,
        }
    }

    /// The strategies NeMo 3.0 accepts for a head: CTC's one, or those with a search for
    /// the transducer.
    pub fn nemo_accepts(self, head: BeamHead) -> bool {
        match head {
            BeamHead::Ctc => self == BeamStrategy::BeamBatch,
            _ => self.transducer_search(head).is_some(),
        }
    }

    /// This strategy's search on a transducer `head`, if NeMo runs it there.
    fn transducer_search(self, head: BeamHead) -> Option<&'static dyn TransducerSearch> {
        use BeamStrategy::*;
        let rnnt = head == BeamHead::Rnnt;
        match self {
            _ if head == BeamHead::Ctc => None,
            MalsdBatch => Some(&malsd::MalsdBatch),
            Maes => Some(&maes::Maes),
            Beam if rnnt => Some(&rnnt_default::RnntBeam),
            Beam => Some(&tdt_default::TdtBeam),
            Tsd if rnnt => Some(&rnnt_sync::Tsd),
            Alsd if rnnt => Some(&rnnt_sync::Alsd),
            MaesBatch if rnnt => Some(&maes_batch::MaesBatch),
            Tsd | Alsd | MaesBatch | BeamBatch => None,
        }
    }

    /// Whether NeMo fuses a boosting tree into this strategy.
    pub fn boosts(self) -> bool {
        matches!(
            self,
            BeamStrategy::MalsdBatch | BeamStrategy::MaesBatch | BeamStrategy::BeamBatch
        )
    }

    fn names_for(head: BeamHead) -> String {
        STRATEGY_NAMES
            .iter()
            .filter(|(s, _)| s.nemo_accepts(head))
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for BeamStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = STRATEGY_NAMES
            .iter()
            .find(|(s, _)| s == self)
            .map_or("?", |(_, n)| n);
        f.write_str(name)
    }
}

impl FromStr for BeamStrategy {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<BeamStrategy> {
        match STRATEGY_NAMES.iter().find(|(_, n)| *n == s) {
            Some((strategy, _)) => Ok(*strategy),
            None => bail!(
                "unknown beam strategy {s:?}; NeMo's are {}",
                STRATEGY_NAMES.map(|(_, n)| n).join(", ")
            ),
        }
    }
}

/// A beam search's settings, NeMo's `decoding.beam` with NeMo's defaults. Built only by
/// [`BeamConfig::new`], which bounds the beam, and read-only after that (but for the ranking,
/// [`BeamConfig::with_score_norm`]): no beam reaches a graph beyond its capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamConfig {
    strategy: BeamStrategy,
    /// Hypotheses kept (`beam_size`), 1 to [`MAX_BEAM_SIZE`].
    beam_size: usize,
    /// Rank the N-best by score per emitted token (NeMo's `score_norm`, default true;
    /// NeMo's CTC `beam_batch` always ranks by the raw score).
    score_norm: bool,
    /// Labels a transducer hypothesis may emit on one frame before a blank is forced
    /// (`max_symbols_per_step`, batched strategies).
    max_symbols_per_step: usize,
    /// `maes` / `maes_batch`: expansion steps per frame.
    maes_num_steps: usize,
    /// `maes`: prefix search depth.
    maes_prefix_alpha: usize,
    /// `maes`: extra candidates considered beyond the beam.
    maes_expansion_beta: usize,
    /// `maes`: log-probability margin of a candidate to the best one.
    maes_expansion_gamma: f64,
    /// `tsd`: most label expansions per frame.
    tsd_max_sym_exp_per_step: usize,
    /// `alsd`: longest output, as a fraction of the frames.
    alsd_max_target_len: f64,
    /// CTC `beam_batch`: score added per emitted token (NeMo's `beam_beta`, default 1.0).
    beam_beta: f32,
    /// CTC `beam_batch`: candidates this far below the step's best are dropped.
    beam_threshold: f32,
}

impl BeamConfig {
    /// `strategy` with `beam_size` hypotheses and NeMo's defaults for the rest, or why a beam
    /// of that size cannot run (in the words the `--beam` option is checked with).
    pub fn new(strategy: BeamStrategy, beam_size: usize) -> Result<BeamConfig> {
        if beam_size == 0 {
            bail!("--beam 0: a beam search keeps at least one hypothesis");
        }
        if beam_size > MAX_BEAM_SIZE {
            bail!(
                "--beam {beam_size}: at most {MAX_BEAM_SIZE} hypotheses (NeMo's configurations use \
                 2 to 16)"
            );
        }
        if strategy == BeamStrategy::Maes && beam_size > MAX_MAES_BEAM_SIZE {
            bail!(
                "--beam {beam_size}: maes takes at most {MAX_MAES_BEAM_SIZE} hypotheses (its steps \
                 grow with the square of the beam)"
            );
        }
        Ok(BeamConfig {
            strategy,
            beam_size,
            score_norm: true,
            max_symbols_per_step: 10,
            maes_num_steps: 2,
            maes_prefix_alpha: 1,
            maes_expansion_beta: 2,
            maes_expansion_gamma: 2.3,
            tsd_max_sym_exp_per_step: 50,
            alsd_max_target_len: 1.0,
            beam_beta: 1.0,
            beam_threshold: 20.0,
        })
    }

    /// These settings, ranking the N-best list by score per token or not (NeMo's
    /// `score_norm`).
    pub fn with_score_norm(self, score_norm: bool) -> BeamConfig {
        BeamConfig { score_norm, ..self }
    }

    pub fn strategy(&self) -> BeamStrategy {
        self.strategy
    }

    pub fn beam_size(&self) -> usize {
        self.beam_size
    }

    pub fn score_norm(&self) -> bool {
        self.score_norm
    }

    /// Why these settings cannot run on `head`, if they cannot: checked before any graph.
    pub fn check(&self, head: BeamHead) -> Result<()> {
        if !self.strategy.nemo_accepts(head) {
            bail!(
                "beam strategy {} does not run on a {} decoder; NeMo's strategies for it: {}",
                self.strategy,
                head.name(),
                BeamStrategy::names_for(head)
            );
        }
        let maes = matches!(self.strategy, BeamStrategy::Maes | BeamStrategy::MaesBatch);
        // NeMo's RNN-T `maes` needs two rounds (its last one adds the blanks).
        let fewest_rounds = if self.strategy == BeamStrategy::Maes && head == BeamHead::Rnnt {
            2
        } else {
            1
        };
        if maes && self.maes_num_steps < fewest_rounds {
            bail!(
                "maes_num_steps must be at least {fewest_rounds} for {self_strategy} on {head_name}",
                self_strategy = self.strategy,
                head_name = head.name()
            );
        }
        if head != BeamHead::Ctc && self.max_symbols_per_step == 0 {
            bail!("max_symbols_per_step must be at least 1");
        }
        Ok(())
    }

    /// Why these settings cannot search a vocabulary of `vocab` pieces (the blank aside), if
    /// they cannot: NeMo's `maes` and `maes_batch` draw the beam plus `maes_expansion_beta`
    /// candidates from it.
    pub fn check_vocabulary(&self, vocab: usize) -> Result<()> {
        let maes = matches!(self.strategy, BeamStrategy::Maes | BeamStrategy::MaesBatch);
        let beta = self.maes_expansion_beta;
        if maes && self.beam_size + beta > vocab {
            bail!(
                "--beam {}: {} draws the beam plus {beta} candidates from the vocabulary, which \
                 has {vocab} pieces: at most --beam {}",
                self.beam_size,
                self.strategy,
                vocab.saturating_sub(beta)
            );
        }
        Ok(())
    }

    /// Why these settings cannot follow a boosting tree, if `boosting` and they cannot: NeMo
    /// fuses one into `malsd_batch`, `maes_batch` and CTC's `beam_batch` only.
    pub fn check_boosting(&self, boosting: bool) -> Result<()> {
        if boosting && !self.strategy.boosts() {
            bail!(
                "beam strategy {} cannot boost phrases (NeMo refuses it too); use malsd_batch (transducers) or beam_batch (CTC)",
                self.strategy
            );
        }
        Ok(())
    }
}

/// One hypothesis of an N-best list.
#[derive(Clone, Debug, PartialEq)]
pub struct NBest {
    /// The emitted tokens with NeMo's timestamps for the strategy: `malsd_batch` gives each
    /// token's frame and TDT duration; TDT's `beam` and `maes` give NeMo's frame + duration
    /// as the frame and no duration (0); RNN-T's `beam`, `tsd` and `maes` give the frame,
    /// `alsd` its step, `maes_batch` the hypothesis' blanks so far; CTC gives the token's
    /// first frame.
    pub tokens: Vec<Token>,
    /// The raw log-probability sum (NeMo's `score`, not normalised; the list is ranked by
    /// NeMo's criterion, see [`BeamConfig::score_norm`]).
    pub score: f32,
}

/// Beam search over a transducer's encoder projection `joint_enc` (`[frames][joint_hidden]`):
/// the N-best list NeMo returns, best first.
pub fn transducer_beam(
    backend: &mut Backend,
    model: &Model,
    gates: &mut InputGates,
    joint_enc: &[f32],
    frames: usize,
    cfg: &BeamConfig,
    boost: Option<&BoostingTree>,
) -> Result<Vec<NBest>> {
    let Some(head) = BeamHead::transducer_of(model.hparams().model_type) else {
        bail!(
            "{}: this model has no transducer decoder (it is {})",
            model.path().display(),
            model.hparams().model_type.name()
        );
    };
    cfg.check(head)?;
    cfg.check_vocabulary(model.hparams().vocab_size)?;
    check_boost(boost, model.hparams().vocab_size)?;
    cfg.check_boosting(boost.is_some())?;
    let Some(search) = cfg.strategy.transducer_search(head) else {
        bail!(
            "beam strategy {} does not run on a {} decoder",
            cfg.strategy,
            head.name()
        );
    };
    let nets = Nets::new(model, gates)?;
    let input = Projection {
        width: nets.frame_width(joint_enc, frames)?,
        joint_enc,
        frames,
    };
    search.search(SearchRun {
        backend,
        nets,
        input,
        cfg,
        boost,
    })
}

/// A transducer search's input: the encoder projection, `frames` rows of `width` values
/// (checked against the nets).
#[derive(Clone, Copy)]
struct Projection<'a> {
    joint_enc: &'a [f32],
    frames: usize,
    width: usize,
}

impl<'a> Projection<'a> {
    /// Frame `t`'s row.
    fn at(&self, t: usize) -> &'a [f32] {
        &self.joint_enc[t * self.width..(t + 1) * self.width]
    }
}

/// Why `boost` cannot steer a search over `vocab` non-blank labels, if it cannot.
fn check_boost(boost: Option<&BoostingTree>, vocab: usize) -> Result<()> {
    if let Some(tree) = boost
        && tree.vocab_size() != vocab
    {
        bail!(
            "the boosting phrases were tokenised for a {}-piece vocabulary; this model has {vocab}",
            tree.vocab_size()
        );
    }
    Ok(())
}

/// NeMo's `lm_weighted_full` fusion of a boosting tree into one row of label
/// log-probabilities (blank last), in NeMo's f32 order of operations: every non-blank label
/// gains alpha x (the log of the non-blank probability, the blank's clamped below 1 - `eps`)
/// plus alpha x its tree bonus; the blank's log-probability is scaled by 1 + alpha.
fn fuse_boost(row: &mut [f32], bonus: &[f32], alpha: f32, eps: f32) {
    let Some((blank_logp, labels)) = row.split_last_mut() else {
        return;
    };
    let non_blank_logp = (-blank_logp.exp().min(1.0 - eps)).ln_1p();
    for (lp, &b) in labels.iter_mut().zip(bonus) {
        *lp += non_blank_logp * alpha + b * alpha;
    }
    *blank_logp *= 1.0 + alpha;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for (s, n) in STRATEGY_NAMES {
            assert_eq!(n.parse::<BeamStrategy>().unwrap(), s);
            assert_eq!(s.to_string(), n);
        }
        assert!("modified_beam".parse::<BeamStrategy>().is_err());
    }

    #[test]
    fn checks_say_what_is_wrong() {
        let err = |s, n, head| {
            BeamConfig::new(s, n)
                .and_then(|c| c.check(head))
                .unwrap_err()
                .to_string()
        };
        assert!(err(BeamStrategy::MalsdBatch, 0, BeamHead::Tdt).contains("--beam 0"));
        assert!(err(BeamStrategy::MalsdBatch, 4, BeamHead::Ctc).contains("does not run on a CTC"));
        assert!(err(BeamStrategy::Tsd, 4, BeamHead::Tdt).contains("does not run on a TDT"));
        assert!(err(BeamStrategy::BeamBatch, 4, BeamHead::Rnnt).contains("RNN-T"));
        for head in [BeamHead::Tdt, BeamHead::Rnnt, BeamHead::Ctc] {
            BeamConfig::new(BeamStrategy::default_for(head), 4)
                .unwrap()
                .check(head)
                .unwrap();
        }
    }

    /// A beam beyond what a graph holds cannot be built, whatever builds it (not only the
    /// options' checks): `--beam 100000` once reached a ggml assertion.
    #[test]
    fn no_config_holds_a_beam_beyond_the_bounds() {
        for (strategy, size, words) in [
            (BeamStrategy::MalsdBatch, MAX_BEAM_SIZE + 1, "at most 256"),
            (
                BeamStrategy::MalsdBatch,
                100_000,
                "--beam 100000: at most 256",
            ),
            (BeamStrategy::BeamBatch, usize::MAX, "at most 256"),
            (
                BeamStrategy::Maes,
                MAX_MAES_BEAM_SIZE + 1,
                "maes takes at most 8",
            ),
        ] {
            let err = BeamConfig::new(strategy, size).unwrap_err().to_string();
            assert!(err.contains(words), "{strategy} {size}: {err}");
        }
        assert_eq!(
            BeamConfig::new(BeamStrategy::Alsd, MAX_BEAM_SIZE)
                .unwrap()
                .beam_size(),
            MAX_BEAM_SIZE
        );
        let maes = BeamConfig::new(BeamStrategy::MaesBatch, 47).unwrap();
        assert!(
            maes.check_vocabulary(48)
                .unwrap_err()
                .to_string()
                .contains("at most --beam 46")
        );
        maes.check_vocabulary(49).unwrap();
    }

    /// Every strategy NeMo accepts on a transducer has its search, and none other does.
    #[test]
    fn each_transducer_strategy_has_one_search() {
        for (strategy, _) in STRATEGY_NAMES {
            for head in [BeamHead::Tdt, BeamHead::Rnnt] {
                let expected = match head {
                    BeamHead::Tdt => matches!(
                        strategy,
                        BeamStrategy::Beam | BeamStrategy::Maes | BeamStrategy::MalsdBatch
                    ),
                    _ => strategy != BeamStrategy::BeamBatch,
                };
                assert_eq!(
                    strategy.transducer_search(head).is_some(),
                    expected,
                    "{strategy}"
                );
            }
            assert!(strategy.transducer_search(BeamHead::Ctc).is_none());
        }
    }
}
