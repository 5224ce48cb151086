//! Words and times of the streaming pipelines' text (NeMo's `BPEDecoder` of
//! `nemo.collections.asr.inference`): tokens grouped into words at word marks, a segment's or
//! a word's times refined around word marks and punctuation, a word that is only a post-word
//! punctuation mark joined to the word before.

use super::{WORD_MARK, ids_to_text, round9};
use crate::decoder::confidence::Aggregation;
use crate::tokenizer::{Tokenizer, Word, is_punctuation};

/// A word's end snaps to the next word's start when that is this close (frames; NeMo's
/// `word_boundary_tolerance`).
const WORD_BOUNDARY_TOLERANCE: f64 = 4.0;

/// Marks that, alone as a word, join the word before (NeMo's `POST_WORD_PUNCTUATION`).
const POST_WORD_PUNCTUATION: [&str; 3] = [".", ",", "?"];

/// What the grouping knows of each piece of a vocabulary.
pub(super) struct Grouping {
    /// The piece starts a word.
    pub word_start: Vec<bool>,
    /// The piece is one of the vocabulary's punctuation marks (NeMo's `asr_supported_puncts`:
    /// the tokenizer's punctuation less the apostrophe); and it is one or the lone word mark.
    punctuation: Vec<bool>,
    punctuation_or_mark: Vec<bool>,
    /// Pieces whose times the transducer pipeline moves onto the piece before them (NeMo's
    /// `tokens_to_move`: the supported punctuation's ids and language tags such as `<en>`),
    /// and the lone word mark's id, moved along inside a run of them.
    movable: Vec<bool>,
    separator: Option<usize>,
    /// NeMo's `asr_supported_puncts`: the punctuation characters of the vocabulary's pieces
    /// (special pieces and those with a word mark left out) but the apostrophe.
    marks: Vec<char>,
    /// Seconds per encoder frame.
    frame_seconds: f64,
}

impl Grouping {
    pub fn new(tokenizer: &Tokenizer, frame_seconds: f64) -> Grouping {
        let pieces = tokenizer.pieces();
        let punctuation: Vec<bool> = pieces.iter().map(|p| is_mark(p)).collect();
        let mark = WORD_MARK.to_string();
        let mut marks: Vec<char> = pieces
            .iter()
            .filter(|p| !is_special(p))
            .flat_map(|p| p.chars())
            .filter(|&c| c != '\'' && is_punctuation(c))
            .collect();
        marks.sort_unstable();
        marks.dedup();
        // A mark's id is its piece's; SentencePiece gives a character that is no piece the
        // unknown piece's id, and so does NeMo's set.
        let id_of = |text: &str| {
            pieces
                .iter()
                .position(|p| p == text)
                .or_else(|| pieces.iter().position(|p| p == "<unk>"))
        };
        let mut movable: Vec<bool> = pieces
            .iter()
            .map(|p| p.starts_with('<') && p.ends_with('>') && p != "<unk>")
            .collect();
        for c in &marks {
            if let Some(id) = id_of(&c.to_string()) {
                movable[id] = true;
            }
        }
        Grouping {
            movable,
            separator: id_of(&mark),
            marks,
            word_start: pieces.iter().map(|p| p.starts_with(WORD_MARK)).collect(),
            punctuation_or_mark: pieces
                .iter()
                .zip(&punctuation)
                .map(|(p, &punct)| punct || *p == mark)
                .collect(),
            punctuation,
            frame_seconds,
        }
    }

    /// NeMo's `update_punctuation_and_language_tokens_timestamps` on a step's transducer
    /// tokens: a run of movable pieces (word marks inside it going along) takes the time of the
    /// piece before it, or `before_first` (the stream's frame 0 in the step's frames) at the
    /// start; a run of word marks alone keeps its times, and so do tokens that are all movable.
    pub fn move_mark_times(&self, ids: &[usize], times: &mut [i64], before_first: i64) {
        let movable = |id: usize| self.movable.get(id).copied().unwrap_or(false);
        let separator = |id: usize| Some(id) == self.separator;
        let either = |id: usize| movable(id) || separator(id);
        if ids.iter().all(|&id| either(id)) {
            return;
        }
        let mut i = 0;
        while i < ids.len() {
            if !either(ids[i]) {
                i += 1;
                continue;
            }
            let (first, mut last) = (i, i);
            i += 1;
            while i < ids.len() && either(ids[i]) {
                if !separator(ids[i]) {
                    last = i;
                }
                i += 1;
            }
            if last > first || movable(ids[first]) {
                let to = if first > 0 {
                    times[first - 1]
                } else {
                    before_first
                };
                times[first..=last].fill(to);
            }
        }
    }

    /// A finished segment's text as NeMo's text processor leaves it for a vocabulary with
    /// punctuation: no space before a mark, and a run of marks cut to its last.
    pub fn tidy_final(&self, text: &str) -> String {
        let joined = self.tidy_partial(text);
        let mut out = String::with_capacity(joined.len());
        let mut run: Option<char> = None;
        for c in joined.chars() {
            if self.marks.contains(&c) {
                run = Some(c);
                continue;
            }
            out.extend(run.take());
            out.push(c);
        }
        out.extend(run);
        out
    }

