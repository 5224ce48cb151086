"""(Copy of ../shared/reference/scripts/run_reference.py with one fix: eval() after
change_attention_model; the shared *_local16 outputs were made with attention dropout on.)
Run a .nemo model on a 16 kHz wav and dump reference tensors / decode results; optional timing.
Usage: run_reference.py MODEL.nemo WAV OUTDIR [--timing N] [--no-dump] [--threads 2]"""
import os, sys, json, time, argparse, logging, resource, copy
import numpy as np, torch, soundfile as sf
from omegaconf import open_dict
from nemo.utils import logging as nlog
nlog.setLevel(logging.ERROR)
import nemo.collections.asr.models as M
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/reference/scripts"))
import refdecode

ap = argparse.ArgumentParser()
ap.add_argument("nemo"); ap.add_argument("wav"); ap.add_argument("out")
ap.add_argument("--timing", type=int, default=0); ap.add_argument("--no-dump", action="store_true")
ap.add_argument("--threads", type=int, default=2); ap.add_argument("--skip-greedy", action="store_true")
ap.add_argument("--transcribe", action="store_true")
ap.add_argument("--att-context", default=None, help="L,R: switch to NeMo's local attention (rel_pos_local_attn) with this window")
a = ap.parse_args()
torch.set_num_threads(a.threads)
os.makedirs(a.out, exist_ok=True)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (peak so far)
res = {"nemo": a.nemo, "wav": a.wav, "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
res["rss_after_import_mib"] = round(rss(), 1)

t0 = time.time()
model = M.ASRModel.restore_from(a.nemo, map_location="cpu")
model.eval()
model.preprocessor.featurizer.dither = 0.0
model.preprocessor.featurizer.pad_to = 0
if a.att_context:
    L, R = (int(v) for v in a.att_context.split(","))
    model.encoder.change_attention_model("rel_pos_local_attn", [L, R])
    # change_attention_model builds fresh attention and positional-encoding modules, which
    # start in training mode: without this their dropout (0.1) stays on.
    model.eval()
    # It also builds the new attention with biases whatever encoder.use_bias says, and loads
    # the old weights with strict=False: a bias-free model (tdt-0.6b-v2) would keep those
    # biases at their random initialisation. Zero them: the model's own attention has none.
    if not model.cfg.encoder.get("use_bias", True):
        with torch.no_grad():
            for layer in model.encoder.layers:
                for lin in ("linear_q", "linear_k", "linear_v", "linear_out"):
                    b = getattr(layer.self_attn, lin).bias
                    if b is not None:
                        b.zero_()
    res["att_context"] = [L, R]; res["self_attention_model"] = "rel_pos_local_attn"
res["load_s"] = round(time.time() - t0, 2); res["class"] = type(model).__name__
res["rss_after_load_mib"] = round(rss(), 1)
fz = model.preprocessor.featurizer
res["featurizer"] = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in dict(
    sample_rate=fz.sample_rate if hasattr(fz, "sample_rate") else None, n_fft=fz.n_fft, hop_length=fz.hop_length,
    win_length=fz.win_length, preemph=fz.preemph, nfilt=fz.nfilt, normalize=fz.normalize, log=fz.log,
    log_zero_guard_type=fz.log_zero_guard_type, log_zero_guard_value=fz.log_zero_guard_value,
    mag_power=fz.mag_power, exact_pad=fz.exact_pad, pad_value=fz.pad_value, frame_splicing=fz.frame_splicing,
    stft_pad_amount=getattr(fz, "stft_pad_amount", None), max_duration=getattr(fz, "max_duration", None)).items()}

x, sr = sf.read(a.wav, dtype="float32"); assert sr == 16000 and x.ndim == 1
sig = torch.from_numpy(x)[None]; ln = torch.tensor([sig.shape[1]])
res["audio_samples"] = int(sig.shape[1])

def save(name, t):
    if not a.no_dump:
        np.save(os.path.join(a.out, name + ".npy"), t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t))

enc_mod = model.encoder
hooks, dumps = [], {}
def hook(name, pick=None):
    def fn(mod, inp, out):
        o = out if pick is None else pick(out)
        dumps[name] = o.detach().clone()
    return fn
