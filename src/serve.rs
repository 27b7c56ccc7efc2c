//! One HTTP/1.1 accept loop for every listener (the extender's verbs, its metrics port, the
//! webhook), so each gets the same limits: a client that sends half a request, or holds a
//! connection open and says nothing, or opens thousands of them, costs a bounded amount and never
//! stops the process from exiting.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::flags::parse_duration;

/// The connection limits, shared by `peakfit extender`, `peakfit webhook` and the agent's `/metrics`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// How long a connection may take to send a request's headers, counted from the end of the
    /// previous reply: it is also how long an idle kept-alive connection stays open (hyper
    /// measures both with one timer). kube-scheduler and the API server reconnect when an idle
    /// connection was closed.
    #[arg(long, env = "PEAKFIT_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have; a slower one gets a
    /// 408 and its connection is closed.
    #[arg(long, env = "PEAKFIT_BODY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// On SIGTERM, how long requests already being served may take to finish; the process then
    /// exits, dropping what is left (kube-scheduler retries).
    #[arg(long, env = "PEAKFIT_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// Open connections served at once on each listener; further clients wait in the kernel's
    /// accept queue. Each costs a file descriptor and a task.
    #[arg(long, env = "PEAKFIT_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_connections: u32,
    /// Open connections one peer address may hold on each listener; a further one is closed at
    /// once. 512 idle connections from one client filled every slot and delayed admissions past
    /// the API server's 5 s (issue 24). Loopback peers (the pod's own containers, e.g.
    /// kube-scheduler beside the extender) are not limited.
    #[arg(long, env = "PEAKFIT_MAX_CONNECTIONS_PER_PEER", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_connections_per_peer: u32,
    /// How long a new connection may take, from accept, to complete its TLS handshake (the
    /// webhook) and send its first request's headers; else it is closed. Later requests on a
    /// kept-alive connection have --idle-timeout.
    #[arg(long, env = "PEAKFIT_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// An address serving only the health probes (`/healthz`, and `/readyz` where the server
    /// has one), plain HTTP, for the kubelet. Every other listener can be filled by the clients
    /// the network policy admits (scrapers, the API server, any pod when the policy is off); this
    /// one is admitted to nobody by the chart's policy, has its own few connection slots, and
    /// so answers the kubelet while the others are full (issue 24: 64 idle connections to the
    /// agent failed its liveness probe three times). Off unless set.
    #[arg(long, env = "PEAKFIT_PROBE_LISTEN")]
    pub probe_listen: Option<std::net::SocketAddr>,
}

/// Connections the probe listener serves at once: the kubelet runs a container's probes one
/// at a time per probe kind (liveness, readiness, startup), so a handful is plenty.
pub const PROBE_CONNECTIONS: u32 = 8;

impl Default for ServeArgs {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(10),
            max_connections: 512,
            max_connections_per_peer: 64,
            header_timeout: Duration::from_secs(5),
            probe_listen: None,
        }
    }
}

/// `GET /healthz` answering `ok` while the process serves: the liveness probe of the agent and
/// the webhook, on their main listener and on `--probe-listen`.
pub fn liveness_router() -> Router {
    Router::new().route("/healthz", axum::routing::get(|| async { "ok" }))
}

/// Binds `--probe-listen` (when set) and serves `app`, the server's health routes only, there
/// until `shutdown`: [`serve`] under the same timeouts with [`PROBE_CONNECTIONS`] slots.
///
/// # Errors
/// When the address cannot be bound.
pub async fn spawn_probes(
    args: &ServeArgs,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    use anyhow::Context as _;
    let Some(addr) = args.probe_listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --probe-listen {addr}"))?;
    tracing::info!(listen = %listener.local_addr()?, "serving the health probes");
    let limits = ServeArgs {
        max_connections: PROBE_CONNECTIONS,
        max_connections_per_peer: PROBE_CONNECTIONS,
        probe_listen: None,
        ..args.clone()
    };
    Ok(Some(tokio::spawn(async move {
        serve(listener, plain, app, &limits, shutdown).await;
    })))
}

