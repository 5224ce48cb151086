//! Token and word confidence against NeMo 3.0's (`confidence.json` of each tiny model, copied to
//! tests/fixtures/decoding/ by scripts/extract_confidence_fixtures.py): every method, alpha,
//! aggregation, blank handling and head NeMo ran, on the 10 s clip, through our whole pipeline.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::confidence::{Aggregation, ConfidenceConfig, Measure};
use parakeet::session::{DecodeOptions, DecodeRequest, DecoderChoice, Session};
use serde_json::Value;

/// Confidence within this of NeMo's; random tiny models give values down to ~1e-20, so absolute.
const TOLERANCE: f64 = 1e-5;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn config(case: &Value) -> ConfidenceConfig {
    let method = &case["method"];
    let name = method["name"].as_str().unwrap();
    let measure: Measure = if name == "max_prob" {
        Measure::MaxProb
    } else {
        format!(
            "entropy_{}_{}",
            method["entropy_type"].as_str().unwrap(),
            method["entropy_norm"].as_str().unwrap()
        )
        .parse()
        .unwrap()
    };
    ConfidenceConfig {
        measure,
        alpha: method["alpha"].as_f64().unwrap(),
        aggregation: case["aggregation"]
            .as_str()
            .unwrap()
            .parse::<Aggregation>()
            .unwrap(),
        exclude_blank: case["exclude_blank"].as_bool().unwrap(),
        tdt_include_duration: case["tdt_include_duration"].as_bool().unwrap(),
    }
}

fn max_abs_diff(ours: &[f64], nemo: &[f64]) -> f64 {
    ours.iter()
        .zip(nemo)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

#[test]
fn confidence_matches_nemo_for_every_method() {
    let mut checked = 0;
    for model in MODELS {
        let fixture = json(&fixtures().join(format!("decoding/{model}/confidence.json")));
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let cases = fixture["cases"].as_object().unwrap();
        assert!(!cases.is_empty(), "{model}: no cases");
        for (name, case) in cases {
            let cfg = config(case);
            let choice = match case["head"].as_str().unwrap() {
                "ctc" => DecoderChoice::Ctc,
                _ => DecoderChoice::Tdt,
            };
            let request = DecodeRequest {
                decoder: choice,
                confidence: Some(cfg),
                ..DecodeRequest::default()
            };
            let opts = DecodeOptions::new(session.model(), &request)
                .unwrap_or_else(|e| panic!("{model} {name}: {e}"));
            let samples = clip_samples(case["clip"].as_str().unwrap());
            let ours = session.transcribe(samples, &opts).unwrap();
            let ids: Vec<u64> = ours.tokens.iter().map(|t| t.id as u64).collect();
            let nemo_ids: Vec<u64> = case["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            assert_eq!(ids, nemo_ids, "{model} {name}: tokens");

            let token_conf: Vec<f64> = ours
                .token_confidence
                .as_ref()
                .unwrap_or_else(|| panic!("{model} {name}: no token confidence"))
                .iter()
                .map(|&c| c as f64)
                .collect();
            let nemo_tokens = floats(&case["token_confidence"]);
            assert_eq!(token_conf.len(), nemo_tokens.len(), "{model} {name}");
            let token_err = max_abs_diff(&token_conf, &nemo_tokens);
            assert!(
                token_err <= TOLERANCE,
                "{model} {name}: token confidence off by {token_err:e}"
            );

            let nemo_words = floats(&case["word_confidence"]);
            let word_conf: Vec<f64> = ours
                .words
                .iter()
                .map(|w| w.confidence.expect("word confidence") as f64)
                .collect();
            let texts: Vec<&str> = ours.words.iter().map(|w| w.text.as_str()).collect();
            // NeMo's word grouping (its word offsets), which its word confidence follows; its
            // `words` split the text at spaces instead, so an `<unk>` glued to a piece is one.
            let head = case["head"].as_str().unwrap();
            let clip = case["clip"].as_str().unwrap();
            let nemo_texts: Vec<&str> = fixture["segmentation"][head][clip]["words"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap())
                .collect();
            assert_eq!(texts, nemo_texts, "{model} {name}: words");
            assert_eq!(word_conf.len(), nemo_words.len(), "{model} {name}: words");
            let word_err = max_abs_diff(&word_conf, &nemo_words);
            assert!(
                word_err <= TOLERANCE,
                "{model} {name}: word confidence off by {word_err:e}"
            );
            checked += 1;
        }
    }
    println!("{checked} NeMo confidence cases equal within {TOLERANCE:e}");
    assert!(checked >= 150, "only {checked} cases checked");
}

/// Our token -> word grouping is NeMo's, `<unk>` and lone `▁` pieces included.
#[test]
fn words_group_tokens_as_nemo() {
    for model in MODELS {
        let fixture = json(&fixtures().join(format!("decoding/{model}/confidence.json")));
        for (head, clips) in fixture["segmentation"].as_object().unwrap() {
            for (clip, seg) in clips.as_object().unwrap() {
                let pieces: Vec<&str> = seg["pieces"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_str().unwrap())
                    .collect();
                let groups: Vec<Vec<usize>> = parakeet::tokenizer::word_groups(&pieces)
                    .into_iter()
                    .map(|g| g.collect())
                    .collect();
                let nemo: Vec<Vec<usize>> =
                    serde_json::from_value(seg["word_token_indices"].clone()).unwrap();
                assert_eq!(groups, nemo, "{model} {head} {clip}");
            }
        }
    }
}
