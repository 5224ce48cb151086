//! Output formats: every subtitle file is parsed back (by `aspasia` and by a strict reader of
//! the exact layout we promise) and compared with the expected cues.

use aspasia::{SubRipSubtitle, Subtitle, WebVttSubtitle};
use parakeet::hparams::Attention;
use parakeet::output::{
    Format, MAX_LINE_CHARS, MAX_LINES, OutputMeta, Segment, check_not_input,
    format_timestamps_line, output_path, render, segments, write_atomic,
};
use parakeet::tokenizer::{Token, TokenClock, Word, detokenize, words};
use parakeet::transcript::Transcript;
use serde_json::{Value, json};
use std::fs;
use std::path::Path;
use std::str::FromStr;

// ---------------------------------------------------------------------------------------------
// Fixtures

const VOCAB: [&str; 12] = [
    "<unk>",
    "▁Hel",
    "lo",
    "▁world",
    ".",
    "▁How",
    "▁are",
    "▁you",
    "?",
    "▁Fine",
    "▁thanks",
    ",",
];

/// "Hello world. How are you? Fine, thanks" through the real detokeniser and word timer:
/// sentence ends after "world." and "you?", and a 1.2 s pause before "thanks".
fn transcript() -> Transcript {
    let vocab: Vec<String> = VOCAB.iter().map(|s| s.to_string()).collect();
    let tokens: Vec<Token> = [
        (1, 0, 2),   // ▁Hel    0.00-0.16
        (2, 2, 2),   // lo      0.16-0.32
        (3, 5, 3),   // ▁world  0.40-0.64
        (4, 8, 1),   // .       0.64-0.72
        (5, 10, 2),  // ▁How    0.80-0.96
        (6, 12, 2),  // ▁are    0.96-1.12
        (7, 14, 3),  // ▁you    1.12-1.36
        (8, 17, 1),  // ?       1.36-1.44
        (9, 20, 4),  // ▁Fine   1.60-1.92
        (11, 24, 1), // ,      1.92-2.00
        (10, 40, 5), // ▁thanks 3.20-3.60
    ]
    .into_iter()
    .map(|(id, frame, duration)| Token {
        id,
        frame,
        duration,
    })
    .collect();
    Transcript {
        text: detokenize(&vocab, tokens.iter().map(|t| t.id)),
        ..tdt_transcript(&vocab, tokens, 4.0)
    }
}

/// A TDT transcript of `tokens` (80 ms frames) over `audio_seconds`: pieces and words as the
/// library makes them, no text.
fn tdt_transcript(vocab: &[String], tokens: Vec<Token>, audio_seconds: f64) -> Transcript {
    let clock = TokenClock {
        frame_seconds: 0.08,
        tdt_durations: true,
        audio_seconds,
    };
    Transcript {
        pieces: tokens.iter().map(|t| vocab[t.id].clone()).collect(),
        words: words(vocab, &tokens, &clock),
        tokens,
        audio_seconds: clock.audio_seconds,
        frame_seconds: clock.frame_seconds,
        tdt_durations: true,
        ..Transcript::default()
    }
}

fn meta() -> OutputMeta {
    OutputMeta {
        model: "parakeet-tdt-0.6b-v2.gguf".into(),
        audio_path: "clips/hello.wav".into(),
        audio_seconds: 4.0,
        timings: vec![
            ("features".into(), 0.0123456),
            ("encoder".into(), 0.5),
            ("decoder".into(), 0.25),
        ],
    }
}

/// The cues of `transcript()`: (start ms, end ms, text).
const CUES: [(u64, u64, &str); 4] = [
    (0, 720, "Hello world."),
    (800, 1440, "How are you?"),
    (1600, 2000, "Fine,"),
    (3200, 3600, "thanks"),
];

fn word(text: &str, start: f64, end: f64) -> Word {
    Word {
        text: text.to_string(),
        start,
        end,
        confidence: None,
        speaker: None,
    }
}

/// `n` unpunctuated words, 0.3 s apart, so only the line length can split them.
fn long_run(n: usize) -> Vec<Word> {
    (0..n)
        .map(|i| {
            let t = i as f64 * 0.3;
            word(&format!("word{i}"), t, t + 0.25)
        })
        .collect()
}