/// Serves `app` on every connection `listener` accepts (after `handshake`, e.g. TLS) until
/// `shutdown` completes; then stops accepting, lets requests in progress finish for up to
/// `args.shutdown_timeout`, and returns, abandoning whatever is still open.
pub async fn serve<IO, F, H>(
    listener: TcpListener,
    handshake: H,
    app: Router,
    args: &ServeArgs,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(TcpStream) -> F + Clone + Send + 'static,
    F: Future<Output = Option<IO>> + Send,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(args.max_connections as usize));
    let peers = Arc::new(Peers::new(args.max_connections_per_peer as usize));
    let (draining_tx, draining) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        // Waiting for a slot before accepting leaves excess clients in the kernel's backlog
        // instead of holding a descriptor and a task for each.
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, usually: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(peer_slot) = peers.admit(peer.ip()) else {
            tracing::debug!(%peer, "peer holds its --max-connections-per-peer; closing");
            continue;
        };
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let service = Noting {
            inner: TowerToHyperService::new(app.clone()),
            started: started.clone(),
            peer,
        };
        let handshake = handshake.clone();
        let mut draining = draining.clone();
        let idle = args.idle_timeout;
        let deadline = tokio::time::Instant::now() + args.header_timeout;
        tokio::spawn(async move {
            let (_permit, _peer_slot) = (permit, peer_slot);
            let Ok(Some(io)) = tokio::time::timeout_at(deadline, handshake(stream)).await else {
                return;
            };
            let conn = hyper::server::conn::http1::Builder::new()
                // Without a timer hyper silently drops its header-read timeout.
                .timer(TokioTimer::new())
                .header_read_timeout(idle)
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let first_headers = tokio::time::sleep_until(deadline);
            tokio::pin!(first_headers);
            let mut waiting_first = true;
            let result = loop {
                tokio::select! {
                    r = conn.as_mut() => break r,
                    () = async { drop(draining.wait_for(|d| *d).await) } => {
                        // Finish the request in progress (if any), then close.
                        conn.as_mut().graceful_shutdown();
                        break conn.await;
                    }
                    () = &mut first_headers, if waiting_first => {
                        if !started.load(std::sync::atomic::Ordering::Acquire) {
                            tracing::debug!(%peer, "no request within --header-timeout; closing");
                            return;
                        }
                        waiting_first = false;
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = draining_tx.send(true);
    let open = args.max_connections as usize - slots.available_permits();
    if open > 0 {
        tracing::info!(
            connections = open,
            deadline = ?args.shutdown_timeout,
            "waiting for requests in progress"
        );
    }
    let all = slots.acquire_many(args.max_connections);
    if tokio::time::timeout(args.shutdown_timeout, all)
        .await
        .is_err()
    {
        tracing::warn!(
            connections = args.max_connections as usize - slots.available_permits(),
            "shutdown deadline passed; dropping the connections still open"
        );
    }
}

/// The connections each peer address holds on one listener, within a cap.
struct Peers {
    cap: usize,
    open: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl Peers {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            open: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// A slot for one more connection of `ip`, or `None` when it holds the cap (loopback is
    /// not counted: only this pod's own containers reach it).
    fn admit(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PeerSlot> {
        if ip.is_loopback() {
            return Some(PeerSlot(None));
        }
        let mut open = self.open.lock();
        let n = open.entry(ip).or_default();
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(PeerSlot(Some((self.clone(), ip))))
    }
}

/// One connection's place in its peer's count, given back on drop.
struct PeerSlot(Option<(Arc<Peers>, std::net::IpAddr)>);

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some((peers, ip)) = &self.0 {
            let mut open = peers.open.lock();
            if let Some(n) = open.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(ip);
                }
            }
        }
    }
}

/// The address a request came from, in its extensions: handlers that ration something per
/// client (`/metrics`) read it.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

/// The connection's service, noting that a request arrived (its headers were read): until then
/// the connection has --header-timeout from accept. It also tells the request its [`Peer`].
struct Noting<S> {
    inner: S,
    started: Arc<std::sync::atomic::AtomicBool>,
    peer: std::net::SocketAddr,
}

impl<S: hyper::service::Service<http::Request<B>>, B> hyper::service::Service<http::Request<B>>
    for Noting<S>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut req: http::Request<B>) -> Self::Future {
        self.started
            .store(true, std::sync::atomic::Ordering::Release);
        req.extensions_mut().insert(Peer(self.peer));
        self.inner.call(req)
    }
}

