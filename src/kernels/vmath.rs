//! Exponentials for the custom ops (softmax, GLU, SiLU, the LSTM cell): one polynomial `e^x`
//! for `x <= 0`, in scalar code and in 512-bit registers with the same operations in the same
//! order (no fused multiply-adds), so both give the same bits. libm's `expf` is a call per
//! value, which kept those loops scalar.

#[cfg(target_arch = "x86_64")]
use super::cpu::avx512;
use super::cpu::multiversioned;

/// `e^x` for `x <= 0`: `2^n * e^r` with `r = x - n ln 2` in `[-ln2/2, ln2/2]` (Cody-Waite
/// split) and a degree-7 Taylor polynomial; within 2e-7 relative, and exactly 0 below -87.3
/// (where f32 underflows anyway). `n` is rounded by adding 1.5 * 2^23, which leaves it in the
/// sum's low mantissa bits.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let a = x.max(MIN_ARG);
    let shifted = a * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = (a - n * LN2_HI) - n * LN2_LO;
    let mut p = TAYLOR[0];
    for c in &TAYLOR[1..] {
        p = p * r + c;
    }
    // 2^n from n's bits: |n| <= 126, so the difference of the two sums' bits is n.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < MIN_ARG { 0.0 } else { p * scale }
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
const ROUND: f32 = 12_582_912.0;
const MIN_ARG: f32 = -87.3;
/// 1/7!, 1/6!, ..., 1/1!, 1/0! (Horner order): the degree-7 remainder is below f32's
/// rounding on `|r| <= ln2/2` (degree 6 left ~2 ulps).
const TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `1 / (1 + e^-x)` from `e^-|x|` (no overflow for any x).
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    let e = exp_nonpositive(-x.abs());
    let num = if x >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

/// `tanh(x) = sign(x) (1 - e) / (1 + e)` from `e = e^-2|x|` (no overflow for any x; within
/// 2e-7 of the exact value, absolutely, near 0 as well).
#[inline(always)]
fn tanh(x: f32) -> f32 {
    let e = exp_nonpositive(-2.0 * x.abs());
    let t = (1.0 - e) / (1.0 + e);
    if x < 0.0 { -t } else { t }
}

/// `e^x` in place, every `x <= 0`.
pub fn exp_in_place(x: &mut [f32]) {
    map_in_place(x, Map::Exp);
}

/// The logistic sigmoid in place.
pub fn sigmoid_in_place(x: &mut [f32]) {
    map_in_place(x, Map::Sigmoid);
}

/// `tanh` in place.
pub fn tanh_in_place(x: &mut [f32]) {
    map_in_place(x, Map::Tanh);
}

/// SiLU in place, `x * sigmoid(x)`.
pub fn silu_in_place(x: &mut [f32]) {
    map_in_place(x, Map::Silu);
}

/// A function of one value that the slices above apply.
#[derive(Clone, Copy)]
enum Map {
    Exp,
    Sigmoid,
    Tanh,
    Silu,
}

impl Map {
    #[inline(always)]
    fn scalar(self, v: f32) -> f32 {
        match self {
            Map::Exp => exp_nonpositive(v),
            Map::Sigmoid => sigmoid(v),
            Map::Tanh => tanh(v),
            Map::Silu => v * sigmoid(v),
        }
    }
}

/// `map` over `x`, sixteen lanes at a time where AVX-512 is there (the same bits).
fn map_in_place(x: &mut [f32], map: Map) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F present.
        let done = unsafe { simd::map_in_place(x, map) };
        x[done..].iter_mut().for_each(|v| *v = map.scalar(*v));
        return;
    }
    map_portable(x, map);
}

multiversioned! {
    /// `map` over `x` in the compiler's vectorisation (AVX2 CPUs and the baseline).
    fn map_portable(x: &mut [f32], map: Map) {
        x.iter_mut().for_each(|v| *v = map.scalar(*v));
    }
}

/// The gated linear unit of one step: `out = a * sigmoid(gate)`.
pub fn glu(a: &[f32], gate: &[f32], out: &mut [f32]) {
    assert!(a.len() == out.len() && gate.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F present; the lengths are equal (asserted).
        let done = unsafe { simd::glu(a, gate, out) };
        for ((o, &a), &g) in out[done..].iter_mut().zip(&a[done..]).zip(&gate[done..]) {
            *o = a * sigmoid(g);
        }
        return;
    }
    glu_portable(a, gate, out);
}

