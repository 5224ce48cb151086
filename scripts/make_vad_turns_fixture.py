#!/usr/bin/env python3
"""Makes tests/fixtures/vad_turns/two_turns.wav, the clip the end-of-turn tests stream: two
utterances from the shared audio (goforward, then librivox_sns_0930, both 16 kHz 16-bit mono)
with one second of digital silence between them."""
import array
import os
import wave

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests/fixtures/vad/audio")
OUT = os.path.join(ROOT, "tests/fixtures/vad_turns/two_turns.wav")
RATE = 16000


def read(name):
    with wave.open(os.path.join(SRC, name)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2), name
        return array.array("h", w.readframes(w.getnframes()))


def main():
    clip = read("goforward.wav") + array.array("h", [0] * RATE) + read("librivox_sns_0930.wav")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with wave.open(OUT, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(clip.tobytes())
    print(f"{OUT}: {len(clip)} samples ({len(clip) / RATE:.2f} s)")


if __name__ == "__main__":
    main()