if not a.no_dump:
    hooks.append(enc_mod.pre_encode.register_forward_hook(hook("enc_pre_encode", lambda o: o[0][0])))     # [T', D]
    hooks.append(enc_mod.pos_enc.register_forward_hook(hook("enc_pos_enc_x", lambda o: o[0][0])))         # x*xscale (+dropout=id)
    hooks.append(enc_mod.pos_enc.register_forward_hook(hook("enc_pos_emb", lambda o: o[1][0])))           # [2T'-1, D]
    for i, layer in enumerate(enc_mod.layers):
        hooks.append(layer.register_forward_hook(hook(f"enc_layer_{i:02d}", lambda o: o[0])))           # [T', D]
    l0 = enc_mod.layers[0]
    for sub in ["norm_feed_forward1", "feed_forward1", "norm_self_att", "self_attn", "norm_conv", "conv",
                "norm_feed_forward2", "feed_forward2", "norm_out"]:
        hooks.append(getattr(l0, sub).register_forward_hook(hook(f"enc_layer_00_{sub}", lambda o: (o[0] if isinstance(o, tuple) else o)[0])))

with torch.no_grad():
    feats, flen = model.preprocessor(input_signal=sig, length=ln)
    enc, elen = model.encoder(audio_signal=feats, length=flen)
for h in hooks: h.remove()
res["features_shape"] = list(feats.shape); res["feat_len"] = int(flen[0])
res["encoder_shape"] = list(enc.shape); res["enc_len"] = int(elen[0])
save("audio", sig[0]); save("features", feats[0]); save("encoder_out", enc[0])
for k, v in dumps.items(): save(k, v)
res["dumped"] = sorted(["audio", "features", "encoder_out"] + list(dumps.keys())) if not a.no_dump else []

def hyp_dict(h, vocab_size):
    ys = h.y_sequence.tolist() if torch.is_tensor(h.y_sequence) else list(h.y_sequence)
    ts = h.timestamp.tolist() if torch.is_tensor(h.timestamp) else (list(h.timestamp) if isinstance(h.timestamp, (list, tuple)) else h.timestamp)
    if isinstance(ts, dict): ts = None
    td = getattr(h, "token_duration", None)
    td = td.tolist() if torch.is_tensor(td) else td
    return {"tokens": ys, "timestamp": ts, "token_duration": td, "text": h.text, "score": float(h.score)}

def transducer_decode(strategy):
    dc = copy.deepcopy(model.cfg.decoding)
    with open_dict(dc):
        dc.strategy = strategy
        dc.tdt_include_token_duration = True
        dc.greedy.loop_labels = True
    if isinstance(model, M.EncDecHybridRNNTCTCBPEModel):
        model.change_decoding_strategy(dc, decoder_type="rnnt", verbose=False)
    else:
        model.change_decoding_strategy(dc, verbose=False)
    with torch.no_grad():
        hyps = model.decoding.rnnt_decoder_predictions_tensor(encoder_output=enc, encoded_lengths=elen, return_hypotheses=True)
    if isinstance(hyps, tuple): hyps = hyps[0]
    return hyps[0]

def ctc_head():
    return model.ctc_decoder if hasattr(model, "ctc_decoder") else model.decoder

def ctc_decode():
    with torch.no_grad():
        lp = ctc_head()(encoder_output=enc)           # [B, T, V+1] log-probs
    save("ctc_logprobs", lp[0])
    ref = refdecode.ctc_greedy(lp[0], int(elen[0]))
    if isinstance(model, M.EncDecHybridRNNTCTCBPEModel):
        with torch.no_grad():
            hyps = model.ctc_decoding.ctc_decoder_predictions_tensor(lp, decoder_lengths=elen, return_hypotheses=True)
    else:
        with torch.no_grad():
            hyps = model.decoding.ctc_decoder_predictions_tensor(lp, decoder_lengths=elen, return_hypotheses=True)
    if isinstance(hyps, tuple): hyps = hyps[0]
    h = hyps[0]
    ys = h.y_sequence.tolist() if torch.is_tensor(h.y_sequence) else list(h.y_sequence)
    # NeMo keeps the un-collapsed per-frame argmax in y_sequence for CTC greedy; collapse it the same way
    nemo_collapsed = refdecode.ctc_greedy(torch.nn.functional.one_hot(torch.tensor(ys), lp.shape[-1]).float(), len(ys))["tokens"] if len(ys) == int(elen[0]) else ys
    return {"frame_argmax": ref["frame_argmax"], "tokens": ref["tokens"], "nemo_tokens": nemo_collapsed,
            "ref_equals_nemo": nemo_collapsed == ref["tokens"], "text": h.text, "blank_frames": ref["blank_frames"],
            "frames": int(elen[0]), "min_margin": ref["min_margin"]}

