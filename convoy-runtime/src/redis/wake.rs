//! Wake-ups: the publisher appends `k = {key}` to `{category}:__wake__` in
//! the same script as the event, and each engine follows that stream with a
//! blocking read on a dedicated connection. Idle partitions therefore cost
//! nothing, however many there are, and new events are picked up at once.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::reply::{first_stream_entries, text};
use super::{BLOCK, RedisBroker, keys};

/// Follows one category's wake stream and reports the keys it names, in
/// batches. After a reconnect it reports `None` ("wake everything"), since
/// the gap may have held wake-ups.
pub(crate) async fn follow(
    broker: Arc<RedisBroker>,
    category: String,
    tx: mpsc::Sender<Option<Vec<String>>>,
    shutdown: CancellationToken,
) {
    let stream = keys::wake_stream(&category);
    let mut last: Option<String> = None;
    let mut backoff = Duration::from_millis(50);
    while !shutdown.is_cancelled() {
        let mut conn = match broker.blocking_conn().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "wake-up listener cannot connect; retrying");
                if sleep_or_stop(backoff, &shutdown).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        if last.is_none() {
            // Start from the newest wake-up; owned units read their streams anyway.
            let r: Result<Value, _> = redis::cmd("XREVRANGE")
                .arg(&stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut conn)
                .await;
            match r {
                Ok(Value::Array(items)) => {
                    last = Some(
                        items
                            .first()
                            .and_then(|i| match i {
                                Value::Array(p) => p.first().and_then(text),
                                _ => None,
                            })
                            .unwrap_or_else(|| "0-0".to_owned()),
                    );
                }
                Ok(_) => last = Some("0-0".to_owned()),
                Err(e) => {
                    tracing::warn!(error = %crate::error::chain(&e), "wake-up listener read failed; retrying");
                    if sleep_or_stop(backoff, &shutdown).await {
                        return;
                    }
                    continue;
                }
            }
        } else if tx.send(None).await.is_err() {
            return;
        }
        backoff = Duration::from_millis(50);
        loop {
            let from = last.clone().unwrap_or_else(|| "0-0".to_owned());
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1024)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&stream)
                .arg(&from);
            let read = cmd.query_async::<Value>(&mut conn);
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = read => r,
            };
            match r {
                Ok(v) => {
                    let mut batch = Vec::new();
                    for (_, entries) in first_stream_entries(&v) {
                        for e in entries {
                            last = Some(e.id.clone());
                            if let Some(f) = &e.fields {
                                for (k, v) in f {
                                    if k == "k" {
                                        batch.push(String::from_utf8_lossy(v).into_owned());
                                    }
                                }
                            }
                        }
                    }
                    if !batch.is_empty() && tx.send(Some(batch)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error::chain(&e), "wake-up listener lost its connection; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Sleeps; true when shutdown fired first.
pub(crate) async fn sleep_or_stop(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}
