//! Long audio is cut at quiet frame boundaries into pieces encoded separately; tokens keep
//! their absolute frames.

mod common;

use common::*;
use parakeet::convert::OutType;
use parakeet::transcribe::{DecoderChoice, Transcriber, chunk_bounds};

const FRAME: usize = 1280;

#[test]
fn bounds_cover_everything_on_frame_boundaries_at_the_quietest_frame() {
    // 30 s of a loud tone with one silent frame at 8.0 s.
    let n = 16000 * 30;
    let mut x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.05).sin()).collect();
    let quiet = 16000 * 8;
    x[quiet..quiet + FRAME].iter_mut().for_each(|v| *v = 0.0);
    let b = chunk_bounds(&x, 16000 * 10);
    assert_eq!(b.first().unwrap().start, 0);
    assert_eq!(b.last().unwrap().end, n);
    for w in b.windows(2) {
        assert_eq!(w[0].end, w[1].start);
    }
    for r in &b {
        assert!(r.len() <= 16000 * 10, "{r:?}");
        assert_eq!(r.start % FRAME, 0, "{r:?}");
    }
    // The first cut lands right after the silent frame.
    assert_eq!(b[0].end, quiet + FRAME);
    // Short audio is one piece.
    assert_eq!(
        chunk_bounds(&x[..16000 * 5], 16000 * 10),
        vec![0..16000 * 5]
    );
}

#[test]
fn chunked_transcript_is_the_pieces_transcripts_with_absolute_frames() {
    let mut tr = Transcriber::load(&gguf("tiny_tdt", OutType::F32), 2).unwrap();
    let clip = clip_samples("speech_10s.wav");
    let long: Vec<f32> = clip.iter().chain(clip.iter()).copied().collect();
    tr.set_max_chunk_seconds(12.0);
    let whole = tr.transcribe(&long, DecoderChoice::Auto).unwrap();
    let bounds = chunk_bounds(&long, 16000 * 12);
    assert_eq!(bounds.len(), 2);
    let mut expected = Vec::new();
    for r in bounds {
        let frame0 = r.start / FRAME;
        let piece = tr.transcribe(&long[r], DecoderChoice::Auto).unwrap();
        expected.extend(piece.tokens.into_iter().map(|mut t| {
            t.frame += frame0;
            t
        }));
    }
    assert!(!expected.is_empty());
    assert_eq!(whole.tokens, expected);
    assert!(whole.tokens.windows(2).all(|w| w[0].frame <= w[1].frame));
    assert!((whole.audio_seconds - 20.0).abs() < 1e-6);
    // Below the limit nothing is cut: the 10 s clip gives NeMo's tokens.
    let single = tr.transcribe(&clip, DecoderChoice::Auto).unwrap();
    let nemo = json(&reference("tiny_tdt").join("result.json"))["greedy_batch"]["tokens"].clone();
    let ids: Vec<u64> = single.tokens.iter().map(|t| t.id as u64).collect();
    let nemo: Vec<u64> = nemo
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ids, nemo);
}
