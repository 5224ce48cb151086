//! The hyperparameters of a Sortformer diarization model (NeMo's `SortformerEncLabelModel`):
//! its Transformer, its speaker head and the streaming settings its checkpoint carries
//! (`sortformer_modules.*`). The FastConformer in front of it is [`super::EncoderParams`].

use crate::err;
use crate::error::Result;

use super::keys;
use crate::gguf::{GgufFile, GgufWriter};

/// The Transformer and head of a Sortformer (`transformer_encoder`, `sortformer_modules`).
#[derive(Clone, Debug, PartialEq)]
pub struct SortformerParams {
    /// Speakers the head predicts (`max_num_of_spks`).
    pub n_spks: usize,
    /// `model_defaults.tf_d_model`: the Transformer's width (`transformer_encoder.hidden_size`).
    pub tf_d_model: usize,
    pub tf_n_layers: usize,
    pub tf_n_heads: usize,
    /// The Transformer feed-forward's hidden width (`inner_size`).
    pub tf_inner_size: usize,
    /// NeMo's `streaming_mode`: the model was trained to stream (no peak normalisation of the
    /// waveform).
    pub streaming_mode: bool,
    /// `eps` of the offline peak normalisation `x / (max(x) + eps)`.
    pub eps: f32,
    /// The checkpoint's own streaming settings (its training values).
    pub streaming: SortformerStreaming,
}

/// NeMo's streaming settings of `sortformer_modules` (sizes in 80 ms frames).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SortformerStreaming {
    pub spkcache_len: usize,
    pub fifo_len: usize,
    pub chunk_len: usize,
    pub spkcache_update_period: usize,
    pub chunk_left_context: usize,
    pub chunk_right_context: usize,
    pub spkcache_sil_frames_per_spk: usize,
    pub pred_score_threshold: f32,
    pub scores_boost_latest: f32,
    pub sil_threshold: f32,
    pub strong_boost_rate: f32,
    pub weak_boost_rate: f32,
    pub min_pos_scores_rate: f32,
}

impl SortformerStreaming {
    /// NeMo's defaults for the settings a checkpoint may leave out (`SortformerModules`).
    pub const NEMO_DEFAULTS: SortformerStreaming = SortformerStreaming {
        spkcache_len: 188,
        fifo_len: 0,
        chunk_len: 188,
        spkcache_update_period: 188,
        chunk_left_context: 1,
        chunk_right_context: 1,
        spkcache_sil_frames_per_spk: 3,
        pred_score_threshold: 0.25,
        scores_boost_latest: 0.05,
        sil_threshold: 0.2,
        strong_boost_rate: 0.75,
        weak_boost_rate: 1.5,
        min_pos_scores_rate: 0.5,
    };

    /// The sizes NeMo's inference example (`e2e_diarize_speech.py`) streams with, 1.04 s of
    /// latency: the other settings as the checkpoint has them.
    pub fn inference_defaults(self) -> SortformerStreaming {
        SortformerStreaming {
            spkcache_len: 188,
            spkcache_update_period: 144,
            fifo_len: 188,
            chunk_len: 6,
            chunk_left_context: 1,
            chunk_right_context: 7,
            ..self
        }
    }
}

/// Bounds on what a file may declare (the published models: 4 speakers, 18 x 192).
const MAX_SPKS: usize = 64;
const MAX_WIDTH: usize = 16_384;
const MAX_LAYERS: usize = 512;
const MAX_FRAMES: usize = 1 << 20;

