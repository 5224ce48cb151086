//! The VAD's end of turn at the front ends: `parakeet stream --vad` on a clip of two utterances
//! a second apart gives one final per `VADIterator` turn, on its boundaries, with the text of
//! streaming that turn alone (a cache-aware and an offline model); its flags are checked.

use crate::common::turns::{alone, iterator_turns, two_turns};
use crate::common::*;
use parakeet::convert::OutType;
use parakeet::model::Model;
use parakeet::stream::turns::TurnParams;
use serde_json::Value;
use std::sync::Arc;

fn stream_vad(model: &str, extra: &[&str]) -> std::process::Output {
    let clip = fixtures().join("vad_turns/two_turns.wav");
    let mut args = vec![clip.to_str().unwrap()];
    args.extend_from_slice(extra);
    crate::stream_buffered::stream_cmd(model, &args, None)
}

#[test]
fn stream_vad_gives_a_final_per_turn_on_the_iterator_s_boundaries() {
    let samples = two_turns();
    let turns = iterator_turns(&samples, &TurnParams::default());
    assert_eq!(turns.len(), 2, "{turns:?}");
    for name in ["tiny_stream_tdt_ctc", "tiny_tdt"] {
        let path = gguf(name, OutType::F32);
        let model = Arc::new(Model::load(&path).unwrap());
        let out = stream_vad(name, &["--vad"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let finals: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["type"] == "final")
            .collect();
        assert_eq!(finals.len(), 2, "{name}: {finals:?}");
        for (f, &(s, e)) in finals.iter().zip(&turns) {
            let solo = alone(&model, &samples[s..e]);
            assert_eq!(solo.len(), 1, "{name}: {solo:?}");
            assert_eq!(f["text"], solo[0].text.as_str(), "{name}: {f}");
            // Milliseconds, as the lines carry them (the boundaries are whole milliseconds).
            assert_eq!(
                f["start"].as_f64().unwrap() * 16000.0,
                s as f64,
                "{name}: {f}"
            );
            assert_eq!(
                f["end"].as_f64().unwrap() * 16000.0,
                e as f64,
                "{name}: {f}"
            );
        }
    }
}

#[test]
fn stream_vad_flags_are_checked() {
    let model = "tiny_tdt";
    for (args, said) in [
        (&["--vad", "--threshold", "1.5"][..], "--threshold 1.5"),
        (&["--vad", "--threshold", "0"][..], "--threshold 0"),
        (
            &["--vad", "--min-silence-ms", "-5"][..],
            "--min-silence-ms -5",
        ),
        (
            &["--vad", "--speech-pad-ms", "nan"][..],
            "--speech-pad-ms NaN",
        ),
        (&["--threshold", "0.6"][..], "needs --vad"),
    ] {
        let out = stream_vad(model, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = stream_vad(model, &["--vad-model", "/nonexistent.gguf"]);
    assert_eq!(out.status.code(), Some(2));
    let out = stream_vad(model, &["--vad", "--vad-model", "/nonexistent.gguf"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent.gguf"), "{stderr}");
}

mod realtime {
    use super::*;
    use base64::Engine;
    use serde_json::json;
    use std::time::{Duration, Instant};
    use tungstenite::Message;
    use tungstenite::stream::MaybeTlsStream;

    type Client = tungstenite::WebSocket<MaybeTlsStream<std::net::TcpStream>>;

    fn send(ws: &mut Client, event: Value) {
        ws.send(Message::Text(event.to_string().into())).unwrap();
    }

    /// The next event, within the socket's read timeout.
    fn next(ws: &mut Client) -> Value {
        loop {
            match ws.read().expect("an event within the timeout") {
                Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
                Message::Close(f) => panic!("closed: {f:?}"),
                _ => {}
            }
        }
    }

    /// Sends a session update and returns its answer (the updated session or an error; the
    /// events of audio sent before it come first and are passed over).
    fn update(ws: &mut Client, session: Value) -> Value {
        send(ws, json!({"type": "session.update", "session": session}));
        loop {
            let e = next(ws);
            if e["type"] == "session.updated" || e["type"] == "error" {
                return e;
            }
        }
    }

    fn vad_update(turn_detection: Value) -> Value {
        json!({"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000},
            "turn_detection": turn_detection,
        }}})
    }

    fn s16le(samples: &[f32]) -> Vec<u8> {
        samples
            .iter()
            .flat_map(|&x| ((x * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes())
            .collect()
    }

    /// `parakeet serve` with `server_vad`: bad values get OpenAI's error event and the
    /// connection goes on; then the two-utterance clip, appended without a commit, gives
    /// `speech_started` / `speech_stopped` on the VADIterator's turns (OpenAI's defaults:
    /// padding 300 ms, silence 500 ms), each turn committed and completed with the text of
    /// streaming it alone.
    #[test]
    fn server_vad_completes_each_turn_without_a_commit() {
        let path = gguf("tiny_stream_tdt_ctc", OutType::F32);
        let model = Arc::new(Model::load(&path).unwrap());
        let server = crate::serve::Server::start_with(&path, &["--threads", "1"]);
        let (mut ws, _) =
            tungstenite::connect(format!("ws://{}/v1/realtime", server.addr)).unwrap();
        if let MaybeTlsStream::Plain(s) = ws.get_mut() {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        }
        assert_eq!(next(&mut ws)["type"], "session.created");

        for (td, param) in [
            (json!({"type": "server_vad", "threshold": 1.5}), "threshold"),
            (json!({"type": "server_vad", "threshold": 0}), "threshold"),
            (
                json!({"type": "server_vad", "prefix_padding_ms": -1}),
                "prefix_padding_ms",
            ),
            (
                json!({"type": "server_vad", "silence_duration_ms": -20}),
                "silence_duration_ms",
            ),
            (
                json!({"type": "server_vad", "silence_duration_ms": "long"}),
                "silence_duration_ms",
            ),
            // Beyond an hour: refused, never wrapped into a small count of samples.
            (
                json!({"type": "server_vad", "prefix_padding_ms": 18446744073709551615_u64}),
                "prefix_padding_ms",
            ),
            (
                json!({"type": "server_vad", "silence_duration_ms": 3600001}),
                "silence_duration_ms",
            ),
            (json!({"type": "semantic_vad"}), "type"),
            (json!({"type": "loud_noises"}), "type"),
        ] {
            let e = update(&mut ws, vad_update(td.clone()));
            assert_eq!(e["type"], "error", "{td}: {e}");
            assert_eq!(e["error"]["code"], "invalid_value", "{td}: {e}");
            if td
                .get(param)
                .is_some_and(|v| v.as_f64().is_some_and(|x| x > 3.6e6))
            {
                let message = e["error"]["message"].as_str().unwrap();
                assert!(message.contains("from 0 to 3600000"), "{td}: {e}");
            }
            assert_eq!(
                e["error"]["param"],
                format!("session.audio.input.turn_detection.{param}"),
                "{td}: {e}"
            );
        }
        // The beta's field, refused the same way.
        let e = update(
            &mut ws,
            json!({"turn_detection": {"type": "server_vad", "threshold": -0.2}}),
        );
        assert_eq!(
            e["error"]["param"], "session.turn_detection.threshold",
            "{e}"
        );

        let e = update(&mut ws, vad_update(json!({"type": "server_vad"})));
        assert_eq!(e["type"], "session.updated", "{e}");
        let want_td = json!({"type": "server_vad", "threshold": 0.5,
            "prefix_padding_ms": 300, "silence_duration_ms": 500});
        assert_eq!(e["session"]["audio"]["input"]["turn_detection"], want_td);
        assert_eq!(e["session"]["turn_detection"], want_td);

        // The clip and a second of silence after it (so that the second turn's 500 ms of
        // silence fit), in 100 ms appends; no commit.
        let mut samples = two_turns();
        samples.extend(std::iter::repeat_n(0.0, 16000));
        let params = TurnParams {
            threshold: 0.5,
            min_silence_ms: 500.0,
            speech_pad_ms: 300.0,
        };
        let turns = iterator_turns(&samples, &params);
        assert_eq!(turns.len(), 2, "{turns:?}");
        for piece in s16le(&samples).chunks(3200) {
            let audio = base64::engine::general_purpose::STANDARD.encode(piece);
            send(
                &mut ws,
                json!({"type": "input_audio_buffer.append", "audio": audio}),
            );
        }
        let started = Instant::now();
        let mut events = Vec::new();
        let mut completed = 0;
        while completed < 2 {
            assert!(started.elapsed() < Duration::from_secs(120), "{events:#?}");
            let e = next(&mut ws);
            assert_ne!(e["type"], "error", "{e}");
            if e["type"] == "conversation.item.input_audio_transcription.completed" {
                completed += 1;
            }
            events.push(e);
        }
        let of =
            |kind: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == kind).collect() };
        let starts = of("input_audio_buffer.speech_started");
        let stops = of("input_audio_buffer.speech_stopped");
        let commits = of("input_audio_buffer.committed");
        let done = of("conversation.item.input_audio_transcription.completed");
        assert_eq!(
            (starts.len(), stops.len(), commits.len()),
            (2, 2, 2),
            "{events:#?}"
        );
        for (i, &(s, e)) in turns.iter().enumerate() {
            let item = &starts[i]["item_id"];
            assert_eq!(
                starts[i]["audio_start_ms"],
                s as u64 * 1000 / 16000,
                "turn {i}"
            );
            assert_eq!(
                stops[i]["audio_end_ms"],
                e as u64 * 1000 / 16000,
                "turn {i}"
            );
            assert_eq!(&stops[i]["item_id"], item, "turn {i}");
            assert_eq!(&commits[i]["item_id"], item, "turn {i}");
            assert_eq!(&done[i]["item_id"], item, "turn {i}");
            let solo = alone(&model, &samples[s..e]);
            assert_eq!(solo.len(), 1, "{solo:?}");
            assert_eq!(done[i]["transcript"], solo[0].text.as_str(), "turn {i}");
            // Stopped, then committed, then completed.
            let at = |e: &Value| events.iter().position(|x| std::ptr::eq(x, e)).unwrap();
            assert!(at(starts[i]) < at(stops[i]) && at(stops[i]) < at(commits[i]));
            assert!(at(commits[i]) < at(done[i]));
        }

        // `null` goes back to commits.
        let e = update(&mut ws, vad_update(Value::Null));
        assert_eq!(e["type"], "session.updated", "{e}");
        assert_eq!(
            e["session"]["audio"]["input"]["turn_detection"],
            Value::Null
        );
    }
}
