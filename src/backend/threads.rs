//! Compute threads as one checked value, which every runner of graphs (a session, speech
//! detection, a diarizer) takes.

use crate::error::{Error, Result};
use std::num::NonZeroUsize;

/// Compute threads: at least one and at most the available cores (threads beyond the cores
/// only fight over them; 10,000 of them never finish a 2 s clip, or fail to start at all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threads(NonZeroUsize);

impl Threads {
    /// One thread (a small model's runner: speech detection beside a stream).
    pub const ONE: Threads = Threads(NonZeroUsize::MIN);

    /// `n` threads: 0 is refused; more than the cores are the cores.
    pub fn new(n: usize) -> Result<Threads> {
        let n = NonZeroUsize::new(n)
            .ok_or_else(|| Error::Options("--threads 0: at least 1 thread is needed".into()))?;
        Ok(Threads(n.min(cores())))
    }

    /// The front ends' policy: `None` is every core; 0 is refused; more than the cores is
    /// the cores, with a warning to show once.
    pub fn resolve(requested: Option<usize>) -> Result<(Threads, Option<String>)> {
        let cores = cores();
        match requested {
            None => Ok((Threads(cores), None)),
            Some(n) if n > cores.get() => Ok((
                Threads(cores),
                Some(format!(
                    "--threads {n} is more than the {cores} available cores; using {cores}"
                )),
            )),
            Some(n) => Ok((Threads::new(n)?, None)),
        }
    }

    /// All available cores.
    pub fn all() -> Threads {
        Threads(cores())
    }

    pub fn get(self) -> usize {
        self.0.get()
    }
}

fn cores() -> NonZeroUsize {
    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_refuse_zero_and_cap_at_the_cores() {
        let cores = cores().get();
        assert!(matches!(Threads::new(0), Err(Error::Options(m)) if m.contains("--threads 0")));
        assert_eq!(Threads::new(1).unwrap().get(), 1);
        assert_eq!(Threads::new(cores + 1).unwrap().get(), cores);
        let (t, warning) = Threads::resolve(Some(10_000)).unwrap();
        assert_eq!(t.get(), cores);
        assert!(warning.unwrap().contains("--threads 10000"));
        assert_eq!(Threads::resolve(None).unwrap(), (Threads::all(), None));
        assert!(Threads::resolve(Some(0)).is_err());
    }
}
