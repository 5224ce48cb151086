//! Phrase boosting against NeMo 3.0 (tests/fixtures/decoding/<model>/boosting.json, stripped
//! from the shared references by scripts/strip_boosting_reference.py): the phrases' ids, every
//! boosting tree NeMo built (states, arcs, backoffs, finals and its advance() table), and greedy
//! TDT, RNN-T and CTC decoding with each phrase list and setting on both clips.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::boosting::{BoostingConfig, BoostingTree};
use parakeet::session::{BeamRequest, DecodeOptions, DecodeRequest, DecoderChoice, Session};
use parakeet::tokenizer::Tokenizer;
use serde_json::Value;

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
    let phrases = phrases(fx, tree["phrase_list"].as_str().unwrap());
    with_settings(phrases, &tree["settings"], alpha)
}

/// `phrases` boosted with NeMo's `boosting_tree` settings `s` (as the fixtures spell them).
fn with_settings(phrases: Vec<String>, s: &Value, alpha: f32) -> BoostingConfig {
    BoostingConfig {
        phrases,
        alpha,
        context_score: f32s(&s["context_score"]),
        depth_scaling: f32s(&s["depth_scaling"]),
        unk_score: f32s(&s["unk_score"]),
        score_per_phrase: f32s(&s["score_per_phrase"]),
        uniform_weights: s["uniform_weights"].as_bool().unwrap(),
    }
}

fn ids(tok: &Tokenizer, phrase: &str) -> Vec<usize> {
    let ids = tok.encode(phrase).unwrap();
    ids.iter().map(|&i| i as usize).collect()
}

fn u32_at(v: &[Value], i: usize) -> u32 {
    v[i].as_u64()
        .unwrap_or_else(|| panic!("not an index: {}", v[i])) as u32
}

/// Every state of `tree` against NeMo's `[arcs_start, arcs_end, order, backoff_to, backoff_w,
/// final]` rows.
fn assert_states_equal(what: &str, tree: &BoostingTree, states: &[Value]) {
    assert_eq!(tree.states().len(), states.len(), "{what}: state count");
    for (i, (ours, s)) in tree.states().iter().zip(states).enumerate() {
        let s = s.as_array().unwrap();
        let nemo = (
            (0..4).map(|k| u32_at(s, k)).collect::<Vec<_>>(),
            f32s(&s[4]),
            f32s(&s[5]),
        );
        let ours_row = (
            vec![ours.arcs_start, ours.arcs_end, ours.order, ours.backoff_to],
            ours.backoff_w,
            ours.final_w,
        );
        assert_eq!(ours_row, nemo, "{what}: state {i}");
        assert_eq!(tree.final_score(i as u32), ours.final_w);
    }
}

/// Arc `i` of `tree` against NeMo's `[from, to, ilabel, weight]`.
fn assert_arc_equal(what: &str, tree: &BoostingTree, i: usize, nemo: &[Value]) {
    let a = tree.arcs()[i];
    assert_eq!(
        (a.from, a.to, a.label, a.weight),
        (
            u32_at(nemo, 0),
            u32_at(nemo, 1),
            u32_at(nemo, 2),
            f32s(&nemo[3])
        ),
        "{what}: arc {i}"
    );
}

/// `tree.advance(state, label)` against NeMo's score (within 1e-6) and next state.
fn assert_advance(
    what: &str,
    tree: &BoostingTree,
    state: u32,
    label: usize,
    nemo: (&Value, &Value),
) {
    let (score, to) = tree.advance(state, label);
    let want = f32s(nemo.0);
    assert!(
        (score - want).abs() <= 1e-6,
        "{what}: advance({state}, {label}) = {score}, NeMo {want}"
    );
    assert_eq!(
        Some(to as u64),
        nemo.1.as_u64(),
        "{what}: next({state}, {label})"
    );
}

fn tokenizer(model: &str) -> Tokenizer {
    let session = Session::load(&gguf(model, OutType::F32), threads(1)).unwrap();
    session.model().tokenizer().clone()
}

