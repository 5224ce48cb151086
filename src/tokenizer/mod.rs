//! The model's vocabulary: emitted tokens, their text (detokenisation) and words with time
//! spans; and text -> ids as NeMo's SentencePiece tokenizer gives them, from the SentencePiece
//! model the converter stores in the GGUF (docs/GGUF.md, "Tokenizer").

mod normalizer;
mod sentencepiece;

use anyhow::{Context, Result};
use std::ops::Range;

use crate::gguf::GgufFile;
use crate::gguf::GgufWriter;
use crate::hparams::keys;
use normalizer::Normalizer;
use sentencepiece::{Algorithm, PieceType, SentencePiece, SentencePieceModel};

/// One emitted token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub id: usize,
    /// Encoder frame where it was emitted.
    pub frame: usize,
    /// TDT duration in frames (0 for RNN-T / CTC).
    pub duration: usize,
}

/// A word with its time span in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Word {
    pub text: String,
    pub start: f64,
    pub end: f64,
    /// NeMo's word confidence, when it was asked for.
    pub confidence: Option<f32>,
    /// Who spoke it (Sortformer's speaker index), when the audio was diarized.
    pub speaker: Option<usize>,
}

/// SentencePiece's word-boundary marker.
const WORD_MARK: char = '\u{2581}';
/// What SentencePiece prints for `<unk>`.
const UNK_SURFACE: &str = " \u{2047} ";

fn piece_text(vocab: &[String], id: usize) -> &str {
    match vocab.get(id).map(String::as_str) {
        Some("<unk>") | None => UNK_SURFACE,
        Some(p) => p,
    }
}

/// Text of a token sequence as NeMo prints it: SentencePiece's decoding (pieces joined, `▁` ->
/// space, the leading space of a first `▁` piece dropped, `<unk>` as ` ⁇ `), then no space
/// before a punctuation mark (NeMo removes those for the punctuation its vocabulary has).
pub fn detokenize(vocab: &[String], ids: impl IntoIterator<Item = usize>) -> String {
    let mut ids = ids.into_iter().peekable();
    let first_is_word = ids
        .peek()
        .is_some_and(|&id| piece_text(vocab, id).starts_with(WORD_MARK));
    let joined: String = ids
        .map(|id| piece_text(vocab, id))
        .collect::<String>()
        .replace(WORD_MARK, " ");
    let text = if first_is_word {
        joined.strip_prefix(' ').unwrap_or(&joined)
    } else {
        &joined
    };
    let punctuation = vocab_punctuation(vocab);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if punctuation.contains(&c) {
            while out.ends_with(' ') && out.trim_end() != "" {
                out.pop();
            }
        }
        out.push(c);
    }
    out
}

/// The punctuation marks the vocabulary spells inside ordinary pieces (not `▁...`, `<...>`,
/// `[...]`), as NeMo derives them.
fn vocab_punctuation(vocab: &[String]) -> Vec<char> {
    let mut marks: Vec<char> = vocab
        .iter()
        .filter(|p| {
            !(p.starts_with(WORD_MARK)
                || (p.starts_with('<') && p.ends_with('>'))
                || (p.starts_with('[') && p.ends_with(']'))
                || p.starts_with("##")
                || p.trim().is_empty())
        })
        .flat_map(|p| p.chars())
        .filter(|&c| is_punctuation(c))
        .collect();
    marks.sort_unstable();
    marks.dedup();
    marks
}

/// Unicode general category P* for the characters Parakeet vocabularies use.
pub fn is_punctuation(c: char) -> bool {
    matches!(c, '!' | '"' | '#' | '%' | '&' | '\'' | '(' | ')' | '*' | ',' | '-' | '.' | '/'
        | ':' | ';' | '?' | '@' | '[' | '\\' | ']' | '_' | '{' | '}'
        | '\u{a1}' | '\u{a7}' | '\u{ab}' | '\u{b6}' | '\u{b7}' | '\u{bb}' | '\u{bf}'
        | '\u{2010}'..='\u{2027}' | '\u{2030}'..='\u{205e}' | '\u{3001}'..='\u{3003}')
}

