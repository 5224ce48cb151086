"""Raises the joint's output bias of pieces of tiny_tdt_punct (PIECE=DELTA, `_` for the word mark) so
that the random model emits punctuation often, then saves the model as OUT.nemo.
Usage: punct_bias.py IN.nemo OUT.nemo PIECE=DELTA..."""
import sys, logging, torch
import nemo.collections.asr.models as M
from nemo.utils import logging as nlog
nlog.setLevel(logging.ERROR)
torch.set_num_threads(2)
src, out = sys.argv[1], sys.argv[2]
deltas = {a.split("=")[0].replace("_", "\u2581"): float(a.split("=")[1]) for a in sys.argv[3:]}
m = M.EncDecRNNTBPEModel.restore_from(src, map_location="cpu")
m.eval()
vocab = m.tokenizer.vocab
with torch.no_grad():
    for p, d in deltas.items():
        m.joint.joint_net[-1].bias[vocab.index(p)] += d
m.save_to(out)
h = m.transcribe(["audio/speech_10s.wav"], batch_size=1, verbose=False)
h = h[0] if not isinstance(h, tuple) else h[0][0]
print(deltas, repr(getattr(h, "text", h)))
