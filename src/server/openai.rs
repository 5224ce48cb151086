//! The OpenAI audio API's shapes: request fields, response formats, and the error body.

use crate::output::{self, Format, OutputMeta, round_ms};
use crate::tokenizer::Word;
use crate::transcript::Transcript;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::collections::HashMap;

/// `response_format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFormat {
    Json,
    Text,
    Srt,
    Vtt,
    VerboseJson,
    /// OpenAI's `TranscriptionDiarized`: segments with their speaker (a server started with
    /// `--diar-model`).
    DiarizedJson,
}

impl ResponseFormat {
    pub fn parse(s: &str) -> Result<ResponseFormat, ApiError> {
        Ok(match s.trim() {
            "json" => ResponseFormat::Json,
            "text" => ResponseFormat::Text,
            "srt" => ResponseFormat::Srt,
            "vtt" => ResponseFormat::Vtt,
            "verbose_json" => ResponseFormat::VerboseJson,
            "diarized_json" => ResponseFormat::DiarizedJson,
            other => {
                return Err(ApiError::bad_request(
                    format!(
                        "unknown response_format {other:?}: expected json, text, srt, vtt, verbose_json or diarized_json"
                    ),
                    Some("response_format"),
                    Some("invalid_value"),
                ));
            }
        })
    }
}

/// `timestamp_granularities[]`: which timings `verbose_json` carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Granularities {
    pub word: bool,
    pub segment: bool,
}

impl Granularities {
    pub fn add(&mut self, s: &str) -> Result<(), ApiError> {
        match s.trim() {
            "word" => self.word = true,
            "segment" => self.segment = true,
            other => {
                return Err(ApiError::bad_request(
                    format!("unknown timestamp granularity {other:?}: expected word or segment"),
                    Some("timestamp_granularities[]"),
                    Some("invalid_value"),
                ));
            }
        }
        Ok(())
    }

    /// As OpenAI: segments unless only words were asked for.
    pub fn resolve(asked: Option<Granularities>) -> Granularities {
        match asked {
            None => Granularities {
                word: false,
                segment: true,
            },
            Some(g) => g,
        }
    }
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorFields<'a>,
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

/// What a client is told to wait before retrying when the queue is full (seconds).
pub const RETRY_AFTER_SECONDS: u32 = 1;

impl ApiError {
    pub fn new(
        status: StatusCode,
        message: impl Into<String>,
        param: Option<&'static str>,
        code: Option<&'static str>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param,
            code,
        }
    }

    pub fn bad_request(
        message: impl Into<String>,
        param: Option<&'static str>,
        code: Option<&'static str>,
    ) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message, param, code)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = ErrorBody {
            error: ErrorFields {
                message: &self.message,
                kind,
                param: self.param,
                code: self.code,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        resp
    }
}

#[derive(Serialize)]
struct Usage {
    #[serde(rename = "type")]
    kind: &'static str,
    /// Whole seconds of audio, rounded up, as OpenAI reports duration-based usage.
    seconds: u64,
}

impl Usage {
    fn of(t: &Transcript) -> Usage {
        Usage {
            kind: "duration",
            seconds: t.audio_seconds.ceil() as u64,
        }
    }
}

#[derive(Serialize)]
struct JsonResponse<'a> {
    text: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct VerboseResponse<'a> {
    task: &'static str,
    language: &'a str,
    duration: f64,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<Vec<VerboseSegment>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    words: Option<Vec<VerboseWord<'a>>>,
    usage: Usage,
}

/// A segment as OpenAI lays it out. The cues are the CLI's subtitle cues. Greedy decoding is
/// temperature 0 and there is no seeking; the log-probability, compression and no-speech
/// estimates Whisper reports have no counterpart here and are left out.
#[derive(Serialize)]
struct VerboseSegment {
    id: usize,
    seek: usize,
    start: f64,
    end: f64,
    text: String,
    tokens: Vec<usize>,
    temperature: f64,
}

#[derive(Serialize)]
struct VerboseWord<'a> {
    word: &'a str,
    start: f64,
    end: f64,
    /// NeMo's word confidence, under the name whisper-style clients read.
    #[serde(skip_serializing_if = "Option::is_none")]
    probability: Option<f32>,
    /// Who spoke it (a diarizing server), labelled as in diarized_json.
    #[serde(skip_serializing_if = "Option::is_none")]
    speaker: Option<String>,
}

/// OpenAI's `TranscriptionDiarized`.
#[derive(Serialize)]
struct DiarizedResponse<'a> {
    task: &'static str,
    duration: f64,
    text: &'a str,
    segments: Vec<DiarizedSegment>,
    usage: Usage,
}

/// OpenAI's `TranscriptionDiarizedSegment`: one of the CLI's cues, all of one speaker.
#[derive(Serialize)]
struct DiarizedSegment {
    #[serde(rename = "type")]
    kind: &'static str,
    id: String,
    start: f64,
    end: f64,
    text: String,
    speaker: String,
}

/// OpenAI's speaker labels: capital letters in the order the speakers are first heard (`A`,
/// `B`, ...; past `Z`, `S26`, `S27`, ...), for the Sortformer's speaker indices.
fn speaker_labels(words: &[Word]) -> HashMap<usize, String> {
    let mut labels = HashMap::new();
    for k in words.iter().filter_map(|w| w.speaker) {
        let n = labels.len();
        labels.entry(k).or_insert_with(|| match u8::try_from(n) {
            Ok(i) if i < 26 => char::from(b'A' + i).to_string(),
            _ => format!("S{n}"),
        });
    }
    labels
}

