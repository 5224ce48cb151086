//! Ending the process from a thread other than the one computing.

/// Ends the process now with `code`, as `_exit` does: no `atexit` handlers and no C++ static
/// destructors run. `std::process::exit` runs them, and when a signal handler's thread exits
/// while the main thread is inside a ggml graph, ggml's and libgomp's destructors tear down
/// state that the computing threads still use (an occasional SIGSEGV instead of the signal's
/// exit code). Standard output is not flushed: it is line-buffered, so only a line still
/// being written is lost, and taking its lock could wait forever on a thread blocked writing.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` takes any status and never returns; it only ends the process (open
    // files are closed by the kernel), so nothing of ours is left half-used.
    unsafe { libc::_exit(code) }
}
