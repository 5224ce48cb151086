//! NeMo's streaming Sortformer (`forward_streaming` with `streaming_update`, the synchronous
//! loop its inference example runs): the features of the whole recording are cut into chunks
//! of `chunk_len` output frames with left and right context; each chunk is pre-encoded on its
//! own and, after the speaker cache and the FIFO (pre-encode embeddings of earlier frames), goes
//! through the encoder, the Transformer and the head. The chunk's own frames are its output and
//! join the FIFO; frames pushed out of the FIFO join the speaker cache, which, when full, is
//! compressed to the frames that best describe each speaker (`_compress_spkcache`), in arrival
//! order within each speaker, with the mean silence embedding in the slots left over.

use anyhow::{Result, bail};

use super::{Activity, DEFAULT_MODEL, Diarizer};
use crate::audio::mel::StreamingMel;
use crate::encoder::{FeatureImage, encode_embeddings, pre_encode_only};
use crate::hparams::{Attention, SortformerStreaming};

/// The streaming sizes a user may set (80 ms frames); unset ones are NeMo's inference defaults
/// (`e2e_diarize_speech.py`: chunk 6, left context 1, right context 7, FIFO 188, speaker cache
/// 188, update period 144; 1.04 s of latency).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StreamSettings {
    /// Streaming: output frames per chunk.
    #[arg(long, value_name = "FRAMES")]
    pub chunk_len: Option<usize>,
    /// Streaming: frames of left context pre-encoded with each chunk.
    #[arg(long, value_name = "FRAMES")]
    pub chunk_left_context: Option<usize>,
    /// Streaming: frames of right context (lookahead) pre-encoded with each chunk.
    #[arg(long, value_name = "FRAMES")]
    pub chunk_right_context: Option<usize>,
    /// Streaming: frames of the FIFO of recent frames.
    #[arg(long, value_name = "FRAMES")]
    pub fifo_len: Option<usize>,
    /// Streaming: frames of the speaker cache.
    #[arg(long, value_name = "FRAMES")]
    pub spkcache_len: Option<usize>,
    /// Streaming: frames moved from the FIFO to the speaker cache at once.
    #[arg(long, value_name = "FRAMES")]
    pub spkcache_update_period: Option<usize>,
}

/// Upper bound on every streaming size (frames of 80 ms: about 22 minutes).
const MAX_FRAMES: usize = 1 << 14;

impl StreamSettings {
    /// Each size as (flag, value, least value).
    fn flags(&self) -> [(&'static str, Option<usize>, usize); 6] {
        [
            ("--chunk-len", self.chunk_len, 1),
            ("--chunk-left-context", self.chunk_left_context, 0),
            ("--chunk-right-context", self.chunk_right_context, 0),
            ("--fifo-len", self.fifo_len, 0),
            ("--spkcache-len", self.spkcache_len, 1),
            ("--spkcache-update-period", self.spkcache_update_period, 1),
        ]
    }

    /// Refuses sizes NeMo refuses (`_check_streaming_parameters`), before a model is loaded.
    pub fn check(&self) -> Result<()> {
        for (name, v, min) in self.flags() {
            if let Some(v) = v
                && !(min..=MAX_FRAMES).contains(&v)
            {
                bail!("{name} {v} is out of range ({min} to {MAX_FRAMES} frames)");
            }
        }
        Ok(())
    }

    /// The flags set, as the command line spells them (`--fifo-len 16`).
    pub fn given(&self) -> Vec<String> {
        self.flags()
            .iter()
            .filter_map(|(name, v, _)| v.map(|v| format!("{name} {v}")))
            .collect()
    }

    /// The model's settings with NeMo's inference sizes, then the ones set here.
    pub fn resolve(&self, model: SortformerStreaming) -> SortformerStreaming {
        let mut s = model.inference_defaults();
        s.chunk_len = self.chunk_len.unwrap_or(s.chunk_len);
        s.chunk_left_context = self.chunk_left_context.unwrap_or(s.chunk_left_context);
        s.chunk_right_context = self.chunk_right_context.unwrap_or(s.chunk_right_context);
        s.fifo_len = self.fifo_len.unwrap_or(s.fifo_len);
        s.spkcache_len = self.spkcache_len.unwrap_or(s.spkcache_len);
        s.spkcache_update_period = self
            .spkcache_update_period
            .unwrap_or(s.spkcache_update_period);
        s
    }
}

/// The state after one chunk (for tests and diagnostics): NeMo's `StreamingSortformerState`.
#[derive(Clone, Debug, Default)]
pub struct ChunkState {
    /// The step's probabilities over [speaker cache | FIFO | chunk with its context],
    /// `[frames][n_spks]`.
    pub step_preds: Vec<f32>,
    /// `[frames][d]` embeddings and `[frames][n_spks]` probabilities after the step.
    pub spkcache: Vec<f32>,
    pub spkcache_preds: Vec<f32>,
    pub fifo: Vec<f32>,
    pub fifo_preds: Vec<f32>,
    pub mean_sil_emb: Vec<f32>,
    /// Whether the speaker cache was compressed in this step.
    pub compressed: bool,
}

/// The FIFO, the speaker cache and the silence profile between chunks.
struct State {
    d: usize,
    n_spks: usize,
    spkcache: Vec<f32>,
    spkcache_preds: Vec<f32>,
    fifo: Vec<f32>,
    fifo_preds: Vec<f32>,
    mean_sil_emb: Vec<f32>,
    n_sil_frames: usize,
    compressed: bool,
}

impl State {
    fn frames(&self, v: &[f32], width: usize) -> usize {
        v.len() / width
    }
}

/// NeMo's streaming loop as the audio arrives: features are computed as soon as their samples
/// are there, and a chunk runs as soon as its frames and its right context are; at the end of
/// the input the last chunks run with what context there is. Each chunk sees exactly what the
/// whole-file loop gives it, so the probabilities are the same, bit for bit, however the audio
/// is cut into pieces. Memory stays bounded: only the features the next chunk reads, the FIFO
/// and the speaker cache are kept.
pub struct DiarStream {
    settings: SortformerStreaming,
    mel: StreamingMel,
    n_mels: usize,
    /// Feature frames from `feat_base` on, `[frames][n_mels]`.
    feats: Vec<f32>,
    feat_base: usize,
    /// The next chunk's first feature frame.
    start: usize,
    state: State,
    samples: usize,
    finished: bool,
    trace: Option<Vec<ChunkState>>,
}

impl DiarStream {
    /// The sizes this stream runs with.
    pub fn settings(&self) -> &SortformerStreaming {
        &self.settings
    }

