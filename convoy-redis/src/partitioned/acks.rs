//! Fenced acknowledgements, batched across the units of one instance: the
//! workers that finish an event at the same time share one script call,
//! while each still waits for its own acknowledgement before its next event
//! (so a crash re-runs at most the event in flight, with `max_unacked = 1`).

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::super::connection::Connection;
use super::super::scripts::Replicated;
use super::super::scripts::ack::{Ack, AckItem, Acked};
use super::super::unit::{At, Unit};
use convoy_core::envelope::now_ms;
use convoy_core::error::Error;

/// The most acknowledgements one call carries.
const MAX_BATCH: usize = 256;
/// The most calls one lane has under way at once.
const IN_FLIGHT: usize = 2;

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

/// Sends the queued acknowledgements, as many per call as are waiting,
/// until every sender is gone. On one server this task is the one lane
/// that takes them all (no hop through another task per acknowledgement);
/// on a cluster one lane per shard (a script touches one shard), each
/// batching what queued while its previous call ran, so a shard whose
/// master is failing over holds up no other shard's acknowledgements.
/// `alive` is the owner's liveness key of each shard.
pub(crate) async fn run(
    redis: Arc<Connection>,
    group: &'static str,
    alive: Arc<[String]>,
    wait: Option<Replicated>,
    mut rx: mpsc::UnboundedReceiver<AckRequest>,
) {
    if !redis.is_cluster() {
        lane(redis, group, alive, wait, rx).await;
        return;
    }
    let mut lanes: HashMap<u32, mpsc::UnboundedSender<AckRequest>> = HashMap::new();
    while let Some(r) = rx.recv().await {
        let to = lanes.entry(r.unit.shard).or_insert_with(|| {
            let (tx, lane_rx) = mpsc::unbounded_channel();
            tokio::spawn(lane(redis.clone(), group, alive.clone(), wait, lane_rx));
            tx
        });
        // A lane ends only with its sender; a request it cannot take drops
        // its reply channel, which its worker sees as a failed
        // acknowledgement (sent again).
        let _ = to.send(r);
    }
}

/// One lane: a call per batch of what queued meanwhile, with up to
/// [`IN_FLIGHT`] calls under way at once (pipelined on the connection), so
/// Redis runs one batch while the replies of the last are on their way and
/// the next is being gathered. Each unit has at most one acknowledgement
/// queued or under way (its worker waits for it), so calls never carry
/// the same unit and their order does not matter.
async fn lane(
    redis: Arc<Connection>,
    group: &'static str,
    alive: Arc<[String]>,
    wait: Option<Replicated>,
    mut rx: mpsc::UnboundedReceiver<AckRequest>,
) {
    let mut under_way = FuturesUnordered::new();
    loop {
        tokio::select! {
            // Replies first: they free a slot and answer workers.
            Some(()) = under_way.next(), if !under_way.is_empty() => {}
            next = rx.recv(), if under_way.len() < IN_FLIGHT => {
                let Some(first) = next else { break };
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                under_way.push(send(redis.clone(), group, alive.clone(), wait, batch));
            }
        }
    }
    while under_way.next().await.is_some() {}
}

/// One call: acknowledges `batch` and answers each request.
async fn send(
    redis: Arc<Connection>,
    group: &'static str,
    alive: Arc<[String]>,
    wait: Option<Replicated>,
    batch: Vec<AckRequest>,
) {
    let mut conn = match redis.shared().await {
        Ok(c) => c,
        Err(e) => {
            answer(batch, Err(e));
            return;
        }
    };
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
