#!/usr/bin/env python3
"""Trims NeMo's beam-search references (outputs/<model>_decoding/beam.json of the shared
reference set) to what tests/pipeline/beam.rs asserts: per model, clip and case the N-best
tokens, timestamps, durations, text and score; cases NeMo refused keep only their error.

CTC `beam_batch` scores are NeMo's computer rerun on the valid frames alone: NeMo's encoder
output of the 10 s clip has one padding frame past its length (126 frames, length 125), and
NeMo's batched CTC beam keeps adding the log-probabilities of frames past the length to the
scores (the tokens stay). Our encoder computes only the valid frames, so the fixture holds
NeMo's scores for those (the case's recorded decoding config applied to the model, NeMo's
decoding run on `ctc_logprobs[:enc_len]`); the script checks that the tokens are the ones of
the recorded run.

usage (NeMo's venv, for torch and NeMo):
  $NEMO_VENV/bin/python scripts/beam_fixture.py REFERENCE_OUTPUTS_DIR tests/fixtures/decoding/beam.json
"""
import json
import sys

import numpy as np
import torch

MODELS = ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"]


def boost_settings(beam):
    """The boosting tree's phrases and settings, or None when the case boosts nothing."""
    tree = beam.get("boosting_tree") or {}
    if not tree.get("key_phrases_list"):
        return None
    keys = ["context_score", "depth_scaling", "unk_score", "score_per_phrase", "uniform_weights"]
    return dict(
        {"phrases": tree["key_phrases_list"], "alpha": beam["boosting_tree_alpha"]},
        **{k: tree[k] for k in keys},
    )


def main(root, dest):
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
                "boost": boost_settings(beam),
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
            if case.get("strategy") == "beam_batch":
                rescore_ctc(root, model, name, case)
    with open(dest, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


def rescore_ctc(root, model, name, case):
    """NeMo's own decoding of the case (its recorded config applied to the model) over the
    CTC log-probabilities of the valid frames."""
    import copy

    import nemo.collections.asr.models as M
    from omegaconf import OmegaConf, open_dict

    asr = M.ASRModel.restore_from(f"{root}/../models/{model}.nemo", map_location="cpu")
    asr.eval()
    hybrid = isinstance(asr, M.EncDecHybridRNNTCTCBPEModel)
    override = json.load(open(f"{root}/{model}_decoding/beam.json"))["cases"][name]["override"]
    cfg = copy.deepcopy(asr.cfg.aux_ctc.decoding if hybrid else asr.cfg.decoding)
    with open_dict(cfg):
        cfg.merge_with(OmegaConf.create(override))
    if hybrid:
        asr.change_decoding_strategy(cfg, decoder_type="ctc", verbose=False)
        decoding = asr.ctc_decoding
    else:
        asr.change_decoding_strategy(cfg, verbose=False)
        decoding = asr.decoding
    for clip, nbest in case["clips"].items():
        suffix = "_2s" if clip == "speech_2s.wav" else ""
        enc_len = json.load(open(f"{root}/{model}{suffix}/result.json"))["enc_len"]
        lp = torch.tensor(np.load(f"{root}/{model}{suffix}/ctc_logprobs.npy")).float()[None, :enc_len]
        with torch.no_grad():
            hyps = decoding.ctc_decoder_predictions_tensor(
                lp, decoder_lengths=torch.tensor([enc_len]), return_hypotheses=True
            )
        hyps = (hyps[0] if isinstance(hyps, tuple) else hyps)[0]
        hyps = hyps.n_best_hypotheses if hasattr(hyps, "n_best_hypotheses") else hyps
        assert len(hyps) == len(nbest), (model, name, clip)
        for ours, recorded in zip(hyps, nbest):
            assert list(map(int, ours.y_sequence)) == recorded["tokens"], (model, name, clip)
            recorded["score_recorded"] = recorded["score"]
            recorded["score"] = float(ours.score)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
