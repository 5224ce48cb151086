//! A fixed set of worker threads, each owning its own state (for the server: a `Session`
//! with its own backend and graph allocator over the one shared model), fed from a bounded
//! queue. Jobs run under `catch_unwind`, so a panic answers its own request and the worker goes
//! on with fresh state.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// Why a job was not run or did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobFailure {
    /// Every worker is busy and the queue is full (or the pool is shutting down).
    Busy,
    /// The job panicked; the message is the panic's payload when it was a string.
    Panicked(String),
}

/// A job wrapped for a worker: runs it on the state, lets the worker renew the state (the
/// `bool` says whether the job panicked), then sends the reply.
type Task<S> = Box<dyn FnOnce(&mut S, &dyn Fn(&mut S, bool)) + Send>;

/// Counters shared with the request side (`/health`).
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Jobs accepted and not yet started.
    pub queued: AtomicUsize,
    /// Jobs running now.
    pub busy: AtomicUsize,
    /// Jobs accepted and not yet answered (queued + running, counted out before the reply).
    accepted: AtomicUsize,
}

pub struct Pool<S> {
    tx: Option<Sender<Task<S>>>,
    /// Jobs accepted at most at once: the workers' plus the queue's.
    capacity: usize,
    handles: Vec<JoinHandle<()>>,
    pub counters: Arc<PoolCounters>,
}

impl<S: 'static> Pool<S> {
    /// `workers` threads, each building its state with `make(worker_index)` (creation errors are
    /// returned before any thread runs). At most `queue` jobs wait beyond the running ones.
    /// After each job, `recycle(&state)` says whether the state should be rebuilt (for the
    /// server: its compute buffer grew past a threshold); it is always rebuilt after a panic.
    pub fn new<M, R>(
        workers: usize,
        queue: usize,
        make: M,
        recycle: R,
    ) -> crate::error::Result<Pool<S>>
    where
        M: Fn(usize) -> crate::error::Result<S> + Send + Sync + 'static,
        R: Fn(usize, &S) -> bool + Send + Sync + 'static,
        S: Send,
    {
        // Unbounded: `submit` admits at most `capacity` jobs, counted until they are answered
        // (a channel's own bound would count a job out when a worker takes it, and refuse a
        // client that sends its next request just before the worker is back to waiting).
        let (tx, rx) = channel::<Task<S>>();
        let workers = workers.max(1);
        let rx = Arc::new(Mutex::new(rx));
        let make = Arc::new(make);
        let recycle = Arc::new(recycle);
        let counters = Arc::new(PoolCounters::default());
        let states = (0..workers)
            .map(|i| make(i))
            .collect::<crate::error::Result<Vec<S>>>()?;
        let handles = states
            .into_iter()
            .enumerate()
            .map(|(i, state)| {
                let (rx, make, recycle) = (rx.clone(), make.clone(), recycle.clone());
                std::thread::Builder::new()
                    .name(format!("worker-{i}"))
                    .spawn(move || worker(i, state, &rx, &*make, &*recycle))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Pool {
            tx: Some(tx),
            capacity: workers + queue,
            handles,
            counters,
        })
    }

    /// Queue `job`; the receiver yields its result, or why it did not complete. Fails at once
    /// with [`JobFailure::Busy`] when the queue is full.
    pub fn submit<T, F>(
        &self,
        job: F,
    ) -> Result<oneshot::Receiver<Result<T, JobFailure>>, JobFailure>
    where
        T: Send + 'static,
        F: FnOnce(&mut S) -> T + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let counters = self.counters.clone();
        let task: Task<S> = Box::new(move |state: &mut S, renew: &dyn Fn(&mut S, bool)| {
            counters.queued.fetch_sub(1, Ordering::SeqCst);
            if reply.is_closed() {
                // The requester went away while the job waited (its client closed the
                // connection): nobody would read the result.
                counters.accepted.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            counters.busy.fetch_add(1, Ordering::SeqCst);
            let result = catch_unwind(AssertUnwindSafe(|| job(state)));
            // Before replying, so that a client holding its answer finds the worker ready.
            renew(state, result.is_err());
            counters.busy.fetch_sub(1, Ordering::SeqCst);
            counters.accepted.fetch_sub(1, Ordering::SeqCst);
            // The requester may have gone away (client closed the connection): nothing to do.
            let _ = reply.send(result.map_err(|p| JobFailure::Panicked(panic_message(&*p))));
        });
        let tx = self.tx.as_ref().ok_or(JobFailure::Busy)?;
        let c = &self.counters;
        c.accepted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .map_err(|_| JobFailure::Busy)?;
        c.queued.fetch_add(1, Ordering::SeqCst);
        if tx.send(task).is_err() {
            // No worker left (cannot happen while `tx` is held, as workers only stop on its drop).
            c.queued.fetch_sub(1, Ordering::SeqCst);
            c.accepted.fetch_sub(1, Ordering::SeqCst);
            return Err(JobFailure::Busy);
        }
        Ok(rx)
    }

    /// Stop taking jobs, let the workers finish what is queued, and wait for them.
    pub fn shutdown(&mut self) {
        self.tx = None;
        for h in self.handles.drain(..) {
            // A worker thread never panics itself (jobs are caught); nothing to report.
            let _ = h.join();
        }
    }
}

