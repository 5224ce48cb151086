#!/usr/bin/env python3
"""Full-size cache-aware streaming architectures with seeded random weights, for the streaming
latency benchmark (no real checkpoint can be downloaded here).

  stream_rnnt_0.6b  nvidia/nemotron-speech-streaming-en-0.6b's shape: 24 x 1024, 8 heads, 128 mels,
                    RNN-T with a 2-layer 640 LSTM, lookaheads [70,13] [70,6] [70,1] [70,0]
  stream_rnnt_120m  nvidia/parakeet_realtime_eou_120m-v1's shape: 17 x 512, 8 heads, 128 mels,
                    RNN-T with a 1-layer 640 LSTM, lookahead [70,1] (160 ms chunks)

Both use the reference set's 1024-piece tokenizer (the EOU model's two extra pieces change
nothing in the timing). The model builder and configs are the reference set's own
(../shared/reference/scripts, or REF_SCRIPTS), so the weights are made exactly as the tiny
reference models' are (seeded, re-initialised, calibrated).

Usage: NEMO_REF=DIR $NEMO_REF/venv/bin/python scripts/build_stream_bench_models.py [NAME ...]
Writes $NEMO_REF/models/NAME.nemo (about 2.4 GB and 0.5 GB).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("REF_SCRIPTS", os.path.join(HERE, "..", "..", "shared", "reference", "scripts")))

import configs  # noqa: E402
import build_models  # noqa: E402

configs.MODELS["stream_rnnt_0.6b"] = ("EncDecRNNTBPEModel", lambda: configs.cache_aware_streaming(
    configs.transducer_cfg(configs.V1024, 128, 24, 1024, 8, 640, 640, 2, use_bias=False, xscaling=False,
                           tdt=False), configs.MULTI_LOOKAHEAD))
configs.MODELS["stream_rnnt_120m"] = ("EncDecRNNTBPEModel", lambda: configs.cache_aware_streaming(
    configs.transducer_cfg(configs.V1024, 128, 17, 512, 8, 640, 640, 1, use_bias=True, xscaling=False,
                           tdt=False), [70, 1]))

if __name__ == "__main__":
    for name in sys.argv[1:] or ["stream_rnnt_120m", "stream_rnnt_0.6b"]:
        build_models.build(name)