    /// Keeps the state after every chunk (see [`DiarStream::take_trace`]).
    pub fn record_chunks(&mut self) {
        self.trace = Some(Vec::new());
    }

    /// The states recorded since the last call.
    pub fn take_trace(&mut self) -> Vec<ChunkState> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Feature frames received so far.
    fn feat_end(&self) -> usize {
        self.feat_base + self.feats.len() / self.n_mels
    }
}

impl Diarizer {
    /// NeMo's streaming diarization of a whole recording with `settings`.
    pub fn diarize_streaming(
        &mut self,
        samples: &[f32],
        settings: &SortformerStreaming,
    ) -> Result<Activity> {
        self.check_length(samples.len())?;
        let mut stream = self.start_stream(settings)?;
        let mut out = self.stream_accept(&mut stream, samples)?;
        out.extend(self.stream_finish(&mut stream)?);
        Ok(self.activity_of(out))
    }

    /// [`Diarizer::diarize_streaming`], recording the state after every chunk.
    pub fn diarize_streaming_traced(
        &mut self,
        samples: &[f32],
        settings: &SortformerStreaming,
        trace: &mut Vec<ChunkState>,
    ) -> Result<Activity> {
        self.check_length(samples.len())?;
        let mut stream = self.start_stream(settings)?;
        stream.record_chunks();
        let mut out = self.stream_accept(&mut stream, samples)?;
        out.extend(self.stream_finish(&mut stream)?);
        trace.extend(stream.take_trace());
        Ok(self.activity_of(out))
    }

    fn activity_of(&self, probs: Vec<f32>) -> Activity {
        let frames = probs.len() / self.params.n_spks;
        self.activity(probs, frames)
    }

    /// Refuses streaming sizes this model cannot run: a speaker cache without room for each
    /// speaker's frames and silence slots, an empty chunk or update period.
    pub fn check_streaming(&self, s: &SortformerStreaming) -> Result<()> {
        let n_spks = self.params.n_spks;
        if s.spkcache_len < (1 + s.spkcache_sil_frames_per_spk) * n_spks {
            bail!(
                "a speaker cache of {} frames is too small for {n_spks} speakers (at least {})",
                s.spkcache_len,
                (1 + s.spkcache_sil_frames_per_spk) * n_spks
            );
        }
        if s.chunk_len == 0 || s.spkcache_update_period == 0 {
            bail!("chunk length and speaker cache update period must be at least 1 frame");
        }
        Ok(())
    }

