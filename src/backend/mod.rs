//! The ggml runtime: the room where ggml's graph API is used. Everything else in the crate sees
//! a safe API:
//!
//! - [`Backend`]: a ggml CPU backend (from ggml's device registry) and its graph allocator
//!   (gallocr); one per transcription worker. [`Backend::compute`] builds a graph in a
//!   metadata-only context, allocates it with the persistent gallocr, writes the registered host
//!   inputs, runs it and reads back the output and any captures.
//! - [`Graph`] / [`Tensor`]: shape-checked graph building over ggml's built-in ops. A mismatch is
//!   a bug in the caller and panics with a message (a Rust panic unwinds; a `GGML_ASSERT` would
//!   abort the process). Our fused CPU ops (the `kernels` room) build on its [`custom`] hooks.
//! - [`DType`] and [`Weight`]: element types, and weights living in backend buffers (a GGUF's
//!   mapping, made by the `gguf` room, or [`HostWeights`] computed at load).

pub(crate) mod custom;
pub mod device;
mod dtype;
pub(crate) mod graph;
pub mod openmp;
mod process;
mod state;
mod threads;
pub(crate) mod weight;

pub use device::{Device, DeviceRequest, GpuApi};
pub use dtype::{DType, quantize_rows};
pub use graph::{Graph, Tensor};
pub use process::{exit_now, peak_rss_bytes, process_running};
pub use state::StateTensors;
pub use threads::Threads;
pub use weight::{
    HostWeights, PaddedLinear, Realised, Slot, Weight, device_bytes, plain_weights, weights_on,
};

use crate::bail;
use crate::error::Result;
use llama_cpp_sys_2 as sys;
use std::ffi::CStr;
use std::time::{Duration, Instant};

/// How the fused ops of a graph become ggml nodes (read while building with
/// [`Graph::lowering`]; each op of the `kernels` room has both lowerings beside each other).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lowering {
    /// Our CPU kernels as custom ops, over weights in our packed layouts (`layout`): the
    /// default, and the fastest on a CPU.
    #[default]
    Kernels,
    /// ggml's built-in ops only, over weights in ggml's own types (f32, f16, q8_0, q4_0): what
    /// any ggml backend can run, and the reference the kernels are checked against.
    Builtin,
}

impl Lowering {
    /// The name `--kernels` and `--profile` use: `kernels` for ours, `ggml` for the built-in
    /// ops.
    pub fn name(self) -> &'static str {
        match self {
            Lowering::Kernels => "kernels",
            Lowering::Builtin => "ggml",
        }
    }

    /// `PARAKEET_KERNELS=ggml` asks every model loaded with the default options for the
    /// built-in lowering (a diagnostic: the whole test suite runs on it so); anything else, or
    /// nothing, leaves our kernels.
    pub fn from_env() -> Lowering {
        match std::env::var("PARAKEET_KERNELS").as_deref() {
            Ok("ggml") => Lowering::Builtin,
            _ => Lowering::Kernels,
        }
    }
}

/// `--kernels`: `auto` (our kernels on the CPU, unless `PARAKEET_KERNELS` says otherwise) or
/// `ggml` (ggml's built-in ops).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelChoice {
    #[default]
    Auto,
    Ggml,
}

impl KernelChoice {
    /// The lowering this choice runs.
    pub fn resolve(self) -> Lowering {
        match self {
            KernelChoice::Auto => Lowering::from_env(),
            KernelChoice::Ggml => Lowering::Builtin,
        }
    }
}

impl std::str::FromStr for KernelChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "auto" => Ok(KernelChoice::Auto),
            "ggml" => Ok(KernelChoice::Ggml),
            _ => Err(format!("'{s}': expected auto or ggml")),
        }
    }
}

