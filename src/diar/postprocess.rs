//! NeMo's post-processing of Sortformer probabilities into speaker segments
//! (`_diarize_output_processing`: `ts_vad_post_processing` per speaker, rounding, then
//! `generate_diarization_output_lines`), with NeMo's number types at every step, so that the
//! segments are NeMo's to the digit wherever no probability sits on a threshold.
//!
//! Per speaker: every 80 ms probability is repeated for each 10 ms unit; a hysteresis opens a
//! segment where p > onset and closes it where p < offset, padded by `pad_onset` before and
//! `pad_offset` after (times in f64, segments stored f32 as NeMo's tensors are); overlapping
//! segments merge; segments shorter than `min_duration_on` go, then gaps shorter than
//! `min_duration_off` are filled. The times are rounded to 2 decimals (Python's `round` on the
//! f32 values), then merged again on a 1e-5 s integer grid (`merge_float_intervals`).

use crate::error::Result;
use crate::{bail, err};

use super::Activity;
use crate::decoder::boosting::round2;

/// The time unit of NeMo's binarization (10 ms).
const UNIT_SECONDS: f64 = 0.01;

/// NeMo's `PostProcessingParams` (seconds; thresholds on probabilities).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PostProcessing {
    pub onset: f64,
    pub offset: f64,
    pub pad_onset: f64,
    pub pad_offset: f64,
    pub min_duration_on: f64,
    pub min_duration_off: f64,
}

/// The parameter sets NeMo publishes for its Sortformers
/// (`examples/speaker_tasks/diarization/conf/post_processing/*.yaml`): name, model generation
/// (v1 offline, v2 streaming), values.
pub const PUBLISHED: &[(&str, Generation, PostProcessing)] = &[
    (
        "dihard3",
        Generation::V1,
        PostProcessing {
            onset: 0.64,
            offset: 0.74,
            pad_onset: 0.06,
            pad_offset: 0.0,
            min_duration_on: 0.1,
            min_duration_off: 0.15,
        },
    ),
    (
        "callhome",
        Generation::V1,
        PostProcessing {
            onset: 0.53,
            offset: 0.49,
            pad_onset: 0.23,
            pad_offset: 0.01,
            min_duration_on: 0.42,
            min_duration_off: 0.34,
        },
    ),
    (
        "dihard3",
        Generation::V2,
        PostProcessing {
            onset: 0.56,
            offset: 1.0,
            pad_onset: 0.063,
            pad_offset: 0.002,
            min_duration_on: 0.007,
            min_duration_off: 0.151,
        },
    ),
    (
        "callhome",
        Generation::V2,
        PostProcessing {
            onset: 0.641,
            offset: 0.561,
            pad_onset: 0.229,
            pad_offset: 0.079,
            min_duration_on: 0.511,
            min_duration_off: 0.296,
        },
    ),
];

/// Which Sortformer a published parameter set was tuned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// `diar_sortformer_4spk-v1` (offline).
    V1,
    /// `diar_streaming_sortformer_4spk-v2` (streaming).
    V2,
}

impl Generation {
    /// The generation of a model: streaming models are v2.
    pub fn of(streaming_mode: bool) -> Generation {
        if streaming_mode {
            Generation::V2
        } else {
            Generation::V1
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Generation::V1 => "v1",
            Generation::V2 => "v2",
        }
    }
}

impl Default for PostProcessing {
    /// NeMo's defaults (`model.diarize()` without a yaml): thresholds 0.5, no padding, no
    /// filtering.
    fn default() -> PostProcessing {
        PostProcessing {
            onset: 0.5,
            offset: 0.5,
            pad_onset: 0.0,
            pad_offset: 0.0,
            min_duration_on: 0.0,
            min_duration_off: 0.0,
        }
    }
}

impl PostProcessing {
    /// A published set by name: `dihard3` or `callhome` for the model's generation, or a
    /// generation named explicitly (`v1-dihard3`, `v2-callhome`, ...).
    pub fn published(name: &str, model: Generation) -> Result<PostProcessing> {
        let (generation, short) = match name.split_once('-') {
            Some(("v1", rest)) => (Generation::V1, rest),
            Some(("v2", rest)) => (Generation::V2, rest),
            _ => (model, name),
        };
        PUBLISHED
            .iter()
            .find(|(n, g, _)| *n == short && *g == generation)
            .map(|(_, _, p)| *p)
            .ok_or_else(|| {
                err!(
                    Options,
                    "unknown post-processing parameter set '{name}' (dihard3, callhome, or \
                     v1-/v2- before either)"
                )
            })
    }

