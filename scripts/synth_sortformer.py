#!/usr/bin/env python3
"""Builds full-size Sortformer .nemo files (random weights) for the diarization benchmark,
without torch: the shapes of NVIDIA's published models from a tiny reference model's key list
and config, written by synth_nemo.py's checkpoint writer.

  v1  nvidia/diar_sortformer_4spk-v1: 80 mels, FastConformer 18 x 512 (8 heads, 256
      subsampling channels, ff 2048), Transformer 18 x 192 (8 heads, inner 768), 4 speakers
  v2  nvidia/diar_streaming_sortformer_4spk-v2: 128 mels, FastConformer 17 x 512, the same
      Transformer, streaming_mode with NeMo's inference sizes (spkcache 188, fifo 188,
      update 144, chunk 6, context 1 / 7)

nemo_full_sortformer.py builds these shapes with NeMo itself (the reference set's configs at
the published sizes), which needs torch; where no NeMo environment exists, this makes the same
shapes with random weights (their values do not change the time a forward takes), and the tiny
model's own window and mel filterbank (a filterbank's zeros do).

usage: synth_sortformer.py v1|v2 TINY.keys.txt TINY.nemo OUT.nemo
  TINY  tiny_sortformer (v1) or tiny_sortformer_stream (v2) of ../shared/reference/models
"""
import os
import re
import sys
import tarfile
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_nemo import front_end, read_keys, write_checkpoint  # noqa: E402

FC, FF, HEADS, SUB, TF, INNER, TF_LAYERS = 512, 2048, 8, 256, 192, 768, 18
ENC_LAYERS = {"v1": 18, "v2": 17}
STREAMING = dict(spkcache_len=188, spkcache_update_period=144, fifo_len=188, chunk_len=6,
                 chunk_left_context=1, chunk_right_context=7)


def full_keys(tiny, generation, mels):
    """The tiny model's keys at full size: layer 0's keys repeated per layer, each width
    scaled by what it is (by name: the tiny widths collide, e.g. 128 is both the conv's 2 x 64
    and the Transformer's 4 x 32)."""
    tiny_fc, tiny_tf = 64, 32
    enc = {tiny_fc: FC, 4 * tiny_fc: FF, 2 * tiny_fc: 2 * FC, 16: SUB}
    tf = {tiny_tf: TF, 4 * tiny_tf: INNER}
    out = []
    for name, shape, dtype in tiny:
        if name.endswith("self_attn.pos_bias_u") or name.endswith("self_attn.pos_bias_v"):
            shape = [HEADS, FC // HEADS]
        elif name == "encoder.pre_encode.out.weight":
            shape = [FC, SUB * (mels // 8)]
        elif name.startswith("encoder."):
            shape = [enc.get(d, d) if d > 9 else d for d in shape]
        elif name.startswith("transformer_encoder."):
            shape = [tf.get(d, d) for d in shape]
        elif name.startswith("sortformer_modules.encoder_proj."):
            shape = [TF, FC][: len(shape)] if len(shape) == 2 else [TF]
        elif name.startswith("sortformer_modules.hidden_to_spks."):
            shape = [shape[0], 2 * TF] if len(shape) == 2 else shape
        elif name.startswith("sortformer_modules."):
            shape = [{tiny_tf: TF}.get(d, d) for d in shape]
        out.append((name, shape, dtype))
    layers = {"encoder": ENC_LAYERS[generation], "transformer_encoder": TF_LAYERS}
    full = []
    for name, shape, dtype in out:
        m = re.match(r"(encoder|transformer_encoder)\.layers\.(\d+)\.(.*)", name)
        if not m:
            full.append((name, shape, dtype))
        elif m.group(2) == "0":
            full += [(f"{m.group(1)}.layers.{i}.{m.group(3)}", shape, dtype)
                     for i in range(layers[m.group(1)])]
    return full


def full_config(cfg, generation):
    cfg["model_defaults"].update(fc_d_model=FC, tf_d_model=TF)
    cfg["sortformer_modules"].update(fc_d_model=FC, tf_d_model=TF)
    if generation == "v2":
        cfg["sortformer_modules"].update(STREAMING)
    cfg["encoder"].update(d_model=FC, n_layers=ENC_LAYERS[generation], n_heads=HEADS,
                          subsampling_conv_channels=SUB, ff_expansion_factor=FF // FC)
    cfg["transformer_encoder"].update(num_layers=TF_LAYERS, hidden_size=TF, inner_size=INNER,
                                      num_attention_heads=HEADS)
    return cfg


def main(generation, keys_path, tiny_nemo, out):
    with tarfile.open(tiny_nemo) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("model_config.yaml"))
        cfg = yaml.safe_load(t.extractfile(member))
    mels = cfg["preprocessor"]["features"]
    keys = full_keys(list(read_keys(keys_path)), generation, mels)
    cfg = full_config(cfg, generation)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        ckpt = os.path.join(tmp, "model_weights.ckpt")
        write_checkpoint(keys, ckpt, front_end(keys, tiny_nemo))
        conf = os.path.join(tmp, "model_config.yaml")
        with open(conf, "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        with tarfile.open(out, "w:") as t:
            t.add(conf, "./model_config.yaml")
            t.add(ckpt, "./model_weights.ckpt")
    print(f"{out}: {len(keys)} tensors, {os.path.getsize(out) / 1e6:.0f} MB")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ENC_LAYERS:
        sys.exit(__doc__)
    main(*sys.argv[1:])
