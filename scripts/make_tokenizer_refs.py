#!/usr/bin/env python3
"""Reference ids for the tokenizer test (tests/pipeline/tokenizer.rs): SentencePiece's own
encoding (`pip install sentencepiece protobuf`; NeMo's `text_to_ids` is `encode_as_ids`) of a
fixed set of strings, for every SentencePiece model the tests use:

- `spe_bpe_v48`: the BPE model inside the tiny .nemo fixtures (nmt_nfkc, as NeMo trains them);
- `spe_bpe_v1024`: a 1024-piece BPE model built the same way (../shared/reference/tokenizers),
  copied to tests/fixtures/tokenizers/;
- `unigram_bytes`: a small unigram model trained here on the same corpus (identity normaliser,
  extra whitespace removed, byte fallback, two user-defined pieces), so that the unigram path
  and those settings are tested too.

The strings: the phrase lists (whose ids NeMo recorded there are kept too, to check that
SentencePiece's encoding is NeMo's) of ../shared/reference/outputs/*_decoding/boosting.json, corpus
lines, and generated text (case, digits, punctuation, runs of spaces, tabs and newlines, NFKC
forms, accents, characters outside the vocabulary, emoji). Usage, from the repository root:

    python3 scripts/make_tokenizer_refs.py [../shared/reference]
"""

import io
import json
import random
import sys
import tarfile
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/tokenizers"
GENERATED = 1500
CORPUS_LINES = 300


def nemo_tokenizer_model(nemo: Path) -> bytes:
    with tarfile.open(nemo) as tar:
        for member in tar.getmembers():
            if member.name.endswith("tokenizer.model"):
                return tar.extractfile(member).read()
    raise SystemExit(f"{nemo}: no tokenizer.model")


def train_unigram(corpus: Path) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_writer=model,
        model_type="unigram",
        vocab_size=300,
        normalization_rule_name="identity",
        remove_extra_whitespaces=True,
        byte_fallback=True,
        user_defined_symbols=["<laugh>", "nemo"],
        character_coverage=0.98,
        num_threads=1,
        seed_sentencepiece_size=20000,
        input_sentence_size=4000,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    return model.getvalue()


def generated_strings(words: list[str], rng: random.Random) -> list[str]:
    extras = [
        "Hello", "WORLD", "NeMo", "nemo", "<laugh>", "don't", "it's", "42", "3.14", "1,000",
        "$5", "e-mail", "U.S.A.", "café", "naïve", "Ærø", "straße", "ｆｕｌｌ", "ＡＢＣ", "①",
        "ﬁ", "Ⅻ", "½", "™", "…", "—", "“quoted”", "¿qué?", "日本語", "中文", "한국어",
        "Привет", "Ωμέγα", "😀", "👍🏽", "a\u0301", "\u00a0", "\u3000", "x\u200by", "\ufeff",
        "\u2581", "▁▁", "<unk>", "<s>", "\t", "\n", "  ", "   ",
    ]
    out = ["", " ", "  ", "\t", "a", "A", " a", "a ", " a ", "a  b", "ab\ncd", "\u2581a"]
    for _ in range(GENERATED):
        n = rng.randint(1, 6)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.65:
                w = rng.choice(words)
                if rng.random() < 0.15:
                    w = w.upper()
                elif rng.random() < 0.15:
                    w = w.capitalize()
            else:
                w = rng.choice(extras)
            parts.append(w)
        sep = lambda: rng.choice([" "] * 12 + ["  ", "\t", "\n", "", ", ", ". ", " - "])
        s = parts[0]
        for p in parts[1:]:
            s += sep() + p
        if rng.random() < 0.1:
            s = rng.choice([" ", "  ", "\t"]) + s
        if rng.random() < 0.1:
            s += rng.choice([" ", "  ", ".", "?", "!"])
        out.append(s)
    return out


def main() -> None:
    shared = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT.parent / "shared/reference")
    corpus = shared / "tokenizers/corpus.txt"
    OUT.mkdir(parents=True, exist_ok=True)

    models = {
        "spe_bpe_v48": nemo_tokenizer_model(ROOT / "tests/fixtures/tiny_tdt.nemo"),
        "spe_bpe_v1024": (shared / "tokenizers/spe_bpe_v1024/tokenizer.model").read_bytes(),
        "unigram_bytes": train_unigram(corpus),
    }
    for name in ("spe_bpe_v1024", "unigram_bytes"):
        (OUT / f"{name}.model").write_bytes(models[name])

    lines = [l for l in corpus.read_text(encoding="utf-8").splitlines() if l.strip()]
    rng = random.Random(19)
    words = sorted({w for l in lines for w in l.split()})
    phrases, nemo_ids = [], {}
    for boosting in sorted(shared.glob("outputs/*_decoding/boosting.json")):
        model = boosting.parent.name.removesuffix("_decoding")
        for entries in json.loads(boosting.read_text())["phrase_lists"].values():
            phrases += [e["phrase"] for e in entries]
            nemo_ids[model] = nemo_ids.get(model, []) + [[e["phrase"], e["ids"]] for e in entries]
    strings = list(dict.fromkeys(phrases + rng.sample(lines, CORPUS_LINES)))
    strings += generated_strings(words, rng)

    refs = {
        "generator": "scripts/make_tokenizer_refs.py",
        # NeMo's own ids of the boosting phrases (boosting.json), per tiny model.
        "nemo_phrase_ids": nemo_ids,
        "strings": strings,
        "ids": {},
    }
    for name, model in models.items():
        sp = spm.SentencePieceProcessor(model_proto=model)
        refs["ids"][name] = [" ".join(map(str, sp.encode_as_ids(s))) for s in strings]
    text = json.dumps(refs, ensure_ascii=False, indent=0)
    (OUT / "refs.json").write_text(text + "\n", encoding="utf-8")
    print(f"{len(strings)} strings, {len(models)} models -> {OUT}")


if __name__ == "__main__":
    main()