    /// Refuses a model that does not stream: an offline Sortformer scales the whole waveform
    /// by its peak before the features, which needs all of it first.
    pub fn check_streams(&self) -> Result<()> {
        if !self.params.streaming_mode || self.mel.normalize_per_feature {
            bail!(
                "{} is an offline Sortformer (it scales the whole recording by its peak), which \
                 cannot diarize live; use a streaming Sortformer ({DEFAULT_MODEL})",
                self.model.path().display()
            );
        }
        Ok(())
    }

    /// A new stream with `settings` (its own state; the diarizer may run other streams or
    /// whole recordings between its chunks).
    pub fn start_stream(&self, settings: &SortformerStreaming) -> Result<DiarStream> {
        self.check_streams()?;
        self.check_streaming(settings)?;
        let d = self.model.hparams().encoder.d_model;
        Ok(DiarStream {
            settings: *settings,
            mel: StreamingMel::new(self.model.window(), self.model.filterbank(), &self.mel),
            n_mels: self.mel.n_mels,
            feats: Vec::new(),
            feat_base: 0,
            start: 0,
            state: State {
                d,
                n_spks: self.params.n_spks,
                spkcache: Vec::new(),
                spkcache_preds: Vec::new(),
                fifo: Vec::new(),
                fifo_preds: Vec::new(),
                mean_sil_emb: vec![0.0; d],
                n_sil_frames: 0,
                compressed: false,
            },
            samples: 0,
            finished: false,
            trace: None,
        })
    }

    /// Feeds 16 kHz samples to `stream`; returns the probabilities of the frames the chunks
    /// they completed give, `[frames][n_spks]` (none until a chunk and its right context are
    /// there).
    pub fn stream_accept(&mut self, stream: &mut DiarStream, samples: &[f32]) -> Result<Vec<f32>> {
        if stream.finished {
            bail!("internal: audio fed to a finished diarization stream");
        }
        let frames = stream.mel.push(samples);
        stream.feats.extend_from_slice(&frames);
        stream.samples += samples.len();
        self.run_chunks(stream)
    }

    /// The input ended: the probabilities of the frames left, the last chunks run with the
    /// right context there is. Fails on a stream too short for one frame.
    pub fn stream_finish(&mut self, stream: &mut DiarStream) -> Result<Vec<f32>> {
        if !stream.finished {
            self.check_length(stream.samples)?;
            let frames = stream.mel.finish();
            stream.feats.extend_from_slice(&frames);
            stream.finished = true;
        }
        self.run_chunks(stream)
    }

    /// Runs every chunk whose features are all there (`streaming_feat_loader`'s cut of the
    /// whole recording: a chunk's right context is cut short only by the end of the input).
    fn run_chunks(&mut self, stream: &mut DiarStream) -> Result<Vec<f32>> {
        let s = stream.settings;
        let factor = self.model.hparams().encoder.subsampling_factor;
        let n_mels = stream.n_mels;
        let mut out = Vec::new();
        loop {
            let available = stream.feat_end();
            let start = stream.start;
            let full_end = start + s.chunk_len * factor;
            let ready = match stream.finished {
                true => start < available,
                false => full_end + s.chunk_right_context * factor <= available,
            };
            if !ready {
                break;
            }
            let left = (s.chunk_left_context * factor).min(start);
            let end = full_end.min(available);
            let right = (s.chunk_right_context * factor).min(available - end);
            let (from, to) = (
                start - left - stream.feat_base,
                end + right - stream.feat_base,
            );
            let chunk = stream.feats[from * n_mels..to * n_mels].to_vec();
            stream.start = end;
            out.extend(self.stream_chunk(stream, chunk, left, right)?);
            // Only the next chunk's left context and what follows are read again.
            let keep = end.saturating_sub(s.chunk_left_context * factor);
            if keep > stream.feat_base {
                stream.feats.drain(..(keep - stream.feat_base) * n_mels);
                stream.feat_base = keep;
            }
        }
        Ok(out)
    }