    /// Refuses values NeMo's hysteresis cannot mean: thresholds outside (0, 1) (an offset of
    /// 1, as NeMo's v2 DIHARD3 set has, is allowed: a segment then ends on any frame below
    /// certainty), negative or non-finite durations.
    pub fn check(&self) -> Result<()> {
        if !(self.onset > 0.0 && self.onset < 1.0) {
            bail!(Options, "onset {} is outside (0, 1)", self.onset);
        }
        if !(self.offset > 0.0 && self.offset <= 1.0) {
            bail!(Options, "offset {} is outside (0, 1]", self.offset);
        }
        for (name, v) in [
            ("pad-onset", self.pad_onset),
            ("pad-offset", self.pad_offset),
            ("min-duration-on", self.min_duration_on),
            ("min-duration-off", self.min_duration_off),
        ] {
            if !(v.is_finite() && (0.0..=3600.0).contains(&v)) {
                bail!(
                    Options,
                    "{name} {v} is not a duration in seconds (0 to 3600)"
                );
            }
        }
        Ok(())
    }
}

/// One speaker's turn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    pub speaker: usize,
    /// Seconds, as NeMo prints them (3 decimals).
    pub start: f64,
    pub end: f64,
}

/// NeMo's segments for `activity` with `params`: speaker by speaker, each speaker's in time
/// order (the order of NeMo's output lines).
pub fn segments(
    activity: &Activity,
    params: &PostProcessing,
    units_per_frame: usize,
) -> Vec<Segment> {
    let mut out = Vec::new();
    for spk in 0..activity.n_spks {
        let raw = speaker_segments(&activity.speaker(spk), params, units_per_frame);
        let rounded: Vec<[f64; 2]> = raw
            .iter()
            .map(|s| [round2(s[0] as f64), round2(s[1] as f64)])
            .collect();
        for [start, end] in merge_float_intervals(&rounded) {
            out.push(Segment {
                speaker: spk,
                start,
                end,
            });
        }
    }
    out
}

/// NeMo's `ts_vad_post_processing` for one speaker's 80 ms probabilities: the f32 segments
/// before rounding.
pub fn speaker_segments(
    probs: &[f32],
    params: &PostProcessing,
    units_per_frame: usize,
) -> Vec<[f32; 2]> {
    let units = probs.len() * units_per_frame;
    let unit = |i: usize| probs[i / units_per_frame];
    let segments = binarization(units, unit, params);
    filtering(segments, params)
}

/// The hysteresis (`binarization`) over `units` 10 ms values.
fn binarization(units: usize, p: impl Fn(usize) -> f32, params: &PostProcessing) -> Vec<[f32; 2]> {
    // Torch compares a float32 tensor with a Python float in float32.
    let (onset, offset) = (params.onset as f32, params.offset as f32);
    let (pad_on, pad_off) = (params.pad_onset, params.pad_offset);
    let mut speech = false;
    let mut start = 0.0f64;
    let mut out = Vec::new();
    for i in 0..units {
        let t = i as f64 * UNIT_SECONDS;
        if speech {
            if p(i) < offset {
                let (a, b) = ((start - pad_on).max(0.0), t + pad_off);
                if b > a {
                    out.push([a as f32, b as f32]);
                }
                start = t;
                speech = false;
            }
        } else if p(i) > onset {
            start = t;
            speech = true;
        }
    }
    if speech {
        // NeMo closes an open segment at the last unit's start.
        let last = units.saturating_sub(1) as f64 * UNIT_SECONDS;
        out.push([(start - pad_on).max(0.0) as f32, (last + pad_off) as f32]);
    }
    merge_overlap_segment(out)
}

/// NeMo's `merge_overlap_segment`: sorted by start, each segment merges with the next when its
/// end reaches the next's start; a merged run keeps its first start and its last end.
fn merge_overlap_segment(mut segments: Vec<[f32; 2]>) -> Vec<[f32; 2]> {
    if segments.len() <= 1 {
        return segments;
    }
    sort_by_start(&mut segments);
    let n = segments.len();
    let joins: Vec<bool> = (0..n - 1)
        .map(|k| segments[k][1] >= segments[k + 1][0])
        .collect();
    let heads = (0..n)
        .filter(|&k| k == 0 || !joins[k - 1])
        .map(|k| segments[k][0]);
    let tails = (0..n)
        .filter(|&k| k == n - 1 || !joins[k])
        .map(|k| segments[k][1]);
    heads.zip(tails).map(|(a, b)| [a, b]).collect()
}

