//! Text -> ids against SentencePiece's own encoding (tests/fixtures/tokenizers/refs.json, made
//! by scripts/make_tokenizer_refs.py) and against the ids NeMo gave the boosting phrases, from
//! the .model files and from the tokenizer stored in a converted GGUF.

use std::collections::HashMap;

use crate::common::{fixtures, gguf, nemo};
use parakeet::convert::{NemoArchive, OutType};
use parakeet::model::Model;
use parakeet::tokenizer::Tokenizer;
use serde::Deserialize;

#[derive(Deserialize)]
struct Refs {
    nemo_phrase_ids: HashMap<String, Vec<(String, Vec<u32>)>>,
    strings: Vec<String>,
    /// Per model, per string: the ids, space-separated.
    ids: HashMap<String, Vec<String>>,
}

fn refs() -> Refs {
    let path = fixtures().join("tokenizers/refs.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn check(tokenizer: &Tokenizer, model: &str, refs: &Refs) {
    let want = &refs.ids[model];
    assert_eq!(want.len(), refs.strings.len());
    let mut wrong = Vec::new();
    for (text, want) in refs.strings.iter().zip(want) {
        let want: Vec<u32> = want.split(' ').filter_map(|i| i.parse().ok()).collect();
        let got = tokenizer.encode(text).unwrap();
        if got != want {
            wrong.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{model}: {} of {} strings differ, e.g.\n{}",
        wrong.len(),
        refs.strings.len(),
        wrong[..wrong.len().min(5)].join("\n")
    );
}

fn from_model_file(name: &str) -> Tokenizer {
    let bytes = std::fs::read(fixtures().join(format!("tokenizers/{name}.model"))).unwrap();
    Tokenizer::with_sentencepiece(&bytes).unwrap()
}

#[test]
fn bpe_v1024_encodes_as_sentencepiece() {
    check(&from_model_file("spe_bpe_v1024"), "spe_bpe_v1024", &refs());
}

#[test]
fn unigram_with_byte_fallback_encodes_as_sentencepiece() {
    check(&from_model_file("unigram_bytes"), "unigram_bytes", &refs());
}

#[test]
fn the_tiny_models_tokenizer_survives_conversion() {
    let refs = refs();
    let archive = NemoArchive::open(&nemo("tiny_tdt")).unwrap();
    let direct = Tokenizer::with_sentencepiece(archive.tokenizer_model().unwrap()).unwrap();
    check(&direct, "spe_bpe_v48", &refs);
    let model = Model::load(&gguf("tiny_tdt", OutType::F32)).unwrap();
    assert_eq!(model.tokenizer().pieces(), direct.pieces());
    check(model.tokenizer(), "spe_bpe_v48", &refs);
}

#[test]
fn boosting_phrases_get_nemos_ids() {
    let refs = refs();
    assert_eq!(refs.nemo_phrase_ids.len(), 4);
    for (model, phrases) in &refs.nemo_phrase_ids {
        let m = Model::load(&gguf(model, OutType::F32)).unwrap();
        for (phrase, ids) in phrases {
            assert_eq!(
                &m.tokenizer().encode(phrase).unwrap(),
                ids,
                "{model}: {phrase}"
            );
        }
    }
}
