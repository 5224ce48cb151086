"""NeMo 3.0's boosting trees for phrase lists harder than the shared references' (shared
prefixes with different per-phrase scores, phrases that are prefixes and suffixes of others,
repeats, uniform weights, negative unk_score), on the 1024-piece tokenizer fixture, written to
tests/fixtures/decoding/boosting_trees_v1024.json: each case's settings, phrases, NeMo's ids,
states and arcs, and advance() on a sample of (state, label) pairs (the whole table is states x
1024; of the start state's arcs, one per label, only those to other states). Run from the repo root with the NeMo venv's python."""
import json, random
import numpy as np
import torch
from omegaconf import OmegaConf
from nemo.collections.common.tokenizers import SentencePieceTokenizer
from nemo.collections.asr.parts.context_biasing.boosting_graph_batched import (
    BoostingTreeModelConfig, GPUBoostingTreeModel)

def f32(x):
    """The shortest decimal that reads back as the same f32."""
    return float(str(np.float32(float(x))))

tok = SentencePieceTokenizer("tests/fixtures/tokenizers/spe_bpe_v1024.model")
rng = random.Random(20)
words = ["data", "date", "database", "dinner", "the", "then", "theory", "the cat", "cat", "category",
         "nvidia", "parakeet", "conformer", "transducer", "token", "tokens", "tokenizer", "speech",
         "speech recognition", "recognition", "a", "an", "anaconda", "cond", "conda", "mississippi",
         "sip", "sipping", "hippo", "hip", "Zürich", "naïve", "data data", "en", "encoding"]
syll = ["ka", "lo", "mi", "ter", "pon", "dra", "vel", "sun", "qui", "zor", "an", "the"]
made = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(150)]
made += [a + " " + b for a, b in zip(made[:30], made[30:60])]
big = words + made + words[:5]          # repeats count once

cases = []
for name, phrases, kw in [
    ("words_default", words, {}),
    ("words_spp5", words, {"score_per_phrase": 5.0}),
    ("words_uniform_unk", words, {"uniform_weights": True, "unk_score": -0.3, "context_score": 1.5}),
    ("words_spp3_uniform", words, {"uniform_weights": True, "score_per_phrase": 3.0, "depth_scaling": 1.0}),
    ("big_cs07_ds3", big, {"context_score": 0.7, "depth_scaling": 3.0}),
    ("big_spp4", big, {"score_per_phrase": 4.0, "unk_score": 0.1}),
]:
    cfg = OmegaConf.structured(BoostingTreeModelConfig(key_phrases_list=phrases, use_triton=False, **kw))
    m = GPUBoostingTreeModel.from_config(cfg, tokenizer=tok)
    S, V = m.num_states, m.vocab_size
    with torch.no_grad():
        sc, ns = m.advance(torch.arange(S, dtype=torch.long))
    pairs = [(s, l) for s in range(S) for l in rng.sample(range(V), 3)]
    # every label a state has an arc for, and the labels of its backoff chain's arcs
    se = m.start_end_arcs.tolist()
    for s in range(1, S):
        for a in range(se[s][0], se[s][1]):
            pairs.append((s, int(m.ilabels[a])))
    # the start state's arcs left out: label l's arc is arc l, back to the start with unk_score
    for i in range(V):
        assert int(m.from_states[i]) == 0 and int(m.ilabels[i]) == i
        if int(m.to_states[i]) == 0:
            assert f32(m.arcs_weights[i]) == f32(cfg.unk_score)
    settings = {k: getattr(cfg, k) for k in ("context_score", "depth_scaling", "unk_score",
                                              "score_per_phrase", "uniform_weights")}
    cases.append({
        "name": name, "settings": settings, "phrases": phrases,
        "ids": [tok.text_to_ids(p) for p in phrases],
        "states": [[se[s][0], se[s][1], int(m.state_order[s]), int(m.backoff_to_states[s]),
                    f32(m.backoff_weights[s]), f32(m.final_weights[s])] for s in range(S)],
        "arcs": [[i, int(m.from_states[i]), int(m.to_states[i]), int(m.ilabels[i]), f32(m.arcs_weights[i])]
                 for i in range(m.num_arcs) if i >= V or int(m.to_states[i]) != 0],
        "advance": [[s, l, f32(sc[s, l]), int(ns[s, l])] for s, l in pairs],
    })
    print(name, S, m.num_arcs, len(pairs))
with open("tests/fixtures/decoding/boosting_trees_v1024.json", "w") as f:
    json.dump({"tokenizer": "tokenizers/spe_bpe_v1024.model", "cases": cases}, f,
              separators=(",", ":"), ensure_ascii=False)
