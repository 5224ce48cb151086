#!/usr/bin/env bash
# Bit-identity check: every converted GGUF, every layer dump and every transcript (json) of the
# five tiny fixture models x {f32,q8_0,q4_0} x {10 s, 2 s} clips, both heads of the hybrid, and
# local attention; N-best lists of each head's default beam search, boosted too. Usage (repo root): scripts/bit_identity.sh BIN OUTDIR, once per binary, then
# diff -r OUTDIR_A OUTDIR_B (timings are dropped from the json; everything else must be byte-equal).
set -euo pipefail
BIN=$(readlink -f "$1"); out=$2; rm -rf "$out"; mkdir -p "$out"
fx=tests/fixtures; ref=$fx/reference
for m in tiny_tdt tiny_tdt_ctc tiny_rnnt tiny_ctc tiny_tdt_ctc_local; do
  for ty in f32 q8_0 q4_0; do
    g=$out/$m-$ty.gguf
    "$BIN" convert "$fx/$m.nemo" "$g" --type $ty >/dev/null 2>&1
    for clip in speech_10s speech_2s; do
      d=$out/$m-$ty-$clip; mkdir -p $d
      "$BIN" transcribe $ref/$clip.wav -m "$g" -t 2 -q -f json -o $d/t --dump-layers $d/layers >/dev/null 2>&1
      if [ $m = tiny_tdt_ctc ]; then "$BIN" transcribe $ref/$clip.wav -m "$g" -t 2 -q -f json -o $d/ctc --decoder ctc >/dev/null 2>&1; fi
      heads=auto; [ $m = tiny_tdt_ctc ] && heads="auto ctc"
      for head in $heads; do
        "$BIN" transcribe $ref/$clip.wav -m "$g" -t 2 -q -f json -o $d/beam-$head --decoder $head --beam 8 --nbest 8 >/dev/null 2>&1
        "$BIN" transcribe $ref/$clip.wav -m "$g" -t 2 -q -f json -o $d/boost-$head --decoder $head --beam 4 --nbest 4 --boost "the speech" --boost-alpha 2 >/dev/null 2>&1
      done
      # every other strategy of the transducer heads, once per model
      strategies="beam maes"; [ $m = tiny_rnnt ] && strategies="beam maes tsd alsd maes_batch"
      if [ $ty = f32 ] && [ $clip = speech_10s ] && [ $m != tiny_ctc ]; then
        for st in $strategies; do
          "$BIN" transcribe $ref/$clip.wav -m "$g" -t 2 -q -f json -o $d/beam-$st --beam 4 --nbest 4 --beam-strategy $st >/dev/null 2>&1
        done
      fi
      if [ $clip = speech_10s ]; then "$BIN" transcribe $ref/$clip.wav -m "$g" -t 2 -q -f json -o $d/l16 --att-context 16,16 --dump-layers $d/l16layers >/dev/null 2>&1; fi
    done
  done
done
# timings differ run to run: drop them
find "$out" -name '*.json' -print0 | xargs -0 python3 -c '
import json, sys
for p in sys.argv[1:]:
    d = json.load(open(p)); d.pop("timings", None); json.dump(d, open(p, "w"), indent=1)'
find "$out" -type f | wc -l
