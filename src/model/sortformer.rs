//! A Sortformer's weights after its FastConformer (`SortformerEncLabelModel`'s
//! `sortformer_modules` and `transformer_encoder`), read once when the model loads and shared
//! by every diarizer over it.

use super::{LayerNorm, Linear};
use crate::backend::DType;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hparams::SortformerParams;

/// `transformer_encoder.layers.N`: a post-LN block, `x = LN1(x + MHA(x)); x = LN2(x + FF(x))`.
#[derive(Clone, Debug)]
pub struct TransformerLayer {
    pub query_net: Linear,
    pub key_net: Linear,
    pub value_net: Linear,
    pub out_projection: Linear,
    pub layer_norm_1: LayerNorm,
    pub dense_in: Linear,
    pub dense_out: Linear,
    pub layer_norm_2: LayerNorm,
}

/// The weights after the FastConformer (NeMo's names).
#[derive(Clone, Debug)]
pub struct SortformerWeights {
    /// `sortformer_modules.encoder_proj` (fc_d_model -> tf_d_model).
    pub encoder_proj: Linear,
    pub layers: Vec<TransformerLayer>,
    pub first_hidden_to_hidden: Linear,
    pub single_hidden_to_spks: Linear,
}

impl SortformerWeights {
    /// Reads the weights by their names in the file (the converter's, NeMo's prefixes).
    pub(super) fn load(f: &GgufFile, fc: usize, p: &SortformerParams) -> Result<SortformerWeights> {
        let w = |name: &str, shape: &[usize]| f.weight(name, shape, &[DType::F32]);
        // The converter's `--type` applies to every matrix but the last one's.
        let linear = |prefix: &str, n_in: usize, n_out: usize| -> Result<Linear> {
            Ok(Linear {
                weight: f.weight(&format!("{prefix}.weight"), &[n_in, n_out], super::MATMUL)?,
                bias: Some(w(&format!("{prefix}.bias"), &[n_out])?),
            })
        };
        let norm = |prefix: &str, d: usize| -> Result<LayerNorm> {
            Ok(LayerNorm {
                weight: w(&format!("{prefix}.weight"), &[d])?,
                bias: w(&format!("{prefix}.bias"), &[d])?,
            })
        };
        let (tf, inner) = (p.tf_d_model, p.tf_inner_size);
        let layers = (0..p.tf_n_layers)
            .map(|i| {
                // The converter's name (`convert::gguf_name`).
                let l = format!("transformer_encoder.{i}");
                let a = format!("{l}.first_sub_layer");
                let ff = format!("{l}.second_sub_layer");
                Ok(TransformerLayer {
                    query_net: linear(&format!("{a}.query_net"), tf, tf)?,
                    key_net: linear(&format!("{a}.key_net"), tf, tf)?,
                    value_net: linear(&format!("{a}.value_net"), tf, tf)?,
                    out_projection: linear(&format!("{a}.out_projection"), tf, tf)?,
                    layer_norm_1: norm(&format!("{l}.layer_norm_1"), tf)?,
                    dense_in: linear(&format!("{ff}.dense_in"), tf, inner)?,
                    dense_out: linear(&format!("{ff}.dense_out"), inner, tf)?,
                    layer_norm_2: norm(&format!("{l}.layer_norm_2"), tf)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let m = "sortformer_modules";
        Ok(SortformerWeights {
            encoder_proj: linear(&format!("{m}.encoder_proj"), fc, tf)?,
            layers,
            first_hidden_to_hidden: linear(&format!("{m}.first_hidden_to_hidden"), tf, tf)?,
            single_hidden_to_spks: linear(&format!("{m}.single_hidden_to_spks"), tf, p.n_spks)?,
        })
    }
}
