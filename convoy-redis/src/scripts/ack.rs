//! `ack.lua`: fenced acknowledgements of one or more units in one call
//! (the workers of an instance that finish events at the same moment share
//! the round trip).

use redis::aio::ConnectionLike;

use super::{Invocation, Refusal, Replicated, SCRIPTS, Status, call_replicated};
use crate::reply::int;
use crate::unit::{At, Unit};
use convoy_core::error::Error;

/// One unit's acknowledgement.
#[derive(Debug)]
pub(crate) struct AckItem<'a> {
    pub(crate) unit: &'a Unit,
    /// The stream the entries were read from.
    pub(crate) at: At,
    /// The fence token.
    pub(crate) token: &'a str,
    /// The owner's incarnation the lease was taken in.
    pub(crate) incarnation: &'a str,
    /// The owner's liveness key in the unit's shard.
    pub(crate) alive: &'a str,
    pub(crate) ids: &'a [String],
    /// Clear the head's failure count (it had failures).
    pub(crate) clear_head: bool,
    /// Record the unit's last activity.
    pub(crate) touch: bool,
    /// Remove from the stream what every group has consumed.
    pub(crate) trim: bool,
}

impl AckItem<'_> {
    /// The flags as ack.lua reads them.
    fn flags(&self) -> &'static str {
        match (self.clear_head, self.touch, self.trim) {
            (false, false, false) => "-",
            (true, false, false) => "-h",
            (false, true, false) => "-a",
            (false, false, true) => "-t",
            (true, true, false) => "-ha",
            (true, false, true) => "-ht",
            (false, true, true) => "-at",
            (true, true, true) => "-hat",
        }
    }
}

/// Acknowledges `items` for `group`.
#[derive(Debug)]
pub(crate) struct Ack<'a> {
    pub(crate) group: &'a str,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
    pub(crate) items: &'a [AckItem<'a>],
}

/// One item's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acked {
    /// Acknowledged (this many entries were still pending).
    Acked(u64),
    /// The fence refused it.
    Refused(Refusal),
}

impl Ack<'_> {
    /// One outcome per item, in order.
    /// With `wait`, the acknowledgements count only once that many
    /// replicas have them (`[broker] wait_acks`).
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
        wait: Option<Replicated>,
    ) -> Result<Vec<Acked>, Error> {
        let mut inv = Invocation::new(&SCRIPTS.ack);
        inv.arg(self.group).arg(self.now_ms);
        // The acknowledged counts are only ever read summed over a
        // category's shards (lag is published - acknowledged; a count going
        // back is a loss wherever it shows), so a call adds every unit of a
        // category to the first such unit's counter: one `INCRBY` per
        // category per call instead of one per shard the call spans (on a
        // cluster a call is in one shard anyway).
        let mut counters: Vec<(&str, &str)> = Vec::new();
        for item in self.items {
            let lane = item.unit.lane(item.at);
            let acked = match counters.iter().find(|(c, _)| *c == lane.category) {
                Some((_, key)) => *key,
                None => {
                    counters.push((&lane.category, &lane.acked));
                    &lane.acked
                }
            };
            inv.key(&item.unit.lease)
                .key(item.unit.stream(item.at))
                .key(&item.unit.state)
                .key(&lane.groups)
                .key(acked)
                .key(item.alive)
                .arg(item.token)
                .arg(item.incarnation)
                .arg(item.flags())
                .arg(item.ids.len())
                .arg(item.ids);
        }
        let reply =
            call_replicated("ack", &inv, conn, "fenced acknowledgement failed", wait).await?;
        if reply.status != Status::Done || reply.values().len() != self.items.len() {
            return Err(reply.unexpected());
        }
        reply
            .values()
            .iter()
            .map(|v| match int(v) {
                Some(n) if n >= 0 => Ok(Acked::Acked(n as u64)),
                Some(n) => Refusal::from_code(n)
                    .map(Acked::Refused)
                    .ok_or_else(|| reply.unexpected()),
                None => Err(reply.unexpected()),
            })
            .collect()
    }
}
