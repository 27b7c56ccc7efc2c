//! Work that must not take a request's CPU: run on threads of lower scheduling priority, so on a
//! busy machine filter, prioritize and bind get the cores first and this gets what they leave.

/// Lowers the calling thread's scheduling priority to `nice` (Linux sets the nice value per
/// thread when given the thread's id; elsewhere nothing changes).
pub fn lower_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice) {
        tracing::debug!(error = %e, nice, "could not lower a background thread's priority");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// The nice value of a `/metrics` render: 10, not the prescorer's 19. At 19 a thread gets about
/// 1.5 % of a core that nice-0 threads keep busy, and a 100 ms render would then outlast
/// Prometheus' 10 s scrape timeout; at 10 it gets about 10 % (CFS weights 110 against 1024), so
/// under full load a render takes at most about ten times as long, and a request that wants the
/// core takes it.
pub const RENDER_NICE: i32 = 10;

/// Runs `work` on a new thread at `nice` and waits for it without holding an async worker. A
/// thread per call: the callers (one render a second at most) are rare enough that a pool
/// would only keep threads idle.
///
/// # Errors
/// When the thread cannot be started or `work` panics, naming `what`.
pub async fn run<T: Send + 'static>(
    what: &'static str,
    nice: i32,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("peakfit-{what}"))
        .spawn(move || {
            lower_priority(nice);
            let _ = tx.send(work());
        })
        .map_err(|e| format!("{what}: cannot start a thread: {e}"))?;
    rx.await.map_err(|_| format!("{what} panicked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_a_thread_of_lower_priority() {
        let nice = run("test", 10, || {
            #[cfg(target_os = "linux")]
            return rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok();
            #[cfg(not(target_os = "linux"))]
            None::<i32>
        })
        .await
        .unwrap();
        #[cfg(target_os = "linux")]
        assert!(nice.is_some_and(|n| n >= 10), "{nice:?}");
        let _ = nice;
        let e = run("boom", 10, || -> u8 { panic!("inside") })
            .await
            .unwrap_err();
        assert_eq!(e, "boom panicked");
    }
}
