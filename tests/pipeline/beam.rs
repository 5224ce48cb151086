//! Beam search against NeMo 3.0: every beam case of `tests/fixtures/decoding/beam.json`
//! (NeMo's N-best lists with beam size 4 for the four tiny models on both clips, through our
//! f32 pipeline from the WAV): each hypothesis' tokens, timestamps, durations and text equal
//! NeMo's, in NeMo's order, and scores within 1e-4 (two f32 steps where that is more). Cases
//! NeMo itself refused (its error is in the fixture) are skipped and named.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::beam::{BeamConfig, BeamStrategy, NBest, transducer_beam};
use parakeet::decoder::boosting::BoostingConfig;
use parakeet::decoder::nets::InputGates;
use parakeet::session::{
    BeamRequest, DecodeOptions, DecodeRequest, DecoderChoice, MAX_BEAM_SIZE, MAX_MAES_BEAM_SIZE,
    Session,
};
use serde_json::Value;

/// The case's boosting settings (NeMo's phrases and settings), or `None`.
fn boost_config(boost: &Value) -> Option<BoostingConfig> {
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
    Some(cfg)
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
    let tokenizer = &session.model().tokenizer();
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
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
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
                let strategy: BeamStrategy = case["strategy"].as_str().unwrap().parse().unwrap();
                let decoder = if name.starts_with("ctc:") {
                    DecoderChoice::Ctc
                } else {
                    DecoderChoice::Tdt
                };
                let request = DecodeRequest {
                    decoder,
                    boost: boost_config(&case["boost"]),
                    beam: Some(BeamRequest {
                        strategy: Some(strategy),
                        score_norm: case["score_norm"].as_bool().unwrap(),
                        ..BeamRequest::new(case["beam_size"].as_u64().unwrap() as usize)
                    }),
                    ..DecodeRequest::default()
                };
                let opts = DecodeOptions::new(session.model(), &request).unwrap();
                let nemo = case["clips"][clip].as_array().unwrap();
                match session.decode_beam(&enc, &opts) {
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

/// Settings a model cannot run are refused with a clear error when the options are built,
/// before any graph.
#[test]
fn beam_settings_the_model_cannot_use_are_refused_before_any_graph() {
    let refused = |model: &str, decoder, strategy: &str, size, boost: bool, expect: &str| {
        let session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let phrases = serde_json::json!({
            "phrases": ["the cat"], "alpha": 1.0, "context_score": 1.0,
            "depth_scaling": 2.0, "unk_score": 0.0, "score_per_phrase": 0.0,
            "uniform_weights": false
        });
        let request = DecodeRequest {
            decoder,
            boost: if boost { boost_config(&phrases) } else { None },
            beam: Some(BeamRequest {
                strategy: Some(strategy.parse().unwrap()),
                ..BeamRequest::new(size)
            }),
            ..DecodeRequest::default()
        };
        let err = DecodeOptions::new(session.model(), &request).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(expect), "{model}: {msg:?} lacks {expect:?}");
        assert!(
            matches!(err, parakeet::error::Error::Options(_)),
            "{model}: {err:?}"
        );
        assert_eq!(session.stats().graphs_computed, 0, "{model}: {msg}");
    };
    let (auto, ctc) = (DecoderChoice::Auto, DecoderChoice::Ctc);
    let cases = [
        ("tiny_tdt", auto, "malsd_batch", 0, false, "--beam 0"),
        (
            "tiny_tdt",
            auto,
            "malsd_batch",
            MAX_BEAM_SIZE + 1,
            false,
            "at most 256",
        ),
        (
            "tiny_ctc",
            auto,
            "beam_batch",
            usize::MAX,
            false,
            "at most 256",
        ),
        (
            "tiny_rnnt",
            auto,
            "maes_batch",
            1 << 32,
            false,
            "at most 256",
        ),
        (
            "tiny_tdt",
            auto,
            "malsd_batch",
            100_000,
            false,
            "at most 256",
        ),
        ("tiny_tdt", auto, "malsd_batch", 4096, false, "at most 256"),
        ("tiny_tdt", auto, "maes", 9, false, "maes takes at most 8"),
        ("tiny_rnnt", auto, "maes", 20, false, "maes takes at most 8"),
        (
            "tiny_rnnt",
            auto,
            "maes_batch",
            64,
            false,
            "maes_batch draws the beam",
        ),
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
    for (model, decoder, strategy, size, boost, expect) in cases {
        refused(model, decoder, strategy, size, boost, expect);
    }
}

/// The largest beams run within the graphs' capacity: the batched searches (whose step graphs
/// grow with the beam) at 256, `maes` (whose graphs grow with its square) at its own bound;
/// the transcript keeps the best of the N-best list, first.
#[test]
fn the_largest_beams_run() {
    for (model, decoder, strategies) in [
        (
            "tiny_tdt",
            DecoderChoice::Auto,
            &["malsd_batch", "maes"][..],
        ),
        (
            "tiny_rnnt",
            DecoderChoice::Auto,
            &["malsd_batch", "maes", "maes_batch", "alsd"][..],
        ),
        ("tiny_ctc", DecoderChoice::Auto, &["beam_batch"][..]),
    ] {
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        // On the 2 s clip `alsd` at the largest beam once returned several times the beam.
        let features = session.features(&clip_samples("speech_2s.wav"));
        let enc = session.encode(&features, false).unwrap();
        let vocab = session.model().hparams().vocab_size;
        for strategy in strategies {
            // `maes` has its own bound; both maes draw the beam and 2 more candidates from
            // the vocabulary.
            let size = match *strategy {
                "maes" => MAX_MAES_BEAM_SIZE,
                "maes_batch" => MAX_BEAM_SIZE.min(vocab - 2),
                _ => MAX_BEAM_SIZE,
            };
            let request = DecodeRequest {
                decoder,
                beam: Some(BeamRequest {
                    strategy: Some(strategy.parse().unwrap()),
                    nbest: 3,
                    ..BeamRequest::new(size)
                }),
                ..DecodeRequest::default()
            };
            let opts = DecodeOptions::new(session.model(), &request).unwrap();
            let nbest = session
                .decode_beam(&enc, &opts)
                .unwrap_or_else(|e| panic!("{model} {strategy}: {e:#}"));
            assert!(!nbest.is_empty(), "{model} {strategy}");
            assert!(nbest.len() <= size, "{model} {strategy}: {}", nbest.len());
            let decoded = session.decode(&enc, &opts).unwrap();
            assert_eq!(decoded.alternatives.len(), 3.min(nbest.len()));
            assert_eq!(
                decoded.alternatives.first(),
                nbest.first(),
                "{model} {strategy}"
            );
        }
    }
}

/// A long utterance (the clip's encoder output eight times over) decodes in the compute
/// buffer of the short one, with the beam's hypotheses and a transcript that grows with it.
#[test]
fn a_long_utterance_decodes_in_the_same_memory() {
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    let features = session.features(&clip_samples("speech_10s.wav"));
    let enc = session.encode(&features, false).unwrap();
    let opts = DecodeOptions::new(
        session.model(),
        &DecodeRequest {
            beam: Some(BeamRequest {
                strategy: Some("malsd_batch".parse().unwrap()),
                ..BeamRequest::new(4)
            }),
            ..DecodeRequest::default()
        },
    )
    .unwrap();
    let short = session.decode_beam(&enc, &opts).unwrap();
    let buffer = session.compute_buffer_bytes();
    let long = parakeet::encoder::Encoded {
        frames: enc.frames * 8,
        d_model: enc.d_model,
        joint_enc: enc.joint_enc.as_ref().map(|j| j.repeat(8)),
        ..Default::default()
    };
    let nbest = session.decode_beam(&long, &opts).unwrap();
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

/// A beam configuration built directly (not through the options) is held to the same bounds
/// before any graph: the largest `maes_batch` beam the tiny RNN-T's vocabulary allows runs, one
/// more is refused with the option's words, and a beam beyond a graph cannot be built.
#[test]
fn a_beam_built_directly_stays_within_the_graph() {
    let mut session = Session::load(&gguf("tiny_rnnt", OutType::F32), threads(2)).unwrap();
    let features = session.features(&clip_samples("speech_2s.wav"));
    let enc = session.encode(&features, false).unwrap();
    let model = session.model().clone();
    let vocab = model.hparams().vocab_size;
    let joint_enc = enc.joint_enc.as_ref().unwrap();
    let mut gates = InputGates::for_model(&model);
    let mut backend = parakeet::backend::Backend::cpu(2).unwrap();
    let mut run = |size: usize| {
        let cfg = BeamConfig::new(BeamStrategy::MaesBatch, size).unwrap();
        transducer_beam(
            &mut backend,
            &model,
            &mut gates,
            joint_enc,
            enc.frames,
            &cfg,
            None,
        )
    };
    let nbest = run(vocab - 2).unwrap();
    assert!(
        !nbest.is_empty() && nbest.len() <= vocab - 2,
        "{}",
        nbest.len()
    );
    let err = run(vocab - 1).unwrap_err().to_string();
    assert!(
        err.contains(&format!("at most --beam {}", vocab - 2)),
        "{err}"
    );
    let err = BeamConfig::new(BeamStrategy::MalsdBatch, 100_000).unwrap_err();
    assert!(
        err.to_string().contains("--beam 100000: at most 256"),
        "{err}"
    );
}