fn ms(seconds: f64) -> u64 {
    (seconds * 1000.0).round() as u64
}

// ---------------------------------------------------------------------------------------------
// Strict readers: the exact layout, with nothing a lenient parser would skip.

#[derive(Debug, PartialEq)]
struct Cue {
    start: u64,
    end: u64,
    lines: Vec<String>,
}

impl Cue {
    fn text(&self) -> String {
        self.lines.join(" ")
    }
}

fn parse_time(s: &str, sep: char) -> u64 {
    let (hms, millis) = s
        .split_once(sep)
        .unwrap_or_else(|| panic!("timestamp {s:?} lacks {sep:?}"));
    let parts: Vec<&str> = hms.split(':').collect();
    assert_eq!(parts.len(), 3, "timestamp {s:?}");
    assert!(parts[0].len() >= 2 && parts[1].len() == 2 && parts[2].len() == 2 && millis.len() == 3);
    let num = |p: &str| -> u64 {
        assert!(p.bytes().all(|b| b.is_ascii_digit()), "timestamp {s:?}");
        p.parse().unwrap()
    };
    let (h, m, sec, milli) = (num(parts[0]), num(parts[1]), num(parts[2]), num(millis));
    assert!(m < 60 && sec < 60, "timestamp {s:?}");
    ((h * 60 + m) * 60 + sec) * 1000 + milli
}

/// Cue blocks: optional index line, `start --> end`, one or more text lines.
fn parse_blocks(body: &str, sep: char, numbered: bool) -> Vec<Cue> {
    if body.is_empty() {
        return Vec::new();
    }
    assert!(body.ends_with('\n') && !body.ends_with("\n\n"), "{body:?}");
    assert!(!body.contains('\r'));
    body.trim_end_matches('\n')
        .split("\n\n")
        .enumerate()
        .map(|(i, block)| {
            let mut lines = block.lines();
            if numbered {
                assert_eq!(lines.next(), Some((i + 1).to_string().as_str()));
            }
            let timing = lines.next().expect("timing line");
            let (a, b) = timing.split_once(" --> ").expect("arrow");
            let text: Vec<String> = lines.map(str::to_string).collect();
            assert!(!text.is_empty() && text.iter().all(|l| !l.trim().is_empty()));
            Cue {
                start: parse_time(a, sep),
                end: parse_time(b, sep),
                lines: text,
            }
        })
        .collect()
}

fn strict_srt(srt: &str) -> Vec<Cue> {
    parse_blocks(srt, ',', true)
}

fn strict_vtt(vtt: &str) -> Vec<Cue> {
    let body = vtt.strip_prefix("WEBVTT\n\n").expect("WEBVTT header");
    parse_blocks(body, '.', false)
}

/// The SRT through `aspasia`, which must agree with the strict reader.
fn srt_cues(srt: &str) -> Vec<Cue> {
    let strict = strict_srt(srt);
    let parsed = SubRipSubtitle::from_str(srt).unwrap();
    let events = parsed.events();
    assert_eq!(
        events.len(),
        strict.len(),
        "aspasia dropped cues of {srt:?}"
    );
    for (e, c) in events.iter().zip(&strict) {
        assert_eq!(i64::from(e.start), c.start as i64);
        assert_eq!(i64::from(e.end), c.end as i64);
        assert_eq!(e.text, c.lines.join("\n"));
    }
    strict
}

fn vtt_cues(vtt: &str) -> Vec<Cue> {
    let strict = strict_vtt(vtt);
    let parsed = WebVttSubtitle::from_str(vtt).unwrap();
    let events = parsed.events();
    assert_eq!(
        events.len(),
        strict.len(),
        "aspasia dropped cues of {vtt:?}"
    );
    for (e, c) in events.iter().zip(&strict) {
        assert_eq!(i64::from(e.start), c.start as i64);
        assert_eq!(i64::from(e.end), c.end as i64);
        assert_eq!(e.text, c.lines.join("\n"));
    }
    strict
}

