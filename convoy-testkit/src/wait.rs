//! Waiting for a condition in a test.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `f` every 50 ms until it is true; panics naming `what` once
/// `timeout` has passed.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