/// The handshake for a plain TCP listener.
pub async fn plain(stream: TcpStream) -> Option<TcpStream> {
    Some(stream)
}

/// Reads a request body within `timeout` and `limit`, answering 408 or 413 (as the caller's JSON
/// problem) otherwise.
pub async fn read_body(
    body: axum::body::Body,
    limit: usize,
    timeout: Duration,
) -> Result<axum::body::Bytes, BodyError> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(BodyError::Timeout(timeout)),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            // axum wraps http_body_util's LengthLimitError; anything else is the client going away.
            let too_big = std::error::Error::source(&e)
                .is_some_and(<dyn std::error::Error>::is::<http_body_util::LengthLimitError>)
                || e.to_string().contains("length limit");
            if too_big {
                Err(BodyError::TooLarge(limit))
            } else {
                Err(BodyError::Read(e.to_string()))
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body took longer than {0:?} to arrive")]
    Timeout(Duration),
    #[error("the request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
    #[error("reading the request body: {0}")]
    Read(String),
}

impl BodyError {
    pub fn status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            Self::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Read(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// How much request body a server reads (the extender's verbs, the webhook's reviews): per
/// request, and all requests and their replies together.
#[derive(Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub in_flight_bytes: usize,
    pub timeout: std::time::Duration,
    /// The in-flight budget in KiB (a semaphore's permits are counted in `u32`).
    budget: Arc<tokio::sync::Semaphore>,
    budget_kib: u32,
}

impl BodyLimits {
    /// `in_flight_bytes` is raised to `max_bytes` if smaller: a request the limit admits must be
    /// able to run.
    pub fn new(max_bytes: u64, in_flight_bytes: u64, timeout: std::time::Duration) -> Self {
        let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        let in_flight_bytes = usize::try_from(in_flight_bytes)
            .unwrap_or(usize::MAX)
            .max(max_bytes);
        let budget_kib = u32::try_from(in_flight_bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(crate::convert::usize_to_u32(
                tokio::sync::Semaphore::MAX_PERMITS,
            ));
        Self {
            max_bytes,
            in_flight_bytes,
            timeout,
            budget: Arc::new(tokio::sync::Semaphore::new(budget_kib as usize)),
            budget_kib,
        }
    }

    /// Waits until `bytes` more fit in the budget; the share returns when the permit drops.
    pub async fn reserve(&self, bytes: usize) -> tokio::sync::OwnedSemaphorePermit {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        self.budget
            .clone()
            .acquire_many_owned(kib.clamp(1, self.budget_kib))
            .await
            .expect("the budget semaphore is never closed")
    }

    /// Grows `held` to cover `bytes` (a reply larger than its request), waiting up to the body
    /// timeout; `None` when the budget stays full that long. For the blocking pool (it blocks).
    pub fn grow_blocking(
        &self,
        mut held: tokio::sync::OwnedSemaphorePermit,
        bytes: usize,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let want = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.budget_kib);
        let have = u32::try_from(held.num_permits()).unwrap_or(u32::MAX);
        let Some(extra) = want.checked_sub(have).filter(|&e| e > 0) else {
            return Some(held);
        };
        let more = match self.budget.clone().try_acquire_many_owned(extra) {
            Ok(p) => p,
            Err(_) => tokio::runtime::Handle::current().block_on(async {
                tokio::time::timeout(self.timeout, self.budget.clone().acquire_many_owned(extra))
                    .await
                    .ok()
                    .map(|p| p.expect("the budget semaphore is never closed"))
            })?,
        };
        held.merge(more);
        Some(held)
    }

    /// Bytes of the in-flight budget not held by a request or reply now (to the KiB).
    pub fn available_bytes(&self) -> usize {
        self.budget.available_permits() * 1024
    }
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self::new(32 << 20, 64 << 20, std::time::Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_parse_with_the_one_duration_syntax() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let cli =
            Cli::try_parse_from(["t", "--idle-timeout", "30s", "--body-timeout", "500ms"]).unwrap();
        assert_eq!(cli.serve.idle_timeout, Duration::from_secs(30));
        assert_eq!(cli.serve.body_timeout, Duration::from_millis(500));
        assert!(Cli::try_parse_from(["t", "--shutdown-timeout", "-1s"]).is_err());
        assert!(Cli::try_parse_from(["t", "--shutdown-timeout", "soon"]).is_err());
    }
}