/// What every cue list must satisfy.
fn assert_well_formed(cues: &[Cue]) {
    for (i, c) in cues.iter().enumerate() {
        assert!(c.end > c.start, "cue {i} {c:?} is empty");
        assert!(
            c.lines.len() <= MAX_LINES,
            "cue {i} {c:?} has too many lines"
        );
        for l in &c.lines {
            assert!(
                l.chars().count() <= MAX_LINE_CHARS,
                "cue {i}: line {l:?} too long"
            );
        }
        if i > 0 {
            assert!(
                c.start >= cues[i - 1].end,
                "cue {i} {c:?} overlaps the one before"
            );
        }
    }
}

fn subtitle_of(words: &[Word], format: Format) -> String {
    let t = Transcript {
        words: words.to_vec(),
        ..Transcript::default()
    };
    render(format, &t, &OutputMeta::default())
}

// ---------------------------------------------------------------------------------------------
// Formats

#[test]
fn format_names_and_extensions() {
    use clap::ValueEnum;
    let names: Vec<String> = Format::ALL.iter().map(|f| f.to_string()).collect();
    assert_eq!(names, ["txt", "json", "srt", "vtt", "tsv"]);
    for f in Format::ALL {
        assert_eq!(f.extension(), f.to_string());
        assert_eq!(Format::from_str(f.extension(), false), Ok(f));
    }
    assert_eq!(Format::value_variants(), Format::ALL);
    assert_eq!(Format::parse_list("all").unwrap(), Format::ALL);
    assert_eq!(
        Format::parse_list("vtt,srt,vtt").unwrap(),
        [Format::Vtt, Format::Srt]
    );
    assert!(Format::parse_list("srt,doc").is_err());
}

#[test]
fn txt_is_the_text_and_a_newline() {
    let t = transcript();
    assert_eq!(t.text, "Hello world. How are you? Fine, thanks");
    assert_eq!(
        render(Format::Txt, &t, &meta()),
        "Hello world. How are you? Fine, thanks\n"
    );
}

/// A TDT token of duration 0 ends where it starts (NeMo's end = start + duration): its word
/// does not run into the next one, and a last token whose duration reaches past the audio
/// ends with the audio.
#[test]
fn json_times_a_zero_duration_token_as_nemo() {
    let vocab: Vec<String> = VOCAB.iter().map(|s| s.to_string()).collect();
    let token = |id, frame, duration| Token {
        id,
        frame,
        duration,
    };
    // "world." then "How", the "." of duration 0 on frame 8; "thanks" from frame 40 for 5
    // frames, past the 3.5 s of audio.
    let tokens = vec![
        token(3, 5, 3),
        token(4, 8, 0),
        token(5, 8, 2),
        token(10, 40, 5),
    ];
    let t = tdt_transcript(&vocab, tokens, 3.5);
    let v: Value = serde_json::from_str(&render(Format::Json, &t, &meta())).unwrap();
    assert_eq!(
        v["tokens"][1],
        json!({"id": 4, "piece": ".", "start": 0.64, "end": 0.64, "duration": 0.0,
               "frame": 8, "duration_frames": 0})
    );
    assert_eq!(v["tokens"][3]["end"], 3.5);
    assert_eq!(
        v["words"],
        json!([
            {"word": "world.", "start": 0.4, "end": 0.64},
            {"word": "How", "start": 0.64, "end": 0.8},
            {"word": "thanks", "start": 3.2, "end": 3.5},
        ])
    );
}

