//! The one way every long-running subcommand learns it should stop.

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C, so every server drains and exits
/// 0 instead of being killed mid-write (a half-applied report, a bind between patch and Binding).
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