impl SortformerParams {
    pub(super) fn read(f: &GgufFile) -> Result<SortformerParams> {
        let shown = f.shown().to_string();
        let u = |key: &str, lo: usize, hi: usize| -> Result<usize> {
            let v = f.u32(key)? as usize;
            if (lo..=hi).contains(&v) {
                Ok(v)
            } else {
                Err(err!(
                    Model,
                    "{shown}: {key} = {v} is not supported ({lo}..={hi})"
                ))
            }
        };
        let unit = |key: &str| -> Result<f32> {
            let v = f.f32(key)?;
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(v)
            } else {
                Err(err!(Model, "{shown}: {key} = {v} is not supported (0..=1)"))
            }
        };
        let positive = |key: &str| -> Result<f32> {
            let v = f.f32(key)?;
            if v.is_finite() && v > 0.0 && v <= 100.0 {
                Ok(v)
            } else {
                Err(err!(
                    Model,
                    "{shown}: {key} = {v} is not supported (0 < v <= 100)"
                ))
            }
        };
        let tf_d_model = u(keys::SF_TF_D_MODEL, 1, MAX_WIDTH)?;
        let tf_n_heads = u(keys::SF_TF_N_HEADS, 1, tf_d_model)?;
        if !tf_d_model.is_multiple_of(tf_n_heads) {
            return Err(err!(
                Model,
                "{shown}: {} = {tf_n_heads} is not supported (a divisor of {} {tf_d_model})",
                keys::SF_TF_N_HEADS,
                keys::SF_TF_D_MODEL
            ));
        }
        let n_spks = u(keys::SF_N_SPKS, 1, MAX_SPKS)?;
        let sil = u(keys::SF_SPKCACHE_SIL_FRAMES_PER_SPK, 0, MAX_FRAMES)?;
        let streaming = SortformerStreaming {
            spkcache_len: u(keys::SF_SPKCACHE_LEN, (1 + sil) * n_spks, MAX_FRAMES)?,
            fifo_len: u(keys::SF_FIFO_LEN, 0, MAX_FRAMES)?,
            chunk_len: u(keys::SF_CHUNK_LEN, 1, MAX_FRAMES)?,
            spkcache_update_period: u(keys::SF_SPKCACHE_UPDATE_PERIOD, 1, MAX_FRAMES)?,
            chunk_left_context: u(keys::SF_CHUNK_LEFT_CONTEXT, 0, MAX_FRAMES)?,
            chunk_right_context: u(keys::SF_CHUNK_RIGHT_CONTEXT, 0, MAX_FRAMES)?,
            spkcache_sil_frames_per_spk: sil,
            pred_score_threshold: unit(keys::SF_PRED_SCORE_THRESHOLD)?,
            scores_boost_latest: unit(keys::SF_SCORES_BOOST_LATEST)?,
            sil_threshold: unit(keys::SF_SIL_THRESHOLD)?,
            strong_boost_rate: positive(keys::SF_STRONG_BOOST_RATE)?,
            weak_boost_rate: positive(keys::SF_WEAK_BOOST_RATE)?,
            min_pos_scores_rate: positive(keys::SF_MIN_POS_SCORES_RATE)?,
        };
        let eps = f.f32(keys::SF_EPS)?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(err!(
                Model,
                "{shown}: {} = {eps} is not supported (finite, >= 0)",
                keys::SF_EPS
            ));
        }
        Ok(SortformerParams {
            n_spks,
            tf_d_model,
            tf_n_layers: u(keys::SF_TF_N_LAYERS, 1, MAX_LAYERS)?,
            tf_n_heads,
            tf_inner_size: u(keys::SF_TF_INNER_SIZE, 1, 4 * MAX_WIDTH)?,
            streaming_mode: f.bool(keys::SF_STREAMING_MODE)?,
            eps,
            streaming,
        })
    }

    pub(super) fn write(&self, w: &mut GgufWriter) -> Result<()> {
        let u = |w: &mut GgufWriter, key: &str, v: usize| -> Result<()> {
            w.set_u32(
                key,
                u32::try_from(v).map_err(|_| err!(Model, "{key} = {v} does not fit a GGUF u32"))?,
            )
        };
        let s = &self.streaming;
        u(w, keys::SF_N_SPKS, self.n_spks)?;
        u(w, keys::SF_TF_D_MODEL, self.tf_d_model)?;
        u(w, keys::SF_TF_N_LAYERS, self.tf_n_layers)?;
        u(w, keys::SF_TF_N_HEADS, self.tf_n_heads)?;
        u(w, keys::SF_TF_INNER_SIZE, self.tf_inner_size)?;
        w.set_bool(keys::SF_STREAMING_MODE, self.streaming_mode)?;
        w.set_f32(keys::SF_EPS, self.eps)?;
        u(w, keys::SF_SPKCACHE_LEN, s.spkcache_len)?;
        u(w, keys::SF_FIFO_LEN, s.fifo_len)?;
        u(w, keys::SF_CHUNK_LEN, s.chunk_len)?;
        u(w, keys::SF_SPKCACHE_UPDATE_PERIOD, s.spkcache_update_period)?;
        u(w, keys::SF_CHUNK_LEFT_CONTEXT, s.chunk_left_context)?;
        u(w, keys::SF_CHUNK_RIGHT_CONTEXT, s.chunk_right_context)?;
        u(
            w,
            keys::SF_SPKCACHE_SIL_FRAMES_PER_SPK,
            s.spkcache_sil_frames_per_spk,
        )?;
        w.set_f32(keys::SF_PRED_SCORE_THRESHOLD, s.pred_score_threshold)?;
        w.set_f32(keys::SF_SCORES_BOOST_LATEST, s.scores_boost_latest)?;
        w.set_f32(keys::SF_SIL_THRESHOLD, s.sil_threshold)?;
        w.set_f32(keys::SF_STRONG_BOOST_RATE, s.strong_boost_rate)?;
        w.set_f32(keys::SF_WEAK_BOOST_RATE, s.weak_boost_rate)?;
        w.set_f32(keys::SF_MIN_POS_SCORES_RATE, s.min_pos_scores_rate)?;
        Ok(())
    }
}