/// Segments by start as `torch.sort` orders them on the CPU: libstdc++'s `std::sort`
/// (introsort), which is not stable, and padded segments often tie at 0 s. Which of two tied
/// segments comes first decides what NeMo's merge keeps, so the order is reproduced exactly.
fn sort_by_start(v: &mut [[f32; 2]]) {
    let less = |a: &[f32; 2], b: &[f32; 2]| a[0] < b[0];
    if v.len() > 1 {
        let depth = 2 * (usize::BITS - 1 - v.len().leading_zeros()) as usize;
        introsort_loop(v, depth, &less);
        final_insertion_sort(v, &less);
    }
}

/// libstdc++'s `_S_threshold`: runs shorter than this are left to the insertion sort.
const SORT_THRESHOLD: usize = 16;

type Less<'a> = &'a dyn Fn(&[f32; 2], &[f32; 2]) -> bool;

fn introsort_loop(v: &mut [[f32; 2]], mut depth: usize, less: Less) {
    let mut last = v.len();
    while last > SORT_THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(&mut v[..last], less);
        introsort_loop(&mut v[cut..last], depth, less);
        last = cut;
    }
}

/// `__unguarded_partition_pivot`: the median of the second, middle and last elements moved
/// to the front, then Hoare's partition around it.
fn partition_pivot(v: &mut [[f32; 2]], less: Less) -> usize {
    let n = v.len();
    let mid = n / 2;
    let (a, b, c) = (1, mid, n - 1);
    let median = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(0, median);
    let (mut first, mut last) = (1, n);
    loop {
        while less(&v[first], &v[0]) {
            first += 1;
        }
        last -= 1;
        while less(&v[0], &v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort(v: &mut [[f32; 2]], less: Less) {
    if v.len() > SORT_THRESHOLD {
        insertion_sort(&mut v[..SORT_THRESHOLD], less);
        for i in SORT_THRESHOLD..v.len() {
            linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, less);
    }
}

fn insertion_sort(v: &mut [[f32; 2]], less: Less) {
    for i in 1..v.len() {
        if less(&v[i], &v[0]) {
            let x = v[i];
            v.copy_within(0..i, 1);
            v[0] = x;
        } else {
            linear_insert(v, i, less);
        }
    }
}

/// `__unguarded_linear_insert`: moves `v[i]` back past the larger elements before it.
fn linear_insert(v: &mut [[f32; 2]], mut i: usize, less: Less) {
    let x = v[i];
    while less(&x, &v[i - 1]) {
        v[i] = v[i - 1];
        i -= 1;
    }
    v[i] = x;
}

/// libstdc++'s `__partial_sort(first, last, last)`: make a heap, then pop it.
fn heap_sort(v: &mut [[f32; 2]], less: Less) {
    let len = v.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let x = v[parent];
        adjust_heap(v, parent, len, x, less);
        if parent == 0 {
            break;
        }
        parent -= 1;
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let x = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, x, less);
    }
}

fn adjust_heap(v: &mut [[f32; 2]], mut hole: usize, len: usize, x: [f32; 2], less: Less) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && less(&v[parent], &x) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[hole] = x;
}

/// NeMo's `filtering` (speech first): segments shorter than `min_duration_on` go, then gaps
/// shorter than `min_duration_off` become speech.
fn filtering(segments: Vec<[f32; 2]>, params: &PostProcessing) -> Vec<[f32; 2]> {
    if segments.is_empty() {
        return segments;
    }
    let (on, off) = (
        params.min_duration_on as f32,
        params.min_duration_off as f32,
    );
    let mut segments = segments;
    if params.min_duration_on > 0.0 {
        segments.retain(|s| s[1] - s[0] >= on);
    }
    if params.min_duration_off > 0.0 {
        let mut sorted = segments.clone();
        sort_by_start(&mut sorted);
        let short_gaps: Vec<[f32; 2]> = sorted
            .windows(2)
            .map(|w| [w[0][1], w[1][0]])
            .filter(|g| g[1] - g[0] < off)
            .collect();
        segments.extend(short_gaps);
        segments = merge_overlap_segment(segments);
    }
    segments
}

/// Decimals and margin of NeMo's `merge_float_intervals` defaults.
const GRID: f64 = 1e5;
const MARGIN: i64 = 2;

