//! The server's connections: accepted up to a cap, each with a deadline on its request heads,
//! and a shutdown that tells every connection and live stream to finish, waits for them up to
//! a deadline, and then gives up on whatever is left.
//!
//! axum's own `serve` has no read timeouts and no cap, so one silent client per descriptor
//! could hold the server; this loop drives hyper's HTTP/1 connections itself.

use axum::Router;
use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// How long connections may wait, and how many there may be.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request head must arrive within this (from the connection's start or the previous
    /// response); request bodies and a live stream's events have the same bound per read or write.
    pub io_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// After the shutdown signal, the most time given to requests and streams in flight.
    pub shutdown_deadline: Duration,
}

/// A connection's place under `--max-connections`. Every request carries it (as an extension),
/// so that a live stream, which outlives its HTTP connection once upgraded, keeps holding it.
#[derive(Clone, Debug)]
pub struct ConnSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// What every connection and live stream holds: the shutdown signal, and (by being alive) a
/// claim that the server waits for on shutdown.
#[derive(Clone, Debug)]
pub struct Drain {
    signal: StopSignal,
    _alive: mpsc::Sender<()>,
}

/// The shutdown signal alone, for what the server need not wait for (its shared state).
#[derive(Clone, Debug)]
pub struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    /// Resolves once the shutdown has begun (never, if its control is gone without signalling).
    pub async fn stopped(&mut self) {
        if self.0.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    pub fn is_stopped(&self) -> bool {
        *self.0.borrow()
    }
}

/// The server's side of [`Drain`]: signals the shutdown and waits for the drains to go.
pub struct DrainControl {
    stop: watch::Sender<bool>,
    alive: mpsc::Receiver<()>,
}

impl Drain {
    pub fn new() -> (DrainControl, Drain) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (alive_tx, alive_rx) = mpsc::channel(1);
        (
            DrainControl {
                stop: stop_tx,
                alive: alive_rx,
            },
            Drain {
                signal: StopSignal(stop_rx),
                _alive: alive_tx,
            },
        )
    }

    /// Resolves once the shutdown has begun.
    pub async fn stopped(&mut self) {
        self.signal.stopped().await;
    }

    pub fn is_stopped(&self) -> bool {
        self.signal.is_stopped()
    }

    /// The signal without the claim.
    pub fn signal(&self) -> StopSignal {
        self.signal.clone()
    }
}

impl DrainControl {
    /// Tells every drain that the server is shutting down.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until every [`Drain`] is dropped, at most `deadline`; true if they all were.
    pub async fn wait(mut self, deadline: Duration) -> bool {
        tokio::time::timeout(deadline, self.alive.recv())
            .await
            .is_ok()
    }
}

/// Accepts connections on `listener` and serves `app` on them until `signal` resolves, then
/// shuts down within the deadline. Returns true if every connection and stream finished in
/// time, false if some were still running (the caller then must not wait for their work).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    control: DrainControl,
    drain: Drain,
    signal: impl Future<Output = ()>,
) -> bool {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(signal);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors (or a connection reset before it was accepted): wait
                    // a moment for connections to close instead of spinning.
                    if !matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) {
                        eprintln!("parakeet serve: cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(tcp, limits.max_connections));
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let mut drain = drain.clone();
        let app = app.clone();
        let slot = ConnSlot(Arc::new(slot));
        tokio::spawn(async move {
            let app = TowerToHyperService::new(app);
            let service = service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(slot.clone());
                app.call(request)
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.io_timeout)
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                () = drain.stopped() => {}
            }
            // Finish the request in flight (if any), then close.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    drop(app);
    control.stop();
    drop(drain);
    control.wait(limits.shutdown_deadline).await
}

/// Answers a connection over the cap with a 503 and closes it; bounded in time, whatever the
/// client does.
async fn refuse(mut tcp: TcpStream, cap: usize) {
    let body = format!(
        r#"{{"error":{{"message":"the server is busy: {cap} connections are open (--max-connections)","type":"server_error","param":null,"code":"server_busy"}}}}"#
    );
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(body.as_bytes()).await?;
        tcp.shutdown().await
    })
    .await;
}
