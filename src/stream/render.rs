//! How the `stream` command shows events: text (a terminal's partial line redrawn in place and
//! finished lines scrolling; elsewhere only the finished lines) or JSON lines.

use super::{StreamEvent, Utterance};
use crate::diar::words::speaker_name;
use serde::Serialize;
use std::io::{self, Write};

/// `--format` of the `stream` command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EventFormat {
    /// Finished utterances one a line (on a terminal, the current one is redrawn as it grows);
    /// `text` is another name for it.
    #[default]
    #[value(name = "txt", alias = "text")]
    Text,
    /// One JSON object a line: {"type": "partial"|"final", "text", "start", "end", "words"};
    /// a word is {"word", "start", "end"}, as in `transcribe`'s JSON and OpenAI's (with
    /// "speaker" in a diarized stream's finals).
    Jsonl,
}

/// Carriage return, then ANSI "erase the whole line": the cursor is back at column 0 of a blank
/// line, ready to draw the partial again.
const REDRAW: &str = "\r\x1b[2K";

/// Writes events to `out`, flushing after each, so a reader at the other end of a pipe sees
/// every line when it happens.
pub struct EventWriter<W: Write> {
    out: W,
    format: EventFormat,
    /// Whether `out` is a terminal (text partials are only drawn there).
    terminal: bool,
    /// A partial line is on the screen, not yet ended by a newline.
    partial_shown: bool,
}

impl<W: Write> EventWriter<W> {
    pub fn new(out: W, format: EventFormat, terminal: bool) -> Self {
        Self {
            out,
            format,
            terminal,
            partial_shown: false,
        }
    }

    pub fn write(&mut self, event: &StreamEvent) -> io::Result<()> {
        match (self.format, event) {
            (EventFormat::Jsonl, StreamEvent::Partial(u)) => self.json_line("partial", u)?,
            (EventFormat::Jsonl, StreamEvent::Final(u)) => self.json_line("final", u)?,
            (EventFormat::Text, StreamEvent::Partial(u)) if self.terminal => {
                write!(self.out, "{REDRAW}{}", u.text)?;
                self.partial_shown = true;
            }
            (EventFormat::Text, StreamEvent::Partial(_)) => return Ok(()),
            (EventFormat::Text, StreamEvent::Final(u)) => {
                if self.terminal {
                    write!(self.out, "{REDRAW}")?;
                }
                writeln!(self.out, "{}", speaker_text(u))?;
                self.partial_shown = false;
            }
        }
        self.out.flush()
    }

    /// Ends a partial line left on the terminal (the input stopped without a final), so the
    /// shell's prompt starts on a line of its own.
    pub fn close(&mut self) -> io::Result<()> {
        if self.partial_shown {
            writeln!(self.out)?;
            self.partial_shown = false;
        }
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    fn json_line(&mut self, kind: &'static str, u: &Utterance) -> io::Result<()> {
        let line = JsonEvent {
            kind,
            text: &u.text,
            start: millis(u.start),
            end: millis(u.end),
            words: u
                .words
                .iter()
                .map(|w| JsonWord {
                    word: &w.text,
                    start: millis(w.start),
                    end: millis(w.end),
                    confidence: w.confidence,
                    speaker: w.speaker.map(speaker_name),
                })
                .collect(),
        };
        serde_json::to_writer(&mut self.out, &line)?;
        writeln!(self.out)
    }
}

/// One `--format jsonl` line, its fields in the documented order.
#[derive(Serialize)]
struct JsonEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    start: f64,
    end: f64,
    words: Vec<JsonWord<'a>>,
}

#[derive(Serialize)]
struct JsonWord<'a> {
    word: &'a str,
    start: f64,
    end: f64,
    /// When asked for (`--confidence`).
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence: Option<f32>,
    /// When diarized (`--diarize`): `speaker_<k>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    speaker: Option<String>,
}

/// A final's line: its text, or, when its words have speakers, each speaker's run of words
/// after the speaker's name in brackets (`[speaker_0] hello there [speaker_1] hi`).
fn speaker_text(u: &Utterance) -> String {
    let mut out = String::new();
    let mut current = None;
    for w in &u.words {
        let Some(k) = w.speaker else {
            return u.text.clone();
        };
        if current != Some(k) {
            let gap = if out.is_empty() { "" } else { " " };
            out.push_str(&format!("{gap}[{}]", speaker_name(k)));
            current = Some(k);
        }
        out.push(' ');
        out.push_str(&w.text);
    }
    if out.is_empty() {
        return u.text.clone();
    }
    out
}

/// Seconds rounded to the millisecond: encoder frames are 40 or 80 ms, so nothing is lost, and
/// the lines do not carry binary fractions like 1.2000000000000002.
fn millis(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Word;

    fn utterance(text: &str, start: f64, end: f64) -> Utterance {
        Utterance {
            text: text.into(),
            start,
            end,
            words: text
                .split(' ')
                .enumerate()
                .map(|(i, w)| Word {
                    text: w.into(),
                    start: start + i as f64 * 0.1,
                    end: start + (i + 1) as f64 * 0.1,
                    confidence: None,
                    speaker: None,
                })
                .collect(),
            tokens: Vec::new(),
        }
    }

    fn render(format: EventFormat, terminal: bool, events: &[StreamEvent]) -> String {
        let mut w = EventWriter::new(Vec::new(), format, terminal);
        for e in events {
            w.write(e).unwrap();
        }
        w.close().unwrap();
        String::from_utf8(w.into_inner()).unwrap()
    }

    fn events() -> Vec<StreamEvent> {
        vec![
            StreamEvent::Partial(utterance("hello", 0.0, 0.1)),
            StreamEvent::Partial(utterance("hello world", 0.0, 0.2)),
            StreamEvent::Final(utterance("hello world", 0.0, 0.2)),
            StreamEvent::Partial(utterance("again", 1.3, 1.4)),
        ]
    }

    #[test]
    fn a_terminal_redraws_the_partial_and_scrolls_finals() {
        assert_eq!(
            render(EventFormat::Text, true, &events()),
            "\r\x1b[2Khello\r\x1b[2Khello world\r\x1b[2Khello world\n\r\x1b[2Kagain\n"
        );
    }

    #[test]
    fn a_pipe_gets_only_finals() {
        assert_eq!(render(EventFormat::Text, false, &events()), "hello world\n");
    }

    #[test]
    fn jsonl_writes_every_event_with_its_words() {
        let out = render(EventFormat::Jsonl, false, &events()[1..3]);
        let line = r#"{"type":"partial","text":"hello world","start":0.0,"end":0.2,"words":[{"word":"hello","start":0.0,"end":0.1},{"word":"world","start":0.1,"end":0.2}]}"#;
        assert_eq!(
            out,
            format!("{line}\n{}\n", line.replace("partial", "final"))
        );
    }
}
