//! What the f32 and int8 GEMM nodes share: the panel queue their threads claim rows from, the
//! one driver that claims, computes and finishes (the residual) each range, and the node's
//! description of its optional sources.

use crate::backend::custom::CustomOp;
use std::ops::Range;

/// What a GEMM node carries in its body: its [`PanelQueue`] counter, which optional sources it
/// has (after its two operands: the bias, then the residual), and what follows the product
/// (and bias) in the node itself.
#[derive(Default)]
pub struct GemmNode {
    pub next: std::sync::atomic::AtomicUsize,
    /// A ReLU on the product (and bias), before the residual: in the stores of the f32 panel
    /// GEMM and of the VNNI int8 kernel, a pass over each claimed range for the other int8
    /// kernels ([`Self::relu_panels`]).
    pub relu: bool,
    /// Whether the node has a bias source (the first after its two operands).
    pub bias: bool,
    /// `residual + scale * v` on each claimed range once it is computed, the residual being
    /// the node's last source (the output's shape): the values of a `scale` node and an `add`
    /// node after it, without another pass over the output.
    pub residual: Option<f32>,
}

impl GemmNode {
    /// The node's bias source (`m` values), null without one.
    pub(crate) fn bias(&self, op: &CustomOp<'_>) -> *const f32 {
        if self.bias {
            op.src_f32(2).as_ptr()
        } else {
            std::ptr::null()
        }
    }

    /// The node's residual source (the output's shape), null without one.
    pub(crate) fn residual_source(&self, op: &CustomOp<'_>) -> *const f32 {
        if self.residual.is_some() {
            op.src_f32(2 + self.bias as usize).as_ptr()
        } else {
            std::ptr::null()
        }
    }

    /// This thread's part of a GEMM node over `m / panel` panels of `panel` rows and `n`
    /// columns: claims ranges of panels from the node's queue, runs `compute(panels, next)` on
    /// each (`next` is the range this thread computes after it, claimed first when
    /// `claim_ahead`, else empty), then finishes the range's rows ([`Self::finish_panels`])
    /// unless `finished_in_store` (the kernel added the residual in its stores).
    pub(crate) fn drive(
        &self,
        op: &CustomOp<'_>,
        (m, n): (usize, usize),
        panel: usize,
        (claim_ahead, finished_in_store): (bool, bool),
        mut compute: impl FnMut(Range<usize>, Range<usize>),
    ) {
        let queue = PanelQueue {
            next: &self.next,
            panels: m / panel,
            threads: op.nth(),
        };
        let (y, residual) = (op.dst_ptr::<f32>(), self.residual_source(op));
        let mut claimed = queue.claim();
        while let Some(panels) = claimed.take() {
            let next = if claim_ahead {
                claimed = queue.claim();
                claimed.clone().unwrap_or(0..0)
            } else {
                0..0
            };
            compute(panels.clone(), next);
            if !finished_in_store {
                // SAFETY: y holds n columns of m rows and this thread claimed these panels'
                // rows; the residual source, where the node has one, has y's shape.
                unsafe { self.finish_panels(y, residual, (m, n), (panels, panel)) };
            }
            if !claim_ahead {
                claimed = queue.claim();
            }
        }
    }

    /// `y = relu(y)` over the rows of `panels` (of `panel` rows each) of every column of `y`
    /// (`n` columns of `m` values), where the node has a ReLU: for a kernel whose store has
    /// none, before [`Self::finish_panels`].
    ///
    /// # Safety
    /// `y` holds `n * m` values and this thread owns these rows.
    pub(crate) unsafe fn relu_panels(
        &self,
        y: *mut f32,
        (m, n): (usize, usize),
        (panels, panel): (Range<usize>, usize),
    ) {
        if !self.relu {
            return;
        }
        let rows = panels.start * panel..panels.end * panel;
        assert!(rows.end <= m);
        for j in 0..n {
            // SAFETY: column j's rows `rows` are within y and this thread's.
            let out =
                unsafe { std::slice::from_raw_parts_mut(y.add(j * m + rows.start), rows.len()) };
            for v in out {
                *v = relu_f32(*v);
            }
        }
    }

    /// What the node does after the product on the panels `panels` (of `panel` rows each) a
    /// thread has just computed: `y = residual + scale * y` over their rows of every column of
    /// `y` (`n` columns of `m` values), where the node has a residual.
    ///
    /// # Safety
    /// `y` holds `n * m` values and this thread owns these rows; `residual` (the node's
    /// residual source, null without one) holds `n * m` values.
    unsafe fn finish_panels(
        &self,
        y: *mut f32,
        residual: *const f32,
        (m, n): (usize, usize),
        (panels, panel): (std::ops::Range<usize>, usize),
    ) {
        if let Some(scale) = self.residual {
            let rows = panels.start * panel..panels.end * panel;
            // SAFETY: per the contract.
            unsafe { add_residual_rows(scale, y, residual, (m, n), rows) };
        }
    }
}

/// ggml's relu, `v > 0 ? v : 0` (-0 and NaN give +0).
pub(crate) fn relu_f32(v: f32) -> f32 {
    if v > 0.0 { v } else { 0.0 }
}

/// `y = residual + scale * y` over rows `rows` of every column of `y` (`n` columns of `m`
/// values), see [`GemmNode::residual`].
///
/// # Safety
/// `y` and `residual` hold `n * m` values and this thread owns `y`'s rows `rows`.
unsafe fn add_residual_rows(
    scale: f32,
    y: *mut f32,
    residual: *const f32,
    (m, n): (usize, usize),
    rows: std::ops::Range<usize>,
) {
    assert!(rows.end <= m && !residual.is_null());
    for j in 0..n {
        // SAFETY: column j's rows `rows` are within y and residual (another tensor, only
        // read); this thread owns them in y.
        let (out, r) = unsafe {
            (
                std::slice::from_raw_parts_mut(y.add(j * m + rows.start), rows.len()),
                std::slice::from_raw_parts(residual.add(j * m + rows.start), rows.len()),
            )
        };
        if scale == 1.0 {
            for (v, &r) in out.iter_mut().zip(r) {
                *v += r;
            }
        } else {
            for (v, &r) in out.iter_mut().zip(r) {
                *v = r + *v * scale;
            }
        }
    }
}

/// Hands out a product's panels to the threads computing it: guided, each claim a fraction of
/// what is left (big ranges first, for the activations' reuse in cache; single pairs at the
/// end), so that no thread waits long for another at the node's end (the random per-node
/// imbalance of a static split cost ~10 % of the 0.6b encoder at 2 threads). One thread
/// takes everything at once.
pub struct PanelQueue<'a> {
    /// Panels handed out so far (zero before the first claim).
    pub next: &'a std::sync::atomic::AtomicUsize,
    pub panels: usize,
    pub threads: usize,
}

impl PanelQueue<'_> {
    /// The next range of panels (starting on a pair), or `None` when all are taken.
    pub fn claim(&self) -> Option<std::ops::Range<usize>> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut cur = self.next.load(Relaxed);
        loop {
            if cur >= self.panels {
                return None;
            }
            let left = self.panels - cur;
            let share = if self.threads <= 1 {
                left
            } else {
                (left / (2 * self.threads)).next_multiple_of(2).max(2)
            };
            let take = share.min(left);
            match self
                .next
                .compare_exchange_weak(cur, cur + take, Relaxed, Relaxed)
            {
                Ok(_) => return Some(cur..cur + take),
                Err(now) => cur = now,
            }
        }
    }
}