#[test]
fn json_has_every_field_with_millisecond_times() {
    let t = transcript();
    let v: Value = serde_json::from_str(&render(Format::Json, &t, &meta())).unwrap();
    assert_eq!(v["text"], "Hello world. How are you? Fine, thanks");
    assert_eq!(v["model"], "parakeet-tdt-0.6b-v2.gguf");
    assert_eq!(v["audio"], "clips/hello.wav");
    assert_eq!(v["duration"], 4.0);

    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 11);
    assert_eq!(
        tokens[0],
        json!({"id": 1, "piece": "▁Hel", "start": 0.0, "end": 0.16, "duration": 0.16,
               "frame": 0, "duration_frames": 2})
    );
    assert_eq!(
        tokens[3],
        json!({"id": 4, "piece": ".", "start": 0.64, "end": 0.72, "duration": 0.08,
               "frame": 8, "duration_frames": 1})
    );
    assert_eq!(tokens[10]["start"], 3.2);
    assert_eq!(tokens[10]["end"], 3.6);
    assert_eq!(tokens[10]["duration"], 0.4);

    let expected_words = json!([
        {"word": "Hello", "start": 0.0, "end": 0.32},
        {"word": "world.", "start": 0.4, "end": 0.72},
        {"word": "How", "start": 0.8, "end": 0.96},
        {"word": "are", "start": 0.96, "end": 1.12},
        {"word": "you?", "start": 1.12, "end": 1.44},
        {"word": "Fine,", "start": 1.6, "end": 2.0},
        {"word": "thanks", "start": 3.2, "end": 3.6},
    ]);
    assert_eq!(v["words"], expected_words);

    let expected_segments: Vec<Value> = CUES
        .iter()
        .map(|&(s, e, text)| {
            json!({"start": s as f64 / 1000.0, "end": e as f64 / 1000.0, "text": text})
        })
        .collect();
    assert_eq!(v["segments"], Value::Array(expected_segments));

    assert_eq!(
        v["timings"],
        json!({"features": 0.012, "encoder": 0.5, "decoder": 0.25})
    );
    // Stages stay in pipeline order, not sorted.
    let json = render(Format::Json, &t, &meta());
    let pos = |k: &str| json.find(&format!("\"{k}\"")).unwrap();
    assert!(pos("features") < pos("encoder") && pos("encoder") < pos("decoder"));
}

#[test]
fn json_names_the_attention_used() {
    let mut t = transcript();
    let v: Value = serde_json::from_str(&render(Format::Json, &t, &meta())).unwrap();
    assert_eq!(
        v["attention"],
        json!({"self_attention_model": "rel_pos", "att_context_size": [-1, -1]})
    );
    t.attention = Attention::Local {
        left: 128,
        right: 64,
    };
    let v: Value = serde_json::from_str(&render(Format::Json, &t, &meta())).unwrap();
    assert_eq!(
        v["attention"],
        json!({"self_attention_model": "rel_pos_local_attn", "att_context_size": [128, 64]})
    );
}

#[test]
fn json_times_are_rounded_to_milliseconds() {
    let t = Transcript {
        words: vec![word("x", 1.0 / 3.0, 2.0 / 3.0)],
        ..Transcript::default()
    };
    let meta = OutputMeta {
        audio_seconds: 1.23456,
        ..OutputMeta::default()
    };
    let v: Value = serde_json::from_str(&render(Format::Json, &t, &meta)).unwrap();
    assert_eq!(v["duration"], 1.235);
    assert_eq!(v["words"][0]["start"], 0.333);
    assert_eq!(v["words"][0]["end"], 0.667);
    assert_eq!(v["segments"][0]["start"], 0.333);
    assert_eq!(v["segments"][0]["end"], 0.667);
}