/// Token frames to seconds, as NeMo times tokens: a TDT token ends after the duration its
/// head predicted (0 allowed: the next token starts on the same frame), an RNN-T or CTC token
/// after the one frame it was emitted on. No token ends after the audio: the last frame, and a
/// TDT duration, can reach past it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenClock {
    pub frame_seconds: f64,
    /// Whether [`Token::duration`] is the TDT head's prediction.
    pub tdt_durations: bool,
    /// Seconds of audio the tokens were decoded from.
    pub audio_seconds: f64,
}

impl TokenClock {
    /// A token's start and end in seconds.
    pub fn span(&self, tok: &Token) -> (f64, f64) {
        let frames = if self.tdt_durations { tok.duration } else { 1 };
        let at = |frame: usize| (frame as f64 * self.frame_seconds).min(self.audio_seconds);
        (at(tok.frame), at(tok.frame + frames))
    }
}

/// Group tokens into words, as NeMo groups them for word confidence and timestamps
/// ([`word_groups`]): a word spans its tokens' spans ([`TokenClock::span`]).
pub fn words(vocab: &[String], tokens: &[Token], clock: &TokenClock) -> Vec<Word> {
    let pieces: Vec<&str> = tokens.iter().map(|t| piece_text(vocab, t.id)).collect();
    word_groups(&pieces)
        .into_iter()
        .map(|group| {
            let text: String = pieces[group.clone()]
                .iter()
                .map(|p| p.replace(WORD_MARK, "").trim().to_owned())
                .collect();
            let spans = tokens[group].iter().map(|t| clock.span(t));
            let (start, end) = spans
                .reduce(|(s, e), (_, e2)| (s, e.max(e2)))
                .unwrap_or_default();
            Word {
                text,
                start,
                end,
                confidence: None,
                speaker: None,
            }
        })
        .collect()
}

/// NeMo's grouping of SentencePiece tokens into words (its word confidence): a word starts at
/// a piece that decodes to other text than itself (one beginning with `▁`, or `<unk>`) and
/// after an `<unk>`; continuations and punctuation join the word before; a group that is a
/// lone `▁` is no word. `pieces` as [`piece_text`] gives them (`<unk>` as its surface).
pub fn word_groups(pieces: &[&str]) -> Vec<Range<usize>> {
    let is_unk = |p: &str| p == UNK_SURFACE || p == "<unk>";
    let mut groups = Vec::new();
    let (mut start, mut prev_unk, mut prev_mark) = (0, false, false);
    for (i, &piece) in pieces.iter().enumerate() {
        let starts_word = piece.starts_with(WORD_MARK) || is_unk(piece);
        if (starts_word || prev_unk) && i > start {
            if !prev_mark {
                groups.push(start..i);
            }
            start = i;
        }
        prev_unk = is_unk(piece);
        prev_mark = piece.len() == WORD_MARK.len_utf8() && piece.starts_with(WORD_MARK);
    }
    if !pieces.is_empty() && !prev_mark {
        groups.push(start..pieces.len());
    }
    groups
}

/// A model's vocabulary, and (in files converted with it) the SentencePiece model that turns
/// text into its ids.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// Pieces in id order; the blank id is `pieces.len()`.
    pieces: Vec<String>,
    sentencepiece: Option<SentencePiece>,
}

impl Tokenizer {
    /// A vocabulary alone: ids -> text only.
    pub fn new(pieces: Vec<String>) -> Tokenizer {
        Tokenizer {
            pieces,
            sentencepiece: None,
        }
    }

    /// The tokenizer a SentencePiece `.model` file describes.
    pub fn with_sentencepiece(model: &[u8]) -> Result<Tokenizer> {
        let (pieces, model) = sentencepiece::parse_model(model)?;
        let sentencepiece = SentencePiece::new(&pieces, model)?;
        Ok(Tokenizer {
            pieces,
            sentencepiece: Some(sentencepiece),
        })
    }