    /// A partial text as NeMo's pipeline prints it for a vocabulary with punctuation: no space
    /// before a mark.
    pub fn tidy_partial(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut space = String::new();
        for c in text.chars() {
            if c.is_whitespace() {
                space.push(c);
                continue;
            }
            if !self.marks.contains(&c) {
                out.push_str(&space);
            }
            space.clear();
            out.push(c);
        }
        out.push_str(&space);
        out
    }

    pub fn starts_word(&self, id: usize) -> bool {
        self.word_start.get(id).copied().unwrap_or(false)
    }

    /// NeMo's `group_tokens_into_words`: a word starts at a piece with the word mark; a word
    /// that is only `.`, `,` or `?` joins the word before (its times and confidence stay that
    /// word's); every other word's times are [`Self::refine`]d, the next word's start and the
    /// previous word's end considered. `confidences` with their aggregation, when measured.
    pub fn words(
        &self,
        tokenizer: &Tokenizer,
        tokens: &[usize],
        timesteps: &[f64],
        confidences: Option<(&[f64], Aggregation)>,
    ) -> Vec<Word> {
        let fs = self.frame_seconds;
        let mut bounds: Vec<usize> = (0..tokens.len())
            .filter(|&i| i == 0 || self.starts_word(tokens[i]))
            .collect();
        bounds.push(tokens.len());
        let mut words: Vec<Word> = Vec::new();
        let mut prev_end: Option<f64> = None;
        for pair in bounds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let text = ids_to_text(tokenizer, &tokens[a..b]);
            if text.is_empty() {
                continue;
            }
            if POST_WORD_PUNCTUATION.contains(&text.as_str())
                && let Some(before) = words.last_mut()
            {
                before.text.push_str(&text);
                continue;
            }
            let next = (b < tokens.len()).then(|| (timesteps[b], self.starts_word(tokens[b])));
            let (start, end) = self.refine(&tokens[a..b], &timesteps[a..b], next, prev_end);
            prev_end = Some(end);
            words.push(Word {
                text,
                start: round9(start * fs),
                end: round9(end * fs),
                confidence: confidences.map(|(c, how)| how.apply(&c[a..b]) as f32),
                speaker: None,
            });
        }
        words
    }

    /// NeMo's `refine_text_segment_timestamp`, in frames: a segment that starts with word marks
    /// or punctuation starts at its first other piece, one that ends with punctuation ends at
    /// its last other piece (each when there is one); the end snaps to the next word's start
    /// within the tolerance (`next`: its start and whether it starts a word); a start before
    /// the previous word's end moves the whole segment past it; a segment of no length lasts a
    /// frame.
    pub fn refine(
        &self,
        tokens: &[usize],
        timesteps: &[f64],
        next: Option<(f64, bool)>,
        prev_end: Option<f64>,
    ) -> (f64, f64) {
        let is = |table: &[bool], id: usize| table.get(id).copied().unwrap_or(false);
        let (mut start, mut end) = (timesteps[0], timesteps[timesteps.len() - 1]);
        let lead = &self.punctuation_or_mark;
        if is(lead, tokens[0])
            && let Some(i) = tokens.iter().position(|&id| !is(lead, id))
        {
            start = timesteps[i];
        }
        let trail = &self.punctuation;
        if is(trail, tokens[tokens.len() - 1])
            && let Some(i) = tokens.iter().rposition(|&id| !is(trail, id))
        {
            end = timesteps[i];
        }
        if let Some((next_start, true)) = next
            && next_start - end <= WORD_BOUNDARY_TOLERANCE
        {
            end = next_start;
        }
        if let Some(p) = prev_end
            && p > start
        {
            let delta = p - start;
            start += delta;
            end += delta;
        }
        let bump = if start == end { 1.0 } else { 0.0 };
        (start, end + bump)
    }
}

/// Whether a piece is one of NeMo's `asr_supported_puncts`: a single punctuation character
/// (Unicode category P, as the tokenizer's supported punctuation is derived) other than the
/// apostrophe, which NeMo's pipelines leave out of the set.
/// Pieces whose characters NeMo's punctuation set leaves out (`extract_punctuation_from_vocab`):
/// tags in brackets or angle brackets, word pieces after a `##`, pieces with a word mark, blank
/// pieces.
fn is_special(piece: &str) -> bool {
    let enclosed = |open: char, close: char| {
        piece.len() >= 2 && piece.starts_with(open) && piece.ends_with(close)
    };
    enclosed('[', ']')
        || enclosed('<', '>')
        || piece.starts_with("##")
        || piece.starts_with(WORD_MARK)
        || piece.chars().all(char::is_whitespace)
}

