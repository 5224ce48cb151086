#!/usr/bin/env python3
"""Makes a random-weight benchmark model emit tokens at about a trained model's rate.

A synthetic model (scripts/synth_nemo.py, converted) has random joint weights: its greedy
transducer emits up to max_symbols (10) tokens on most frames, ten times or more what a trained
model emits on speech, so the decoder's share of a benchmark says little about a real
checkpoint. This adds BIAS to the joint's blank logit (`joint.joint_net.2.bias[vocab]`) in a
copy of the GGUF, and for a TDT model makes duration 0 unlikely (a trained TDT rarely predicts
it), so that the decoder's work per frame is a trained model's. The encoder is untouched.

usage: gguf_blank_bias.py IN.gguf OUT.gguf BIAS
"""
import shutil
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
F32 = 0


def tensors(path):
    """(key-values, {name: (dims, type, absolute offset)}) of a GGUF v3 file."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        _version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def value(kind):
            if kind == 8:
                return string()
            if kind == 9:
                inner, n = struct.unpack("<IQ", f.read(12))
                return [value(inner) for _ in range(n)]
            fmt = "<" + SCALAR[kind]
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        kv = {}
        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack("<I", f.read(4))
            kv[key] = value(kind)
        infos = {}
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = struct.unpack("<I", f.read(4))
            dims = struct.unpack("<" + "Q" * n_dims, f.read(8 * n_dims))
            kind, offset = struct.unpack("<IQ", f.read(12))
            infos[name] = (dims, kind, offset)
        align = kv.get("general.alignment", 32)
        base = (f.tell() + align - 1) // align * align
    return kv, {k: (d, t, base + o) for k, (d, t, o) in infos.items()}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, bias = sys.argv[1], sys.argv[2], float(sys.argv[3])
    kv, infos = tensors(src)
    name = "joint.joint_net.2.bias"
    if name not in infos or infos[name][1] != F32:
        sys.exit(f"{src}: no f32 {name} (not a transducer model?)")
    (width,), _, offset = infos[name]
    vocab = kv["parakeet.vocab_size"]
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        values = list(struct.unpack(f"<{width}f", f.read(4 * width)))
        values[vocab] += bias
        if width > vocab + 1:
            # TDT: the first duration logit is duration 0.
            values[vocab + 1] -= 10.0
        f.seek(offset)
        f.write(struct.pack(f"<{width}f", *values))
    print(f"{dst}: blank logit bias +{bias} ({width - vocab - 1} duration logits)")


if __name__ == "__main__":
    main()
