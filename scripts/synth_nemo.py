#!/usr/bin/env python3
"""Builds a synthetic full-size .nemo (random weights) from a NeMo key list, without torch.

For exercising the converter and the loader at real model sizes (2.4 GB for tdt_0.6b_v2) when
the real checkpoints aren't at hand. The config is a tiny reference model's config with every
size taken from the key list's shapes; the weights are N(0, 0.02) float32 (int64 for
`num_batches_tracked`), pickled the way torch.save does (protocol 2, persistent storage ids),
except the window and mel filterbank, the base model's own where its mel count is the same, and
the norms' scales and running variances, 1 as NeMo initialises them (a random variance is partly
negative, which makes the activations NaN).

usage: synth_nemo.py KEYS.txt BASE.nemo TOKENIZER.vocab OUT.nemo
  KEYS.txt        lines `name<TAB>[shape]<TAB>dtype` (../shared/reference/models/*.keys.txt)
  BASE.nemo       a tiny reference model of the same family (TDT / hybrid), for its config
  TOKENIZER.vocab SentencePiece vocab with the model's vocabulary size
"""
import collections
import io
import json
import os
import pickle
import re
import sys
import tarfile
import tempfile
import types
import zipfile

import numpy as np
import yaml


# Stand-ins that pickle as the globals torch.save emits.
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")
sys.modules["torch"], sys.modules["torch._utils"] = torch, torch_utils
for cls in ("FloatStorage", "LongStorage"):
    setattr(torch, cls, type(cls, (), {"__module__": "torch"}))


def _rebuild_tensor_v2(*args):
    raise RuntimeError("never called")


_rebuild_tensor_v2.__module__ = "torch._utils"
torch_utils._rebuild_tensor_v2 = _rebuild_tensor_v2


class Storage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, storage, shape):
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        stride, acc = [], 1
        for n in reversed(self.shape):
            stride.insert(0, acc)
            acc *= n
        args = (self.storage, 0, tuple(self.shape), tuple(stride), False, collections.OrderedDict())
        return (_rebuild_tensor_v2, args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def read_keys(path):
    for line in open(path, encoding="utf-8"):
        name, shape, dtype = line.rstrip("\n").split("\t")[:3]
        yield name, json.loads(shape), dtype


class _CheckpointReader(pickle.Unpickler):
    """Unpickles a torch.save state dict into (storage key, offset, shape) per tensor."""

    def persistent_load(self, pid):
        return pid[2]  # ("storage", type, key, location, numel)

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda key, offset, shape, *rest: (key, offset, tuple(shape))
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch":
            return name
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


def read_tensors(nemo, names):
    """The float32 tensors `names` of a .nemo's checkpoint, as flat little-endian arrays."""
    with tarfile.open(nemo) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("model_weights.ckpt"))
        ckpt = io.BytesIO(t.extractfile(member).read())
    with zipfile.ZipFile(ckpt) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        root = pkl[: -len("data.pkl")]
        state = _CheckpointReader(io.BytesIO(z.read(pkl))).load()
        out = {}
        for name in names:
            key, offset, shape = state[name]
            numel = int(np.prod(shape)) if shape else 1
            data = np.frombuffer(z.read(f"{root}data/{key}"), "<f4")
            out[name] = data[offset:offset + numel].copy()
    return out


def write_checkpoint(keys, path, fixed=None):
    """Random weights for `keys`, except the flat arrays `fixed` gives by name."""
    rng = np.random.default_rng(0)
    state = collections.OrderedDict()
    fixed = fixed or {}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for i, (name, shape, dtype) in enumerate(keys):
            numel = int(np.prod(shape)) if shape else 1
            if dtype == "int64":
                data, cls = np.zeros(numel, np.int64), torch.LongStorage
            else:
                data = (rng.standard_normal(numel, dtype=np.float32) * 0.02).astype("<f4")
                cls = torch.FloatStorage
            if name in fixed:
                # Drawn anyway: every other tensor keeps the values it has without `fixed`.
                data = fixed[name].astype("<f4")
                assert data.size == numel, name
            elif name.endswith("running_var") or is_norm_scale(name, shape):
                # NeMo's initial value, 1. A batch norm divides by sqrt(running_var + eps): a
                # random, partly negative variance makes every activation after the first conv
                # module NaN (in NeMo as here); norm scales of 0.02 shrink every block's output
                # until the heads see their biases alone and emit one token throughout.
                data = np.ones(numel, "<f4")
            z.writestr(f"archive/data/{i}", data.tobytes())
            state[name] = Tensor(Storage(cls, str(i), numel), shape)
        buf = io.BytesIO()
        Pickler(buf, protocol=2).dump(state)
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")


