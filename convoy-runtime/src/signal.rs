//! Waiting for the operating system to ask the service to stop.

/// Resolves when the process is asked to stop: `SIGINT` (Ctrl-C) or
/// `SIGTERM` (what `kill`, systemd and container runtimes send) on Unix,
/// Ctrl-C elsewhere. Hand it to [`Engine::run_until`](crate::Engine::run_until)
/// for a graceful shutdown: every worker finishes the event in flight,
/// acknowledges it and releases its lease.
///
/// If a signal handler cannot be installed, that is logged and the future
/// waits for the other signal only (or never resolves, when neither can be
/// installed), so the engine is never stopped by mistake.
///
/// ```no_run
/// # async fn run(engine: convoy_runtime::Engine) -> Result<(), convoy_runtime::Error> {
/// engine.run_until(convoy_runtime::shutdown_signal()).await
/// # }
/// ```
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the engine");
                None
            }
        };
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = interrupt() => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    interrupt().await;
}

async fn interrupt() {
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::error!(error = %e, "cannot listen for Ctrl-C");
        std::future::pending::<()>().await;
    }
}
