//! Phrase boosting against NeMo 3.0 (tests/fixtures/decoding/<model>/boosting.json, stripped
//! from the shared references by scripts/strip_boosting_reference.py): the phrases' ids, every
//! boosting tree NeMo built (states, arcs, backoffs, finals and its advance() table), and greedy
//! TDT, RNN-T and CTC decoding with each phrase list and setting on both clips.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::boosting::{BoostingConfig, BoostingTree};
use parakeet::session::{DecoderChoice, Session};
use parakeet::tokenizer::Tokenizer;
use serde_json::Value;
use std::sync::Arc;

fn fixture(model: &str) -> Value {
    json(
        &fixtures()
            .join("decoding")
            .join(model)
            .join("boosting.json"),
    )
}

fn f32s(v: &Value) -> f32 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")) as f32
}

fn phrases(fx: &Value, list: &str) -> Vec<String> {
    fx["phrase_lists"][list]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phrase"].as_str().unwrap().to_owned())
        .collect()
}

/// The config NeMo built tree `tree_id` with, at `alpha`.
fn config(fx: &Value, tree_id: &str, alpha: f32) -> BoostingConfig {
    let tree = &fx["trees"][tree_id];
    let s = &tree["settings"];
    BoostingConfig {
        phrases: phrases(fx, tree["phrase_list"].as_str().unwrap()),
        alpha,
        context_score: f32s(&s["context_score"]),
        depth_scaling: f32s(&s["depth_scaling"]),
        unk_score: f32s(&s["unk_score"]),
        score_per_phrase: f32s(&s["score_per_phrase"]),
        uniform_weights: s["uniform_weights"].as_bool().unwrap(),
    }
}

fn tokenizer(model: &str) -> Tokenizer {
    let session = Session::load(&gguf(model, OutType::F32), 1).unwrap();
    session.model().tokenizer.clone()
}

#[test]
fn phrases_tokenise_as_nemos_text_to_ids() {
    for model in MODELS {
        let fx = fixture(model);
        let tok = tokenizer(model);
        for (list, items) in fx["phrase_lists"].as_object().unwrap() {
            for item in items.as_array().unwrap() {
                let phrase = item["phrase"].as_str().unwrap();
                let ours: Vec<usize> = tok
                    .encode(phrase)
                    .unwrap()
                    .iter()
                    .map(|&i| i as usize)
                    .collect();
                assert_eq!(ours, ints(&item["ids"]), "{model} {list}: {phrase:?}");
            }
        }
    }
}