    /// The tokenizer of a parakeet GGUF: its pieces, and its SentencePiece model when the file
    /// has one (files converted before it was stored have the pieces only).
    pub fn read(f: &GgufFile) -> Result<Tokenizer> {
        let shown = f.path().display();
        let pieces = f.str_array(keys::TOKENS)?;
        if f.get(keys::TOKENIZER_ALGORITHM).is_none() {
            return Ok(Tokenizer::new(pieces));
        }
        let name = f.str(keys::TOKENIZER_ALGORITHM)?;
        let algorithm = Algorithm::from_name(&name).with_context(|| {
            format!(
                "{shown}: {} = {name} is not supported (unigram, bpe)",
                keys::TOKENIZER_ALGORITHM
            )
        })?;
        let scores = f.f32_array(keys::SCORES)?;
        let types = f
            .int_array(keys::TOKEN_TYPE)?
            .into_iter()
            .map(|code| {
                PieceType::from_code(code).with_context(|| {
                    format!("{shown}: {} holds unknown type {code}", keys::TOKEN_TYPE)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let model = SentencePieceModel {
            algorithm,
            scores,
            types,
            normalizer: Normalizer {
                name: f.str(keys::NORMALIZER_NAME)?,
                charsmap: f.bytes(keys::PRECOMPILED_CHARSMAP)?,
                add_dummy_prefix: f.bool(keys::ADD_DUMMY_PREFIX)?,
                remove_extra_whitespaces: f.bool(keys::REMOVE_EXTRA_WHITESPACES)?,
                escape_whitespaces: f.bool(keys::ESCAPE_WHITESPACES)?,
            },
            byte_fallback: f.bool(keys::BYTE_FALLBACK)?,
        };
        let sentencepiece = SentencePiece::new(&pieces, model)
            .with_context(|| format!("{shown}: the tokenizer's SentencePiece model"))?;
        Ok(Tokenizer {
            pieces,
            sentencepiece: Some(sentencepiece),
        })
    }

    /// Writes the `tokenizer.ggml.*` and `parakeet.tokenizer.*` keys (docs/GGUF.md).
    pub fn write(&self, w: &mut GgufWriter) -> Result<()> {
        w.set_str(keys::TOKENIZER_MODEL, "sentencepiece")?;
        w.set_str_array(keys::TOKENS, &self.pieces)?;
        let Some(m) = self.sentencepiece.as_ref().map(SentencePiece::model) else {
            return Ok(());
        };
        w.set_f32_array(keys::SCORES, &m.scores)?;
        let types: Vec<i32> = m.types.iter().map(|&t| t as i32).collect();
        w.set_i32_array(keys::TOKEN_TYPE, &types)?;
        w.set_str(keys::TOKENIZER_ALGORITHM, m.algorithm.name())?;
        let n = &m.normalizer;
        w.set_str(keys::NORMALIZER_NAME, &n.name)?;
        w.set_bytes(keys::PRECOMPILED_CHARSMAP, &n.charsmap)?;
        w.set_bool(keys::ADD_DUMMY_PREFIX, n.add_dummy_prefix)?;
        w.set_bool(keys::REMOVE_EXTRA_WHITESPACES, n.remove_extra_whitespaces)?;
        w.set_bool(keys::ESCAPE_WHITESPACES, n.escape_whitespaces)?;
        w.set_bool(keys::BYTE_FALLBACK, m.byte_fallback)?;
        Ok(())
    }

    /// Number of pieces (the blank id).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub fn pieces(&self) -> &[String] {
        &self.pieces
    }

    pub fn piece(&self, id: usize) -> Option<&str> {
        self.pieces.get(id).map(String::as_str)
    }

    /// Whether [`encode`](Self::encode) can work (the file has the SentencePiece model).
    pub fn can_encode(&self) -> bool {
        self.sentencepiece.is_some()
    }

    /// The id [`encode`](Self::encode) gives text that no piece spells (`None` without the
    /// SentencePiece model).
    pub fn unknown_id(&self) -> Option<u32> {
        self.sentencepiece.as_ref().map(SentencePiece::unknown_id)
    }

    /// See [`detokenize`].
    pub fn detokenize(&self, ids: impl IntoIterator<Item = usize>) -> String {
        detokenize(&self.pieces, ids)
    }

    /// See [`words`].
    /// The token index ranges of the words [`words`](Self::words) makes, as NeMo groups them.
    pub fn word_groups(&self, tokens: &[Token]) -> Vec<Range<usize>> {
        let pieces: Vec<&str> = tokens
            .iter()
            .map(|t| piece_text(&self.pieces, t.id))
            .collect();
        word_groups(&pieces)
    }

    pub fn words(&self, tokens: &[Token], clock: &TokenClock) -> Vec<Word> {
        words(&self.pieces, tokens, clock)
    }

    /// `text` as the model's ids, exactly as NeMo's `text_to_ids` (SentencePiece's encoding).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let sentencepiece = self.sentencepiece.as_ref().context(
            "this model file has no SentencePiece model, only its vocabulary, so text cannot \
             be turned into ids; convert the .nemo again with this version",
        )?;
        Ok(sentencepiece.encode(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vec<String> {
        ["<unk>", "▁he", "llo", "▁world", ",", "▁", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn detokenize_joins_pieces_like_sentencepiece() {
        let v = vocab();
        assert_eq!(detokenize(&v, [1, 2, 4, 3]), "hello, world");
        assert_eq!(detokenize(&v, [5, 1]), " he");
        assert_eq!(detokenize(&v, [1, 0, 2]), "he \u{2047} llo");
        // <unk> first keeps its leading space; no space before punctuation.
        assert_eq!(detokenize(&v, [0, 6]), " \u{2047} a");
        assert_eq!(detokenize(&v, [1, 0, 4]), "he \u{2047},");
    }

    #[test]
    fn words_carry_time_spans() {
        let v = vocab();
        let t = |id, frame, duration| Token {
            id,
            frame,
            duration,
        };
        let tokens = [t(1, 0, 2), t(2, 2, 1), t(4, 3, 0), t(3, 10, 4)];
        let span = |w: &Word| (w.text.clone(), w.start, w.end);
        let near = |got: Vec<(String, f64, f64)>, want: [(&str, f64, f64); 2]| {
            assert_eq!(got.len(), 2);
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.0, w.0);
                assert!(
                    (g.1 - w.1).abs() < 1e-9 && (g.2 - w.2).abs() < 1e-9,
                    "{g:?} {w:?}"
                );
            }
        };
        // TDT: a token ends after its predicted duration, the zero-duration "," on its own
        // frame; the last word stops at the audio's end (1.1 s, not frame 14's 1.12 s).
        let tdt = TokenClock {
            frame_seconds: 0.08,
            tdt_durations: true,
            audio_seconds: 1.1,
        };
        let w = words(&v, &tokens, &tdt);
        near(
            w.iter().map(span).collect(),
            [("hello,", 0.0, 0.24), ("world", 0.8, 1.1)],
        );
        let (start, end) = tdt.span(&tokens[2]);
        assert!(start == end && (start - 0.24).abs() < 1e-9);
        // RNN-T and CTC: each token covers its frame.
        let one_frame = TokenClock {
            tdt_durations: false,
            audio_seconds: 10.0,
            ..tdt
        };
        let w = words(&v, &tokens, &one_frame);
        near(
            w.iter().map(span).collect(),
            [("hello,", 0.0, 0.32), ("world", 0.8, 0.88)],
        );
    }

    #[test]
    fn words_start_at_marks_and_unknowns_and_skip_a_lone_mark() {
        let groups = word_groups(&["\u{2581}a", "b", "\u{2581}", "\u{2581}c", "<unk>", "d"]);
        assert_eq!(groups, vec![0..2, 3..4, 4..5, 5..6]);
        // A lone mark before a continuation is that word's start.
        assert_eq!(word_groups(&["\u{2581}", "a", "\u{2581}"]), vec![0..2]);
    }
}
