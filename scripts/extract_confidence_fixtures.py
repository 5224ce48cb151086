#!/usr/bin/env python3
"""Copy what the confidence tests read from NeMo's references into tests/fixtures/decoding/.

Usage: scripts/extract_confidence_fixtures.py REFERENCE_OUTPUTS_DIR
(REFERENCE_OUTPUTS_DIR = ../shared/reference/outputs, made by run_decoding_reference.py).
Keeps, per model and case of confidence.json: the settings, NeMo's tokens, token and word
confidence and words; and NeMo's token -> word grouping (`segmentation`).
"""
import json
import sys
from pathlib import Path

MODELS = ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"]


def main():
    src = Path(sys.argv[1])
    out_dir = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "decoding"
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        ref = json.loads((src / f"{model}_decoding" / "confidence.json").read_text())
        cases = {}
        for clip, results in ref["results"].items():
            for name, case in ref["cases"].items():
                r = results.get(name)
                if r is None or "error" in case or "error" in (r or {}):
                    continue
                cfg = case["decoding_cfg"]["confidence_cfg"]
                cases[f"{clip}|{name}"] = {
                    "clip": clip,
                    "head": case["head"],
                    "method": cfg["method_cfg"],
                    "aggregation": cfg["aggregation"],
                    "exclude_blank": cfg["exclude_blank"],
                    "tdt_include_duration": cfg["tdt_include_duration"],
                    "tokens": r["tokens"],
                    "token_confidence": r["token_confidence"],
                    "word_confidence": r["word_confidence"],
                    "words": r["words"],
                }
        seg = {
            head: {
                clip: {k: v[k] for k in ("tokens", "pieces", "words", "word_token_indices")}
                for clip, v in clips.items()
            }
            for head, clips in ref["segmentation"].items()
        }
        out = {"model": model, "cases": cases, "segmentation": seg}
        path = out_dir / model / "confidence.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, separators=(",", ":")))
        print(f"{path}: {len(cases)} cases, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