#[test]
fn srt_parses_back_to_the_expected_cues() {
    let srt = render(Format::Srt, &transcript(), &meta());
    assert_eq!(
        srt,
        "1\n00:00:00,000 --> 00:00:00,720\nHello world.\n\n\
         2\n00:00:00,800 --> 00:00:01,440\nHow are you?\n\n\
         3\n00:00:01,600 --> 00:00:02,000\nFine,\n\n\
         4\n00:00:03,200 --> 00:00:03,600\nthanks\n"
    );
    let cues = srt_cues(&srt);
    let got: Vec<(u64, u64, String)> = cues.iter().map(|c| (c.start, c.end, c.text())).collect();
    let want: Vec<(u64, u64, String)> = CUES
        .iter()
        .map(|&(s, e, t)| (s, e, t.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_well_formed(&cues);
}

#[test]
fn vtt_parses_back_to_the_same_cues_as_srt() {
    let t = transcript();
    let vtt = render(Format::Vtt, &t, &meta());
    assert!(vtt.starts_with("WEBVTT\n\n00:00:00.000 --> 00:00:00.720\nHello world.\n\n"));
    let cues = vtt_cues(&vtt);
    assert_eq!(cues, srt_cues(&render(Format::Srt, &t, &meta())));
    assert_well_formed(&cues);
}

#[test]
fn vtt_escapes_markup() {
    let vtt = subtitle_of(
        &[word("R&D", 0.0, 0.5), word("<b>-->", 0.5, 1.0)],
        Format::Vtt,
    );
    assert_eq!(
        vtt,
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nR&amp;D &lt;b&gt;--&gt;\n"
    );
    vtt_cues(&vtt);
}

#[test]
fn tsv_has_millisecond_segments() {
    let tsv = render(Format::Tsv, &transcript(), &meta());
    assert_eq!(
        tsv,
        "start\tend\ttext\n0\t720\tHello world.\n800\t1440\tHow are you?\n\
         1600\t2000\tFine,\n3200\t3600\tthanks\n"
    );
}

#[test]
fn empty_transcript_gives_valid_empty_files() {
    let t = Transcript::default();
    let m = OutputMeta::default();
    assert_eq!(render(Format::Srt, &t, &m), "");
    assert_eq!(render(Format::Vtt, &t, &m), "WEBVTT\n\n");
    assert_eq!(render(Format::Tsv, &t, &m), "start\tend\ttext\n");
    assert_eq!(render(Format::Txt, &t, &m), "\n");
    assert!(srt_cues("").is_empty());
    assert!(vtt_cues("WEBVTT\n\n").is_empty());
    let v: Value = serde_json::from_str(&render(Format::Json, &t, &m)).unwrap();
    assert_eq!(v["text"], "");
    for key in ["tokens", "words", "segments"] {
        assert_eq!(v[key], json!([]), "{key}");
    }
    assert_eq!(v["timings"], json!({}));
    assert!(segments(&[]).is_empty());
}

#[test]
fn timestamps_listing_has_one_line_per_word() {
    let t = transcript();
    let listing = format_timestamps_line(&t.words[..2]);
    assert_eq!(
        listing,
        "[00:00:00.000 --> 00:00:00.320] Hello\n[00:00:00.400 --> 00:00:00.720] world.\n"
    );
    assert_eq!(
        format_timestamps_line(&[word("late", 3725.24, 3725.68)]),
        "[01:02:05.240 --> 01:02:05.680] late\n"
    );
    assert_eq!(format_timestamps_line(&[]), "");
}

// ---------------------------------------------------------------------------------------------
// Segmentation

#[test]
fn segments_split_at_sentence_ends_of_any_script() {
    let ws = [
        word("Is", 0.0, 0.2),
        word("it?", 0.2, 0.4),
        word("Yes!", 0.5, 0.7),
        word("Well…", 0.8, 1.0),
        word("これは", 1.1, 1.3),
        word("ペン。", 1.3, 1.5),
        word("He", 1.6, 1.7),
        word("said", 1.7, 1.8),
        word("\"no.\"", 1.8, 2.0),
        word("3.5", 2.1, 2.3),
        word("m", 2.3, 2.4),
    ];
    let texts: Vec<String> = segments(&ws).into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        [
            "Is it?",
            "Yes!",
            "Well…",
            "これは ペン。",
            "He said \"no.\"",
            "3.5 m"
        ]
    );
}

#[test]
fn segments_split_at_pauses_over_a_second() {
    let ws = [
        word("one", 0.0, 0.5),
        word("two", 1.5, 2.0),    // 1.0 s gap: same cue
        word("three", 3.04, 3.5), // 1.04 s gap: new cue
    ];
    let segs = segments(&ws);
    assert_eq!(
        segs,
        [
            Segment {
                start: 0.0,
                end: 2.0,
                text: "one two".into(),
                confidence: None,
                speaker: None,
            },
            Segment {
                start: 3.04,
                end: 3.5,
                text: "three".into(),
                confidence: None,
                speaker: None,
            },
        ]
    );
}

/// Greedy fill: the fewest lines `text` needs at `width` characters.
fn lines_needed(text: &str) -> usize {
    let mut lines = 0;
    let mut len = 0;
    for w in text.split(' ') {
        let n = w.chars().count();
        if lines == 0 || len + 1 + n > MAX_LINE_CHARS {
            lines += 1;
            len = n;
        } else {
            len += 1 + n;
        }
    }
    lines
}

#[test]
fn segments_split_at_the_line_length_and_are_as_full_as_allowed() {
    let ws = long_run(60);
    let segs = segments(&ws);
    assert!(segs.len() > 3, "{segs:?}");
    // Nothing lost or reordered.
    let all: Vec<&str> = segs.iter().flat_map(|s| s.text.split(' ')).collect();
    let expected: Vec<String> = ws.iter().map(|w| w.text.clone()).collect();
    assert_eq!(all, expected);
    for (i, s) in segs.iter().enumerate() {
        assert!(lines_needed(&s.text) <= MAX_LINES, "{s:?}");
        assert!(s.text.chars().count() <= MAX_LINES * MAX_LINE_CHARS + 1);
        let lines = s.lines();
        assert!(lines.len() <= MAX_LINES);
        assert!(
            lines.iter().all(|l| l.chars().count() <= MAX_LINE_CHARS),
            "{lines:?}"
        );
        assert_eq!(lines.join(" "), s.text);
        // Split only where the next word would not have fitted.
        if let Some(next) = segs.get(i + 1) {
            let first = next.text.split(' ').next().unwrap();
            assert!(
                lines_needed(&format!("{} {first}", s.text)) > MAX_LINES,
                "{s:?}"
            );
        }
    }
    // Cue times are the first word's start and the last word's end.
    assert_eq!(segs[0].start, 0.0);
    let n0 = segs[0].text.split(' ').count();
    assert_eq!(ms(segs[0].end), ms(ws[n0 - 1].end));
    assert_eq!(ms(segs[1].start), ms(ws[n0].start));
}

#[test]
fn long_cues_wrap_into_two_balanced_lines_in_srt_and_vtt() {
    let ws = long_run(40);
    let srt = subtitle_of(&ws, Format::Srt);
    let cues = srt_cues(&srt);
    assert_well_formed(&cues);
    assert!(cues.iter().any(|c| c.lines.len() == 2));
    for c in cues.iter().filter(|c| c.lines.len() == 2) {
        let (a, b) = (c.lines[0].chars().count(), c.lines[1].chars().count());
        assert!(a.abs_diff(b) <= 7, "unbalanced {c:?}");
    }
    let vtt_cues = vtt_cues(&subtitle_of(&ws, Format::Vtt));
    assert_eq!(vtt_cues, cues);
}

#[test]
fn zero_length_and_overlapping_words_still_make_increasing_cues() {
    let ws = [
        word("A.", 1.0, 1.0),
        word("B.", 1.0, 1.0),
        word("C.", 0.9, 0.9), // out of order
        word("late", 2.0, 2.5),
        word("word.", 2.5, 3.2),
        word("next.", 3.12, 3.4), // starts before the previous word ends
    ];
    let segs = segments(&ws);
    let times: Vec<(u64, u64)> = segs.iter().map(|s| (ms(s.start), ms(s.end))).collect();
    assert_eq!(
        times,
        [
            (1000, 1001),
            (1001, 1002),
            (1002, 1003),
            (2000, 3120),
            (3120, 3400)
        ]
    );
    for f in [Format::Srt, Format::Vtt] {
        let text = subtitle_of(&ws, f);
        let cues = if f == Format::Srt {
            srt_cues(&text)
        } else {
            vtt_cues(&text)
        };
        assert_eq!(cues.len(), 5);
        assert_well_formed(&cues);
    }
}

// ---------------------------------------------------------------------------------------------
// Files

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn write_atomic_writes_everything_and_leaves_no_temp() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("talk.srt");
    let big = render(
        Format::Srt,
        &Transcript {
            words: long_run(5000),
            ..Transcript::default()
        },
        &meta(),
    );
    write_atomic(&target, big.as_bytes()).unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), big);
    // Replaces an existing file whole.
    write_atomic(&target, b"short\n").unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"short\n");
    assert_eq!(dir_entries(dir.path()), ["talk.srt"]);
}

