//! Beam search against NeMo 3.0: every beam case of `tests/fixtures/decoding/beam.json`
//! (NeMo's N-best lists with beam size 4 for the four tiny models on both clips, through our
//! f32 pipeline from the WAV): each hypothesis' tokens, timestamps, durations and text equal
//! NeMo's, in NeMo's order, and scores within 1e-4 (two f32 steps where that is more). Cases
//! NeMo itself refused (its error is in the fixture) are skipped and named.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::beam::{BeamConfig, BeamStrategy, NBest};
use parakeet::decoder::boosting::{BoostingConfig, BoostingTree};
use parakeet::session::{DecoderChoice, Session};
use serde_json::Value;
use std::sync::Arc;

/// The case's boosting tree (NeMo's phrases and settings), or `None`.
fn boost_tree(session: &Session, boost: &Value) -> Option<Arc<BoostingTree>> {
    if boost.is_null() {
        return None;
    }
    let f32_of = |key: &str| boost[key].as_f64().unwrap() as f32;
    let cfg = BoostingConfig {
        phrases: boost["phrases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_owned())
            .collect(),
        alpha: f32_of("alpha"),
        context_score: f32_of("context_score"),
        depth_scaling: f32_of("depth_scaling"),
        unk_score: f32_of("unk_score"),
        score_per_phrase: f32_of("score_per_phrase"),
        uniform_weights: boost["uniform_weights"].as_bool().unwrap(),
    };
    Some(Arc::new(
        BoostingTree::new(&session.model().tokenizer, &cfg).unwrap(),
    ))
}

fn fixture() -> Value {
    json(&fixtures().join("decoding/beam.json"))
}

/// Compares one case's N-best list; the first difference, if any.
fn compare(session: &Session, ours: &[NBest], nemo: &[Value]) -> Result<(), String> {
    if ours.len() != nemo.len() {
        return Err(format!(
            "{} hypotheses, NeMo {}: ours {:?}",
            ours.len(),
            nemo.len(),
            ours.iter().map(|h| h.score).collect::<Vec<_>>()
        ));
    }
    let tokenizer = &session.model().tokenizer;
    for (rank, (h, n)) in ours.iter().zip(nemo).enumerate() {
        let ids: Vec<usize> = h.tokens.iter().map(|t| t.id).collect();
        if ids != ints(&n["tokens"]) {
            return Err(format!(
                "#{rank}: tokens {ids:?}, NeMo {:?} (scores {} / {})",
                ints(&n["tokens"]),
                h.score,
                n["score"]
            ));
        }
        let frames: Vec<usize> = h.tokens.iter().map(|t| t.frame).collect();
        if frames != ints(&n["timestamp"]) {
            return Err(format!(
                "#{rank}: timestamps {frames:?}, NeMo {:?}",
                ints(&n["timestamp"])
            ));
        }
        if let Some(d) = n["token_duration"]
            .as_array()
            .map(|_| ints(&n["token_duration"]))
        {
            let ours: Vec<usize> = h.tokens.iter().map(|t| t.duration).collect();
            if ours != d {
                return Err(format!("#{rank}: durations {ours:?}, NeMo {d:?}"));
            }
        }
        let text = tokenizer.detokenize(ids.iter().copied());
        if text != n["text"].as_str().unwrap() {
            return Err(format!("#{rank}: text {text:?}, NeMo {}", n["text"]));
        }
        let score = n["score"].as_f64().unwrap();
        // 1e-4, or four f32 steps where the score is so large that f32 cannot resolve 1e-4
        // (boosted RNN-T scores reach -2000, where one step is 1.2e-4): a score sums a few
        // hundred log-probabilities, and ggml's f32 matrix-vector products (the f32 decoder)
        // sum in another order in a portable build (SSE) than in a native one (AVX-512):
        // tiny_rnnt's alsd #3 on speech_10s is -521.88873 native, -521.88867 portable, NeMo
        // -521.88880 (two steps of 6.1e-5 apart).
        let ulp = (score.abs() as f32).next_up() as f64 - score.abs();
        if (h.score as f64 - score).abs() > 1e-4f64.max(4.0 * ulp) {
            return Err(format!("#{rank}: score {}, NeMo {score}", h.score));
        }
    }
    Ok(())
}

#[test]
fn beam_search_matches_nemo_nbest() {
    let fixture = fixture();
    let mut passed = Vec::new();
    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    let mut ran_by_nemo = 0;
    for model in MODELS {
        let cases = fixture[model].as_object().unwrap();
        let mut session = Session::load(&gguf(model, OutType::F32), 2).unwrap();
        for (_, clip) in CLIPS {
            let features = session.features(&clip_samples(clip));
            let enc = session.encode(&features, false).unwrap();
            for (name, case) in cases {
                let what = format!("{model} {clip} {name}");
                if let Some(err) = case.get("error") {
                    skipped.push(format!("{what} (NeMo: {})", err.as_str().unwrap()));
                    continue;
                }
                ran_by_nemo += 1;
                let tree = boost_tree(&session, &case["boost"]);
                session.set_boosting(tree);
                let strategy: BeamStrategy = case["strategy"].as_str().unwrap().parse().unwrap();
                let mut cfg =
                    BeamConfig::new(strategy, case["beam_size"].as_u64().unwrap() as usize);
                cfg.score_norm = case["score_norm"].as_bool().unwrap();
                let choice = if name.starts_with("ctc:") {
                    DecoderChoice::Ctc
                } else {
                    DecoderChoice::Tdt
                };
                let nemo = case["clips"][clip].as_array().unwrap();
                match session.decode_beam(&enc, choice, &cfg) {
                    Ok(ours) => match compare(&session, &ours, nemo) {
                        Ok(()) => passed.push(what),
                        Err(e) => failed.push(format!("{what}: {e}")),
                    },
                    Err(e) => failed.push(format!("{what}: error {e:#}")),
                }
            }
        }
    }
    println!("passed ({}):\n  {}", passed.len(), passed.join("\n  "));
    println!("skipped ({}):\n  {}", skipped.len(), skipped.join("\n  "));
    assert!(failed.is_empty(), "failed:\n  {}", failed.join("\n  "));
    assert_eq!(passed.len(), ran_by_nemo, "every case NeMo ran must pass");
    assert_eq!(ran_by_nemo, 40, "the fixture's cases");
}

/// Settings a model cannot run are refused with a clear error before any graph runs.
#[test]
fn beam_settings_the_model_cannot_use_are_refused_before_any_graph() {
    let refused = |model: &str, choice, cfg: BeamConfig, boost: bool, expect: &str| {
        let mut session = Session::load(&gguf(model, OutType::F32), 2).unwrap();
        let features = session.features(&clip_samples("speech_2s.wav"));
        let enc = session.encode(&features, false).unwrap();
        if boost {
            let phrases = serde_json::json!({
                "phrases": ["the cat"], "alpha": 1.0, "context_score": 1.0,
                "depth_scaling": 2.0, "unk_score": 0.0, "score_per_phrase": 0.0,
                "uniform_weights": false
            });
            let tree = boost_tree(&session, &phrases);
            session.set_boosting(tree);
        }
        let graphs = session.stats().graphs_computed;
        let err = session.decode_beam(&enc, choice, &cfg).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(expect), "{model}: {msg:?} lacks {expect:?}");
        assert_eq!(session.stats().graphs_computed, graphs, "{model}: {msg}");
    };
    let (auto, ctc) = (DecoderChoice::Auto, DecoderChoice::Ctc);
    let cases = [
        ("tiny_tdt", auto, "malsd_batch", 0, false, "beam size 0"),
        ("tiny_tdt", auto, "tsd", 4, false, "does not run on a TDT"),
        (
            "tiny_tdt",
            auto,
            "beam_batch",
            4,
            false,
            "does not run on a TDT",
        ),
        (
            "tiny_ctc",
            auto,
            "malsd_batch",
            4,
            false,
            "does not run on a CTC",
        ),
        ("tiny_tdt", ctc, "beam_batch", 4, false, "no CTC head"),
        // NeMo refuses `beam` with a boosting tree (the fixture's `beam+boost` cases).
        ("tiny_rnnt", auto, "beam", 4, true, "cannot boost phrases"),
        ("tiny_tdt", auto, "beam", 4, true, "cannot boost phrases"),
        ("tiny_tdt", auto, "maes", 4, true, "cannot boost phrases"),
    ];
    for (model, choice, strategy, size, boost, expect) in cases {
        let cfg = BeamConfig::new(strategy.parse().unwrap(), size);
        refused(model, choice, cfg, boost, expect);
    }
}