/// Counters behind `--profile`.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// The device that computes, `name (description)`.
    pub device: String,
    /// Whether it is a device other than the CPU (a scheduler with the CPU as fallback).
    pub on_device: bool,
    /// On a device: bytes of its memory the model's weights hold.
    pub device_weight_bytes: usize,
    /// On a device: bytes of its memory the backend's compute buffer holds now.
    pub device_compute_bytes: usize,
    /// On a device: `(free, total)` bytes of its memory after the last compute.
    pub device_memory: (usize, usize),
    pub graphs_computed: u64,
    pub compute_time: Duration,
    /// Size of the gallocr's compute buffer now.
    pub compute_buffer_bytes: usize,
    /// Largest size the compute buffer has had.
    pub peak_compute_buffer_bytes: usize,
    /// Time per kind of graph node, when [`Backend::set_op_timing`] is on: label -> (time,
    /// nodes). A node's time runs from the end of the previous node to its own end on ggml's
    /// first thread, so it includes the wait for the slowest thread of the previous node.
    pub op_times: std::collections::BTreeMap<String, (Duration, u64)>,
    /// A device backend: nodes its scheduler put on the CPU fallback instead, by op.
    pub fallback_ops: std::collections::BTreeMap<String, u64>,
    /// A device backend: graph splits (runs on one backend) over all computes.
    pub splits: u64,
    /// A device backend: bytes copied between the device and the CPU for split inputs,
    /// approximated as each tensor read on a backend other than its own, once per graph.
    pub crossed_bytes: u64,
}

/// Results of one [`Backend::compute`].
#[derive(Debug)]
pub struct Computed {
    /// The graph's output tensor as f32, ggml order (`ne0` fastest).
    pub output: Vec<f32>,
    /// Its shape, `[ne0, ne1, ne2, ne3]`.
    pub shape: [usize; 4],
    /// Captured tensors, in the order they were registered with [`Graph::capture`].
    pub captures: Vec<Capture>,
}

#[derive(Debug)]
pub struct Capture {
    pub name: String,
    pub data: Vec<f32>,
    pub shape: [usize; 4],
}

/// A typed handle to a tensor captured with [`Graph::capture`], valid for the result of the
/// compute whose graph registered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CaptureId(pub(crate) usize);

impl Computed {
    /// The capture registered under `name` (tests and diagnostics; code reads by handle).
    pub fn capture(&self, name: &str) -> Option<&Capture> {
        self.captures.iter().find(|c| c.name == name)
    }

    /// The capture `id` refers to.
    pub fn get(&self, id: CaptureId) -> Result<&Capture> {
        match self.captures.get(id.0) {
            Some(c) => Ok(c),
            None => bail!(Internal, "internal: capture {} is not in this result", id.0),
        }
    }

    /// Every capture except those in `taken`, in registration order (named layer taps).
    pub fn into_others(self, taken: &[CaptureId]) -> Vec<Capture> {
        self.captures
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !taken.contains(&CaptureId(*i)))
            .map(|(_, c)| c)
            .collect()
    }

    /// Moves the data of capture `id` out (each capture is taken once).
    pub fn take(&mut self, id: CaptureId) -> Result<Vec<f32>> {
        match self.captures.get_mut(id.0) {
            Some(c) => Ok(std::mem::take(&mut c.data)),
            None => bail!(Internal, "internal: capture {} is not in this result", id.0),
        }
    }
}

/// One persistent ggml backend and its graph allocator.
pub struct Backend {
    /// The device's backend (the CPU's for the CPU).
    backend: sys::ggml_backend_t,
    /// The CPU path's persistent allocator (unused under a scheduler).
    galloc: sys::ggml_gallocr_t,
    device: Device,
    /// A non-CPU device: ggml's scheduler over it and the CPU as fallback.
    sched: Option<Sched>,
    n_threads: usize,
    stats: Stats,
    /// Run after every node (boxed: ggml holds its address).
    hook: Box<NodeHook>,
    /// Base of the compute buffer last given huge pages (see [`advise_huge_pages`]).
    advised_base: usize,
    /// Graphs are allocated and their buffer written, not computed ([`Backend::prepare`]).
    dry_run: bool,
    /// How fused ops become nodes in this backend's graphs.
    lowering: Lowering,
}

/// Reports the fraction of a graph's nodes computed so far.
pub type ProgressFn = Box<dyn FnMut(f64) + Send>;

/// What runs after every node of a compute: progress reports and/or node end times.
#[derive(Default)]
struct NodeHook {
    done: usize,
    total: usize,
    report: Option<ProgressFn>,
    /// Node end times (the compute's start first), when timing nodes.
    ends: Option<Vec<Instant>>,
}

impl NodeHook {
    fn active(&self) -> bool {
        self.report.is_some() || self.ends.is_some()
    }
}

