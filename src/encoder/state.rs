//! What the encoder keeps between the chunks of a stream: [`EncoderState`] (the stream's
//! progress, NeMo's caches when recorded, the test hooks) and the caches themselves in backend
//! buffers (rings of keys, values and conv inputs per layer, and the projected positional
//! tables), with the view of one layer's caches that a chunk's graph reads and writes.

use crate::bail;
use crate::error::Result;

use crate::backend::{Backend, Graph, StateTensors, Tensor};
use crate::hparams::StreamingParams;

/// What the encoder carries from one chunk of a stream to the next (NeMo's
/// `cache_last_channel`, `cache_last_channel_len` and `cache_last_time`).
///
/// A whole file is one chunk from a fresh [`EncoderState::new`], which keeps no caches. A
/// stream of a cache-aware model starts from [`EncoderState::streaming`]: every chunk then
/// attends to the last `last_channel_cache_size` frames of each layer before it and continues
/// each layer's causal depthwise conv from its last `kernel - 1` inputs.
///
/// The caches stay in backend buffers between chunks ([`ResidentCaches`]). NeMo caches the
/// LayerNorm'd attention input; since `linear_k` and `linear_v` act on each frame alone, the
/// keys and values of those frames are cached instead (the same numbers, each frame projected
/// once instead of once per chunk it stays in the cache), and the positional table's
/// projection (`linear_pos`, fixed for a lookahead) is computed once per stream.
#[derive(Debug, Default)]
pub struct EncoderState {
    /// A chunk has been encoded from this state.
    pub(super) started: bool,
    pub(super) stream: Option<StreamCaches>,
    pub(super) resident: Option<ResidentCaches>,
    /// Keep NeMo's caches on the host too ([`EncoderState::record_caches`]).
    pub(super) record: bool,
    /// Chunks the cache rings hold past their live rows ([`EncoderState::set_cache_room`]).
    pub(super) cache_room: Option<usize>,
    /// Frames per time slice of a whole file's layers ([`EncoderState::set_layer_slice`]).
    pub(super) layer_slice: Option<usize>,
    /// Encoder frames of the padded input a whole file stands in ([`EncoderState::padded`]).
    pub(super) padded_to: Option<usize>,
}

/// A stream's progress and, when recorded ([`EncoderState::record_caches`]), NeMo's caches.
#[derive(Clone, Debug)]
pub struct StreamCaches {
    pub params: StreamingParams,
    /// Recorded only: per layer, `[last_channel_cache_size][d_model]` row-major: the last
    /// frames of the LayerNorm'd attention input (`norm_self_att`'s output), oldest first; the
    /// first `cache_size - channel_len` rows are not filled yet (zeros, masked).
    pub channel: Vec<Vec<f32>>,
    pub channel_len: usize,
    /// Recorded only: per layer, `[kernel - 1][d_model]` row-major: the last inputs of the
    /// depthwise conv (zeros at the start: the causal conv's padding).
    pub time: Vec<Vec<f32>>,
    /// Chunks encoded so far.
    pub chunks: usize,
}

/// A stream's caches in backend buffers, read and written in place by each chunk's graph.
///
/// Per layer: the keys and the values (`linear_k` / `linear_v` of the attention input) and the
/// depthwise conv's inputs, each a ring of rows where the live cache is the `keep` rows from
/// `start`: a chunk writes its T new rows right after them and reads the `keep + T` rows as
/// one contiguous view, then `start` moves on by T. When the next chunk would not fit, the
/// live rows move to the front (every ~`keep / T` chunks, through the host). And the layer's
/// projected positional table, once computed.
#[derive(Debug)]
pub(super) struct ResidentCaches {
    pub(super) tensors: StateTensors,
    /// Rows of each key / value ring and its live start; the same for the conv rings.
    pub(super) kv: Ring,
    pub(super) time: Ring,
    /// Rows of the positional table, and whether the tensors hold its projection.
    pub(super) positions: usize,
    pub(super) positions_ready: bool,
}

