"""Builds tiny_tdt_punct: tiny_tdt's shape (128 mels, 2 layers of 64, TDT) with the 1024-piece
tokenizer (whose pieces include `.` `,` `?` `!`), seeded and calibrated by the reference set's
build_models.py. Run with the reference set's scripts directory on PYTHONPATH and NEMO_REF set
(its tokenizers/ and audio/ are read, the model is written to $NEMO_REF/models/).
Usage: build_punct_model.py tiny_tdt_punct"""
import sys
import configs, build_models

configs.MODELS["tiny_tdt_punct"] = ("EncDecRNNTBPEModel", lambda: configs.transducer_cfg(
    configs.V1024, 128, 2, 64, 2, 32, 32, 2, sub_ch=16, use_bias=False, xscaling=False, tdt=True))
for n in sys.argv[1:]:
    build_models.build(n)
