//! The fused encoder graph against NeMo's per-layer outputs, every reference model and clip.

mod common;

use common::*;
use parakeet::convert::OutType;
use parakeet::transcribe::Transcriber;

/// Worst relative error allowed in f32 (‖ours − NeMo‖ / ‖NeMo‖).
const F32_TOL: f64 = 1e-4;

#[test]
fn every_layer_matches_nemo_in_f32() {
    let mut worst = (0.0f64, String::new());
    for model in MODELS {
        let mut tr = Transcriber::load(&gguf(model, OutType::F32), 2).unwrap();
        for (suffix, clip) in CLIPS {
            let dir = reference(&format!("{model}{suffix}"));
            let features = tr.features(&clip_samples(clip));
            let enc = tr.encode(&features, true).unwrap();
            let frames = enc.frames;
            let d = enc.d_model;
            let result = json(&dir.join("result.json"));
            assert_eq!(
                frames as u64,
                result["enc_len"].as_u64().unwrap(),
                "{model}{suffix}: frames"
            );
            let mut checked = 0;
            for (name, ours) in &enc.layers {
                let path = dir.join(format!("{name}.npy"));
                if !path.exists() {
                    continue;
                }
                let (shape, nemo) = npy(&path);
                // NeMo's tensors carry one padding frame past the valid ones.
                let valid = &nemo[..frames * d];
                assert!(shape[shape.len() - 1] == d, "{name}: shape {shape:?}");
                let err = rel_err(ours, valid);
                println!("{model}{suffix} {name}: rel err {err:.2e}");
                if err > worst.0 {
                    worst = (err, format!("{model}{suffix} {name}"));
                }
                assert!(err <= F32_TOL, "{model}{suffix} {name}: rel err {err:.3e}");
                checked += 1;
            }
            assert!(
                checked >= 3,
                "{model}{suffix}: only {checked} layers compared"
            );
            // encoder_out.npy is [d, T'+1] (channels first).
            let (shape, nemo) = npy(&dir.join("encoder_out.npy"));
            let t_all = shape[shape.len() - 1];
            let nemo_t: Vec<f32> = (0..frames)
                .flat_map(|t| (0..d).map(move |c| (t, c)))
                .map(|(t, c)| nemo[c * t_all + t])
                .collect();
            let err = rel_err(&enc.output, &nemo_t);
            println!("{model}{suffix} encoder_out: rel err {err:.2e}");
            assert!(
                err <= F32_TOL,
                "{model}{suffix} encoder_out: rel err {err:.3e}"
            );
        }
    }
    println!("worst: {:.2e} at {}", worst.0, worst.1);
}