/// ggml's CPU backend calls this on its first thread after every node (as an abort check);
/// it never aborts.
unsafe extern "C" fn node_done(data: *mut std::os::raw::c_void) -> bool {
    // SAFETY: `data` is the backend's `NodeHook`, registered in `compute`, alive and not
    // otherwise borrowed until the compute returns and unregisters it.
    let hook = unsafe { &mut *(data as *mut NodeHook) };
    if let Some(ends) = hook.ends.as_mut() {
        ends.push(Instant::now());
    }
    hook.done += 1;
    let frac = hook.done as f64 / hook.total.max(1) as f64;
    if let Some(report) = hook.report.as_mut() {
        // A panic must not unwind into C; a failed progress report is not worth stopping for.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report(frac)));
    }
    false
}

/// Adds each computed node's time (from `ends`, which starts with the compute's start) to
/// `times` under the node's label: its name (set by [`Graph`] to what it is), else its op.
///
/// # Safety
/// `gf` is the graph just computed.
unsafe fn add_node_times(
    gf: *mut sys::ggml_cgraph,
    ends: &[Instant],
    times: &mut std::collections::BTreeMap<String, (Duration, u64)>,
) {
    let mut n = 0;
    // SAFETY: per the contract; node pointers of a built graph are valid.
    unsafe {
        for i in 0..sys::ggml_graph_n_nodes(gf) {
            let node = sys::ggml_graph_node(gf, i);
            if !computes((*node).op) {
                continue;
            }
            let (Some(&start), Some(&end)) = (ends.get(n), ends.get(n + 1)) else {
                break;
            };
            n += 1;
            let name = cstr((*node).name.as_ptr());
            let label = if name.is_empty() {
                cstr(sys::ggml_op_desc(node))
            } else {
                name
            };
            let slot = times.entry(label).or_default();
            slot.0 += end - start;
            slot.1 += 1;
        }
    }
}

/// Whether ggml computes (and calls back after) a node of this op.
fn computes(op: sys::ggml_op) -> bool {
    !matches!(
        op,
        sys::GGML_OP_NONE
            | sys::GGML_OP_RESHAPE
            | sys::GGML_OP_TRANSPOSE
            | sys::GGML_OP_VIEW
            | sys::GGML_OP_PERMUTE
    )
}

/// Nodes ggml actually computes (it skips views and reshapes without a callback).
///
/// # Safety
/// `gf` is a built graph.
unsafe fn computed_nodes(gf: *mut sys::ggml_cgraph) -> usize {
    // SAFETY: per the contract; node pointers of a built graph are valid.
    unsafe {
        (0..sys::ggml_graph_n_nodes(gf))
            .filter(|&i| computes((*sys::ggml_graph_node(gf, i)).op))
            .count()
    }
}