#[test]
fn write_atomic_accepts_a_relative_path() {
    // Tests run in the package root, so "target/<fresh dir>/x.txt" is relative. The folder
    // may be missing when CARGO_TARGET_DIR puts the build elsewhere.
    fs::create_dir_all("target").unwrap();
    let dir = tempfile::tempdir_in("target").unwrap();
    let rel = Path::new("target")
        .join(dir.path().file_name().unwrap())
        .join("x.txt");
    write_atomic(&rel, b"x").unwrap();
    assert_eq!(fs::read(&rel).unwrap(), b"x");
}

#[test]
fn write_atomic_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/out.vtt");
    let err = format!("{:#}", write_atomic(&missing, b"x").unwrap_err());
    assert!(err.contains(&missing.display().to_string()), "{err}");

    let file = dir.path().join("plain");
    fs::write(&file, "").unwrap();
    let under_file = file.join("out.vtt");
    let err = format!("{:#}", write_atomic(&under_file, b"x").unwrap_err());
    assert!(err.contains(&under_file.display().to_string()), "{err}");

    // The rename fails onto a non-empty directory: the temp file must go too.
    let occupied = dir.path().join("occupied");
    fs::create_dir(&occupied).unwrap();
    fs::write(occupied.join("keep"), "").unwrap();
    let err = format!("{:#}", write_atomic(&occupied, b"x").unwrap_err());
    assert!(err.contains(&occupied.display().to_string()), "{err}");
    assert_eq!(dir_entries(dir.path()), ["occupied", "plain"]);
    assert_eq!(dir_entries(&occupied), ["keep"]);
}