multiversioned! {
    /// [`glu`] in the compiler's vectorisation (AVX2 CPUs and the baseline).
    fn glu_portable(a: &[f32], gate: &[f32], out: &mut [f32]) {
        for ((o, &a), &g) in out.iter_mut().zip(a).zip(gate) {
            *o = a * sigmoid(g);
        }
    }
}

/// [`exp_nonpositive`]'s Cody-Waite split and degree-7 Taylor polynomial on sixteen lanes in
/// fused multiply-adds, scaled by `2^n` with `vscalefps`: about half the instructions, within
/// the same 2e-7 (not the same bits, so not for the loops that match the scalar code); 0 below
/// -87.3 as there. For kernels that inline their own passes (the attention's softmax).
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_nonpositive_fma(
    x: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let a = _mm512_max_ps(x, _mm512_set1_ps(MIN_ARG));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(a, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), a);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(TAYLOR[0]);
    for &c in &TAYLOR[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    // Lanes at or above the cut (NaN included) keep their value, the rest are 0.
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(MIN_ARG));
    _mm512_maskz_scalef_ps(keep, p, n)
}

/// The loops above, sixteen lanes at a time; each returns how many leading values it did
/// (the rest, fewer than 16, are left to the scalar code).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{LN2_HI, LN2_LO, LOG2E, MIN_ARG, Map, ROUND, TAYLOR};
    use std::arch::x86_64::*;

    const LANES: usize = 16;

    /// [`super::exp_nonpositive`] on sixteen lanes (the same operations).
    #[inline(always)]
    unsafe fn exp_nonpositive(x: __m512) -> __m512 {
        // SAFETY: AVX-512F (the callers' contract).
        unsafe {
            let a = _mm512_max_ps(x, _mm512_set1_ps(MIN_ARG));
            let shifted = _mm512_add_ps(
                _mm512_mul_ps(a, _mm512_set1_ps(LOG2E)),
                _mm512_set1_ps(ROUND),
            );
            let n = _mm512_sub_ps(shifted, _mm512_set1_ps(ROUND));
            let r = _mm512_sub_ps(
                _mm512_sub_ps(a, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
                _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
            );
            let mut p = _mm512_set1_ps(TAYLOR[0]);
            for &c in &TAYLOR[1..] {
                p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
            }
            let n_bits = _mm512_sub_epi32(
                _mm512_castps_si512(shifted),
                _mm512_set1_epi32(ROUND.to_bits() as i32),
            );
            let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                n_bits,
                _mm512_set1_epi32(127),
            )));
            let y = _mm512_mul_ps(p, scale);
            // Zero where x < MIN_ARG (ordered compare: NaN keeps the polynomial's value, as
            // the scalar `if` does).
            let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(MIN_ARG));
            _mm512_mask_mov_ps(y, under, _mm512_setzero_ps())
        }
    }

    /// [`super::sigmoid`] on sixteen lanes.
    #[inline(always)]
    unsafe fn sigmoid(x: __m512) -> __m512 {
        // SAFETY: AVX-512F (the callers' contract).
        unsafe {
            let abs = _mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(x),
                _mm512_set1_epi32(0x7fff_ffff),
            ));
            let e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), abs));
            let one = _mm512_set1_ps(1.0);
            let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
            let nonneg = !negative & _mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x);
            // num = x >= 0 ? 1 : e (NaN: e, as the scalar `if` gives).
            let num = _mm512_mask_mov_ps(e, nonneg, one);
            _mm512_div_ps(num, _mm512_add_ps(one, e))
        }
    }

    /// [`super::tanh`] on sixteen lanes.
    #[inline(always)]
    unsafe fn tanh(x: __m512) -> __m512 {
        // SAFETY: AVX-512F (the callers' contract).
        unsafe {
            let sign = _mm512_set1_epi32(i32::MIN);
            let abs = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
            let minus_2abs = _mm512_mul_ps(_mm512_set1_ps(-2.0), abs);
            let e = exp_nonpositive(minus_2abs);
            let one = _mm512_set1_ps(1.0);
            let t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
            // -t where x < 0 (the scalar `if`: -0 and NaN keep t's sign).
            let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
            let flipped = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), sign));
            _mm512_mask_mov_ps(t, negative, flipped)
        }
    }

    /// # Safety
    /// AVX-512F; `a`, `gate` and `out` have the same length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn glu(a: &[f32], gate: &[f32], out: &mut [f32]) -> usize {
        let n = out.len() / LANES * LANES;
        for i in (0..n).step_by(LANES) {
            // SAFETY: lanes i..i + 16 are inside all three (same lengths).
            unsafe {
                let g = sigmoid(_mm512_loadu_ps(gate.as_ptr().add(i)));
                let y = _mm512_mul_ps(_mm512_loadu_ps(a.as_ptr().add(i)), g);
                _mm512_storeu_ps(out.as_mut_ptr().add(i), y);
            }
        }
        n
    }

    /// [`super::map_in_place`]'s lanes; returns how many leading values it did.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn map_in_place(x: &mut [f32], map: Map) -> usize {
        let n = x.len() / LANES * LANES;
        for i in (0..n).step_by(LANES) {
            // SAFETY: lanes i..i + 16 are inside x.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let v = _mm512_loadu_ps(p);
                let y = match map {
                    Map::Exp => exp_nonpositive(v),
                    Map::Sigmoid => sigmoid(v),
                    Map::Tanh => tanh(v),
                    Map::Silu => _mm512_mul_ps(v, sigmoid(v)),
                };
                _mm512_storeu_ps(p, y);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f32;
        let xs: Vec<f32> = (0..20000).map(|i| -(i as f32) * 0.0044).collect();
        let mut ys = xs.clone();
        exp_in_place(&mut ys);
        for (&x, &y) in xs.iter().zip(&ys) {
            let e = x.exp();
            if e > 1e-30 {
                worst = worst.max(((y - e) / e).abs());
            }
            assert_eq!(y, exp_nonpositive(x), "SIMD and scalar differ at {x}");
        }
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        let mut tiny = [-100.0f32, -88.0, 0.0];
        exp_in_place(&mut tiny);
        assert_eq!(tiny, [0.0, 0.0, 1.0]);
    }

    /// Values over [-100, 100), plus the edges, in a length that leaves a scalar tail.
    fn arguments() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..20001).map(|i| (i as f32 - 10000.0) * 0.01).collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 1e30, -1e30]);
        xs
    }

    #[test]
    fn glu_silu_sigmoid_tanh_match_f64_and_their_scalar_code() {
        let xs = arguments();
        let a: Vec<f32> = xs.iter().map(|x| (x * 0.37).sin() * 3.0).collect();
        let mut glu_out = vec![0f32; xs.len()];
        glu(&a, &xs, &mut glu_out);
        let mut silu_out = xs.clone();
        silu_in_place(&mut silu_out);
        let sig = |x: f32| 1.0 / (1.0 + (-(x as f64)).exp());
        let (mut worst_glu, mut worst_silu) = (0f64, 0f64);
        for i in 0..xs.len() {
            let (x, g, s) = (xs[i], glu_out[i], silu_out[i]);
            let (want_g, want_s) = (a[i] as f64 * sig(x), x as f64 * sig(x));
            // Relative to the value, with an absolute floor for results near zero (below
            // -87.3 the exponential is flushed to 0).
            worst_glu = worst_glu.max((g as f64 - want_g).abs() / want_g.abs().max(1e-20));
            worst_silu = worst_silu.max((s as f64 - want_s).abs() / want_s.abs().max(1e-20));
            assert_eq!(g, a[i] * sigmoid(x), "glu: SIMD and scalar differ at {x}");
            assert_eq!(s, x * sigmoid(x), "silu: SIMD and scalar differ at {x}");
        }
        assert!(worst_glu < 3e-7, "glu: worst relative error {worst_glu:e}");
        let (mut sig_out, mut tanh_out) = (xs.clone(), xs.clone());
        sigmoid_in_place(&mut sig_out);
        tanh_in_place(&mut tanh_out);
        let (mut worst_sig, mut worst_tanh) = (0f64, 0f64);
        for (i, &x) in xs.iter().enumerate() {
            assert_eq!(
                sig_out[i],
                sigmoid(x),
                "sigmoid: SIMD and scalar differ at {x}"
            );
            assert_eq!(tanh_out[i], tanh(x), "tanh: SIMD and scalar differ at {x}");
            let (want_s, want_t) = (sig(x), (x as f64).tanh());
            worst_sig = worst_sig.max((sig_out[i] as f64 - want_s).abs() / want_s.max(1e-20));
            // Absolute near 0 (1 - e cancels), relative beyond.
            let t_err = (tanh_out[i] as f64 - want_t).abs() / want_t.abs().max(1.0);
            worst_tanh = worst_tanh.max(t_err);
        }
        assert!(
            worst_sig < 3e-7,
            "sigmoid: worst relative error {worst_sig:e}"
        );
        assert!(worst_tanh < 2e-7, "tanh: worst error {worst_tanh:e}");
        assert!(
            worst_silu < 3e-7,
            "silu: worst relative error {worst_silu:e}"
        );
    }
}