has_transducer = hasattr(model, "joint")
if has_transducer:
    res["blank_index"] = model.decoder.blank_idx
    res["durations"] = list(model.cfg.decoding.get("durations", []) or [])
    res["max_symbols"] = model.cfg.decoding.greedy.get("max_symbols", None)
    if not a.skip_greedy:
        res["greedy"] = hyp_dict(transducer_decode("greedy"), None)
    res["greedy_batch"] = hyp_dict(transducer_decode("greedy_batch"), None)
    if "greedy" in res:
        res["greedy_equals_greedy_batch"] = res["greedy"]["tokens"] == res["greedy_batch"]["tokens"]
    durs = res["durations"] or None
    r = refdecode.transducer_greedy(model, enc[0], int(elen[0]), int(res["max_symbols"]), durs)
    json.dump(r["trace"], open(os.path.join(a.out, "decode_trace.json"), "w"))
    res["ref_decoder"] = {k: v for k, v in r.items() if k != "trace"}
    res["ref_equals_nemo_greedy_batch"] = r["tokens"] == res["greedy_batch"]["tokens"] and r["timestamp"] == res["greedy_batch"]["timestamp"]
    g = res["greedy_batch"]
    ts = g["timestamp"] or []
    from collections import Counter
    c = Counter(ts)
    res["transducer_stats"] = {"n_tokens": len(g["tokens"]), "frames": int(elen[0]),
                               "frames_with_emission": len(c), "max_emissions_one_frame": max(c.values()) if c else 0,
                               "duration_hist": dict(Counter(g["token_duration"] or []))}
if hasattr(model, "ctc_decoder") or isinstance(model, M.EncDecCTCModelBPE):
    res["ctc"] = ctc_decode()

if a.transcribe:
    if isinstance(model, M.EncDecHybridRNNTCTCBPEModel):
        model.change_decoding_strategy(decoder_type="rnnt", verbose=False)
    t0 = time.time()
    out = model.transcribe([a.wav], batch_size=1, verbose=False)
    o = out[0] if isinstance(out, list) else out[0][0]
    res["transcribe_text"] = o.text if hasattr(o, "text") else o
    res["transcribe_s"] = round(time.time() - t0, 2)

if a.timing:
    if has_transducer: model.change_decoding_strategy(
        decoder_type="rnnt", verbose=False) if isinstance(model, M.EncDecHybridRNNTCTCBPEModel) else None
    T = {"preprocessor_ms": [], "encoder_ms": [], "decode_greedy_batch_ms": [], "decode_ctc_ms": []}
    with torch.inference_mode():
        for it in range(a.timing + 1):   # first iteration = warm-up, discarded
            t0 = time.perf_counter(); f, fl = model.preprocessor(input_signal=sig, length=ln); t1 = time.perf_counter()
            e, el = model.encoder(audio_signal=f, length=fl); t2 = time.perf_counter()
            if has_transducer:
                model.decoding.rnnt_decoder_predictions_tensor(encoder_output=e, encoded_lengths=el, return_hypotheses=False)
            t3 = time.perf_counter()
            if "ctc" in res:
                lp = ctc_head()(encoder_output=e); lp.argmax(-1)
            t4 = time.perf_counter()
            if it == 0: continue
            T["preprocessor_ms"].append((t1 - t0) * 1e3); T["encoder_ms"].append((t2 - t1) * 1e3)
            if has_transducer: T["decode_greedy_batch_ms"].append((t3 - t2) * 1e3)
            if "ctc" in res: T["decode_ctc_ms"].append((t4 - t3) * 1e3)
    res["timing_median_ms"] = {k: round(float(np.median(v)), 1) for k, v in T.items() if v}
    res["timing_min_ms"] = {k: round(float(np.min(v)), 1) for k, v in T.items() if v}
    res["timing_runs"] = a.timing
res["peak_rss_mib"] = round(rss(), 1)
json.dump(res, open(os.path.join(a.out, "result.json"), "w"), indent=1)
short = {k: v for k, v in res.items() if k not in ("greedy", "greedy_batch", "ctc", "dumped", "featurizer", "ref_decoder")}
print(json.dumps(short, indent=None)[:3000])
for k in ("greedy", "greedy_batch"):
    if k in res: print(k, "n_tok", len(res[k]["tokens"]), "text:", repr(res[k]["text"][:120]))
if "ctc" in res: print("ctc", "n_tok", len(res["ctc"]["tokens"]), "blank_frames", res["ctc"]["blank_frames"], "/", res["ctc"]["frames"], "ref==nemo", res["ctc"]["ref_equals_nemo"], "min_margin %.4f" % res["ctc"]["min_margin"], repr(res["ctc"]["text"][:100]))
if "ref_decoder" in res: print("ref transducer == nemo greedy_batch:", res["ref_equals_nemo_greedy_batch"], "steps", res["ref_decoder"]["steps"], "min_token_margin %.4f" % res["ref_decoder"]["min_token_margin"], "min_dur_margin", res["ref_decoder"]["min_duration_margin"])
