//! What `--profile` prints beside each command's own stages: the backend's graphs, compute
//! buffer and peak memory, and the graph nodes' time by kind.

use std::time::Duration;

use crate::backend::Stats;

/// The backend's counters (graphs, peak compute buffer, peak RSS) and its node times by kind.
pub fn print_backend(stats: &Stats) {
    eprintln!(
        "graphs computed {}, peak compute buffer {:.1} MiB, peak RSS {}",
        stats.graphs_computed,
        stats.peak_compute_buffer_bytes as f64 / (1 << 20) as f64,
        crate::backend::peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.1} MiB",
            b as f64 / (1 << 20) as f64
        ))
    );
    print_device(stats);
    print_op_times(&stats.op_times);
}

/// Which device ran; on a device, its memory, what fell back to the CPU and what crossed.
fn print_device(stats: &Stats) {
    eprintln!("device {}", stats.device);
    if !stats.on_device {
        return;
    }
    let mib = crate::backend::device::mib;
    let (free, total) = stats.device_memory;
    eprintln!(
        "device memory: weights {}, compute buffer {}, {} free of {}",
        mib(stats.device_weight_bytes),
        mib(stats.device_compute_bytes),
        mib(free),
        mib(total)
    );
    eprintln!(
        "{} graph splits, {} crossed between the device and the CPU",
        stats.splits,
        mib(stats.crossed_bytes as usize)
    );
    if stats.fallback_ops.is_empty() {
        eprintln!("no op fell back to the CPU");
    } else {
        let ops: Vec<String> = stats
            .fallback_ops
            .iter()
            .map(|(op, n)| format!("{op} x{n}"))
            .collect();
        eprintln!("ran on the CPU (the device lacks them): {}", ops.join(", "));
    }
}

/// The graph nodes' time by kind (every graph of the run together), largest first.
fn print_op_times(times: &std::collections::BTreeMap<String, (Duration, u64)>) {
    let total: Duration = times.values().map(|(d, _)| *d).sum();
    if total.is_zero() {
        return;
    }
    let mut rows: Vec<_> = times.iter().collect();
    rows.sort_by_key(|(_, (d, _))| std::cmp::Reverse(*d));
    eprintln!(
        "graph nodes by kind (a node's time includes waiting for the previous one's threads)"
    );
    for (label, (d, n)) in rows {
        eprintln!(
            "  {:>9.1} ms {:>5.1} % {:>6} x  {label}",
            d.as_secs_f64() * 1e3,
            100.0 * d.as_secs_f64() / total.as_secs_f64(),
            n
        );
    }
}
