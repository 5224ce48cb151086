//! Ctrl-C (SIGINT) and SIGTERM (on Windows: Ctrl-C, Ctrl-Break, the console closing) for the
//! commands that end cleanly on them: `transcribe` removes the output it was writing before it
//! exits, `stream` finishes the utterance in progress.

use crate::error::{Context, Result};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Set by [`stop_on_signal`] once a signal came.
static STOP: AtomicBool = AtomicBool::new(false);
/// The exit code the signal calls for (0: none yet).
static CODE: AtomicU8 = AtomicU8::new(0);

/// The exit code of a command ended by a signal, as a shell reports a process it killed
/// (128 + the signal's number): 130 for SIGINT, 143 for SIGTERM.
pub const SIGINT_EXIT: u8 = 130;
pub const SIGTERM_EXIT: u8 = 143;

/// From now on SIGINT and SIGTERM no longer kill the process: at the first, `on_signal` runs
/// on a thread of its own with the exit code the signal calls for; a second one ends the
/// process at once (someone pressing Ctrl-C again does not want to wait).
pub fn on_signal(on_signal: impl FnOnce(u8) + Send + 'static) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal handler")?;
    // The handlers are in place before this returns: a signal from now on is caught.
    let mut signals = {
        let _inside = runtime.enter();
        Signals::new().context("cannot install the signal handlers")?
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let code = runtime.block_on(signals.next());
            CODE.store(code, Ordering::SeqCst);
            STOP.store(true, Ordering::SeqCst);
            let again = std::thread::spawn(move || {
                let code = runtime.block_on(signals.next());
                crate::backend::exit_now(code.into());
            });
            on_signal(code);
            let _ = again.join();
        })
        .context("cannot start the signal handler")?;
    Ok(())
}

/// A flag that turns true when SIGINT or SIGTERM comes (after [`on_signal`]).
pub fn stop_flag() -> &'static AtomicBool {
    &STOP
}

/// The exit code of the signal that came, if one did.
pub fn received() -> Option<u8> {
    match CODE.load(Ordering::SeqCst) {
        0 => None,
        code => Some(code),
    }
}

#[cfg(unix)]
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) -> u8 {
        tokio::select! {
            _ = self.interrupt.recv() => SIGINT_EXIT,
            _ = self.terminate.recv() => SIGTERM_EXIT,
        }
    }
}

/// Windows: Ctrl-C, Ctrl-Break, and the console window closing (or the user logging off, the
/// system shutting down). For the last three Windows ends the process once the handler
/// returns, and tokio's handler does not return: the process has the few seconds Windows gives
/// it to remove its temp files and exit, as after SIGTERM.
#[cfg(windows)]
struct Signals {
    interrupt: tokio::signal::windows::CtrlC,
    brk: tokio::signal::windows::CtrlBreak,
    close: tokio::signal::windows::CtrlClose,
    logoff: tokio::signal::windows::CtrlLogoff,
    shutdown: tokio::signal::windows::CtrlShutdown,
}

#[cfg(windows)]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::windows;
        Ok(Signals {
            interrupt: windows::ctrl_c()?,
            brk: windows::ctrl_break()?,
            close: windows::ctrl_close()?,
            logoff: windows::ctrl_logoff()?,
            shutdown: windows::ctrl_shutdown()?,
        })
    }

    async fn next(&mut self) -> u8 {
        tokio::select! {
            _ = self.interrupt.recv() => SIGINT_EXIT,
            _ = self.brk.recv() => SIGINT_EXIT,
            _ = self.close.recv() => SIGTERM_EXIT,
            _ = self.logoff.recv() => SIGTERM_EXIT,
            _ = self.shutdown.recv() => SIGTERM_EXIT,
        }
    }
}

#[cfg(not(any(unix, windows)))]
struct Signals;

#[cfg(not(any(unix, windows)))]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    async fn next(&mut self) -> u8 {
        let _ = tokio::signal::ctrl_c().await;
        SIGINT_EXIT
    }
}