#[test]
fn phrases_tokenise_as_nemos_text_to_ids() {
    for model in MODELS {
        let fx = fixture(model);
        let tok = tokenizer(model);
        for (list, items) in fx["phrase_lists"].as_object().unwrap() {
            for item in items.as_array().unwrap() {
                let phrase = item["phrase"].as_str().unwrap();
                assert_eq!(
                    ids(&tok, phrase),
                    ints(&item["ids"]),
                    "{model} {list}: {phrase:?}"
                );
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
            assert_states_equal(&what, &tree, states);
            let arcs = nemo["arcs"].as_array().unwrap();
            assert_eq!(tree.arcs().len(), arcs.len(), "{what}: arc count");
            for (i, a) in arcs.iter().enumerate() {
                assert_arc_equal(&what, &tree, i, a.as_array().unwrap());
            }
            let (mut scores, mut next) = (vec![0.0; vocab], vec![0; vocab]);
            let nemo_scores = nemo["advance_scores"].as_array().unwrap();
            let nemo_next = nemo["advance_next_states"].as_array().unwrap();
            assert_eq!(nemo_scores.len(), states.len());
            for state in 0..states.len() {
                tree.advance_all(state as u32, &mut scores, &mut next);
                for label in 0..vocab {
                    let nemo = (&nemo_scores[state][label], &nemo_next[state][label]);
                    assert_advance(&what, &tree, state as u32, label, nemo);
                    assert_eq!(
                        (scores[label], next[label]),
                        tree.advance(state as u32, label),
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
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let tok = session.model().tokenizer().clone();
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
                let boost = case["tree"]
                    .as_str()
                    .map(|id| config(&fx, id, f32s(&case["alpha"])));
                let boosted = boost.is_some();
                let request = DecodeRequest {
                    decoder: choice,
                    boost,
                    ..DecodeRequest::default()
                };
                let opts = DecodeOptions::new(session.model(), &request).unwrap();
                let tokens = session.decode(&enc, &opts).unwrap().tokens;
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
                    let whole = session.transcribe(samples.clone(), &opts).unwrap();
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
/// the next call without phrases is not boosted: nothing of a call stays in the session.
#[test]
fn boosting_is_the_calls_and_does_not_stay_in_the_session() {
    let fx = fixture("tiny_tdt");
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    let key = "tdt:C_3plus|S1_a1_cs1_ds2";
    let case = &fx["cases"][key];
    let request = DecodeRequest {
        boost: Some(config(
            &fx,
            case["tree"].as_str().unwrap(),
            f32s(&case["alpha"]),
        )),
        ..DecodeRequest::default()
    };
    let opts = DecodeOptions::new(session.model(), &request).unwrap();
    assert_eq!(opts.boosting().unwrap().phrases(), 4);
    let clip = CLIPS[0].1;
    let boosted = session.transcribe(clip_samples(clip), &opts).unwrap();
    assert_eq!(
        boosted.text,
        fx["results"][clip][key]["text"].as_str().unwrap()
    );
    let greedy = DecodeOptions::greedy(session.model()).unwrap();
    let plain = session.transcribe(clip_samples(clip), &greedy).unwrap();
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
    // Through the options, the phrase is named the same way, as the user's option error.
    let session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(1)).unwrap();
    let request = DecodeRequest {
        boost: Some(BoostingConfig {
            phrases: vec!["data".into(), "".into()],
            alpha: 1.0,
            ..BoostingConfig::default()
        }),
        ..DecodeRequest::default()
    };
    let e = DecodeOptions::new(session.model(), &request).unwrap_err();
    assert!(
        matches!(&e, parakeet::error::Error::Options(m) if m.contains("boost phrase 2")),
        "{e:?}"
    );
}

/// Weights outside their documented finite ranges are refused before the tree is built,
/// naming the flag; the ends of the ranges decode (greedy and CTC beam alike) with no error.
#[test]
fn boosting_weights_outside_their_ranges_are_refused() {
    let mut session = Session::load(&gguf("tiny_tdt_ctc", OutType::F32), threads(2)).unwrap();
    let boost = |alpha: f32, context_score: f32| BoostingConfig {
        phrases: vec!["the cat".into()],
        alpha,
        context_score,
        ..BoostingConfig::default()
    };
    for (alpha, score, flag) in [
        (
            1e37,
            1.0,
            "--boost-alpha 10000000000000000000000000000000000000",
        ),
        (f32::NAN, 1.0, "--boost-alpha NaN"),
        (-1.0, 1.0, "--boost-alpha -1"),
        (1e7, 1.0, "--boost-alpha 10000000"),
        (1.0, 3e38, "--boost-context-score"),
        (1.0, f32::INFINITY, "--boost-context-score inf"),
    ] {
        let request = DecodeRequest {
            boost: Some(boost(alpha, score)),
            ..DecodeRequest::default()
        };
        let e = DecodeOptions::new(session.model(), &request).unwrap_err();
        assert!(
            matches!(&e, parakeet::error::Error::Options(m) if m.contains(flag) && m.contains("takes")),
            "{alpha} {score}: {e:?}"
        );
    }
    let samples = clip_samples(CLIPS[1].1);
    for decoder in [DecoderChoice::Auto, DecoderChoice::Ctc] {
        for beam in [None, Some(BeamRequest::new(4))] {
            let request = DecodeRequest {
                decoder,
                boost: Some(boost(10.0, 10.0)),
                beam,
                ..DecodeRequest::default()
            };
            let opts = DecodeOptions::new(session.model(), &request).unwrap();
            let t = session.transcribe(samples.clone(), &opts).unwrap();
            assert!(!t.tokens.is_empty(), "{decoder:?}");
        }
    }
}

/// Trees harder than the shared references' (shared prefixes with different per-phrase scores,
/// phrases inside others, repeats, uniform weights, 220 phrases) on the 1024-piece tokenizer,
/// against NeMo (scripts/make_boosting_tree_refs.py): ids, every state, every arc off the start
/// state's unk arcs, and advance() on sampled (state, label) pairs.
#[test]
fn larger_trees_on_a_real_vocabulary_equal_nemos() {
    let fx = json(&fixtures().join("decoding/boosting_trees_v1024.json"));
    let tok = Tokenizer::with_sentencepiece(
        &std::fs::read(fixtures().join(fx["tokenizer"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    for case in fx["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let phrases: Vec<String> = case["phrases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_owned())
            .collect();
        for (phrase, ids) in phrases.iter().zip(case["ids"].as_array().unwrap()) {
            assert_eq!(
                self::ids(&tok, phrase),
                ints(ids),
                "{name}: ids of {phrase:?}"
            );
        }
        let tree =
            BoostingTree::new(&tok, &with_settings(phrases, &case["settings"], 1.0)).unwrap();
        let states = case["states"].as_array().unwrap();
        assert_states_equal(name, &tree, states);
        // Listed: every arc but the start state's unk arcs (label l's arc is arc l).
        let listed = case["arcs"].as_array().unwrap();
        let vocab = tok.len();
        let ours: Vec<usize> = (0..tree.arcs().len())
            .filter(|&i| i >= vocab || tree.arcs()[i].to != 0)
            .collect();
        let nemo: Vec<usize> = listed
            .iter()
            .map(|a| a[0].as_u64().unwrap() as usize)
            .collect();
        assert_eq!(ours, nemo, "{name}: arcs listed");
        for a in listed {
            let a = a.as_array().unwrap();
            assert_arc_equal(name, &tree, a[0].as_u64().unwrap() as usize, &a[1..]);
        }
        for (i, arc) in tree.arcs()[..vocab].iter().enumerate() {
            if arc.to == 0 {
                assert_eq!(
                    (arc.from, arc.label, arc.weight),
                    (0, i as u32, f32s(&case["settings"]["unk_score"]))
                );
            }
        }
        for p in case["advance"].as_array().unwrap() {
            let (state, label) = (
                p[0].as_u64().unwrap() as u32,
                p[1].as_u64().unwrap() as usize,
            );
            assert_advance(name, &tree, state, label, (&p[2], &p[3]));
        }
        println!("{name}: {} states equal NeMo's", states.len());
    }
}