#[test]
fn output_path_mirrors_the_input_tree() {
    let out = Path::new("/out");
    assert_eq!(
        output_path(Path::new("/data/talk.wav"), None, out, Format::Srt),
        Path::new("/out/talk.srt")
    );
    assert_eq!(
        output_path(
            Path::new("/data/in/a/b/talk.flac"),
            Some(Path::new("/data/in")),
            out,
            Format::Vtt
        ),
        Path::new("/out/a/b/talk.vtt")
    );
    assert_eq!(
        output_path(
            Path::new("in/x.v2.wav"),
            Some(Path::new("in")),
            out,
            Format::Json
        ),
        Path::new("/out/x.v2.json")
    );
    assert_eq!(
        output_path(
            Path::new("rec/noext"),
            Some(Path::new("rec")),
            Path::new("o"),
            Format::Tsv
        ),
        Path::new("o/noext.tsv")
    );
    // Not under the root: the file name alone.
    assert_eq!(
        output_path(
            Path::new("/elsewhere/t.mp3"),
            Some(Path::new("/data")),
            out,
            Format::Txt
        ),
        Path::new("/out/t.txt")
    );
}

#[test]
fn check_not_input_refuses_the_input_itself() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("notes.txt");
    fs::write(&input, "audio?").unwrap();

    // Writing txt next to an input that already ends in .txt would overwrite it.
    let out = output_path(&input, Some(dir.path()), dir.path(), Format::Txt);
    let err = check_not_input(&out, &input).unwrap_err().to_string();
    assert!(err.contains(&out.display().to_string()), "{err}");

    // Another spelling of the same path.
    let dotted = dir.path().join(".").join("notes.txt");
    assert!(check_not_input(&dotted, &input).is_err());
    #[cfg(unix)]
    {
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        assert!(check_not_input(&link, &input).is_err());
        let hard = dir.path().join("hard.txt");
        fs::hard_link(&input, &hard).unwrap();
        assert!(check_not_input(&hard, &input).is_err());
    }

    let other = dir.path().join("notes.json");
    check_not_input(&other, &input).unwrap(); // does not exist yet
    fs::write(&other, "{}").unwrap();
    check_not_input(&other, &input).unwrap();
    assert_eq!(fs::read_to_string(&input).unwrap(), "audio?");
}
