//! Fenced acknowledgements, batched across the units of one instance: the
//! workers that finish an event at the same time share one script call,
//! while each still waits for its own acknowledgement before its next event
//! (so a crash re-runs at most the event in flight, with `max_unacked = 1`).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::super::scripts::SCRIPTS;
use super::super::{RedisBroker, keys, now_ms};

/// The most acknowledgements one call carries.
const MAX_BATCH: usize = 256;

/// One unit's acknowledgement.
pub(crate) struct AckRequest {
    pub(crate) lease: Arc<str>,
    pub(crate) stream: Arc<str>,
    pub(crate) unit: Arc<str>,
    pub(crate) category: &'static str,
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
    /// `Ok(n)` with `n < 0` refused by the fence (a [`Refusal`] code),
    /// `Ok(n)` acknowledged, `Err` not known.
    ///
    /// [`Refusal`]: super::super::scripts::Refusal
    pub(crate) reply: oneshot::Sender<Result<i64, String>>,
}

/// The flags of one request, as ack.lua reads them.
fn flags(r: &AckRequest) -> String {
    let mut f = String::from("-");
    if r.clear_head {
        f.push('h');
    }
    if r.touch {
        f.push('a');
    }
    if r.trim {
        f.push('t');
    }
    f
}

/// Sends the queued acknowledgements, as many per call as are waiting,
/// until every sender is gone.
pub(crate) async fn run(
    broker: Arc<RedisBroker>,
    group: &'static str,
    alive: String,
    mut rx: mpsc::UnboundedReceiver<AckRequest>,
) {
    // The per-category key names, formatted once.
    let mut names: HashMap<&'static str, (String, String)> = HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let mut inv = SCRIPTS.ack.prepare_invoke();
        inv.arg(group).arg(now_ms());
        for r in &batch {
            let (groups, acked) = names
                .entry(r.category)
                .or_insert_with(|| (keys::groups(r.category), keys::acked(group, r.category)));
            inv.key(&*r.lease)
                .key(&*r.stream)
                .key(&*r.unit)
                .key(&*groups)
                .key(&*acked)
                .arg(&*r.token)
                .arg(&*r.inc)
                .arg(flags(r))
                .arg(r.ids.len())
                .arg(&r.ids);
        }
        inv.key(&alive);
        let result: Result<Vec<i64>, String> = match broker.conn().await {
            Ok(mut c) => inv
                .invoke_async(&mut c)
                .await
                .map_err(|e| crate::error::chain(&e)),
            Err(e) => Err(crate::error::chain(&e)),
        };
        match result {
            Ok(answers) => {
                for (r, n) in batch.into_iter().zip(answers) {
                    let _ = r.reply.send(Ok(n));
                }
            }
            Err(e) => {
                for r in batch {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
