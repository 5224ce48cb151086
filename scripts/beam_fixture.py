#!/usr/bin/env python3
"""Trims NeMo's beam-search references (outputs/<model>_decoding/beam.json of the shared
reference set) to what tests/pipeline/beam.rs asserts: per model, clip and case the N-best
tokens, timestamps, durations, text and score; cases NeMo refused keep only their error.

CTC `beam_batch` scores are NeMo's computer rerun on the valid frames alone: NeMo's encoder
output of the 10 s clip has one padding frame past its length (126 frames, length 125), and
NeMo's batched CTC beam keeps adding the log-probabilities of frames past the length to the
scores (the tokens stay). Our encoder computes only the valid frames, so the fixture holds
NeMo's scores for those (`BatchedBeamCTCComputer` on `ctc_logprobs[:enc_len]`, with the
case's beam size, beam_beta and beam_threshold); the script checks that the tokens and
timestamps are the ones of the recorded run.

usage (NeMo's venv, for torch and NeMo):
  $NEMO_VENV/bin/python scripts/beam_fixture.py REFERENCE_OUTPUTS_DIR > tests/fixtures/decoding/beam.json
"""
import json
import sys

import numpy as np
import torch
from nemo.collections.asr.parts.submodules.ctc_batched_beam_decoding import BatchedBeamCTCComputer

MODELS = ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"]


def main(root):
    out = {}
    for model in MODELS:
        src = json.load(open(f"{root}/{model}_decoding/beam.json"))
        cases = {}
        for name, case in src["cases"].items():
            if "error" in case:
                cases[name] = {"error": case["error"].splitlines()[0][:200]}
                continue
            beam = case["decoding_cfg"]["beam"]
            cases[name] = {
                "strategy": case["decoding_cfg"]["strategy"],
                "beam_size": beam["beam_size"],
                "score_norm": beam.get("score_norm", True),
                "boost": beam.get("boosting_tree", {}).get("key_phrases_list"),
                "clips": {},
            }
        for clip, results in src["results"].items():
            for name, result in results.items():
                if name not in cases or "error" in cases[name] or not isinstance(result, dict):
                    continue
                if "error" in result:
                    # NeMo accepted the config but failed to decode (a missing KenLM model, an
                    # uninstalled library).
                    cases[name] = {"error": result["error"].splitlines()[0][:200]}
                    continue
                cases[name]["clips"][clip] = [
                    {
                        "tokens": h["tokens"],
                        "timestamp": h["timestamp"],
                        "token_duration": h.get("token_duration"),
                        "text": h["text"],
                        "score": h["score"],
                    }
                    for h in result["nbest"]
                ]
        out[model] = cases
    for model in MODELS:
        for name, case in out[model].items():
            if case.get("strategy") == "beam_batch" and case.get("boost") is None:
                rescore_ctc(root, model, name, case)
    json.dump(out, sys.stdout, separators=(",", ":"))
    print()


def rescore_ctc(root, model, name, case):
    cfg = json.load(open(f"{root}/{model}_decoding/beam.json"))["cases"][name]["decoding_cfg"]["beam"]
    for clip, nbest in case["clips"].items():
        suffix = "_2s" if clip == "speech_2s.wav" else ""
        enc_len = json.load(open(f"{root}/{model}{suffix}/result.json"))["enc_len"]
        lp = torch.tensor(np.load(f"{root}/{model}{suffix}/ctc_logprobs.npy")).float()[None, :enc_len]
        computer = BatchedBeamCTCComputer(
            blank_index=lp.shape[-1] - 1,
            beam_size=cfg["beam_size"],
            beam_beta=cfg["beam_beta"],
            beam_threshold=cfg["beam_threshold"],
            allow_cuda_graphs=False,
        )
        hyps = computer(lp, torch.tensor([enc_len])).to_nbest_hyps_list(score_norm=False)[0]
        hyps = hyps.n_best_hypotheses
        assert len(hyps) == len(nbest), (model, clip)
        for ours, recorded in zip(hyps, nbest):
            assert ours.y_sequence.tolist() == recorded["tokens"], (model, clip)
            assert ours.timestamp.tolist() == recorded["timestamp"], (model, clip)
            recorded["score_recorded"] = recorded["score"]
            recorded["score"] = float(ours.score)


if __name__ == "__main__":
    main(sys.argv[1])