/// A long utterance (the clip's encoder output eight times over) decodes in the compute
/// buffer of the short one, with the beam's hypotheses and a transcript that grows with it.
#[test]
fn a_long_utterance_decodes_in_the_same_memory() {
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), 2).unwrap();
    let features = session.features(&clip_samples("speech_10s.wav"));
    let enc = session.encode(&features, false).unwrap();
    let cfg = BeamConfig::new("malsd_batch".parse().unwrap(), 4);
    let short = session
        .decode_beam(&enc, DecoderChoice::Auto, &cfg)
        .unwrap();
    let buffer = session.compute_buffer_bytes();
    let long = parakeet::encoder::Encoded {
        frames: enc.frames * 8,
        d_model: enc.d_model,
        joint_enc: enc.joint_enc.as_ref().map(|j| j.repeat(8)),
        ..Default::default()
    };
    let nbest = session
        .decode_beam(&long, DecoderChoice::Auto, &cfg)
        .unwrap();
    assert_eq!(session.compute_buffer_bytes(), buffer);
    assert_eq!(nbest.len(), 4);
    let (n_short, n_long) = (short[0].tokens.len(), nbest[0].tokens.len());
    assert!(
        n_long > 6 * n_short && n_long < 10 * n_short,
        "{n_short} -> {n_long} tokens"
    );
    let frames: Vec<usize> = nbest[0].tokens.iter().map(|t| t.frame).collect();
    assert!(frames.is_sorted() && frames.last() < Some(&long.frames));
}
