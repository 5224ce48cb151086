//! Text -> ids as SentencePiece encodes them (NeMo's `text_to_ids`): the model's normaliser,
//! then its segmentation, BPE merges or the unigram model's best path, then SentencePiece's
//! handling of unknown text (one `<unk>` for a run of unknown pieces, or UTF-8 byte pieces
//! when the model has byte fallback).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use crate::error::{Error, Fault, Result};
use crate::{bail, ensure};

use super::normalizer::Normalizer;

/// How a model segments normalised text (SentencePiece's `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Unigram,
    Bpe,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Unigram => "unigram",
            Algorithm::Bpe => "bpe",
        }
    }

    pub fn from_name(name: &str) -> Option<Algorithm> {
        match name {
            "unigram" => Some(Algorithm::Unigram),
            "bpe" => Some(Algorithm::Bpe),
            _ => None,
        }
    }
}

/// A piece's role (SentencePiece's `SentencePiece.Type`; llama.cpp's `token_type` uses the same
/// numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceType {
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl PieceType {
    pub fn from_code(code: i64) -> Option<PieceType> {
        Some(match code {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }

    /// Pieces that segmentation may produce (the rest are ids only: `<unk>`, `<s>`, bytes).
    fn is_segment(self) -> bool {
        matches!(
            self,
            PieceType::Normal | PieceType::UserDefined | PieceType::Unused
        )
    }
}

/// Everything besides the pieces themselves that encoding needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SentencePieceModel {
    pub algorithm: Algorithm,
    /// Per piece, in id order.
    pub scores: Vec<f32>,
    pub types: Vec<PieceType>,
    pub normalizer: Normalizer,
    /// Unknown text as its UTF-8 bytes' `<0xXX>` pieces instead of `<unk>`.
    pub byte_fallback: bool,
}

/// The `.model` file's protobuf messages, as far as encoding needs them (SentencePiece's
/// `sentencepiece_model.proto`; unlisted fields are skipped).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelProto {
        #[prost(message, repeated, tag = "1")]
        pub pieces: Vec<Piece>,
        #[prost(message, optional, tag = "2")]
        pub trainer_spec: Option<TrainerSpec>,
        #[prost(message, optional, tag = "3")]
        pub normalizer_spec: Option<NormalizerSpec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Piece {
        #[prost(string, optional, tag = "1")]
        pub piece: Option<String>,
        #[prost(float, optional, tag = "2")]
        pub score: Option<f32>,
        #[prost(int32, optional, tag = "3", default = "1")]
        pub r#type: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrainerSpec {
        #[prost(int32, optional, tag = "3", default = "1")]
        pub model_type: Option<i32>,
        #[prost(bool, optional, tag = "24", default = "false")]
        pub treat_whitespace_as_suffix: Option<bool>,
        #[prost(bool, optional, tag = "35", default = "false")]
        pub byte_fallback: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NormalizerSpec {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub precompiled_charsmap: Option<Vec<u8>>,
        #[prost(bool, optional, tag = "3", default = "true")]
        pub add_dummy_prefix: Option<bool>,
        #[prost(bool, optional, tag = "4", default = "true")]
        pub remove_extra_whitespaces: Option<bool>,
        #[prost(bool, optional, tag = "5", default = "true")]
        pub escape_whitespaces: Option<bool>,
    }
}

/// Parses a SentencePiece `.model` file: its pieces in id order, and the rest of the model.
pub fn parse_model(bytes: &[u8]) -> Result<(Vec<String>, SentencePieceModel)> {
    use prost::Message;
    let m = proto::ModelProto::decode(bytes)
        .fault(Error::Model, "not a SentencePiece model (protobuf)")?;
    let trainer = m.trainer_spec.unwrap_or_default();
    let algorithm = match trainer.model_type() {
        1 => Algorithm::Unigram,
        2 => Algorithm::Bpe,
        3 => bail!(
            Model,
            "SentencePiece model type WORD is not supported (unigram, bpe)"
        ),
        4 => bail!(
            Model,
            "SentencePiece model type CHAR is not supported (unigram, bpe)"
        ),
        other => bail!(Model, "unknown SentencePiece model type {other}"),
    };
    ensure!(
        !trainer.treat_whitespace_as_suffix(),
        Model,
        "SentencePiece's treat_whitespace_as_suffix is not supported"
    );
    let spec = m.normalizer_spec.unwrap_or_default();
    let normalizer = Normalizer {
        name: spec.name().to_owned(),
        charsmap: spec.precompiled_charsmap().to_vec(),
        add_dummy_prefix: spec.add_dummy_prefix(),
        remove_extra_whitespaces: spec.remove_extra_whitespaces(),
        escape_whitespaces: spec.escape_whitespaces(),
    };
    let mut pieces = Vec::with_capacity(m.pieces.len());
    let mut scores = Vec::with_capacity(m.pieces.len());
    let mut types = Vec::with_capacity(m.pieces.len());
    for (id, p) in m.pieces.iter().enumerate() {
        pieces.push(p.piece().to_owned());
        scores.push(p.score());
        types.push(
            PieceType::from_code(p.r#type().into()).with_fault(Error::Model, || {
                format!("piece {id} has unknown type {}", p.r#type())
            })?,
        );
    }
    let model = SentencePieceModel {
        algorithm,
        scores,
        types,
        normalizer,
        byte_fallback: trainer.byte_fallback(),
    };
    Ok((pieces, model))
}

/// A model ready to encode: the lookups built once from its pieces.
#[derive(Clone, Debug)]
pub struct SentencePiece {
    model: SentencePieceModel,
    /// Every piece -> its id.
    ids: HashMap<String, u32>,
    /// Pieces that segmentation may produce -> id.
    segments: HashMap<String, u32>,
    /// User-defined pieces, longest first: kept whole, never normalised or split.
    user_defined: Vec<String>,
    unk: u32,
    longest_piece: usize,
    /// Lowest and highest score of a normal piece (the unigram model prices unknown text and
    /// user-defined pieces from them).
    min_score: f32,
    max_score: f32,
}

/// What the unigram model charges for an unknown character, below the cheapest piece.
const UNK_PENALTY: f32 = 10.0;

impl SentencePiece {
    pub fn new(pieces: &[String], model: SentencePieceModel) -> Result<SentencePiece> {
        ensure!(
            model.scores.len() == pieces.len() && model.types.len() == pieces.len(),
            Model,
            "{} pieces but {} scores and {} types",
            pieces.len(),
            model.scores.len(),
            model.types.len()
        );
        let unk = model
            .types
            .iter()
            .position(|&t| t == PieceType::Unknown)
            .fault(Error::Model, "the SentencePiece model has no <unk> piece")?;
        if let Err(why) = model.normalizer.check_charsmap() {
            bail!(
                Model,
                "its text normalisation table ({}, precompiled_charsmap) is corrupt: {why}",
                model.normalizer.name
            );
        }
        let (mut ids, mut segments) = (HashMap::new(), HashMap::new());
        let mut user_defined = Vec::new();
        let (mut min_score, mut max_score) = (f32::MAX, f32::MIN_POSITIVE);
        for (id, piece) in pieces.iter().enumerate() {
            let ty = model.types[id];
            ensure!(
                ids.insert(piece.clone(), id as u32).is_none(),
                Model,
                "the SentencePiece model lists piece {piece:?} twice"
            );
            if ty.is_segment() {
                segments.insert(piece.clone(), id as u32);
            }
            if ty == PieceType::UserDefined && !piece.is_empty() {
                user_defined.push(piece.clone());
            }
            if ty == PieceType::Normal {
                min_score = min_score.min(model.scores[id]);
                max_score = max_score.max(model.scores[id]);
            }
        }
        user_defined.sort_by_key(|p| Reverse(p.len()));
        Ok(SentencePiece {
            model,
            longest_piece: segments.keys().map(|p| p.len()).max().unwrap_or(1),
            ids,
            segments,
            user_defined,
            unk: unk as u32,
            min_score,
            max_score,
        })
    }

    /// The length of the user-defined piece that `text` starts with (0: none).
    fn user_defined_prefix(&self, text: &str) -> usize {
        self.user_defined
            .iter()
            .find(|p| text.starts_with(p.as_str()))
            .map_or(0, |p| p.len())
    }

    /// One symbol at the start of `text`: a user-defined piece, else one character.
    fn symbol_len(&self, text: &str) -> (usize, bool) {
        match self.user_defined_prefix(text) {
            0 => (text.chars().next().map_or(0, char::len_utf8), false),
            n => (n, true),
        }
    }

    pub fn model(&self) -> &SentencePieceModel {
        &self.model
    }

    /// The id of `<unk>`, what [`encode`](Self::encode) gives for text no piece spells.
    pub fn unknown_id(&self) -> u32 {
        self.unk
    }

    /// `text` as ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let normalized = self
            .model
            .normalizer
            .normalize(text, |t| self.user_defined_prefix(t));
        let pieces = match self.model.algorithm {
            Algorithm::Bpe => self.bpe(&normalized),
            Algorithm::Unigram => self.unigram(&normalized),
        };
        let mut ids = Vec::with_capacity(pieces.len());
        let mut previous_unknown = false;
        for (piece, id) in pieces {
            let unknown = id == self.unk;
            if unknown && self.model.byte_fallback {
                ids.extend(piece.bytes().map(|b| {
                    self.ids
                        .get(format!("<0x{b:02X}>").as_str())
                        .copied()
                        .unwrap_or(self.unk)
                }));
                previous_unknown = false;
                continue;
            }
            // SentencePiece reports a run of unknown pieces as one.
            if !(unknown && previous_unknown) {
                ids.push(id);
            }
            previous_unknown = unknown;
        }
        ids
    }

    /// The id of a final piece (`<unk>` for text no piece spells).
    fn id(&self, piece: &str) -> u32 {
        self.ids.get(piece).copied().unwrap_or(self.unk)
    }

    /// BPE: start from symbols (characters, user-defined pieces), then repeatedly merge the
    /// adjacent pair that spells the highest-scoring piece (leftmost on ties). A merge into an
    /// unused piece is undone at the end, back into the pieces it was made of.
    fn bpe<'t>(&self, text: &'t str) -> Vec<(&'t str, u32)> {
        struct Symbol {
            start: usize,
            len: usize,
            prev: Option<usize>,
            next: Option<usize>,
            frozen: bool,
        }
        #[derive(PartialEq)]
        struct Candidate {
            score: f32,
            left: usize,
            right: usize,
            len: usize,
        }
        impl Eq for Candidate {}
        impl Ord for Candidate {
            fn cmp(&self, other: &Self) -> Ordering {
                self.score
                    .total_cmp(&other.score)
                    .then_with(|| other.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Candidate {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }

        let mut symbols: Vec<Symbol> = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let (len, frozen) = self.symbol_len(&text[at..]);
            let index = symbols.len();
            symbols.push(Symbol {
                start: at,
                len,
                prev: index.checked_sub(1),
                next: (at + len < text.len()).then_some(index + 1),
                frozen,
            });
            at += len;
        }
        let mut agenda = BinaryHeap::new();
        let mut unmerge: HashMap<&'t str, (&'t str, &'t str)> = HashMap::new();
        let piece = |s: &Symbol| &text[s.start..s.start + s.len];
        let mut consider = |symbols: &[Symbol],
                            agenda: &mut BinaryHeap<Candidate>,
                            left: Option<usize>,
                            right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r) = (&symbols[left], &symbols[right]);
            if l.frozen || r.frozen {
                return;
            }
            let merged = &text[l.start..l.start + l.len + r.len];
            let Some(&id) = self.segments.get(merged) else {
                return;
            };
            agenda.push(Candidate {
                score: self.model.scores[id as usize],
                left,
                right,
                len: merged.len(),
            });
            if self.model.types[id as usize] == PieceType::Unused {
                unmerge.insert(merged, (piece(l), piece(r)));
            }
        };
        for i in 1..symbols.len() {
            consider(&symbols, &mut agenda, Some(i - 1), Some(i));
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (&symbols[top.left], &symbols[top.right]);
            // Stale: one side has been merged into something else since.
            if l.len == 0 || r.len == 0 || l.len + r.len != top.len {
                continue;
            }
            let right_next = r.next;
            symbols[top.left].len = top.len;
            symbols[top.left].next = right_next;
            if let Some(n) = right_next {
                symbols[n].prev = Some(top.left);
            }
            symbols[top.right].len = 0;
            consider(
                &symbols,
                &mut agenda,
                symbols[top.left].prev,
                Some(top.left),
            );
            consider(&symbols, &mut agenda, Some(top.left), right_next);
        }
        let mut out = Vec::new();
        let mut index = (!symbols.is_empty()).then_some(0);
        while let Some(i) = index {
            self.resegment(piece(&symbols[i]), &unmerge, &mut out);
            index = symbols[i].next;
        }
        out
    }

    fn resegment<'t>(
        &self,
        piece: &'t str,
        unmerge: &HashMap<&'t str, (&'t str, &'t str)>,
        out: &mut Vec<(&'t str, u32)>,
    ) {
        let id = self.id(piece);
        if self.model.types[id as usize] == PieceType::Unused
            && let Some(&(left, right)) = unmerge.get(piece)
        {
            self.resegment(left, unmerge, out);
            self.resegment(right, unmerge, out);
        } else {
            out.push((piece, id));
        }
    }

    /// Unigram: the segmentation with the highest total score (Viterbi over character
    /// positions); a character no piece starts with is `<unk>` at a penalty.
    fn unigram<'t>(&self, text: &'t str) -> Vec<(&'t str, u32)> {
        #[derive(Clone, Copy)]
        struct Best {
            id: u32,
            score: f32,
            start: Option<usize>,
        }
        let unknown_score = self.min_score - UNK_PENALTY;
        let mut best = vec![
            Best {
                id: 0,
                score: 0.0,
                start: None,
            };
            text.len() + 1
        ];
        let offer = |best: &mut [Best], end: usize, start: usize, id: u32, score: f32| {
            let candidate = score + best[start].score;
            let node = &mut best[end];
            if node.start.is_none() || candidate > node.score {
                *node = Best {
                    id,
                    score: candidate,
                    start: Some(start),
                };
            }
        };
        let mut start = 0;
        while start < text.len() {
            let char_len = text[start..].chars().next().map_or(1, char::len_utf8);
            let mut covered = false;
            let limit = text.len().min(start + self.longest_piece);
            for end in (start + 1..=limit).filter(|&e| text.is_char_boundary(e)) {
                let Some(&id) = self.segments.get(&text[start..end]) else {
                    continue;
                };
                let ty = self.model.types[id as usize];
                if ty == PieceType::Unused {
                    continue;
                }
                // A user-defined piece always wins over splitting it.
                let score = if ty == PieceType::UserDefined {
                    (end - start) as f32 * self.max_score - 0.1
                } else {
                    self.model.scores[id as usize]
                };
                offer(&mut best, end, start, id, score);
                covered |= end - start == char_len;
            }
            if !covered {
                offer(&mut best, start + char_len, start, self.unk, unknown_score);
            }
            start += char_len;
        }
        let mut out = Vec::new();
        let mut end = text.len();
        while end > 0 {
            let node = best[end];
            let start = node.start.expect("every character boundary is reached");
            out.push((&text[start..end], node.id));
            end = start;
        }
        out.reverse();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nmt_nfkc's table, from the 1024-piece BPE model of the fixtures.
    fn nfkc() -> Normalizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tokenizers/spe_bpe_v1024.model"
        );
        let bytes = std::fs::read(path).unwrap();
        parse_model(&bytes).unwrap().1.normalizer
    }

    #[test]
    fn a_damaged_table_is_named_and_a_sound_one_passes() {
        let sound = nfkc();
        assert_eq!(sound.name, "nmt_nfkc");
        assert_eq!(sound.check_charsmap(), Ok(()));
        let identity = Normalizer {
            charsmap: Vec::new(),
            ..sound.clone()
        };
        assert_eq!(identity.check_charsmap(), Ok(()));
        let size = u32::from_le_bytes(sound.charsmap[..4].try_into().unwrap()) as usize;
        let damaged = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut n = sound.clone();
            edit(&mut n.charsmap);
            n.check_charsmap().unwrap_err()
        };
        let e = damaged(&|t| t.truncate(3));
        assert_eq!(e, "3 bytes, shorter than its 4-byte header");
        let e = damaged(&|t| t.truncate(size));
        assert_eq!(
            e,
            format!(
                "its header gives a {size}-byte trie, but the table holds {} bytes",
                size - 4
            )
        );
        let e = damaged(&|t| t[..4].copy_from_slice(&(size as u32 - 2).to_le_bytes()));
        assert!(e.contains("not a whole number of 4-byte units"), "{e}");
        let e = damaged(&|t| {
            let end = t.len() - 1;
            t[end] = b'x';
        });
        assert_eq!(e, "its replacement strings do not end with a NUL");
        // A rule's value past the strings, and a replacement that is not UTF-8: the value
        // units are those with bit 31 set.
        let value_at = (4..4 + size)
            .step_by(4)
            .find(|&i| sound.charsmap[i + 3] & 0x80 != 0)
            .unwrap();
        let e = damaged(&|t| t[value_at..value_at + 3].fill(0xff));
        assert!(
            e.contains("-byte replacement strings, not to the start of one"),
            "{e}"
        );
        let e = damaged(&|t| t[4 + size] = 0xff);
        assert_eq!(e, "its replacement string 1 is not UTF-8 text");
        // A unit whose children would lie past the trie's end.
        let inner_at = (4..4 + size)
            .step_by(4)
            .find(|&i| sound.charsmap[i + 3] & 0x80 == 0)
            .unwrap();
        let e = damaged(&|t| t[inner_at + 2..inner_at + 4].copy_from_slice(&[0xff, 0x7f]));
        assert!(e.contains("points outside the trie of"), "{e}");
        // Units that hold no value at all.
        let e = damaged(&|t| t[4..4 + size].fill(0));
        assert_eq!(e, "its trie holds no rule");
    }
}