/// Where the live rows of a set of ring tensors are.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ring {
    pub(super) rows: usize,
    pub(super) keep: usize,
    pub(super) start: usize,
}

/// The state tensors of layer `i` are `PER_LAYER * i +` these: keys, values, conv inputs,
/// projected positions.
const PER_LAYER: usize = 4;
const KEYS: usize = 0;
const VALUES: usize = 1;
const CONV: usize = 2;
const POSITIONS: usize = 3;
fn keys_of(i: usize) -> usize {
    PER_LAYER * i + KEYS
}
fn values_of(i: usize) -> usize {
    PER_LAYER * i + VALUES
}
fn conv_of(i: usize) -> usize {
    PER_LAYER * i + CONV
}
fn positions_of(i: usize) -> usize {
    PER_LAYER * i + POSITIONS
}

impl ResidentCaches {
    /// Zeroed caches for `layers` layers of width `d`, for chunks of at most `most` frames.
    pub(super) fn new(
        backend: &Backend,
        layers: usize,
        d: usize,
        params: &StreamingParams,
        positions: usize,
        most: usize,
        room: Option<usize>,
    ) -> Result<ResidentCaches> {
        let kv = Ring::new(params.last_channel_cache_size, most, room);
        let time = Ring::new(params.last_time_cache_size, most, room);
        let shapes: Vec<[usize; 2]> = (0..layers)
            .flat_map(|_| [[d, kv.rows], [d, kv.rows], [d, time.rows], [d, positions]])
            .collect();
        Ok(ResidentCaches {
            tensors: backend.state_tensors(&shapes)?,
            kv,
            time,
            positions,
            positions_ready: false,
        })
    }

    /// Every ring empty and zeroed, as at the start of a stream (the positions stay).
    fn clear(&mut self) {
        let layers = self.tensors.len() / PER_LAYER;
        for (ring, of) in [
            (&mut self.kv, &[KEYS, VALUES][..]),
            (&mut self.time, &[CONV][..]),
        ] {
            ring.start = 0;
            for i in 0..layers {
                for &of in of {
                    let t = PER_LAYER * i + of;
                    let zeros = vec![0f32; ring.keep * self.tensors.shape(t)[0]];
                    self.tensors.write_rows(t, 0, &zeros);
                }
            }
        }
    }

    /// Room after the live rows of every ring for a chunk of `frames` frames.
    pub(super) fn make_room(&mut self, layers: usize, frames: usize) -> Result<()> {
        for (ring, of) in [
            (&mut self.kv, &[KEYS, VALUES][..]),
            (&mut self.time, &[CONV][..]),
        ] {
            if ring.keep + frames > ring.rows {
                bail!(
                    Internal,
                    "internal: a chunk of {frames} frames does not fit a stream cache of {} rows",
                    ring.rows
                );
            }
            if ring.start + ring.keep + frames <= ring.rows {
                continue;
            }
            for i in 0..layers {
                for &of in of {
                    let t = PER_LAYER * i + of;
                    let live = self.tensors.read_rows(t, ring.start, ring.keep);
                    self.tensors.write_rows(t, 0, &live);
                }
            }
            ring.start = 0;
        }
        Ok(())
    }
}

impl Ring {
    /// A ring keeping `keep` rows for chunks of up to `most` rows, with room for `room`
    /// chunks after the live rows (by default about `keep / most`: the live rows then move
    /// back to the front once per cache length, a copy as large as one chunk's writes).
    fn new(keep: usize, most: usize, room: Option<usize>) -> Ring {
        let rows = match room {
            Some(chunks) => keep + most * chunks.max(1),
            None => 2 * (keep + most),
        };
        Ring {
            rows,
            keep,
            start: 0,
        }
    }
}

impl EncoderState {
    /// The state at the start of a stream (or of a whole file).
    pub fn new() -> EncoderState {
        EncoderState::default()
    }