def is_norm_scale(name, shape):
    """A layer or batch norm's scale (`...norm...weight`, one dimension)."""
    parts = name.split(".")
    return len(shape) == 1 and parts[-1] == "weight" and "norm" in parts[-2]


FRONT_END = ("preprocessor.featurizer.window", "preprocessor.featurizer.fb")


def front_end(keys, base_nemo):
    """NeMo's window and mel filterbank: the base model's own where `keys` has the same shapes,
    else the filterbank NeMo computes (librosa's Slaney mel, 0 to 8 kHz). A random filterbank
    has negative weights (log of a negative energy: NaN features) and no zero weights (the
    features cost several times a real one's)."""
    shapes = {name: shape for name, shape, _ in keys}
    base = {name: shape for name, shape, _ in read_keys_of(base_nemo)}
    same = [name for name in FRONT_END if name in shapes and shapes[name] == base.get(name)]
    fixed = read_tensors(base_nemo, same)
    fb = "preprocessor.featurizer.fb"
    if fb in shapes and fb not in fixed:
        import librosa

        _, mels, bins = shapes[fb]
        n_fft = 2 * (bins - 1)
        fixed[fb] = librosa.filters.mel(
            sr=16000, n_fft=n_fft, n_mels=mels, fmin=0.0, fmax=8000.0, norm="slaney"
        ).astype(np.float32).ravel()
    return fixed


def read_keys_of(nemo):
    """(name, shape, dtype) of the float tensors in a .nemo's checkpoint."""
    with tarfile.open(nemo) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("model_weights.ckpt"))
        ckpt = io.BytesIO(t.extractfile(member).read())
    with zipfile.ZipFile(ckpt) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        state = _CheckpointReader(io.BytesIO(z.read(pkl))).load()
    return [(name, list(shape), "float32") for name, (_, _, shape) in state.items()]


def make_config(base_cfg, keys, vocab):
    shapes = {name: shape for name, shape, _ in keys}
    cfg = base_cfg
    d_model = shapes["encoder.pre_encode.out.weight"][0]
    mels = shapes["preprocessor.featurizer.fb"][1]
    layers = len({m.group(1) for n in shapes if (m := re.match(r"encoder\.layers\.(\d+)\.", n))})
    lstm = len([n for n in shapes if re.match(r"decoder\.prediction\.dec_rnn\.lstm\.weight_ih_l\d+$", n)])
    pred = shapes["decoder.prediction.embed.weight"][1]
    joint = shapes["joint.enc.weight"][0]
    cfg["preprocessor"]["features"] = mels
    enc = cfg["encoder"]
    enc.update(feat_in=mels, d_model=d_model, n_layers=layers,
               n_heads=shapes["encoder.layers.0.self_attn.pos_bias_u"][0],
               subsampling_conv_channels=shapes["encoder.pre_encode.conv.0.weight"][0],
               use_bias="encoder.layers.0.self_attn.linear_q.bias" in shapes,
               ff_expansion_factor=shapes["encoder.layers.0.feed_forward1.linear1.weight"][0] // d_model)
    cfg["decoder"]["prednet"].update(pred_hidden=pred, pred_rnn_layers=lstm)
    cfg["decoder"]["vocab_size"] = len(vocab)
    cfg["joint"]["jointnet"].update(joint_hidden=joint, encoder_hidden=d_model, pred_hidden=pred)
    cfg["joint"]["num_classes"] = len(vocab)
    for key in ("enc_hidden", "pred_hidden", "joint_hidden"):
        cfg["model_defaults"][key] = {"enc_hidden": d_model, "pred_hidden": pred, "joint_hidden": joint}[key]
    cfg["joint"]["vocabulary"] = cfg["labels"] = vocab
    if "aux_ctc" in cfg:
        cfg["aux_ctc"]["decoder"].update(feat_in=d_model, num_classes=len(vocab), vocabulary=vocab)
    return cfg


def main(keys_path, base_nemo, vocab_path, out):
    keys = list(read_keys(keys_path))
    vocab = [line.split("\t")[0] for line in open(vocab_path, encoding="utf-8")]
    with tarfile.open(base_nemo) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("model_config.yaml"))
        base_cfg = yaml.safe_load(t.extractfile(member))
    cfg = make_config(base_cfg, keys, vocab)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        ckpt = os.path.join(tmp, "model_weights.ckpt")
        write_checkpoint(keys, ckpt, front_end(keys, base_nemo))
        conf = os.path.join(tmp, "model_config.yaml")
        with open(conf, "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f, allow_unicode=True, sort_keys=False)
        with tarfile.open(out, "w:") as t:
            t.add(conf, "./model_config.yaml")
            t.add(ckpt, "./model_weights.ckpt")
    print(f"{out}: {len(keys)} tensors, {os.path.getsize(out) / 1e9:.2f} GB")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