#[test]
fn boosting_trees_equal_nemos() {
    for model in MODELS {
        let fx = fixture(model);
        let tok = tokenizer(model);
        let vocab = fx["vocab_size"].as_u64().unwrap() as usize;
        for (id, nemo) in fx["trees"].as_object().unwrap() {
            let what = format!("{model} tree {id}");
            let tree = BoostingTree::new(&tok, &config(&fx, id, 1.0)).unwrap();
            assert_eq!(tree.vocab_size(), vocab, "{what}: vocabulary");
            let states = nemo["states"].as_array().unwrap();
            assert_eq!(tree.states().len(), states.len(), "{what}: state count");
            for (i, (ours, s)) in tree.states().iter().zip(states).enumerate() {
                let ours = (
                    ours.arcs_start as usize,
                    ours.arcs_end as usize,
                    ours.order as usize,
                    ours.backoff_to as usize,
                );
                let s = s.as_array().unwrap();
                let ints: Vec<usize> = s[..4]
                    .iter()
                    .map(|v| v.as_u64().unwrap() as usize)
                    .collect();
                assert_eq!(
                    ours,
                    (ints[0], ints[1], ints[2], ints[3]),
                    "{what}: state {i}"
                );
                let st = tree.states()[i];
                assert_eq!(
                    st.backoff_w,
                    f32s(&s[4]),
                    "{what}: state {i} backoff weight"
                );
                assert_eq!(st.final_w, f32s(&s[5]), "{what}: state {i} final weight");
                assert_eq!(tree.final_score(i as u32), st.final_w);
            }
            let arcs = nemo["arcs"].as_array().unwrap();
            assert_eq!(tree.arcs().len(), arcs.len(), "{what}: arc count");
            for (i, (ours, a)) in tree.arcs().iter().zip(arcs).enumerate() {
                let a = a.as_array().unwrap();
                let nemo = (
                    a[0].as_u64().unwrap() as u32,
                    a[1].as_u64().unwrap() as u32,
                    a[2].as_u64().unwrap() as u32,
                    f32s(&a[3]),
                );
                assert_eq!(
                    (ours.from, ours.to, ours.label, ours.weight),
                    nemo,
                    "{what}: arc {i}"
                );
            }
            let (mut scores, mut next) = (vec![0.0; vocab], vec![0; vocab]);
            let nemo_scores = nemo["advance_scores"].as_array().unwrap();
            let nemo_next = nemo["advance_next_states"].as_array().unwrap();
            assert_eq!(nemo_scores.len(), states.len());
            for state in 0..states.len() {
                let want_scores = nemo_scores[state].as_array().unwrap();
                let want_next = ints(&nemo_next[state]);
                tree.advance_all(state as u32, &mut scores, &mut next);
                for label in 0..vocab {
                    let (score, to) = tree.advance(state as u32, label);
                    let want = f32s(&want_scores[label]);
                    assert!(
                        (score - want).abs() <= 1e-6,
                        "{what}: advance({state}, {label}) = {score}, NeMo {want}"
                    );
                    assert_eq!(
                        to as usize, want_next[label],
                        "{what}: next({state}, {label})"
                    );
                    assert_eq!(
                        (scores[label], next[label]),
                        (score, to),
                        "{what}: advance_all"
                    );
                }
            }
        }
        println!(
            "{model}: {} trees equal NeMo's",
            fx["trees"].as_object().unwrap().len()
        );
    }
}

/// Every boosting case (and the unboosted baseline) of every model, head and clip: tokens,
/// frames, durations and text equal NeMo's greedy_batch with `boosting_tree`. One encoder pass
/// per clip serves every case; the baseline also runs the whole pipeline from the samples.
#[test]
fn boosted_greedy_decoding_equals_nemo() {
    let mut checked = 0;
    for model in MODELS {
        let fx = fixture(model);
        let mut session = Session::load(&gguf(model, OutType::F32), 2).unwrap();
        let tok = session.model().tokenizer.clone();
        for (clip, results) in fx["results"].as_object().unwrap() {
            let samples = clip_samples(clip);
            let features = session.features(&samples);
            let enc = session.encode(&features, false).unwrap();
            for (key, nemo) in results.as_object().unwrap() {
                let case = &fx["cases"][key];
                let what = format!("{model} {clip} {key}");
                let choice = match case["head"].as_str().unwrap() {
                    "ctc" => DecoderChoice::Ctc,
                    _ => DecoderChoice::Tdt,
                };
                let tree = case["tree"].as_str().map(|id| {
                    let alpha = f32s(&case["alpha"]);
                    Arc::new(BoostingTree::new(&tok, &config(&fx, id, alpha)).unwrap())
                });
                let boosted = tree.is_some();
                session.set_boosting(tree);
                let (tokens, _) = session.decode(&enc, choice).unwrap();
                let ids: Vec<usize> = tokens.iter().map(|t| t.id).collect();
                assert_eq!(ids, ints(&nemo["tokens"]), "{what}: tokens");
                let frames: Vec<usize> = tokens.iter().map(|t| t.frame).collect();
                assert_eq!(frames, ints(&nemo["timestamp"]), "{what}: frames");
                if let Some(d) = nemo.get("token_duration") {
                    let durs: Vec<usize> = tokens.iter().map(|t| t.duration).collect();
                    assert_eq!(durs, ints(d), "{what}: durations");
                }
                let text = tok.detokenize(ids.iter().copied());
                assert_eq!(text, nemo["text"].as_str().unwrap(), "{what}: text");
                if !boosted {
                    let whole = session.transcribe(samples.clone(), choice).unwrap();
                    assert_eq!(whole.tokens, tokens, "{what}: transcribe");
                }
                checked += 1;
            }
        }
    }
    println!("{checked} decodes equal NeMo's");
    assert!(checked >= 4 * 2 * 11, "only {checked} cases checked");
}