fn is_mark(piece: &str) -> bool {
    let mut chars = piece.chars();
    matches!((chars.next(), chars.next()), (Some(c), None) if c != '\'' && is_punctuation(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Tokenizer {
        let pieces = [
            "<unk>",
            "\u{2581}",
            "\u{2581}hello",
            "\u{2581}world",
            ".",
            ",",
            "?",
            "'",
            "s",
            "\u{2581}the",
            "!",
            "-",
        ];
        Tokenizer::new(pieces.iter().map(|p| p.to_string()).collect())
    }

    /// The ids of pieces named by their text (`_` for the word mark).
    fn ids(pieces: &[&str]) -> Vec<usize> {
        let t = vocab();
        let id = |p: &str| {
            let p = p.replace('_', "\u{2581}");
            t.pieces().iter().position(|q| *q == p).unwrap()
        };
        pieces.iter().map(|p| id(p)).collect()
    }

    fn words(pieces: &[&str], timesteps: &[f64]) -> Vec<(String, f64, f64)> {
        let t = vocab();
        Grouping::new(&t, 0.08)
            .words(&t, &ids(pieces), timesteps, None)
            .into_iter()
            .map(|w| (w.text, w.start / 0.08, w.end / 0.08))
            .map(|(w, s, e)| (w, round9(s), round9(e)))
            .collect()
    }

    fn w(text: &str, start: f64, end: f64) -> (String, f64, f64) {
        (text.to_string(), start, end)
    }

    #[test]
    fn the_marks_are_single_punctuation_pieces_but_the_apostrophe() {
        let g = Grouping::new(&vocab(), 0.08);
        let marks: Vec<usize> = (0..12).filter(|&i| g.punctuation[i]).collect();
        assert_eq!(marks, ids(&[".", ",", "?", "!", "-"]));
        let [mark, apostrophe, unknown] = ids(&["_", "'", "<unk>"])[..] else {
            unreachable!()
        };
        assert!(g.punctuation_or_mark[mark] && !g.punctuation[mark]);
        assert!(!g.punctuation[apostrophe] && !g.punctuation[unknown]);
    }

    // The expected times follow NeMo's `refine_text_segment_timestamp` and
    // `group_tokens_into_words` step by step, in frames.

    #[test]
    fn a_word_ends_at_its_last_piece_before_its_punctuation() {
        // "world." ends at "▁world" (12), not at the stop (19); "hello" ends at the next
        // word's start, 3 frames later.
        assert_eq!(
            words(&["_hello", "_world", "."], &[9.0, 12.0, 19.0]),
            [w("hello", 9.0, 12.0), w("world.", 12.0, 13.0)]
        );
        // Two marks: the last piece that is not one.
        assert_eq!(
            words(&["_hello", "s", "!", "?"], &[2.0, 6.0, 8.0, 9.0]),
            [w("hellos!?", 2.0, 6.0)]
        );
        // The apostrophe is no mark: the word ends on it.
        assert_eq!(
            words(&["_hello", "'"], &[2.0, 6.0]),
            [w("hello'", 2.0, 6.0)]
        );
    }

    #[test]
    fn a_lone_post_word_mark_joins_the_word_before() {
        // "▁" "," is a word of its own text ",": it joins "hello", whose end snapped to the
        // mark's start (within 4 frames); the next word's start is pushed past nothing.
        assert_eq!(
            words(&["_hello", "_", ",", "_world"], &[3.0, 5.0, 6.0, 20.0]),
            [w("hello,", 3.0, 5.0), w("world", 20.0, 21.0)]
        );
        // "!" is not a post-word mark: a word of its own; it starts at the word mark (no
        // other piece) and ends there too (the word mark is no punctuation), a frame long.
        assert_eq!(
            words(&["_hello", "_", "!"], &[3.0, 10.0, 11.0]),
            [w("hello", 3.0, 4.0), w("!", 10.0, 11.0)]
        );
        // First in the list, there is no word before: a word of its own, ending at the next
        // word's start.
        assert_eq!(
            words(&[".", "_the"], &[4.0, 5.0]),
            [w(".", 4.0, 5.0), w("the", 5.0, 6.0)]
        );
    }

    #[test]
    fn a_segment_starts_after_its_leading_marks() {
        let t = vocab();
        let g = Grouping::new(&t, 0.08);
        // A word mark then punctuation: the start is the first other piece's.
        assert_eq!(
            g.refine(
                &ids(&["_", ",", "_the", "_world", "."]),
                &[1.0, 2.0, 4.0, 9.0, 12.0],
                None,
                None
            ),
            (4.0, 9.0)
        );
        // Only punctuation: the times stay.
        assert_eq!(
            g.refine(&ids(&[".", ","]), &[1.0, 3.0], None, None),
            (1.0, 3.0)
        );
        // A word mark is no punctuation: a segment ending in one ends there.
        assert_eq!(
            g.refine(&ids(&["_", "."]), &[1.0, 3.0], None, None),
            (1.0, 2.0)
        );
        // A piece inside the segment that is punctuation changes nothing.
        assert_eq!(
            g.refine(
                &ids(&["_hello", ",", "_world"]),
                &[1.0, 2.0, 4.0],
                None,
                None
            ),
            (1.0, 4.0)
        );
    }
}
