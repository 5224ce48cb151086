//! Transcribing only speech (`transcribe --vad`): the speech segments are the `silero-vad`
//! package's (its reference outputs in tests/fixtures/vad, every parameter set), and each
//! segment's tokens, words and confidence are exactly those of transcribing the segment's
//! samples alone, shifted by its start; with greedy, beam, boosting, confidence, local
//! attention and the CTC head. No speech gives an empty transcript, bad parameters an error.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::boosting::BoostingConfig;
use parakeet::decoder::confidence::ConfidenceConfig;
use parakeet::encoder::AttentionChoice;
use parakeet::error::Error;
use parakeet::session::{
    BeamRequest, DecodeOptions, DecodeRequest, DecoderChoice, Session, SpeechRequest,
};
use parakeet::transcript::Transcript;
use parakeet::vad::SpeechParams;

const RATE: f64 = 16000.0;

/// A clip of speech with long silences, as the package's reference read it.
fn long_silence() -> Vec<f32> {
    parakeet::audio::load_audio(&fixtures().join("vad/audio/speech_long_silence.wav"))
        .unwrap()
        .samples
}

/// The package's segments of `clip` for parameter set `set`: its parameters and the segments
/// in samples.
fn package(clip: &str, set: &str) -> (SpeechParams, Vec<(usize, usize)>) {
    let v = json(&fixtures().join("vad").join(clip).join("segments.json"));
    let s = &v["segments"][set];
    let params = crate::vad::params(&s["params"]);
    let segments = s["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["start"].as_u64().unwrap() as usize,
                s["end"].as_u64().unwrap() as usize,
            )
        })
        .collect();
    (params, segments)
}

fn with_speech(request: &DecodeRequest, params: SpeechParams) -> DecodeRequest {
    DecodeRequest {
        speech: Some(SpeechRequest {
            params,
            model: None,
        }),
        ..request.clone()
    }
}

/// Transcribes `samples` with speech detection by `request` and `params`, checks the spans
/// against `want` (samples), and each span against its samples transcribed alone by `request`.
fn check_per_segment(
    session: &mut Session,
    samples: &[f32],
    request: &DecodeRequest,
    params: SpeechParams,
    want: &[(usize, usize)],
    name: &str,
) -> Transcript {
    let opts = DecodeOptions::new(session.model(), &with_speech(request, params)).unwrap();
    let t = session.transcribe(samples.to_vec(), &opts).unwrap();
    let spans = t.speech.clone().expect("speech spans");
    let got: Vec<(f64, f64)> = spans.iter().map(|s| (s.start, s.end)).collect();
    let want_s: Vec<(f64, f64)> = want
        .iter()
        .map(|&(s, e)| (s as f64 / RATE, e as f64 / RATE))
        .collect();
    assert_eq!(got, want_s, "{name}: speech segments");
    assert_eq!(t.audio_seconds, samples.len() as f64 / RATE, "{name}");

    let alone = DecodeOptions::new(session.model(), request).unwrap();
    let mut texts = Vec::new();
    for (k, &(s, e)) in want.iter().enumerate() {
        let part = session.transcribe(samples[s..e].to_vec(), &alone).unwrap();
        let offset = s as f64 / RATE;
        let tokens =
            spans[k].first_token..spans.get(k + 1).map_or(t.tokens.len(), |n| n.first_token);
        let words = spans[k].first_word..spans.get(k + 1).map_or(t.words.len(), |n| n.first_word);
        assert_eq!(
            t.tokens[tokens.clone()],
            part.tokens[..],
            "{name} segment {k}: tokens"
        );
        assert_eq!(
            t.pieces[tokens.clone()],
            part.pieces[..],
            "{name} segment {k}: pieces"
        );
        for (i, tok) in tokens.clone().enumerate() {
            let (a, b) = t.token_times(tok);
            let (pa, pb) = part.token_times(i);
            assert!(
                (a - pa - offset).abs() < 1e-9 && (b - pb - offset).abs() < 1e-9,
                "{name} segment {k}: token {i} at {a}..{b}, alone {pa}..{pb} + {offset}"
            );
        }
        assert_eq!(
            t.words[words.clone()].len(),
            part.words.len(),
            "{name} segment {k}"
        );
        for (w, p) in t.words[words].iter().zip(&part.words) {
            assert_eq!(
                (&w.text, w.confidence),
                (&p.text, p.confidence),
                "{name} {k}"
            );
            assert!(
                (w.start - p.start - offset).abs() < 1e-9 && (w.end - p.end - offset).abs() < 1e-9,
                "{name} segment {k}: {w:?} vs {p:?} + {offset}"
            );
            // Inside its speech segment (a token covers at least one frame past its start).
            assert!(
                w.start >= spans[k].start && w.start < spans[k].end,
                "{name} segment {k}: {w:?} outside {:?}",
                spans[k]
            );
        }
        if let (Some(all), Some(alone)) = (&t.token_confidence, &part.token_confidence) {
            assert_eq!(all[tokens], alone[..], "{name} segment {k}: confidence");
        }
        if !part.text.trim().is_empty() {
            texts.push(part.text.trim().to_owned());
        }
    }
    println!(
        "{name}: {} segments, {} tokens, {} words: {:?}",
        spans.len(),
        t.tokens.len(),
        t.words.len(),
        t.text
    );
    assert_eq!(t.text, texts.join(" "), "{name}: text");
    assert!(!t.tokens.is_empty(), "{name}: nothing transcribed");
    t
}