impl<S> Drop for Pool<S> {
    fn drop(&mut self) {
        self.tx = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker<S>(
    index: usize,
    mut state: S,
    rx: &Mutex<Receiver<Task<S>>>,
    make: &dyn Fn(usize) -> crate::error::Result<S>,
    recycle: &dyn Fn(usize, &S) -> bool,
) {
    loop {
        // The lock is held only while waiting for a job, never while running one, so it is
        // never poisoned by a job's panic; a poisoned lock still hands out the receiver.
        let task = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.recv()
        };
        let Ok(task) = task else {
            return; // the pool is shutting down and the queue is empty
        };
        task(&mut state, &|state: &mut S, panicked: bool| {
            if panicked || recycle(index, state) {
                match make(index) {
                    Ok(fresh) => *state = fresh,
                    Err(e) => {
                        eprintln!("worker {index}: cannot rebuild its state ({e:#}); keeping it")
                    }
                }
            }
        });
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::time::Duration;

    fn block_on<T>(rx: oneshot::Receiver<T>) -> T {
        rx.blocking_recv().expect("worker dropped the reply")
    }

    #[test]
    fn a_queued_job_whose_requester_left_is_skipped() {
        let pool = Pool::new(1, 4, |_| Ok(()), |_, _| false).unwrap();
        let gate = Arc::new(Barrier::new(2));
        let g = gate.clone();
        let first = pool.submit(move |_: &mut ()| {
            g.wait();
        });
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let gone = pool.submit(move |_: &mut ()| {
            r.fetch_add(1, Ordering::SeqCst);
        });
        // The second requester goes away while its job waits behind the first.
        drop(gone.unwrap());
        gate.wait();
        block_on(first.unwrap()).unwrap();
        let after = pool.submit(|_: &mut ()| 7);
        assert_eq!(block_on(after.unwrap()), Ok(7));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(pool.counters.accepted.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_panicking_job_fails_alone_and_the_worker_goes_on_with_fresh_state() {
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        // State: how many jobs this state has run.
        let pool = Pool::new(
            1,
            4,
            move |_| {
                m.fetch_add(1, Ordering::SeqCst);
                Ok(0usize)
            },
            |_, _| false,
        )
        .unwrap();
        let r = pool.submit(|n: &mut usize| {
            *n += 1;
            *n
        });
        assert_eq!(block_on(r.unwrap()), Ok(1));
        let r = pool.submit(|_: &mut usize| -> usize { panic!("boom in a job") });
        assert_eq!(
            block_on(r.unwrap()),
            Err(JobFailure::Panicked("boom in a job".into()))
        );
        // The state was rebuilt after the panic: the count starts again.
        let r = pool.submit(|n: &mut usize| {
            *n += 1;
            *n
        });
        assert_eq!(block_on(r.unwrap()), Ok(1));
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn state_is_rebuilt_when_recycle_says_so() {
        // State: a buffer; a job grows it; recycle when it is over 100 bytes.
        let pool = Pool::new(
            1,
            4,
            |_| Ok(Vec::<u8>::new()),
            |_, buf: &Vec<u8>| buf.len() > 100,
        )
        .unwrap();
        let grow = |n: usize| {
            move |buf: &mut Vec<u8>| {
                let before = buf.len();
                buf.resize(before + n, 0);
                before
            }
        };
        assert_eq!(block_on(pool.submit(grow(50)).unwrap()), Ok(0));
        assert_eq!(block_on(pool.submit(grow(60)).unwrap()), Ok(50));
        // 110 bytes > 100: released before this job.
        assert_eq!(block_on(pool.submit(grow(1)).unwrap()), Ok(0));
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_accepts_again_later() {
        let gate = Arc::new(Barrier::new(2));
        let pool = Pool::new(1, 1, |_| Ok(()), |_, _| false).unwrap();
        let g = gate.clone();
        // Occupies the worker until the test passes the barrier.
        let running = pool.submit(move |_: &mut ()| g.wait()).unwrap();
        while pool.counters.busy.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let queued = pool.submit(|_: &mut ()| 7).unwrap();
        assert_eq!(pool.counters.queued.load(Ordering::SeqCst), 1);
        assert_eq!(pool.submit(|_: &mut ()| 8).unwrap_err(), JobFailure::Busy);
        gate.wait();
        assert!(block_on(running).is_ok());
        assert_eq!(block_on(queued), Ok(7));
        assert_eq!(block_on(pool.submit(|_: &mut ()| 9).unwrap()), Ok(9));
    }

    #[test]
    fn a_client_holding_its_answer_finds_its_slot_free() {
        // No queue: back-to-back jobs are never refused, however fast the next one comes.
        let pool = Pool::new(1, 0, |_| Ok(()), |_, _| false).unwrap();
        for i in 0..200 {
            assert_eq!(block_on(pool.submit(move |_: &mut ()| i).unwrap()), Ok(i));
        }
    }

    #[test]
    fn shutdown_finishes_queued_jobs() {
        let mut pool = Pool::new(2, 8, |_| Ok(()), |_, _| false).unwrap();
        let rxs: Vec<_> = (0..6)
            .map(|i| {
                pool.submit(move |_: &mut ()| {
                    std::thread::sleep(Duration::from_millis(5));
                    i
                })
                .unwrap()
            })
            .collect();
        pool.shutdown();
        let got: Vec<_> = rxs.into_iter().map(block_on).collect();
        assert_eq!(got, (0..6).map(Ok).collect::<Vec<_>>());
        assert_eq!(pool.submit(|_: &mut ()| 0).unwrap_err(), JobFailure::Busy);
    }
}