/// NeMo's `merge_float_intervals`: times to integers of 1e-5 s (via float32, as `fl2int`), the
/// start moved 2 units later (intervals that only touch stay apart; empty ones go), merged,
/// and back (`int2fl`: float32, rounded to 5 decimals in float32).
fn merge_float_intervals(ranges: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let fl2int = |x: f64| ((x * GRID) as f32).round_ties_even() as i64;
    let int2fl = |n: i64| {
        let v = (n as f64 / GRID) as f32;
        ((v * GRID as f32).round_ties_even() / GRID as f32) as f64
    };
    let ints: Vec<[i64; 2]> = ranges
        .iter()
        .map(|r| [fl2int(r[0]) + MARGIN, fl2int(r[1])])
        .filter(|r| r[0] < r[1])
        .collect();
    merge_int_intervals(ints)
        .into_iter()
        .map(|[a, b]| [int2fl(a - MARGIN), int2fl(b)])
        .collect()
}

/// NeMo's `merge_int_intervals`, which sorts the starts and the ends each on their own
/// (`torch.sort(dim=0)`) before merging.
fn merge_int_intervals(intervals: Vec<[i64; 2]>) -> Vec<[i64; 2]> {
    if intervals.len() <= 1 {
        return intervals;
    }
    let mut starts: Vec<i64> = intervals.iter().map(|r| r[0]).collect();
    let mut ends: Vec<i64> = intervals.iter().map(|r| r[1]).collect();
    starts.sort_unstable();
    ends.sort_unstable();
    let mut out = Vec::new();
    let (mut start, mut end) = (starts[0], ends[0]);
    for (&s, &e) in starts.iter().zip(&ends).skip(1) {
        if end >= s {
            end = end.max(e);
        } else {
            out.push([start, end]);
            start = s;
            end = end.max(e);
        }
    }
    out.push([start, end]);
    out
}

/// NeMo's output line of a segment: `start end speaker_k`, 3 decimals.
pub fn nemo_line(s: &Segment) -> String {
    format!("{:.3} {:.3} speaker_{}", s.start, s.end, s.speaker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis_pads_and_closes_at_the_last_unit() {
        let p = PostProcessing::default();
        // 80 ms frames: on, off, on (to the end).
        let segs = speaker_segments(&[0.9, 0.1, 0.7], &p, 8);
        assert_eq!(segs, vec![[0.0, 0.08], [0.16, 0.23]]);
        let p = PostProcessing {
            pad_onset: 0.05,
            pad_offset: 0.1,
            ..p
        };
        // The padding makes them overlap: one segment.
        assert_eq!(speaker_segments(&[0.9, 0.1, 0.7], &p, 8), vec![[0.0, 0.33]]);
    }

    #[test]
    fn filtering_drops_short_turns_then_fills_short_gaps() {
        let p = PostProcessing {
            min_duration_on: 0.1,
            min_duration_off: 0.2,
            ..PostProcessing::default()
        };
        let segs = filtering(vec![[0.0, 0.5], [0.6, 0.65], [0.7, 1.0], [1.5, 2.0]], &p);
        assert_eq!(segs, vec![[0.0, 1.0], [1.5, 2.0]]);
    }

    #[test]
    fn float_intervals_keep_touching_turns_apart_and_drop_empty_ones() {
        let got = merge_float_intervals(&[[0.0, 0.08], [0.08, 0.16], [0.5, 0.5], [0.3, 0.4]]);
        // The times come back through float32, as NeMo's `int2fl` gives them.
        let f = |x: f32| x as f64;
        assert_eq!(
            got,
            vec![[0.0, f(0.08)], [f(0.08), f(0.16)], [f(0.3), f(0.4)]]
        );
        assert_eq!(round2(0.125), 0.12);
        assert_eq!(round2(0.375), 0.38);
    }

    #[test]
    fn published_sets_by_name_and_generation() {
        let v1 = PostProcessing::published("dihard3", Generation::V1).unwrap();
        assert_eq!(v1.onset, 0.64);
        let v2 = PostProcessing::published("dihard3", Generation::V2).unwrap();
        assert_eq!(v2.offset, 1.0);
        let named = PostProcessing::published("v1-callhome", Generation::V2).unwrap();
        assert_eq!(named.min_duration_on, 0.42);
        assert!(PostProcessing::published("ami", Generation::V1).is_err());
        for (_, _, p) in PUBLISHED {
            p.check().unwrap();
        }
        let bad = PostProcessing {
            onset: 1.0,
            ..PostProcessing::default()
        };
        assert!(bad.check().is_err());
        let bad = PostProcessing {
            min_duration_on: -0.1,
            ..PostProcessing::default()
        };
        assert!(bad.check().is_err());
    }
}