#[test]
fn segments_are_the_package_s_for_every_parameter_set() {
    let samples = long_silence();
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    let request = DecodeRequest::default();
    for set in ["default", "sensitive", "split_max", "split_legacy"] {
        let (params, want) = package("speech_long_silence", set);
        assert!(want.len() >= 5, "{set}");
        check_per_segment(&mut session, &samples, &request, params, &want, set);
    }
}

#[test]
fn each_segment_is_transcribed_as_alone_with_every_decoding() {
    let samples = long_silence();
    let (params, want) = package("speech_long_silence", "default");
    let mut session = Session::load(&gguf("tiny_tdt_ctc", OutType::F32), threads(2)).unwrap();
    let cases = [
        ("greedy", DecodeRequest::default()),
        ("ctc", DecodeRequest::with_decoder(DecoderChoice::Ctc)),
        (
            "confidence",
            DecodeRequest {
                confidence: Some(ConfidenceConfig::default()),
                ..DecodeRequest::default()
            },
        ),
        (
            "beam",
            DecodeRequest {
                beam: Some(BeamRequest::new(4)),
                ..DecodeRequest::default()
            },
        ),
        (
            "boosting",
            DecodeRequest {
                boost: Some(BoostingConfig {
                    phrases: vec!["data".into()],
                    alpha: 2.0,
                    ..BoostingConfig::default()
                }),
                ..DecodeRequest::default()
            },
        ),
        (
            "local attention",
            DecodeRequest {
                attention: AttentionChoice::Local { left: 8, right: 8 },
                ..DecodeRequest::default()
            },
        ),
    ];
    for (name, request) in cases {
        let t = check_per_segment(
            &mut session,
            &samples,
            &request,
            params.clone(),
            &want,
            name,
        );
        match name {
            "confidence" => assert_eq!(
                t.token_confidence.as_ref().map(Vec::len),
                Some(t.tokens.len())
            ),
            "beam" => {
                assert_eq!(t.alternatives.len(), 1);
                assert_eq!(t.alternatives[0].tokens, t.tokens);
                assert_eq!(t.alternatives[0].text, t.text);
            }
            "boosting" => assert_eq!(t.decoding.boosted_phrases, 1),
            _ => {}
        }
    }
}

#[test]
fn silence_and_empty_audio_give_an_empty_transcript() {
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(1)).unwrap();
    let opts = DecodeOptions::new(
        session.model(),
        &with_speech(&DecodeRequest::default(), SpeechParams::default()),
    )
    .unwrap();
    let silence = parakeet::audio::load_audio(&fixtures().join("vad/audio/silence_5s.wav"))
        .unwrap()
        .samples;
    // Less than one VAD window, and nothing at all.
    for samples in [silence, vec![0.0; 100], Vec::new()] {
        let n = samples.len();
        let t = session.transcribe(samples, &opts).unwrap();
        assert_eq!(t.speech, Some(Vec::new()), "{n} samples");
        assert_eq!((t.text.as_str(), t.tokens.len(), t.words.len()), ("", 0, 0));
        assert_eq!(t.audio_seconds, n as f64 / RATE);
    }
}

#[test]
fn bad_speech_parameters_are_option_errors() {
    let session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(1)).unwrap();
    let bad = |params: SpeechParams, beam: Option<BeamRequest>| {
        let request = DecodeRequest {
            beam,
            ..with_speech(&DecodeRequest::default(), params)
        };
        match DecodeOptions::new(session.model(), &request) {
            Err(Error::Options(m)) => m,
            other => panic!("{other:?}"),
        }
    };
    let p = |f: fn(&mut SpeechParams)| {
        let mut p = SpeechParams::default();
        f(&mut p);
        p
    };
    for (params, says) in [
        (p(|p| p.threshold = 1.0), "threshold 1"),
        (p(|p| p.threshold = 0.0), "threshold 0"),
        (p(|p| p.neg_threshold = Some(0.6)), "neg-threshold 0.6"),
        (p(|p| p.min_silence_ms = -1.0), "min-silence-ms -1"),
        (p(|p| p.speech_pad_ms = f64::NAN), "speech-pad-ms NaN"),
    ] {
        let m = bad(params, None);
        assert!(m.contains(says), "{m}");
    }
    let nbest = BeamRequest {
        nbest: 2,
        ..BeamRequest::new(4)
    };
    let m = bad(SpeechParams::default(), Some(nbest));
    assert!(m.contains("--nbest 2"), "{m}");
}
