//! Wake-ups: a publish appends entries `k = {key}`, `k = {key2}`, ... to
//! `{category}:__wake__`, naming the keys it wrote to, and each engine
//! follows that stream with a blocking read on a dedicated connection. Idle
//! partitions therefore cost nothing, however many there are, and new
//! events are picked up at once.
//!
//! On one server each shard's publish script writes an entry per category
//! (split every 2,000 keys), atomic with the records. On a cluster the wake stream is in no shard's slot, so the
//! publisher writes one entry per category right after its scripts
//! ([`hint`]). A wake-up is a hint: a lost one delays a pick-up until the
//! owner's next poll or the next heartbeat's discovery, and loses nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use redis::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::connection::{BLOCK, Conn, Connection, query_by_slot};
use super::reply::{first_stream_entries, text};
use crate::tracing;
use convoy_core::backoff::Backoff;
use convoy_core::error::{Error, chain};
use convoy_core::names;

/// Writes the wake-ups of `(category, key)` pairs (with `released`: the
/// keys' leases were just released), after the change they announce is
/// written: one entry per category, naming each of its keys, so an owner
/// reads a batch's wake-ups at once.
pub(crate) async fn hint<'a>(
    conn: &mut Conn,
    keys: impl IntoIterator<Item = (&'a str, &'a str)>,
    released: bool,
) -> Result<(), Error> {
    let mut by_category: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (category, key) in keys {
        by_category.entry(category).or_default().push(key);
    }
    let cmds: Vec<(String, redis::Cmd)> = by_category
        .into_iter()
        .map(|(category, keys)| {
            let stream = names::wake_stream(category);
            let mut c = redis::cmd("XADD");
            c.arg(&stream)
                .arg("MAXLEN")
                .arg("~")
                .arg(names::WAKE_MAXLEN)
                .arg("*");
            for k in keys {
                c.arg("k").arg(k);
            }
            if released {
                c.arg("r").arg("1");
            }
            (stream, c)
        })
        .collect();
    if cmds.is_empty() {
        return Ok(());
    }
    query_by_slot(conn, cmds)
        .await
        .map(drop)
        .map_err(|e| Error::redis("failed to write wake-ups", e))
}

/// Wakes every engine following `category`'s wake-ups to read the pauses
/// of its keys again (an entry with `p`, after an operator paused or
/// resumed a key or prefix).
pub(crate) async fn pauses_changed(conn: &mut Conn, category: &str) -> Result<(), Error> {
    let mut c = redis::cmd("XADD");
    c.arg(names::wake_stream(category))
        .arg("MAXLEN")
        .arg("~")
        .arg(names::WAKE_MAXLEN)
        .arg("*")
        .arg("p")
        .arg("1");
    c.query_async::<Value>(conn)
        .await
        .map(drop)
        .map_err(|e| Error::redis("failed to write the wake-up of a pause", e))
}

/// How long [`hint_later`] keeps trying.
const HINT_LATER_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Writes wake-ups that could not be written with their batch (the wake
/// stream's master failing over, say), again and again with a back-off
/// for up to [`HINT_LATER_FOR`]: publishing does not wait for them.
/// Meanwhile the engines' followers, whose reads of the same stream fail
/// too, wake every unit they own as after any missed wake-ups.
pub(crate) async fn hint_later(mut conn: Conn, keys: Vec<(String, String)>) {
    let started = std::time::Instant::now();
    let mut backoff = Backoff::reconnect();
    loop {
        let pairs = keys.iter().map(|(c, k)| (c.as_str(), k.as_str()));
        match hint(&mut conn, pairs, false).await {
            Ok(()) => return,
            Err(e) if started.elapsed() >= HINT_LATER_FOR => {
                tracing::error!(error = %chain(&e), keys = keys.len(), "wake-ups of published events could not be written for a minute; their owners find the events when their wake-up streams are read again (every owner wakes all its units after a failed read) or at their next rescan");
                return;
            }
            Err(_) => tokio::time::sleep(backoff.next_delay()).await,
        }
    }
}

/// A wake-up: a key with new events, a key whose lease was just released,
/// or (`pauses`, with no key) operators' pauses changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wake {
    pub(crate) key: String,
    pub(crate) released: bool,
    pub(crate) pauses: bool,
}

/// Follows the wake streams of `categories` and reports the keys they name,
/// in batches. After a reconnect it reports `None` ("wake everything"),
/// since the gap may have held wake-ups.
pub(crate) async fn follow(
    redis: Arc<Connection>,
    categories: Vec<String>,
    tx: mpsc::Sender<Option<Vec<Wake>>>,
    shutdown: CancellationToken,
) {
    let streams: Vec<String> = categories.iter().map(|c| names::wake_stream(c)).collect();
    let mut last: Option<Vec<String>> = None;
    let mut backoff = Backoff::reconnect();
    while !shutdown.is_cancelled() {
        let mut conn = match redis.blocking().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %chain(&e), "wake-up listener cannot connect; retrying");
                if !backoff.wait_or_stop(&shutdown).await {
                    return;
                }
                continue;
            }
        };
        if last.is_none() {
            // Start from the newest wake-ups; owned units read their streams anyway.
            match newest_ids(&mut conn, &streams).await {
                Ok(ids) => last = Some(ids),
                Err(e) => {
                    tracing::warn!(error = %e, "wake-up listener read failed; retrying");
                    if !backoff.wait_or_stop(&shutdown).await {
                        return;
                    }
                    continue;
                }
            }
        } else if tx.send(None).await.is_err() {
            return;
        }
        backoff.reset();
        let Some(ids) = last.as_mut() else { continue };
        loop {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1024)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&streams)
                .arg(&*ids);
            let read = cmd.query_async::<Value>(&mut conn);
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = read => r,
            };
            match r {
                Ok(v) => {
                    let mut batch = Vec::new();
                    for (stream, entries) in first_stream_entries(v) {
                        let Some(i) = streams.iter().position(|s| *s == stream) else {
                            continue;
                        };
                        for e in entries {
                            ids[i] = e.id.clone();
                            if let Some(f) = &e.fields {
                                let released = f.iter().any(|(k, _)| k == "r");
                                if f.iter().any(|(k, _)| k == "p") {
                                    batch.push(Wake {
                                        key: String::new(),
                                        released: false,
                                        pauses: true,
                                    });
                                }
                                for (k, v) in f {
                                    if k == "k" {
                                        batch.push(Wake {
                                            key: String::from_utf8_lossy(v).into_owned(),
                                            released,
                                            pauses: false,
                                        });
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
                    tracing::warn!(error = %chain(&e), "wake-up listener lost its connection; reconnecting");
                    break;
                }
            }
        }
    }
}

/// The id of each stream's newest entry (`0-0` for an empty stream).
async fn newest_ids(
    conn: &mut super::connection::Conn,
    streams: &[String],
) -> Result<Vec<String>, redis::RedisError> {
    let mut pipe = redis::pipe();
    for s in streams {
        pipe.cmd("XREVRANGE")
            .arg(s)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    Ok(replies
        .iter()
        .map(|r| match r {
            Value::Array(items) => items
                .first()
                .and_then(|i| match i {
                    Value::Array(p) => p.first().and_then(text),
                    _ => None,
                })
                .unwrap_or_else(|| "0-0".to_owned()),
            _ => "0-0".to_owned(),
        })
        .collect())
}
