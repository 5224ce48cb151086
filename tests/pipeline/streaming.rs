//! NeMo's cache-aware streaming models (causal subsampling and convolutions, `chunked_limited`
//! attention, LayerNorm in the conv module, raw log-mel): the whole-file encoder and decode
//! against NeMo's dumps (`outputs/tiny_stream_*` of the shared references).

use crate::common::*;
use crate::local_attention::check_against_nemo;
use parakeet::backend::Lowering;
use parakeet::convert::OutType;
use parakeet::hparams::Attention;
use parakeet::session::{DecoderChoice, Session};
use parakeet::stream::{
    CacheAwareConfig, CacheAwareStream, LiveTranscriber, StreamEvent, Utterance,
};

pub const STREAM_MODELS: [&str; 2] = ["tiny_stream_rnnt", "tiny_stream_tdt_ctc"];

#[test]
fn streaming_models_convert_with_their_streaming_hyperparameters() {
    let session = Session::load(&gguf("tiny_stream_rnnt", OutType::F32), threads(1)).unwrap();
    let e = &session.model().hparams().encoder;
    assert_eq!(
        e.attention,
        Attention::Chunked {
            left: 70,
            right: 13
        }
    );
    assert_eq!(e.att_context_sizes, [[70, 13], [70, 6], [70, 1], [70, 0]]);
    assert!(e.causal_downsampling && e.causal_conv() && e.conv_layer_norm);
    assert!(!session.model().hparams().preprocessor.normalize_per_feature);
    // NeMo's streaming_cfg for each lookahead (result.json of the streaming references).
    let result = json(&reference("tiny_stream_rnnt_stream").join("result.json"));
    for &[l, r] in &e.att_context_sizes {
        let nemo = &result["lookaheads"][format!("att_{l}_{r}")]["streaming_cfg"];
        let ours = e.streaming([l, r]).unwrap();
        assert_eq!(ours.chunk_size.to_vec(), ints(&nemo["chunk_size"]));
        assert_eq!(ours.shift_size.to_vec(), ints(&nemo["shift_size"]));
        assert_eq!(
            ours.valid_out_len as u64,
            nemo["valid_out_len"].as_u64().unwrap()
        );
        assert_eq!(
            ours.last_channel_cache_size as u64,
            nemo["last_channel_cache_size"].as_u64().unwrap()
        );
        assert_eq!(
            vec![0, ours.pre_encode_cache_size],
            ints(&nemo["pre_encode_cache_size"])
        );
        assert_eq!(
            ours.drop_extra_pre_encoded as u64,
            nemo["drop_extra_pre_encoded"].as_u64().unwrap()
        );
    }
    let hybrid = Session::load(&gguf("tiny_stream_tdt_ctc", OutType::F32), threads(1)).unwrap();
    assert_eq!(
        hybrid.model().hparams().encoder.att_context_sizes,
        [[70, 13]]
    );
}

/// Whole files as NeMo's `transcribe` runs them (default lookahead): every dumped layer within
/// 1e-4 relative, and the tokens, frames and durations of every head identical.
#[test]
fn streaming_models_transcribe_whole_files_as_nemo() {
    for model in STREAM_MODELS {
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        for (suffix, clip) in CLIPS {
            let name = format!("{model}{suffix}");
            check_against_nemo(
                &mut session,
                parakeet::encoder::AttentionChoice::Auto,
                &clip_samples(clip),
                &reference(&name),
                &name,
            );
        }
    }
}

/// One streamed run: the per-chunk records and the events.
struct Run {
    records: Vec<parakeet::stream::ChunkRecord>,
    events: Vec<StreamEvent>,
}

fn stream_in_pieces(
    model: &str,
    lookahead: [i64; 2],
    decoder: DecoderChoice,
    samples: &[f32],
    piece: usize,
    (cache_room, lowering): (Option<usize>, Lowering),
) -> Run {
    let session = session_on(&gguf(model, OutType::F32), threads(2), lowering);
    let config = CacheAwareConfig {
        att_context: Some(lookahead),
        decoder,
        record_chunks: true,
    };
    let mut stream = CacheAwareStream::new(session, config).unwrap();
    if let Some(chunks) = cache_room {
        stream.set_cache_room(chunks);
    }
    let mut events = Vec::new();
    for part in samples.chunks(piece) {
        events.extend(stream.accept(part).unwrap());
    }
    events.extend(stream.finish().unwrap());
    Run {
        records: stream.take_records(),
        events,
    }
}

/// NeMo's `[d, T]` dump as our `[T][d]`.
fn frames_major(shape: &[usize], data: &[f32]) -> Vec<f32> {
    let (d, t) = (shape[0], shape[1]);
    (0..t)
        .flat_map(|i| (0..d).map(move |c| data[c * t + i]))
        .collect()
}