/// The `stream` form field: `true` or `false`.
pub fn parse_stream(s: &str) -> Result<bool, ApiError> {
    parse_flag("stream", s)
}

/// A true-or-false form field `field` (empty is false).
pub fn parse_flag(field: &'static str, s: &str) -> Result<bool, ApiError> {
    match s.trim() {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" | "" => Ok(false),
        other => Err(ApiError::bad_request(
            format!("{field} must be true or false, not {other:?}"),
            Some(field),
            Some("invalid_value"),
        )),
    }
}

/// OpenAI's streamed transcription: server-sent events, a `transcript.text.delta` per word of
/// the text and a `transcript.text.done` with the whole text. The deltas come once the
/// upload is transcribed (an offline model has no earlier text), which is what a client of the
/// streaming API reads.
pub fn render_stream(t: &Transcript) -> Response {
    let text = t.text.trim();
    let mut body = String::new();
    let mut event = |e: serde_json::Value| {
        body.push_str("data: ");
        body.push_str(&e.to_string());
        body.push_str("\n\n");
    };
    // Each word with the space after it: the deltas join to the text exactly.
    for piece in text.split_inclusive(' ') {
        event(serde_json::json!({"type": "transcript.text.delta", "delta": piece}));
    }
    event(serde_json::json!({"type": "transcript.text.done", "text": text}));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The response body for `t` in `format`: json and verbose_json as OpenAI lays them out, text,
/// srt and vtt exactly as the CLI writes its txt, srt and vtt files; verbose_json names the
/// audio's `language`.
pub fn render(
    format: ResponseFormat,
    t: &Transcript,
    granularities: Granularities,
    language: &str,
) -> Response {
    let text_like = |f: Format, mime: &'static str| {
        let body = output::render(f, t, &OutputMeta::default());
        ([(header::CONTENT_TYPE, mime)], body).into_response()
    };
    let text = t.text.trim();
    match format {
        ResponseFormat::Text => text_like(Format::Txt, "text/plain; charset=utf-8"),
        ResponseFormat::Srt => text_like(Format::Srt, "text/plain; charset=utf-8"),
        ResponseFormat::Vtt => text_like(Format::Vtt, "text/vtt; charset=utf-8"),
        ResponseFormat::Json => axum::Json(JsonResponse {
            text,
            usage: Usage::of(t),
        })
        .into_response(),
        ResponseFormat::VerboseJson => {
            let segments = granularities.segment.then(|| verbose_segments(t));
            let labels = speaker_labels(&t.words);
            let words = granularities.word.then(|| {
                t.words
                    .iter()
                    .map(|w| VerboseWord {
                        word: &w.text,
                        start: round_ms(w.start),
                        end: round_ms(w.end),
                        probability: w.confidence,
                        speaker: w.speaker.and_then(|k| labels.get(&k).cloned()),
                    })
                    .collect()
            });
            axum::Json(VerboseResponse {
                task: "transcribe",
                language,
                duration: round_ms(t.audio_seconds),
                text,
                segments,
                words,
                usage: Usage::of(t),
            })
            .into_response()
        }
        ResponseFormat::DiarizedJson => {
            let labels = speaker_labels(&t.words);
            let segments = output::transcript_segments(t)
                .into_iter()
                .enumerate()
                .map(|(i, c)| DiarizedSegment {
                    kind: "transcript.text.segment",
                    id: format!("seg_{i}"),
                    start: c.start,
                    end: c.end,
                    speaker: c
                        .speaker
                        .and_then(|k| labels.get(&k).cloned())
                        .unwrap_or_default(),
                    text: c.text,
                })
                .collect();
            axum::Json(DiarizedResponse {
                task: "transcribe",
                duration: round_ms(t.audio_seconds),
                text,
                segments,
                usage: Usage::of(t),
            })
            .into_response()
        }
    }
}

/// The CLI's cues, each with the ids of the tokens that start inside it (from its start to
/// the next cue's start).
fn verbose_segments(t: &Transcript) -> Vec<VerboseSegment> {
    let cues = output::transcript_segments(t);
    let mut tokens: Vec<Vec<usize>> = vec![Vec::new(); cues.len()];
    for (i, tok) in t.tokens.iter().enumerate() {
        let start = round_ms(t.token_times(i).0);
        // The last cue starting at or before the token (tokens before the first cue, such as
        // leading punctuation, go to the first).
        let k = cues.partition_point(|c| c.start <= start).saturating_sub(1);
        if let Some(list) = tokens.get_mut(k) {
            list.push(tok.id);
        }
    }
    cues.into_iter()
        .zip(tokens)
        .enumerate()
        .map(|(id, (c, tokens))| VerboseSegment {
            id,
            seek: 0,
            start: c.start,
            end: c.end,
            text: c.text,
            tokens,
            temperature: 0.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_granularities_parse_or_fail_with_the_param_named() {
        assert_eq!(
            ResponseFormat::parse("verbose_json").unwrap(),
            ResponseFormat::VerboseJson
        );
        let e = ResponseFormat::parse("xml").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param, Some("response_format"));
        let mut g = Granularities::default();
        g.add("word").unwrap();
        assert_eq!(
            Granularities::resolve(Some(g)),
            Granularities {
                word: true,
                segment: false
            }
        );
        assert!(Granularities::resolve(None).segment);
        assert_eq!(
            g.add("char").unwrap_err().param,
            Some("timestamp_granularities[]")
        );
    }
}
