//! Fenced acknowledgements, batched across the units of one instance: the
//! workers that finish an event at the same time share one script call,
//! while each still waits for its own acknowledgement before its next event
//! (so a crash re-runs at most the event in flight, with `max_unacked = 1`).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::super::connection::Connection;
use super::super::scripts::Replicated;
use super::super::scripts::ack::{Ack, AckItem, Acked};
use super::super::unit::{At, Unit};
use crate::envelope::now_ms;
use crate::error::Error;

/// The most acknowledgements one call carries.
const MAX_BATCH: usize = 256;

/// One unit's acknowledgement, as a worker queues it.
pub(crate) struct AckRequest {
    pub(crate) unit: Arc<Unit>,
    /// The stream the entries were read from.
    pub(crate) at: At,
    pub(crate) token: Arc<str>,
    /// The owner's incarnation the worker took the lease in.
    pub(crate) inc: Arc<str>,
    pub(crate) ids: Vec<String>,
    /// Clear the head's failure count (it had failures).
    pub(crate) clear_head: bool,
    /// Record the unit's last activity.
    pub(crate) touch: bool,
    /// Remove from the stream what every group has consumed.
    pub(crate) trim: bool,
    /// The outcome; an error is shared by every request of the call (it
    /// may have run: the worker sends the same acknowledgement again).
    pub(crate) reply: oneshot::Sender<Result<Acked, Arc<Error>>>,
}

impl AckRequest {
    fn item<'a>(&'a self, alive: &'a str) -> AckItem<'a> {
        AckItem {
            unit: &self.unit,
            at: self.at,
            token: &self.token,
            incarnation: &self.inc,
            alive,
            ids: &self.ids,
            clear_head: self.clear_head,
            touch: self.touch,
            trim: self.trim,
        }
    }
}

/// Sends the queued acknowledgements, as many per call as are waiting (one
/// call per shard, at once: a script touches one shard), until every sender
/// is gone. `alive` is the owner's liveness key of each shard.
pub(crate) async fn run(
    redis: Arc<Connection>,
    group: &'static str,
    alive: Arc<[String]>,
    wait: Option<Replicated>,
    mut rx: mpsc::UnboundedReceiver<AckRequest>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let conn = match redis.shared().await {
            Ok(c) => c,
            Err(e) => {
                answer(batch, Err(e));
                continue;
            }
        };
        // One call for the whole batch on one server; on a cluster one per
        // shard (a script's keys must be in one hash slot), sent at once.
        let mut by_shard: BTreeMap<u32, Vec<AckRequest>> = BTreeMap::new();
        let cluster = conn.is_cluster();
        for r in batch {
            let shard = if cluster { r.unit.shard } else { 0 };
            by_shard.entry(shard).or_default().push(r);
        }
        // Each shard's call runs on its own: a shard whose master is
        // failing over holds up no other shard's acknowledgements (a unit
        // has at most one acknowledgement in flight: its worker waits for
        // the answer).
        for batch in by_shard.into_values() {
            let mut conn = conn.clone();
            let alive = alive.clone();
            tokio::spawn(async move {
                let items: Vec<AckItem<'_>> = batch
                    .iter()
                    .map(|r| r.item(alive.get(r.unit.shard as usize).map_or("", String::as_str)))
                    .collect();
                let result = Ack {
                    group,
                    now_ms: now_ms(),
                    items: &items,
                }
                .run(&mut conn, wait)
                .await;
                drop(items);
                answer(batch, result);
            });
        }
    }
}

/// Hands each request its outcome.
fn answer(batch: Vec<AckRequest>, result: Result<Vec<Acked>, Error>) {
    match result {
        Ok(answers) => {
            for (r, answer) in batch.into_iter().zip(answers) {
                let _ = r.reply.send(Ok(answer));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
    }
}