/// Asks the kernel for transparent huge pages over `[base, base + len)` (the 2 MiB-aligned
/// part), before its first touch: fewer page faults for the compute buffer (fresh memory, ~70
/// MiB for an 11 s clip on the 0.6b; docs/BENCHMARKS.md has the measurements). A hint: where
/// THP is off or unsupported, pages stay small.
fn advise_huge_pages(base: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = base.next_multiple_of(HUGE);
        let end = (base + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: advice only, over whole pages inside the live buffer; MADV_HUGEPAGE
            // changes no contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (base, len);
}

// The raw handles are only touched through &mut self.
unsafe impl Send for Backend {}

/// ggml's scheduler over a device backend and the CPU backend (last: ggml's fallback for an op
/// the device lacks), sized for graphs of up to `capacity` nodes and leafs.
struct Sched {
    sched: sys::ggml_backend_sched_t,
    cpu: sys::ggml_backend_t,
    capacity: usize,
}

impl Sched {
    /// # Safety
    /// `device` and `cpu` are live backends, the CPU one a CPU backend.
    unsafe fn new(device: sys::ggml_backend_t, cpu: sys::ggml_backend_t, capacity: usize) -> Sched {
        let mut backends = [device, cpu];
        // Weights live in the device's buffer; no op is offloaded with copies of host weights
        // (a copy per compute), so op_offload is off.
        // SAFETY: per the contract; ggml copies the array.
        let sched = unsafe {
            sys::ggml_backend_sched_new(
                backends.as_mut_ptr(),
                std::ptr::null_mut(),
                2,
                capacity,
                false,
                false,
            )
        };
        Sched {
            sched,
            cpu,
            capacity,
        }
    }
}

/// Nodes a single graph may hold; the encoder of a 42-layer model needs a few thousand.
const GRAPH_NODES: usize = 16 * 1024;

/// The scheduler's hash set holds a graph's nodes and leafs together.
fn sched_capacity(max_nodes: usize) -> usize {
    2 * max_nodes + WEIGHT_LEAFS
}
/// Room kept in every graph for leafs that are model weights (a 42-layer model has ~1200).
const WEIGHT_LEAFS: usize = 4096;

impl Backend {
    /// A CPU backend running `n_threads` threads (0 -> 1), from ggml's device registry.
    pub fn cpu(n_threads: usize) -> Result<Backend> {
        Backend::new(Device::cpu()?, n_threads)
    }

    /// A backend on `device`: the CPU's with its persistent graph allocator, or for any other
    /// device ggml's scheduler with the device first and the CPU (`n_threads` threads) as
    /// fallback for the ops the device lacks.
    pub fn new(device: Device, n_threads: usize) -> Result<Backend> {
        let cpu_device = Device::cpu()?;
        // SAFETY: plain constructors over a registry device; null results are checked and
        // what was made is freed on every failing path.
        unsafe {
            let backend = sys::ggml_backend_dev_init(device.raw(), std::ptr::null());
            if backend.is_null() {
                bail!(
                    Internal,
                    "ggml: could not initialise the device {}",
                    device.describe()
                );
            }
            let buft = sys::ggml_backend_get_default_buffer_type(backend);
            let galloc = sys::ggml_gallocr_new(buft);
            if galloc.is_null() {
                sys::ggml_backend_free(backend);
                bail!(Internal, "ggml: could not create the graph allocator");
            }
            let sched = if device.is_cpu() {
                None
            } else {
                let cpu = sys::ggml_backend_dev_init(cpu_device.raw(), std::ptr::null());
                if cpu.is_null() {
                    sys::ggml_gallocr_free(galloc);
                    sys::ggml_backend_free(backend);
                    bail!(Internal, "ggml: could not initialise the CPU backend");
                }
                Some(Sched::new(backend, cpu, sched_capacity(GRAPH_NODES)))
            };
            let mut b = Backend {
                backend,
                galloc,
                device,
                sched,
                n_threads: 1,
                stats: Stats::default(),
                hook: Box::default(),
                advised_base: 0,
                dry_run: false,
                // Our kernels are CPU code: any other device runs ggml's own ops.
                lowering: if device.is_cpu() {
                    Lowering::Kernels
                } else {
                    Lowering::Builtin
                },
            };
            b.stats.device = device.describe();
            b.stats.on_device = !device.is_cpu();
            b.set_threads(n_threads);
            Ok(b)
        }
    }

    /// Zero-filled f32 tensors of the given `[width, rows]` shapes that keep their values
    /// across this backend's computes (a stream's caches). They live in the device's buffer type, so a graph on the device reads them in place.
    pub fn state_tensors(&self, shapes: &[[usize; 2]]) -> Result<StateTensors> {
        // SAFETY: `backend` is live; its default buffer type is static.
        let buft = unsafe { sys::ggml_backend_get_default_buffer_type(self.backend) };
        StateTensors::new(buft, shapes).map_err(|e| self.device_error(e))
    }

    /// The device this backend computes on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The CPU backend: this one, or a device's fallback.
    fn cpu_backend(&self) -> sys::ggml_backend_t {
        self.sched.as_ref().map_or(self.backend, |s| s.cpu)
    }

    /// A failure to allocate on a device, said with the device's name and its free memory.
    fn device_error(&self, e: crate::error::Error) -> crate::error::Error {
        if self.device.is_cpu() {
            return e;
        }
        let (free, total) = self.device.memory();
        crate::err!(
            Internal,
            "{e} on {} ({} free of {})",
            self.device.describe(),
            device::mib(free),
            device::mib(total)
        )
    }

    /// Threads used by every following compute (values below 1 mean 1).
    pub fn set_threads(&mut self, n: usize) {
        self.n_threads = n.max(1);
        // SAFETY: the CPU backend is live.
        unsafe { sys::ggml_backend_cpu_set_n_threads(self.cpu_backend(), self.n_threads as i32) };
    }

    pub fn threads(&self) -> usize {
        self.n_threads
    }

    /// How the fused ops of every following graph are lowered (the weights they read must be
    /// in the layouts it takes: packed or plain for [`Lowering::Kernels`], plain for
    /// [`Lowering::Builtin`]).
    /// A device other than the CPU keeps [`Lowering::Builtin`].
    pub fn set_lowering(&mut self, lowering: Lowering) {
        if self.sched.is_none() {
            self.lowering = lowering;
        }
    }

    /// Notes the bytes of model weights this backend's device holds (for `--profile`).
    pub fn set_device_weight_bytes(&mut self, bytes: usize) {
        self.stats.device_weight_bytes = bytes;
    }

    pub fn lowering(&self) -> Lowering {
        self.lowering
    }

    pub fn device_name(&self) -> String {
        // SAFETY: returns a static C string owned by ggml.
        unsafe { cstr(sys::ggml_backend_name(self.backend)) }
    }

    /// Bytes of compute buffers as allocated now, on the device and (under a scheduler) on the
    /// CPU fallback: `(device, cpu)`.
    pub fn compute_buffers(&self) -> (usize, usize) {
        match &self.sched {
            None => (self.compute_buffer_bytes(), 0),
            // SAFETY: the scheduler and both backends are live.
            Some(s) => unsafe {
                (
                    sys::ggml_backend_sched_get_buffer_size(s.sched, self.backend),
                    sys::ggml_backend_sched_get_buffer_size(s.sched, s.cpu),
                )
            },
        }
    }

    /// Report each following compute's progress to `report` (the fraction of its nodes
    /// done, from ggml's first compute thread), or stop reporting with `None`.
    pub fn set_progress(&mut self, report: Option<ProgressFn>) {
        self.hook.report = report;
    }

    /// Time every node of the following computes by kind, into [`Stats::op_times`].
    pub fn set_op_timing(&mut self, on: bool) {
        self.hook.ends = on.then(Vec::new);
    }

    /// Bytes of the compute buffer as allocated now (0 before the first graph).
    pub fn compute_buffer_bytes(&self) -> usize {
        if self.sched.is_some() {
            let (device, cpu) = self.compute_buffers();
            return device + cpu;
        }
        // SAFETY: galloc is live.
        unsafe { sys::ggml_gallocr_get_buffer_size(self.galloc, 0) }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Runs `work` with graphs allocated but not computed: the compute buffer grows to what they
    /// need and every page of it is written (zeros; outputs read back as zeros). A process's
    /// compute buffer is fresh memory, whose first touch costs page faults and the kernel's
    /// zeroing: about 40-400 ms for a 0.6b encoder over 11 s on these VMs, which would
    /// otherwise land in the first utterance's encoder.
    pub fn prepare<T>(&mut self, work: impl FnOnce(&mut Backend) -> T) -> T {
        /// Ends the dry run however `work` ends (a panic included): a backend left in it
        /// would silently compute nothing.
        struct DryRun<'a>(&'a mut Backend);
        impl Drop for DryRun<'_> {
            fn drop(&mut self) {
                self.0.dry_run = false;
            }
        }
        self.dry_run = true;
        let guard = DryRun(self);
        work(&mut *guard.0)
    }

    /// Build a graph with `build`, allocate it with the persistent gallocr, write its inputs,
    /// run it, and read back the tensor `build` returns plus every capture it registered.
    pub fn compute<F>(&mut self, build: F) -> Result<Computed>
    where
        F: for<'g> FnOnce(&mut Graph<'g>) -> Result<Tensor<'g>>,
    {
        self.compute_sized(GRAPH_NODES, build)
    }

    /// [`Backend::compute`] for one of many small graphs run back to back (a decoder step:
    /// tens of microseconds of work each). On Windows it runs on one thread: there libgomp's
    /// threads meet at every op through kernel semaphores (no spinning, unlike Linux's futex
    /// barriers), a hand-off that costs more than such a graph's work on two threads saves
    /// (`scripts/bench_wine.sh`). Elsewhere, and for one thread, it is `compute`. The results
    /// are the same on any number of threads (each output element is computed by one thread).
    pub fn compute_step<F>(&mut self, build: F) -> Result<Computed>
    where
        F: for<'g> FnOnce(&mut Graph<'g>) -> Result<Tensor<'g>>,
    {
        if cfg!(windows) && self.n_threads > 1 {
            let n = self.n_threads;
            self.set_threads(1);
            let out = self.compute(build);
            self.set_threads(n);
            return out;
        }
        self.compute(build)
    }

    /// [`Backend::compute`] for a graph of up to `max_nodes` nodes (an encoder over a long file
    /// runs its blocks in many time slices). A graph that outgrows it is an error, never ggml's
    /// abort.
    pub fn compute_sized<F>(&mut self, max_nodes: usize, build: F) -> Result<Computed>
    where
        F: for<'g> FnOnce(&mut Graph<'g>) -> Result<Tensor<'g>>,
    {
        let max_nodes = max_nodes.max(GRAPH_NODES);
        let mut graph = Graph::new(max_nodes, self.lowering)?;
        let out = build(&mut graph)?;
        let out = graph.mark_output(out);
        // Nodes and leafs are each at most the tensors made in the graph's context plus the
        // weights it reads (a few thousand at most).
        let made = graph.tensors_made();
        if made + WEIGHT_LEAFS > max_nodes {
            bail!(
                Internal,
                "internal: a graph of {made} tensors exceeds its capacity of {max_nodes} nodes"
            );
        }
        let start = Instant::now();
        if self.sched.is_some() {
            let result = self.compute_scheduled(&mut graph, out, max_nodes)?;
            self.stats.device_compute_bytes = self.compute_buffers().0;
            self.stats.device_memory = self.device.memory();
            self.stats.graphs_computed += 1;
            self.stats.compute_time += start.elapsed();
            let bytes = self.compute_buffer_bytes();
            self.stats.compute_buffer_bytes = bytes;
            self.stats.peak_compute_buffer_bytes = self.stats.peak_compute_buffer_bytes.max(bytes);
            return Ok(result);
        }
        // SAFETY: the graph and all its tensors live in `graph`'s context (or in weight buffers
        // that outlive this call); tensors are only written after allocation.
        let result = unsafe {
            let gf = graph.finish(out);
            // The gallocr replays its last plan whenever a graph has as many nodes and leafs as
            // the previous one, even if they are different tensors (an input where a weight was:
            // a wild write). Re-plan every graph; the buffer itself only ever grows.
            if !sys::ggml_gallocr_reserve(self.galloc, gf)
                || !sys::ggml_gallocr_alloc_graph(self.galloc, gf)
            {
                bail!(
                    Internal,
                    "ggml: could not allocate the compute graph (out of memory?)"
                );
            }
            // A new (grown) buffer: ask for huge pages before anything touches it.
            let buffer = (*out.raw()).buffer;
            if !buffer.is_null() {
                let base = sys::ggml_backend_buffer_get_base(buffer) as usize;
                if base != self.advised_base {
                    self.advised_base = base;
                    advise_huge_pages(base, sys::ggml_backend_buffer_get_size(buffer));
                }
            }
            if self.dry_run {
                // Every page of the buffer written once now, not by the first real graph.
                if !buffer.is_null() {
                    sys::ggml_backend_buffer_clear(buffer, 0);
                }
                let (output, shape) = graph::read_f32(out.raw());
                return Ok(Computed {
                    output,
                    shape,
                    captures: graph.read_captures(),
                });
            }
            graph.upload_inputs();
            let hooked = self.hook.active();
            if hooked {
                let hook = &mut *self.hook;
                hook.done = 0;
                hook.total = computed_nodes(gf);
                if let Some(ends) = hook.ends.as_mut() {
                    ends.clear();
                    ends.reserve(hook.total + 1);
                    ends.push(Instant::now());
                }
                let data: *mut NodeHook = hook;
                sys::ggml_backend_cpu_set_abort_callback(
                    self.backend,
                    Some(node_done),
                    data.cast(),
                );
            }
            let status = sys::ggml_backend_graph_compute(self.backend, gf);
            if hooked {
                sys::ggml_backend_cpu_set_abort_callback(self.backend, None, std::ptr::null_mut());
                if let Some(ends) = &self.hook.ends {
                    add_node_times(gf, ends, &mut self.stats.op_times);
                }
            }
            if status != sys::GGML_STATUS_SUCCESS {
                bail!(Internal, "ggml: graph compute failed (status {status})");
            }
            let captures = graph.read_captures();
            let (output, shape) = graph::read_f32(out.raw());
            Computed {
                output,
                shape,
                captures,
            }
        };
        self.stats.graphs_computed += 1;
        self.stats.compute_time += start.elapsed();
        // SAFETY: galloc is live.
        let bytes = unsafe { sys::ggml_gallocr_get_buffer_size(self.galloc, 0) };
        self.stats.compute_buffer_bytes = bytes;
        self.stats.peak_compute_buffer_bytes = self.stats.peak_compute_buffer_bytes.max(bytes);
        Ok(result)
    }
}