    /// A whole-file state for audio that NeMo encodes inside a longer, zero-padded input
    /// (a buffered stream's last buffer): the output has `frames` encoder frames, those past
    /// the audio's own computed as NeMo's masked encoder computes them (subsampling output
    /// masked to zero, attention rows and keys masked, depthwise-conv inputs masked); the
    /// audio's frames are what an unpadded pass gives.
    pub fn padded(frames: usize) -> EncoderState {
        EncoderState {
            padded_to: Some(frames),
            ..EncoderState::default()
        }
    }

    /// The state at the start of a cache-aware stream with `params` (one of the model's
    /// lookaheads, [`crate::hparams::EncoderParams::streaming`]): NeMo's
    /// `get_initial_cache_state` (zeros; the backend caches are made by the first chunk).
    pub fn streaming(params: StreamingParams) -> EncoderState {
        EncoderState {
            stream: Some(StreamCaches {
                params,
                channel: Vec::new(),
                channel_len: 0,
                time: Vec::new(),
                chunks: 0,
            }),
            ..EncoderState::default()
        }
    }

    /// Back to the start of the stream (an utterance ended): empty caches in the same
    /// buffers. The projected positional tables stay: they depend on the weights and the
    /// lookahead only.
    pub fn restart(&mut self) {
        if let Some(c) = self.stream.as_mut() {
            c.channel.clear();
            c.time.clear();
            c.channel_len = 0;
            c.chunks = 0;
        }
        if let Some(r) = self.resident.as_mut() {
            r.clear();
        }
    }

    /// Keep NeMo's caches (`cache_last_channel`, `cache_last_time`) on the host after every
    /// chunk, in [`EncoderState::caches`] (tests and diagnostics; the stream itself does not
    /// need them).
    pub fn record_caches(&mut self) {
        self.record = true;
    }

    /// Test hook: room for only `chunks` chunks in the cache rings, so that their live rows
    /// move to the front that often (set before the first chunk).
    #[doc(hidden)]
    pub fn set_cache_room(&mut self, chunks: usize) {
        self.cache_room = Some(chunks);
    }

    /// Test hook: whole-file layers under local attention run in time slices of `frames`
    /// frames (a multiple of 32) from this many frames on, instead of the encoder's own, so
    /// that a short clip takes the sliced path.
    #[doc(hidden)]
    pub fn set_layer_slice(&mut self, frames: usize) {
        self.layer_slice = Some(frames);
    }

    /// The stream's progress and, when recorded, its caches (None for a whole-file state).
    pub fn caches(&self) -> Option<&StreamCaches> {
        self.stream.as_ref()
    }
}

/// A layer's streaming caches in the graph: the rings of its keys, values and conv inputs
/// (state tensors, [`ResidentCaches`]) and, until the stream holds it, where its projected
/// positional table goes.
#[derive(Clone, Copy)]
pub(super) struct LayerCache<'g> {
    pub(super) keys: Tensor<'g>,
    pub(super) values: Tensor<'g>,
    pub(super) kv: Ring,
    pub(super) conv: Tensor<'g>,
    pub(super) time: Ring,
    pub(super) store_positions: Option<Tensor<'g>>,
}

impl ResidentCaches {
    /// Layer `i`'s caches in graph `g`; with `store_positions`, where the layer's projected
    /// positional table goes (the stream does not hold it yet).
    pub(super) fn layer<'g>(
        &self,
        g: &mut Graph<'g>,
        i: usize,
        store_positions: bool,
    ) -> LayerCache<'g> {
        LayerCache {
            keys: g.state(&self.tensors, keys_of(i)),
            values: g.state(&self.tensors, values_of(i)),
            kv: self.kv,
            conv: g.state(&self.tensors, conv_of(i)),
            time: self.time,
            store_positions: store_positions.then(|| g.state(&self.tensors, positions_of(i))),
        }
    }

    /// Layer `i`'s projected positional table, held by the stream.
    pub(super) fn positions<'g>(&self, g: &mut Graph<'g>, i: usize) -> Tensor<'g> {
        g.state(&self.tensors, positions_of(i))
    }
}
