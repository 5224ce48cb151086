#!/usr/bin/env python3
"""Copies what the buffered-streaming tests compare from NeMo's reference runs, small.

Reads ../shared/reference/outputs/<model>_buffered*/<head>_<setting>/result.json (NeMo 3.0's
BufferedRNNTPipeline / BufferedCTCPipeline, step by step) and writes one compact JSON per model,
clip, head and setting to tests/fixtures/buffered/. Transducer token timestamps are made local
to the step's chunk (NeMo's minus the step's timestamp_offset).

usage: scripts/extract_buffered_fixtures.py [REFERENCE_OUTPUTS_DIR]
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/reference/outputs")
OUT = ROOT / "tests/fixtures/buffered"


def step_of(s, head):
    clip = s["clip"]
    out = {
        "is_last": s["is_last"],
        "valid_samples": s["buffer"]["valid_samples"],
        "encoded_len": s["encoder"]["valid"] + s["encoder"]["roll_frames"],
        "eou": clip["out"]["eou"],
        "start_end": [int(x) for x in clip["out"]["start_end"]],
        "overlap_skipped": s.get("state_update", {}).get("overlap_skipped", 0),
        "committed": s.get("state_update", {}).get("appended_tokens", []),
        "committed_ts": s.get("state_update", {}).get("appended_timesteps", []),
        "final": [
            {"text": g["text"], "start": g["start"], "end": g["end"]}
            for g in s["output"]["final_segments"]
        ],
        "partial": s["output"]["partial_transcript"],
    }
    if head == "rnnt":
        offset = clip["in"]["timestamp_offset"]
        for call in s["decoder_calls"]:
            hyp = call["hyp"]
            out[call["pass"]] = [[t, ts - offset] for t, ts in zip(hyp["tokens"], hyp["timestamps"])]
    else:
        out["labels"] = s["log_probs"]["frame_argmax"]
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for model_dir in sorted(SRC.glob("*_buffered*")):
        for result in sorted(model_dir.glob("*/result.json")):
            r = json.loads(result.read_text())
            head = result.parent.name.split("_")[0]
            fixture = {
                "source": f"{model_dir.name}/{result.parent.name}/result.json",
                "chunk_left_right_secs": r["chunk_left_right_secs"],
                "audio_samples": r["audio"]["samples"],
                "steps": [step_of(s, head) for s in r["steps"]],
                "final": r["final"],
                "words": [
                    {"text": w["text"], "start": w["start"], "end": w["end"]}
                    for w in r["word_granularity"]["final_words"]
                ],
            }
            name = f"{model_dir.name}_{result.parent.name}.json"
            (OUT / name).write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
            print(name)


if __name__ == "__main__":
    main()