/// A boosted transcript from the samples (the path the CLI takes) is the decode above, and
/// the session forgets the tree when told.
#[test]
fn a_session_boosts_until_told_to_stop() {
    let fx = fixture("tiny_tdt");
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), 2).unwrap();
    let tok = session.model().tokenizer.clone();
    let key = "tdt:C_3plus|S1_a1_cs1_ds2";
    let case = &fx["cases"][key];
    let tree = BoostingTree::new(
        &tok,
        &config(&fx, case["tree"].as_str().unwrap(), f32s(&case["alpha"])),
    )
    .unwrap();
    assert_eq!(tree.phrases(), 4);
    session.set_boosting(Some(Arc::new(tree)));
    let clip = CLIPS[0].1;
    let boosted = session
        .transcribe(clip_samples(clip), DecoderChoice::Auto)
        .unwrap();
    assert_eq!(
        boosted.text,
        fx["results"][clip][key]["text"].as_str().unwrap()
    );
    session.set_boosting(None);
    let plain = session
        .transcribe(clip_samples(clip), DecoderChoice::Auto)
        .unwrap();
    assert_eq!(
        plain.text,
        fx["results"][clip]["tdt:baseline"]["text"]
            .as_str()
            .unwrap()
    );
}

#[test]
fn bad_phrase_lists_are_refused_with_the_phrase_named() {
    let tok = tokenizer("tiny_tdt");
    let refuse = |list: &[&str]| {
        let cfg = BoostingConfig {
            phrases: list.iter().map(|s| s.to_string()).collect(),
            alpha: 1.0,
            ..BoostingConfig::default()
        };
        format!("{:#}", BoostingTree::new(&tok, &cfg).unwrap_err())
    };
    let e = refuse(&["data", ""]);
    assert!(e.contains("boost phrase 2") && e.contains("empty"), "{e}");
    let e = refuse(&["data", "日本語"]);
    assert!(
        e.contains("boost phrase 2 (\"日本語\")") && e.contains("<unk>"),
        "{e}"
    );
    // A model converted before the tokenizer was stored has its pieces only.
    let pieces_only = Tokenizer::new(tok.pieces().to_vec());
    let e = format!(
        "{:#}",
        BoostingTree::new(
            &pieces_only,
            &BoostingConfig {
                phrases: vec!["data".into()],
                ..BoostingConfig::default()
            }
        )
        .unwrap_err()
    );
    assert!(
        e.contains("convert the .nemo again with this version"),
        "{e}"
    );
    // A tree of another vocabulary is refused by the session, not misread.
    let big = Tokenizer::with_sentencepiece(
        &std::fs::read(fixtures().join("tokenizers/spe_bpe_v1024.model")).unwrap(),
    )
    .unwrap();
    let other = BoostingTree::new(
        &big,
        &BoostingConfig {
            phrases: vec!["data".into()],
            alpha: 1.0,
            ..BoostingConfig::default()
        },
    )
    .unwrap();
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), 1).unwrap();
    session.set_boosting(Some(Arc::new(other)));
    let e = format!(
        "{:#}",
        session
            .transcribe(clip_samples(CLIPS[1].1), DecoderChoice::Auto)
            .unwrap_err()
    );
    assert!(e.contains("1024-piece vocabulary"), "{e}");
}
