#!/usr/bin/env python3
"""Silero VAD's weights (the `silero-vad` package's model, MIT) as a GGUF for parakeet's
built-in voice activity detection.

Reads the safetensors export of `silero_vad.jit`'s state_dict (every tensor float32, names as
in the checkpoint) and writes each tensor unchanged under its own name, shapes in ggml order
(torch's reversed), plus a few metadata keys. Standard library only: both formats are simple.
Usage: scripts/silero_vad_gguf.py SAFETENSORS OUT.gguf
(the committed copy: ../shared/reference/vad/silero_vad_v6.2.safetensors -> assets/silero_vad_v6.2.gguf)
"""
import json
import struct
import sys

ALIGN = 32
GGUF_STRING, GGUF_U32 = 8, 4
GGML_F32 = 0


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {info['dtype']}, expected F32")
        start, end = info["data_offsets"]
        tensors.append((name, info["shape"], raw[base + start : base + end]))
    # The file's own order is by offset; keep it so the GGUF is reproducible.
    return sorted(tensors, key=lambda t: (not t[0].startswith("_model."), t[0]))


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tensors = read_safetensors(sys.argv[1])
    meta = [
        ("general.architecture", GGUF_STRING, "silero-vad"),
        ("general.name", GGUF_STRING, "Silero VAD v6.2"),
        ("general.license", GGUF_STRING, "MIT"),
        ("general.source.url", GGUF_STRING, "https://github.com/snakers4/silero-vad"),
        ("silero_vad.version", GGUF_STRING, "6.2"),
        ("general.alignment", GGUF_U32, ALIGN),
    ]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
    for key, ty, value in meta:
        out += gguf_string(key) + struct.pack("<I", ty)
        out += gguf_string(value) if ty == GGUF_STRING else struct.pack("<I", value)
    offset = 0
    for name, shape, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(shape))
        for n in reversed(shape):
            out += struct.pack("<q", n)
        out += struct.pack("<IQ", GGML_F32, offset)
        offset += -(-len(data) // ALIGN) * ALIGN
    out += b"\0" * (-len(out) % ALIGN)
    for _, _, data in tensors:
        out += data + b"\0" * (-len(data) % ALIGN)
    with open(sys.argv[2], "wb") as f:
        f.write(out)
    print(f"{sys.argv[2]}: {len(tensors)} tensors, {len(out)} bytes")


if __name__ == "__main__":
    main()