/// Every lookahead of both streaming models on both clips, the audio fed in pieces of 1234
/// samples, whole, and (2 s clip) one sample at a time: each chunk's new tokens, the partial
/// text after it and the final text equal NeMo's `conformer_stream_step` loop; the first two
/// chunks' encoder outputs and caches, and all chunks' encoder output, within 1e-4 relative.
#[test]
fn streaming_matches_nemo_chunk_by_chunk_for_every_lookahead() {
    streaming_chunk_by_chunk(Lowering::Kernels);
}

/// The cache-aware chunk step in ggml's built-in ops: the caches read as the cached rows and
/// the chunk's own (`Graph::append_rows`), written in place for the next chunk.
#[test]
fn streaming_matches_nemo_chunk_by_chunk_on_ggml_ops() {
    streaming_chunk_by_chunk(Lowering::Builtin);
}

fn streaming_chunk_by_chunk(lowering: Lowering) {
    for model in STREAM_MODELS {
        for (suffix, clip) in CLIPS {
            let dir = reference(&format!("{model}_stream{suffix}"));
            let result = json(&dir.join("result.json"));
            let samples = clip_samples(clip);
            let mut pieces = vec![1234, samples.len()];
            if suffix == "_2s" {
                pieces.push(1);
            }
            for (name, la) in result["lookaheads"].as_object().unwrap() {
                let ctx: Vec<i64> = la["att_context_size"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_i64().unwrap())
                    .collect();
                let lookahead = [ctx[0], ctx[1]];
                for head in result["heads"].as_array().unwrap() {
                    let head = head.as_str().unwrap();
                    let decoder = if head == "ctc" {
                        DecoderChoice::Ctc
                    } else {
                        DecoderChoice::Auto
                    };
                    let nemo = &la[head]["streaming"];
                    let chunks = nemo["chunks"].as_array().unwrap();
                    for &piece in &pieces {
                        let what = format!("{model}{suffix} {name} {head} piece {piece}");
                        let run = stream_in_pieces(
                            model,
                            lookahead,
                            decoder,
                            &samples,
                            piece,
                            (None, lowering),
                        );
                        check_run(&run, chunks, &nemo["final"], &what);
                        if head == "rnnt" && piece == 1234 {
                            check_encoder(&run, &dir.join(name), &what);
                            // The caches' rings moving their rows to the front every chunk
                            // and every third chunk (a long stream's case) change nothing.
                            for room in [1, 3] {
                                let what = format!("{what} cache room {room}");
                                let run = stream_in_pieces(
                                    model,
                                    lookahead,
                                    decoder,
                                    &samples,
                                    piece,
                                    (Some(room), lowering),
                                );
                                check_run(&run, chunks, &nemo["final"], &what);
                                check_encoder(&run, &dir.join(name), &what);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn check_run(run: &Run, chunks: &[serde_json::Value], last: &serde_json::Value, what: &str) {
    assert_eq!(run.records.len(), chunks.len(), "{what}: chunks");
    let mut partials = run.events.iter().filter_map(|e| match e {
        StreamEvent::Partial(u) => Some(u),
        _ => None,
    });
    for (i, (ours, nemo)) in run.records.iter().zip(chunks).enumerate() {
        assert_eq!(
            ours.new_tokens,
            ints(&nemo["new_tokens"]),
            "{what}: chunk {i}"
        );
        if !ours.new_tokens.is_empty() {
            let p = partials
                .next()
                .expect("a partial after a chunk with tokens");
            let ids: Vec<usize> = p.tokens.iter().map(|t| t.id).collect();
            if let Some(tokens) = nemo.get("tokens") {
                assert_eq!(ids, ints(tokens), "{what}: partial after chunk {i}");
            }
            assert_eq!(
                p.text,
                nemo["text"].as_str().unwrap(),
                "{what}: chunk {i} text"
            );
        }
    }
    assert!(partials.next().is_none(), "{what}: partials without tokens");
    let finals: Vec<&Utterance> = run
        .events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Final(u) => Some(u),
            _ => None,
        })
        .collect();
    let text = last["text"].as_str().unwrap();
    if text.is_empty() {
        assert!(finals.is_empty(), "{what}: a final without text");
    } else {
        assert_eq!(finals.len(), 1, "{what}: finals");
        assert_eq!(finals[0].text, text, "{what}: final text");
        let ids: Vec<usize> = finals[0].tokens.iter().map(|t| t.id).collect();
        assert_eq!(ids, ints(&last["tokens"]), "{what}: final tokens");
        if let Some(ts) = last.get("timestamp") {
            let frames: Vec<usize> = finals[0].tokens.iter().map(|t| t.frame).collect();
            assert_eq!(frames, ints(ts), "{what}: final frames");
        }
    }
}

/// Chunks 0 and 1 (encoder output, both caches, the cache length) and the whole stream's
/// encoder output against NeMo's dumps.
fn check_encoder(run: &Run, dir: &std::path::Path, what: &str) {
    const TOL: f64 = 1e-4;
    for (i, rec) in run.records.iter().take(2).enumerate() {
        let (shape, nemo) = npy(&dir.join(format!("chunk{i:02}_encoder_out.npy")));
        let err = rel_err(&rec.encoder_out, &frames_major(&shape, &nemo));
        assert!(
            err <= TOL,
            "{what}: chunk {i} encoder_out rel err {err:.2e}"
        );
        let (_, channel) = npy(&dir.join(format!("chunk{i:02}_cache_last_channel.npy")));
        let ours: Vec<f32> = rec.caches.channel.concat();
        let err = rel_err(&ours, &channel);
        assert!(
            err <= TOL,
            "{what}: chunk {i} cache_last_channel rel err {err:.2e}"
        );
        // NeMo's [layers, 1, d, k - 1]; ours per layer [k - 1][d].
        let (shape, time) = npy(&dir.join(format!("chunk{i:02}_cache_last_time.npy")));
        let (d, k) = (shape[2], shape[3]);
        let nemo_time: Vec<f32> = (0..shape[0])
            .flat_map(|l| (0..k).flat_map(move |j| (0..d).map(move |c| (l, j, c))))
            .map(|(l, j, c)| time[(l * d + c) * k + j])
            .collect();
        let err = rel_err(&rec.caches.time.concat(), &nemo_time);
        assert!(
            err <= TOL,
            "{what}: chunk {i} cache_last_time rel err {err:.2e}"
        );
        println!("{what}: chunk {i} encoder and caches within {TOL:e}");
    }
    let bytes = std::fs::read(dir.join("chunk01_cache_last_channel_len.npy")).unwrap();
    let len = npyz::NpyFile::new(&bytes[..])
        .unwrap()
        .into_vec::<i64>()
        .unwrap();
    assert_eq!(run.records[1].caches.channel_len as i64, len[0], "{what}");
    let (shape, nemo) = npy(&dir.join("stream_encoder_out.npy"));
    let ours: Vec<f32> = run
        .records
        .iter()
        .flat_map(|r| r.encoder_out.iter().copied())
        .collect();
    let err = rel_err(&ours, &frames_major(&shape, &nemo));
    println!("{what}: stream_encoder_out rel err {err:.2e}");
    assert!(err <= TOL, "{what}: stream_encoder_out rel err {err:.2e}");
}

/// An end-of-utterance piece ends the utterance there with a `Final` (without the piece) and
/// the next tokens start a new one. The tiny models have no `<EOU>`: one of their pieces is
/// made the marker.
#[test]
fn an_end_of_utterance_token_gives_a_final_and_a_new_utterance() {
    let session = Session::load(&gguf("tiny_stream_rnnt", OutType::F32), threads(2)).unwrap();
    let config = CacheAwareConfig {
        att_context: Some([70, 13]),
        record_chunks: true,
        ..CacheAwareConfig::default()
    };
    let mut stream = CacheAwareStream::new(session, config).unwrap();
    // NeMo's chunk 0 emits [46, 29, 29, 27, ...] (result.json): 27 ends the utterance.
    stream.set_end_markers(vec![27]);
    let samples = clip_samples("speech_10s.wav");
    let mut events = stream.accept(&samples).unwrap();
    events.extend(stream.finish().unwrap());
    let records = stream.take_records();
    assert_eq!(records[0].new_tokens[..4], [46, 29, 29, 27]);
    let StreamEvent::Final(first) = &events[0] else {
        panic!("the first chunk ends an utterance: {:?}", events[0]);
    };
    let ids: Vec<usize> = first.tokens.iter().map(|t| t.id).collect();
    let want: Vec<usize> = records[0]
        .new_tokens
        .iter()
        .copied()
        .filter(|&id| id != 27)
        .collect();
    assert_eq!(ids, want, "the chunk's tokens without the marker");
    // After the Final a new utterance grows from empty.
    let later: Vec<&StreamEvent> = events[1..].iter().collect();
    assert!(!later.is_empty());
    for e in later {
        let u = match e {
            StreamEvent::Partial(u) | StreamEvent::Final(u) => u,
        };
        assert!(u.tokens.iter().all(|t| t.id != 27), "markers never appear");
        assert!(
            u.tokens.iter().all(|t| t.frame >= 14),
            "later utterances start later"
        );
    }
}

#[test]
fn non_streaming_models_and_unknown_lookaheads_are_refused() {
    let session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(1)).unwrap();
    let e = CacheAwareStream::new(session, CacheAwareConfig::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("not a cache-aware streaming model") && e.contains("nemotron-speech-streaming"),
        "{e}"
    );
    let session = Session::load(&gguf("tiny_stream_rnnt", OutType::F32), threads(1)).unwrap();
    let config = CacheAwareConfig {
        att_context: Some([70, 2]),
        ..CacheAwareConfig::default()
    };
    let e = CacheAwareStream::new(session, config)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("att_context 70,2 is not one of the model's lookaheads (70,13 70,6 70,1 70,0)"),
        "{e}"
    );
    let session = Session::load(&gguf("tiny_stream_rnnt", OutType::F32), threads(1)).unwrap();
    let config = CacheAwareConfig {
        decoder: DecoderChoice::Ctc,
        ..CacheAwareConfig::default()
    };
    let e = CacheAwareStream::new(session, config)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no CTC head"), "{e}");
}
