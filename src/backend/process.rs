//! The process itself, as each system tells it: ending it from a thread other than the one
//! computing, whether another process still runs, its peak memory.

/// Ends the process now with `code`, as `_exit` does: no `atexit` handlers and no C++ static
/// destructors run. `std::process::exit` runs them, and when a signal handler's thread exits
/// while the main thread is inside a ggml graph, ggml's and libgomp's destructors tear down
/// state that the computing threads still use (an occasional SIGSEGV instead of the signal's
/// exit code). Standard output is not flushed: it is line-buffered, so only a line still
/// being written is lost, and taking its lock could wait forever on a thread blocked writing.
pub fn exit_now(code: i32) -> ! {
    #[cfg(target_os = "linux")]
    // SAFETY: `_exit` takes any status and never returns; it only ends the process (open
    // files are closed by the kernel), so nothing of ours is left half-used.
    unsafe {
        libc::_exit(code)
    }
    #[cfg(windows)]
    {
        use windows_sys::Win32::System::Threading::{GetCurrentProcess, TerminateProcess};
        // SAFETY: the pseudo handle of this process is always valid; TerminateProcess on it
        // ends every thread at once (no DLL detach, no C++ destructors: Windows' `_exit`).
        // Windows reads the exit code as unsigned: a negative code keeps its bits.
        unsafe {
            TerminateProcess(GetCurrentProcess(), code as u32);
        }
        // Not reached; the type system does not know TerminateProcess on ourselves returns
        // only on failure, which for our own process it does not.
        std::process::abort()
    }
    #[cfg(not(any(target_os = "linux", windows)))]
    std::process::exit(code)
}

/// Whether a process with this id runs now (unknown: assumed running, so nothing of it is
/// touched). On Linux `/proc` tells, on Windows `OpenProcess`; elsewhere unknown.
pub fn process_running(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        if !std::path::Path::new("/proc/self").exists() {
            return true;
        }
        std::path::Path::new("/proc").join(pid.to_string()).exists()
    }
    #[cfg(windows)]
    {
        use windows_sys::Win32::Foundation::{
            CloseHandle, ERROR_INVALID_PARAMETER, GetLastError, STILL_ACTIVE,
        };
        use windows_sys::Win32::System::Threading::{
            GetExitCodeProcess, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
        };
        // SAFETY: OpenProcess takes any id and returns null on failure; the handle it gives
        // is used once and closed here.
        unsafe {
            let handle = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
            if handle.is_null() {
                // No such process; any other failure (another user's process: access
                // denied) leaves it running.
                return GetLastError() != ERROR_INVALID_PARAMETER;
            }
            let mut code = 0u32;
            let ok = GetExitCodeProcess(handle, &mut code);
            CloseHandle(handle);
            // A process that ended but whose handle someone still holds is not running.
            ok == 0 || code == STILL_ACTIVE as u32
        }
    }
    #[cfg(not(any(target_os = "linux", windows)))]
    {
        let _ = pid;
        true
    }
}

/// The process's peak resident memory in bytes, where the system reports it: `VmHWM` on
/// Linux, the peak working set on Windows.
pub fn peak_rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
    #[cfg(windows)]
    {
        use windows_sys::Win32::System::ProcessStatus::{
            GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS,
        };
        use windows_sys::Win32::System::Threading::GetCurrentProcess;
        let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
        // SAFETY: an all-zero PROCESS_MEMORY_COUNTERS is a valid value (plain integers).
        let mut counters: PROCESS_MEMORY_COUNTERS = unsafe { std::mem::zeroed() };
        counters.cb = size;
        // SAFETY: the pseudo handle of this process is always valid, and `counters` is a
        // writable struct of the size given.
        let ok = unsafe { GetProcessMemoryInfo(GetCurrentProcess(), &mut counters, size) };
        (ok != 0).then_some(counters.PeakWorkingSetSize as u64)
    }
    #[cfg(not(any(target_os = "linux", windows)))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_has_a_peak() {
        assert!(process_running(std::process::id()));
        #[cfg(any(target_os = "linux", windows))]
        {
            let peak = peak_rss_bytes().expect("peak memory");
            // More than the code itself, less than the machine.
            assert!(peak > 1 << 20 && peak < 1 << 40, "{peak}");
        }
    }

    #[test]
    fn an_ended_child_is_not_running() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--list")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        child.wait().unwrap();
        // Reaped (Linux) and its handle closed (Windows): the id names no process now,
        // unless the system gave it to a new one in between (unlikely within the test).
        assert!(!process_running(pid));
    }
}
