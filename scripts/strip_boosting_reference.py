"""Copies what the boosting tests read from NeMo's boosting references
(../shared/reference/outputs/<model>_decoding/boosting.json, made by run_decoding_reference.py)
into tests/fixtures/decoding/<model>/boosting.json: the phrase lists with their ids, every tree
NeMo built (states, arcs, its advance() table) with the settings that built it, and each case's
tokens, frames, durations and text. Run from the repo root: python3 scripts/strip_boosting_reference.py [REF]"""
import json, os, sys

src = sys.argv[1] if len(sys.argv) > 1 else "../shared/reference"
TREE_KEYS = ("context_score", "depth_scaling", "unk_score", "score_per_phrase", "uniform_weights")
for model in ("tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"):
    d = json.load(open(f"{src}/outputs/{model}_decoding/boosting.json"))
    out = {"model": model, "vocab_size": d["vocab_size"], "heads": d["heads"],
           "phrase_lists": {k: [{"phrase": p["phrase"], "ids": p["ids"]} for p in v]
                            for k, v in d["phrase_lists"].items()},
           "trees": {}, "cases": {}, "results": {}}
    for key, c in d["cases"].items():
        assert "error" not in c, (model, key)
        out["cases"][key] = {"head": c["head"], "phrase_list": c["phrase_list"], "tree": c["tree"],
                             "alpha": c["params"]["alpha"] if c["params"] else None}
        if c["tree"] and c["tree"] not in out["trees"]:
            t = d["trees"][c["tree"]]
            settings = {k: c["decoding_cfg"]["greedy"]["boosting_tree"][k] for k in TREE_KEYS}
            out["trees"][c["tree"]] = {
                "phrase_list": t["phrase_list"], "settings": settings,
                "states": [[s["arcs_start"], s["arcs_end"], s["order"], s["backoff_to"], s["backoff_w"], s["final"]]
                           for s in t["states"]],
                "arcs": [[a["from"], a["to"], a["ilabel"], a["weight"]] for a in t["arcs"]],
                "advance_scores": t["advance_scores"], "advance_next_states": t["advance_next_states"]}
    for clip, r in d["results"].items():
        o = out["results"][clip] = {}
        for key, h in r.items():
            if not isinstance(h, dict):
                continue
            assert "error" not in h and h.get("replay_equals_nemo", True), (model, clip, key)
            o[key] = {k: h[k] for k in ("tokens", "timestamp", "token_duration", "text") if h.get(k) is not None}
    os.makedirs(f"tests/fixtures/decoding/{model}", exist_ok=True)
    with open(f"tests/fixtures/decoding/{model}/boosting.json", "w") as f:
        json.dump(out, f, separators=(",", ":"), ensure_ascii=False)
