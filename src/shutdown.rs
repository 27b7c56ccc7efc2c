//! The one way every long-running subcommand learns it should stop.

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C, so each command stops and exits 0
/// instead of being killed mid-write: the extender's and the agent's servers drain the requests
/// in flight (no bind left between patch and Binding, no half-applied report); the webhook stops
/// accepting and returns, dropping the connections it holds.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C received: shutting down"),
                }
                return;
            }
            Err(e) => tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops peakfit"),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// [`signal`], shared: every listener of a command (verbs, metrics, probes) stops on the one
/// signal. Needs a tokio runtime.
#[derive(Clone)]
pub struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    /// Starts waiting for the signal.
    pub fn on_signal() -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            signal().await;
            let _ = tx.send(true);
        });
        Self(rx)
    }

    /// Resolves once the signal has come (at once if it already has).
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}
