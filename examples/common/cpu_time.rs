//! Process CPU time for the benchmarks (included with `#[path]`, not an example itself).

/// CPU seconds of the whole process (every thread): on a shared machine it counts the work
/// done, free of the time other processes take the cores (report wall time beside it).
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Minor page faults of the whole process so far (fresh memory touched for the first time).
#[allow(dead_code)]
pub fn minor_faults() -> i64 {
    // SAFETY: getrusage writes the rusage it is given.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt
    }
}