    /// `forward_streaming_step` over one chunk's features (`[frames][n_mels]` with `left` and
    /// `right` frames of context): its own frames' probabilities.
    fn stream_chunk(
        &mut self,
        stream: &mut DiarStream,
        chunk: Vec<f32>,
        left: usize,
        right: usize,
    ) -> Result<Vec<f32>> {
        let (s, st) = (&stream.settings, &mut stream.state);
        let factor = self.model.hparams().encoder.subsampling_factor;
        let d = st.d;
        let (embs, n) = pre_encode_only(
            &mut self.backend,
            &self.model,
            FeatureImage::from_frames(chunk, stream.n_mels)?,
        )?;
        // NeMo's round and ceil of the offsets in frames.
        let lc = (left as f64 / factor as f64).round_ties_even() as usize;
        let rc = right.div_ceil(factor);
        if n < lc + rc {
            bail!("internal: a chunk of {n} frames is shorter than its context {lc} + {rc}");
        }
        let (cache_frames, fifo_frames) = (st.frames(&st.spkcache, d), st.frames(&st.fifo, d));
        let total = cache_frames + fifo_frames + n;
        let mut input = Vec::with_capacity(total * d);
        input.extend_from_slice(&st.spkcache);
        input.extend_from_slice(&st.fifo);
        input.extend_from_slice(&embs);
        let encoded = encode_embeddings(
            &mut self.backend,
            &self.model,
            &input,
            total,
            Attention::Full,
        )?;
        let (preds, _) = self.head(&encoded, total, false)?;
        let (chunk_preds, compressed) = update(st, s, &embs, &preds, lc, n - lc - rc, cache_frames);
        if let Some(t) = stream.trace.as_mut() {
            t.push(ChunkState {
                step_preds: preds,
                spkcache: st.spkcache.clone(),
                // NeMo keeps none until the first compression.
                spkcache_preds: match st.compressed {
                    true => st.spkcache_preds.clone(),
                    false => Vec::new(),
                },
                fifo: st.fifo.clone(),
                fifo_preds: st.fifo_preds.clone(),
                mean_sil_emb: st.mean_sil_emb.clone(),
                compressed,
            });
        }
        Ok(chunk_preds)
    }
}

/// `streaming_update` (synchronous): the chunk's frames join the FIFO; when it overflows, its
/// oldest frames move to the speaker cache (updating the silence profile), which is compressed
/// once it is over its size. Returns the chunk's probabilities and whether it compressed.
fn update(
    st: &mut State,
    s: &SortformerStreaming,
    embs: &[f32],
    preds: &[f32],
    lc: usize,
    chunk_len: usize,
    cache_frames: usize,
) -> (Vec<f32>, bool) {
    let (d, k) = (st.d, st.n_spks);
    let fifo_frames = st.fifo.len() / d;
    // This step's probabilities of the FIFO's frames replace the ones it had.
    st.fifo_preds = preds[cache_frames * k..(cache_frames + fifo_frames) * k].to_vec();
    let first = cache_frames + fifo_frames + lc;
    let chunk_preds = preds[first * k..(first + chunk_len) * k].to_vec();
    st.fifo
        .extend_from_slice(&embs[lc * d..(lc + chunk_len) * d]);
    st.fifo_preds.extend_from_slice(&chunk_preds);
    let mut compressed = false;
    if fifo_frames + chunk_len > s.fifo_len {
        let pop = s
            .spkcache_update_period
            .max((chunk_len + fifo_frames).saturating_sub(s.fifo_len))
            .min(fifo_frames + chunk_len);
        let pop_embs: Vec<f32> = st.fifo.drain(..pop * d).collect();
        let pop_preds: Vec<f32> = st.fifo_preds.drain(..pop * k).collect();
        silence_profile(st, s, &pop_embs, &pop_preds);
        st.spkcache.extend_from_slice(&pop_embs);
        if !st.compressed {
            // Before the first compression the cache's probabilities are this step's.
            st.spkcache_preds = preds[..cache_frames * k].to_vec();
        }
        st.spkcache_preds.extend_from_slice(&pop_preds);
        if st.spkcache.len() / d > s.spkcache_len {
            compress(st, s);
            st.compressed = true;
            compressed = true;
        }
    }
    (chunk_preds, compressed)
}

/// `_get_silence_profile`: the running mean of the embeddings of frames whose probabilities
/// sum below `sil_threshold`.
fn silence_profile(st: &mut State, s: &SortformerStreaming, embs: &[f32], preds: &[f32]) {
    let (d, k) = (st.d, st.n_spks);
    let silent: Vec<usize> = (0..preds.len() / k)
        .filter(|&f| preds[f * k..(f + 1) * k].iter().sum::<f32>() < s.sil_threshold)
        .collect();
    if silent.is_empty() {
        return;
    }
    let n_old = st.n_sil_frames as f32;
    let n_new = st.n_sil_frames + silent.len();
    for c in 0..d {
        let sum: f32 = silent.iter().map(|&f| embs[f * d + c]).sum();
        st.mean_sil_emb[c] = (st.mean_sil_emb[c] * n_old + sum) / n_new as f32;
    }
    st.n_sil_frames = n_new;
}

/// `_compress_spkcache` (inference: no speaker permutation, no noise): keeps `spkcache_len`
/// frames, scored per speaker by how surely that speaker alone speaks, the newest frames
/// boosted a little, each speaker's best frames boosted so that every speaker keeps some,
/// `spkcache_sil_frames_per_spk` silence slots per speaker; ordered speaker by speaker, frames
/// in arrival order within a speaker.
fn compress(st: &mut State, s: &SortformerStreaming) {
    let (d, k) = (st.d, st.n_spks);
    let n = st.spkcache.len() / d;
    let preds = &st.spkcache_preds;
    let per_spk = s.spkcache_len / k - s.spkcache_sil_frames_per_spk;
    let strong = (per_spk as f64 * s.strong_boost_rate as f64).floor() as usize;
    let weak = (per_spk as f64 * s.weak_boost_rate as f64).floor() as usize;
    let min_pos = (per_spk as f64 * s.min_pos_scores_rate as f64).floor() as usize;
    let thr = s.pred_score_threshold;
    // `_get_log_pred_scores`, float32.
    let ln_half = 0.5f64.ln() as f32;
    let mut scores = vec![0f32; n * k];
    for f in 0..n {
        let p = &preds[f * k..(f + 1) * k];
        let log1: Vec<f32> = p.iter().map(|&x| (1.0 - x).max(thr).ln()).collect();
        let sum1 = log1.iter().fold(0f32, |a, &b| a + b);
        for j in 0..k {
            scores[f * k + j] = p[j].max(thr).ln() - log1[j] + sum1 - ln_half;
        }
    }
    // `_disable_low_scores`.
    for j in 0..k {
        for f in 0..n {
            if preds[f * k + j] <= 0.5 {
                scores[f * k + j] = f32::NEG_INFINITY;
            }
        }
        let positive = (0..n).filter(|&f| scores[f * k + j] > 0.0).count();
        if positive >= min_pos {
            for f in 0..n {
                let v = &mut scores[f * k + j];
                if *v <= 0.0 && preds[f * k + j] > 0.5 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }
    if s.scores_boost_latest > 0.0 {
        for v in &mut scores[s.spkcache_len.min(n) * k..] {
            *v += s.scores_boost_latest;
        }
    }
    // `_boost_topk_scores`: strong (2 ln 2), then weak (ln 2).
    for (count, scale) in [(strong, 2.0f64), (weak, 1.0)] {
        let add = (-(scale * 0.5f64.ln())) as f32;
        for j in 0..k {
            let column: Vec<f32> = (0..n).map(|f| scores[f * k + j]).collect();
            for f in top_indices(&column, count.min(n)) {
                scores[f * k + j] += add;
            }
        }
    }
    // Flattened speaker-major with the silence slots (+inf) after each speaker's frames.
    let sil = s.spkcache_sil_frames_per_spk;
    let padded = n + sil;
    let flat: Vec<f32> = (0..k)
        .flat_map(|j| {
            let scores = &scores;
            (0..padded).map(move |f| match f < n {
                true => scores[f * k + j],
                false => f32::INFINITY,
            })
        })
        .collect();
    let chosen = top_indices(&flat, s.spkcache_len.min(flat.len()));
    // `-inf` picks sort last (NeMo's max_index); the rest ascending: speaker by speaker.
    let mut keys: Vec<(bool, usize)> = chosen
        .iter()
        .map(|&i| (flat[i] == f32::NEG_INFINITY, i))
        .collect();
    keys.sort_unstable();
    let mut cache = Vec::with_capacity(s.spkcache_len * d);
    let mut cache_preds = Vec::with_capacity(s.spkcache_len * k);
    for (disabled, i) in keys {
        let frame = i % padded;
        if disabled || frame >= n {
            cache.extend_from_slice(&st.mean_sil_emb);
            cache_preds.extend(std::iter::repeat_n(0.0, k));
        } else {
            cache.extend_from_slice(&st.spkcache[frame * d..(frame + 1) * d]);
            cache_preds.extend_from_slice(&preds[frame * k..(frame + 1) * k]);
        }
    }
    st.spkcache = cache;
    st.spkcache_preds = cache_preds;
}

/// The indices of the `count` largest values (`torch.topk`; ties to the lower index).
fn top_indices(values: &[f32], count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    order.truncate(count);
    order
}
