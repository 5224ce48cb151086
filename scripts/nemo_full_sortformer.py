#!/usr/bin/env python3
"""Full-size Sortformer models built by NeMo itself (random weights, NeMo's own initialisation)
and NeMo's per-frame speaker probabilities on given clips: the published shapes for the speed
benchmark, and a parity check of the converter and our forward at full size (the shared
reference models are tiny).

  v1  nvidia/diar_sortformer_4spk-v1: 80 mels, FastConformer 18 x 512 (8 heads, 256 subsampling
      channels), Transformer 18 x 192 (8 heads, inner 768), 4 speakers
  v2  nvidia/diar_streaming_sortformer_4spk-v2: 128 mels, no normalisation, 17 layers,
      streaming_mode with the published inference sizes (spkcache 188, fifo 188, update 144,
      chunk 6, context 1 / 7)

The configs are the reference set's (`build_sortformer.sortformer_cfg`) at the published sizes.
Run in a NeMo 3.0 environment (the reference set's `reproduce.sh` builds one):

  nemo_full_sortformer.py v1|v2 OUT_DIR WAV...
    OUT_DIR/full_sortformer_v1.nemo, and per clip OUT_DIR/full_sortformer_v1.CLIP.npy: NeMo's
    model.forward() probabilities [frames, 4] (streamed for v2, as forward() does)

Compare with ours: `parakeet convert X.nemo X.gguf`, `parakeet diarize CLIP -m X.gguf -f json
--probabilities -o OUT.json`, then `scripts/compare_probabilities.py OUT.json X.CLIP.npy`.
"""
import os
import sys

import numpy as np
import soundfile as sf
import torch

REF = os.environ.get("REF_SCRIPTS", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "..", "..", "shared", "reference", "scripts"))
sys.path.insert(0, REF)
from build_sortformer import PUBLISHED_STREAM_PARAMS, sortformer_cfg  # noqa: E402
from nemo.collections.asr.models import SortformerEncLabelModel  # noqa: E402

FC, TF, HEADS, SUB, INNER, TF_LAYERS = 512, 192, 8, 256, 768, 18
ENC_LAYERS = {"v1": 18, "v2": 17}


def config(generation):
    cfg = sortformer_cfg(generation == "v2")
    cfg.model_defaults.fc_d_model = FC
    cfg.model_defaults.tf_d_model = TF
    cfg.sortformer_modules.fc_d_model = FC
    cfg.sortformer_modules.tf_d_model = TF
    enc = cfg.encoder
    enc.d_model, enc.n_layers, enc.n_heads = FC, ENC_LAYERS[generation], HEADS
    enc.subsampling_conv_channels = SUB
    tf = cfg.transformer_encoder
    tf.num_layers, tf.hidden_size, tf.inner_size, tf.num_attention_heads = TF_LAYERS, TF, INNER, HEADS
    if generation == "v2":
        for k, v in PUBLISHED_STREAM_PARAMS.items():
            cfg.sortformer_modules[k] = v
    return cfg


@torch.no_grad()
def main():
    generation, out = sys.argv[1], sys.argv[2]
    assert generation in ENC_LAYERS, "v1 or v2"
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = SortformerEncLabelModel(cfg=config(generation)).eval()
    name = f"full_sortformer_{generation}"
    model.save_to(os.path.join(out, f"{name}.nemo"))
    for wav in sys.argv[3:]:
        x, sr = sf.read(wav, dtype="float32")
        assert sr == 16000 and x.ndim == 1, f"{wav}: 16 kHz mono"
        sig, ln = torch.from_numpy(x)[None], torch.tensor([len(x)])
        preds = model.forward(audio_signal=sig, audio_signal_length=ln)[0]
        clip = os.path.splitext(os.path.basename(wav))[0]
        np.save(os.path.join(out, f"{name}.{clip}.npy"), preds.numpy().astype(np.float32))
        p = preds.numpy()
        print(f"{name} {clip}: {p.shape[0]} frames, mean {p.mean():.3f}, "
              f"active {(p > 0.5).mean(0).round(3).tolist()}")


if __name__ == "__main__":
    main()