impl Backend {
    /// [`Backend::compute_sized`] under the scheduler: it splits the graph between the device
    /// and the CPU, allocates both parts, and copies what crosses between them.
    fn compute_scheduled<'g>(
        &mut self,
        graph: &mut Graph<'g>,
        out: Tensor<'g>,
        max_nodes: usize,
    ) -> Result<Computed> {
        let need = sched_capacity(max_nodes);
        let Some(s) = self.sched.as_mut() else {
            bail!(Internal, "internal: no scheduler on this backend");
        };
        if s.capacity < need {
            // SAFETY: nothing is allocated from the old scheduler between computes; the
            // backends it ran on outlive it.
            unsafe {
                sys::ggml_backend_sched_free(s.sched);
                *s = Sched::new(self.backend, s.cpu, need);
            }
        }
        let sched = s.sched;
        // SAFETY: the graph's tensors live in its context or in buffers that outlive this call;
        // inputs are written after allocation, outputs read (ggml_backend_tensor_get: they may
        // live on the device) after the compute.
        unsafe {
            let gf = graph.finish(out);
            sys::ggml_backend_sched_reset(sched);
            if !sys::ggml_backend_sched_alloc_graph(sched, gf) {
                sys::ggml_backend_sched_reset(sched);
                return Err(self.device_error(crate::err!(
                    Internal,
                    "ggml: could not allocate the compute graph (out of memory?)"
                )));
            }
            self.count_placement(gf);
            if !self.dry_run {
                graph.upload_inputs();
                let status = sys::ggml_backend_sched_graph_compute(sched, gf);
                if status != sys::GGML_STATUS_SUCCESS {
                    sys::ggml_backend_sched_reset(sched);
                    return Err(self.device_error(crate::err!(
                        Internal,
                        "ggml: graph compute failed (status {status})"
                    )));
                }
            }
            let captures = graph.read_captures();
            let (output, shape) = graph::read_f32(out.raw());
            Ok(Computed {
                output,
                shape,
                captures,
            })
        }
    }

    /// Adds an allocated graph's placement to the stats: the nodes that run on the CPU
    /// fallback, by op, its split count, and the bytes of tensors read on a backend other than
    /// their own (each once: the scheduler copies a split input once per backend).
    ///
    /// # Safety
    /// `gf` was just allocated by this backend's scheduler.
    unsafe fn count_placement(&mut self, gf: *mut sys::ggml_cgraph) {
        let Some(s) = &self.sched else { return };
        let mut crossed = std::collections::HashSet::new();
        // SAFETY: per the contract; node pointers of an allocated graph are valid.
        unsafe {
            for i in 0..sys::ggml_graph_n_nodes(gf) {
                let node = sys::ggml_graph_node(gf, i);
                if !computes((*node).op) {
                    continue;
                }
                let on = sys::ggml_backend_sched_get_tensor_backend(s.sched, node);
                if on == s.cpu {
                    *self
                        .stats
                        .fallback_ops
                        .entry(cstr(sys::ggml_op_desc(node)))
                        .or_default() += 1;
                }
                for &src in (*node).src.iter().filter(|p| !p.is_null()) {
                    let from = sys::ggml_backend_sched_get_tensor_backend(s.sched, src);
                    if !from.is_null() && from != on && crossed.insert((src, on)) {
                        self.stats.crossed_bytes += sys::ggml_nbytes(src) as u64;
                    }
                }
            }
            self.stats.splits += sys::ggml_backend_sched_get_n_splits(s.sched).max(0) as u64;
        }
    }

    /// Hand the compute buffer back to the system when a long utterance grew it past
    /// `keep_bytes` (the gallocr's buffer otherwise only ever grows); the next compute
    /// allocates what it needs. Returns whether it was released.
    pub fn release_compute_buffer(&mut self, keep_bytes: usize) -> Result<bool> {
        if self.sched.is_some() {
            // The scheduler's buffers are sized by its last graph and kept.
            return Ok(false);
        }
        // SAFETY: galloc is live; no graph is in flight (we hold &mut self).
        let bytes = unsafe { sys::ggml_gallocr_get_buffer_size(self.galloc, 0) };
        if bytes <= keep_bytes {
            return Ok(false);
        }
        // SAFETY: a fresh allocator for the same buffer type replaces the old one, which is
        // freed once; results already read back live in host memory.
        unsafe {
            let buft = sys::ggml_backend_get_default_buffer_type(self.backend);
            let fresh = sys::ggml_gallocr_new(buft);
            if fresh.is_null() {
                bail!(Internal, "ggml: could not create the graph allocator");
            }
            sys::ggml_gallocr_free(self.galloc);
            self.galloc = fresh;
        }
        self.stats.compute_buffer_bytes = 0;
        Ok(true)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: the handles were created in `new` and are freed once, the scheduler before
        // the backends it runs on.
        unsafe {
            if let Some(s) = self.sched.take() {
                sys::ggml_backend_sched_free(s.sched);
                sys::ggml_backend_free(s.cpu);
            }
            sys::ggml_gallocr_free(self.galloc);
            sys::ggml_backend_free(self.backend);
        }
    }
}

