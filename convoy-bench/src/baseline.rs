//! The baseline: an unordered plain consumer group on one stream.
//!
//! Each consumer loops on `XREADGROUP COUNT 100` (with `BLOCK`), decodes
//! every entry exactly as convoy does (envelope fields, then the JSON
//! payload), records it in the same [`ProbeState`] as convoy's handler, and
//! acknowledges the whole batch with one multi-id `XACK`. No leases, no
//! fencing, no ordering.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use convoy_runtime::{Envelope, Priority};
use redis::Value;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::model::{ProbeState, Tick};

/// The baseline's stream.
pub const STREAM: &str = "baseline";
/// The baseline's consumer group.
pub const GROUP: &str = "baseline-group";
/// Entries per `XREADGROUP`.
pub const BATCH: usize = 100;

/// The stream entry fields of `event`: a real convoy envelope, so both
/// sides move the same bytes.
fn fields(event: &Tick) -> Result<Vec<(&'static str, String)>> {
    let env = Envelope::wrap(event, Some(event.client_id.clone()), Priority::Normal, None)
        .map_err(|e| anyhow!("encoding a baseline entry failed: {e}"))?;
    Ok(env.to_fields())
}

/// Appends `events` to the baseline stream (pipelined `XADD`s).
pub async fn prepublish(conn: &mut MultiplexedConnection, events: &[Tick]) -> Result<()> {
    for chunk in events.chunks(1000) {
        let mut pipe = redis::pipe();
        for e in chunk {
            pipe.cmd("XADD").arg(STREAM).arg("*");
            for (k, v) in fields(e)? {
                pipe.arg(k).arg(v);
            }
            pipe.ignore();
        }
        let () = pipe
            .query_async(conn)
            .await
            .context("XADD to the baseline stream failed")?;
    }
    Ok(())
}

/// Appends one event (one `XADD`).
pub async fn publish_one(conn: &mut MultiplexedConnection, event: &Tick) -> Result<()> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(STREAM).arg("*");
    for (k, v) in fields(event)? {
        cmd.arg(k).arg(v);
    }
    let _: String = cmd
        .query_async(conn)
        .await
        .context("XADD to the baseline stream failed")?;
    Ok(())
}

/// Creates the group, reading from `start` (`0` = everything, `$` = new
/// entries only); creates the stream when missing.
pub async fn create_group(conn: &mut MultiplexedConnection, start: &str) -> Result<()> {
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(STREAM)
        .arg(GROUP)
        .arg(start)
        .arg("MKSTREAM")
        .query_async(conn)
        .await
        .context("XGROUP CREATE failed")?;
    Ok(())
}

/// A running baseline consumer.
#[derive(Debug)]
pub struct Consumer {
    /// Its task.
    pub task: JoinHandle<Result<()>>,
    /// Its connection's `CLIENT ID` (to cut it like a crash would).
    pub client_id: i64,
}

/// Starts `n` consumers named `{prefix}1..{prefix}n`, each on its own
/// connection, blocking at most `block` per read.
pub async fn start_consumers(
    client: &redis::Client,
    prefix: &str,
    n: usize,
    block: Duration,
    state: &Arc<ProbeState>,
    stop: &CancellationToken,
) -> Result<Vec<Consumer>> {
    let mut out = Vec::with_capacity(n);
    for i in 1..=n {
        let mut conn = blocking_connection(client, block).await?;
        let client_id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await
            .context("CLIENT ID failed")?;
        let task = tokio::spawn(consume(
            conn,
            format!("{prefix}{i}"),
            block,
            state.clone(),
            stop.clone(),
        ));
        out.push(Consumer { task, client_id });
    }
    Ok(out)
}

/// Crashes a consumer: its task is aborted and the server drops its
/// connection at once (`CLIENT KILL ID`), as the kernel would on `kill -9`;
/// whatever it had been delivered stays pending.
pub async fn crash(admin: &mut MultiplexedConnection, consumer: Consumer) -> Result<()> {
    consumer.task.abort();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(consumer.client_id)
        .query_async(admin)
        .await
        .context("CLIENT KILL failed")?;
    Ok(())
}

/// A connection whose reads may block for `block`.
async fn blocking_connection(
    client: &redis::Client,
    block: Duration,
) -> Result<MultiplexedConnection> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(block + Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .context("connecting a baseline consumer failed")
}

/// Waits for consumers to end and returns the first error.
pub async fn join(consumers: Vec<Consumer>) -> Result<()> {
    for c in consumers {
        c.task.await.context("a baseline consumer panicked")??;
    }
    Ok(())
}

/// One consumer: read a batch, handle it, ack it, until `stop`.
async fn consume(
    mut conn: MultiplexedConnection,
    name: String,
    block: Duration,
    state: Arc<ProbeState>,
    stop: CancellationToken,
) -> Result<()> {
    let block_ms = block.as_millis() as u64;
    loop {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(&name)
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(STREAM)
            .arg(">");
        let read = cmd.query_async::<Option<StreamReadReply>>(&mut conn);
        let reply = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = read => r.context("XREADGROUP failed")?,
        };
        let Some(reply) = reply else { continue };
        let mut ids = Vec::with_capacity(BATCH);
        for key in reply.keys {
            for entry in key.ids {
                let fields: Vec<(&str, &[u8])> = entry
                    .map
                    .iter()
                    .filter_map(|(k, v)| match v {
                        Value::BulkString(b) => Some((k.as_str(), b.as_slice())),
                        _ => None,
                    })
                    .collect();
                let env = Envelope::from_fields(STREAM, &entry.id, fields)
                    .map_err(|e| anyhow!("malformed baseline entry: {e}"))?;
                let tick: Tick = env
                    .decode()
                    .map_err(|e| anyhow!("undecodable baseline entry: {e}"))?;
                state.record(&tick);
                ids.push(entry.id);
            }
        }
        if ids.is_empty() {
            continue;
        }
        let _: i64 = redis::cmd("XACK")
            .arg(STREAM)
            .arg(GROUP)
            .arg(&ids)
            .query_async(&mut conn)
            .await
            .context("XACK failed")?;
    }
}