/// A backend device known to ggml's registry.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub description: String,
    pub kind: &'static str,
}

/// Every device in ggml's backend registry (CPU here; GPU backends appear when compiled in).
pub fn devices() -> Vec<DeviceInfo> {
    // SAFETY: registry queries return static data owned by ggml.
    unsafe {
        (0..sys::ggml_backend_dev_count())
            .map(|i| {
                let dev = sys::ggml_backend_dev_get(i);
                let kind = match sys::ggml_backend_dev_type(dev) {
                    sys::GGML_BACKEND_DEVICE_TYPE_CPU => "cpu",
                    sys::GGML_BACKEND_DEVICE_TYPE_GPU => "gpu",
                    sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => "accel",
                    _ => "other",
                };
                DeviceInfo {
                    name: cstr(sys::ggml_backend_dev_name(dev)),
                    description: cstr(sys::ggml_backend_dev_description(dev)),
                    kind,
                }
            })
            .collect()
    }
}

/// What ggml's CPU backend was compiled to use, as its registry reports it (the list llama.cpp's
/// system info prints: `SSE3`, `AVX2`, `OPENMP`, `REPACK`, ... with their values). ggml's ops
/// outside our kernels (element-wise, softmax, small `mul_mat`) run on exactly these.
pub fn ggml_cpu_features() -> Vec<(String, String)> {
    // SAFETY: registry queries return static data owned by ggml; the feature list ends with a
    // null name, as ggml_backend_get_features_t documents.
    unsafe {
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        if dev.is_null() {
            return Vec::new();
        }
        let reg = sys::ggml_backend_dev_backend_reg(dev);
        let sym =
            sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_get_features".as_ptr());
        if sym.is_null() {
            return Vec::new();
        }
        let get: sys::ggml_backend_get_features_t = std::mem::transmute(sym);
        let Some(get) = get else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut f = get(reg);
        while !f.is_null() && !(*f).name.is_null() {
            out.push((cstr((*f).name), cstr((*f).value)));
            f = f.add(1);
        }
        out
    }
}

/// Quiet ggml's own logging: it prints buffer allocations at info level and, for a malformed
/// GGUF, its parser's view of the problem; every failure reaches the user as our own one-line
/// error naming the file instead. `PARAKEET_GGML_LOG=1` keeps ggml's messages for debugging.
pub fn silence_ggml_logs() {
    unsafe extern "C" fn quiet(
        _level: sys::ggml_log_level,
        text: *const std::os::raw::c_char,
        _: *mut std::os::raw::c_void,
    ) {
        if !text.is_null() && std::env::var_os("PARAKEET_GGML_LOG").is_some() {
            // SAFETY: ggml passes a NUL-terminated message.
            eprint!("{}", unsafe { cstr(text) });
        }
    }
    // SAFETY: installs a static callback.
    unsafe { sys::ggml_log_set(Some(quiet), std::ptr::null_mut()) };
}

/// ggml's tensor names hold at most 63 bytes.
pub(crate) const MAX_NAME: usize = 63;

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: per the contract above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
