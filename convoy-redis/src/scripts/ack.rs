//! `ack.lua`: fenced acknowledgements of one or more units in one call
//! (the workers of an instance that finish events at the same moment share
//! the round trip).

use std::fmt::Write as _;

use redis::Value;
use redis::aio::ConnectionLike;
use smallvec::{Array, SmallVec};

use super::{Invocation, Refusal, Replicated, Reply, SCRIPTS, Status, call_replicated};
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
    /// Whether the call names the unit's state hash (flags 'h' or 'a').
    fn names_state(&self) -> bool {
        self.clear_head || self.touch
    }

    /// The flags as ack.lua reads them (`""` for none).
    fn flags(&self) -> &'static str {
        match (self.clear_head, self.touch, self.trim) {
            (false, false, false) => "",
            (true, false, false) => "h",
            (false, true, false) => "a",
            (false, false, true) => "t",
            (true, true, false) => "ha",
            (true, false, true) => "ht",
            (false, true, true) => "at",
            (true, true, true) => "hat",
        }
    }
}

/// The position of `item` in `list`, pushing it when it is new.
fn index_of<A: Array>(list: &mut SmallVec<A>, item: A::Item) -> usize
where
    A::Item: PartialEq,
{
    index_of_by(list, item, PartialEq::eq)
}

/// [`index_of`], with `same` saying which item stands for `item`.
fn index_of_by<A: Array>(
    list: &mut SmallVec<A>,
    item: A::Item,
    same: impl Fn(&A::Item, &A::Item) -> bool,
) -> usize {
    match list.iter().position(|x| same(x, &item)) {
        Some(i) => i,
        None => {
            list.push(item);
            list.len() - 1
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
        let inv = self.invocation();
        let reply =
            call_replicated("ack", &inv, conn, "fenced acknowledgement failed", wait).await?;
        self.answers(&reply)
    }

    /// The script call.
    pub(crate) fn invocation(&self) -> Invocation {
        // What the units share is named once per call (see ack.lua): the
        // (liveness key, incarnation) pairs, the acknowledged counters and
        // the groups sets; each unit names its pair and counter in its spec.
        //
        // The acknowledged counts are only ever read summed over a
        // category's shards (lag is published - acknowledged; a count going
        // back is a loss wherever it shows), so a call adds every unit of a
        // category to the first such unit's counter: one `INCRBY` per
        // category per call instead of one per shard the call spans (on a
        // cluster a call is in one shard anyway).
        let mut pairs: SmallVec<[(&str, &str); 4]> = SmallVec::new();
        // Per category: its name and the counter its units add to.
        let mut counters: SmallVec<[(&str, &str); 4]> = SmallVec::new();
        let mut groups: SmallVec<[&str; 4]> = SmallVec::new();
        // Per item: its pair, its counter and its groups set (for a trim).
        let mut placed: SmallVec<[(usize, usize, Option<usize>); 8]> =
            SmallVec::with_capacity(self.items.len());
        for item in self.items {
            let lane = item.unit.lane(item.at);
            let pair = index_of(&mut pairs, (item.alive, item.incarnation));
            let category = index_of_by(&mut counters, (&lane.category, &lane.acked), |a, b| {
                a.0 == b.0
            });
            let set = item
                .trim
                .then(|| index_of(&mut groups, lane.groups.as_str()));
            placed.push((pair, category, set));
        }
        let (na, units) = (pairs.len(), self.items.len());
        // 1-based KEYS index of a groups set.
        let groups_at = |g: usize| na + units + counters.len() + 1 + g;
        // Every key first (the call is written as the command itself):
        // the shared ones, then per unit its stream and, with 'h' or 'a',
        // its state hash; then the values.
        let ns = na + units + counters.len() + groups.len();
        let keys = ns + units + self.items.iter().filter(|i| i.names_state()).count();
        // Per unit its token, spec and ids.
        let ids: usize = self.items.iter().map(|i| i.ids.len()).sum();
        // One more than the most ids a unit of the call acknowledges.
        let span = self.items.iter().map(|i| i.ids.len()).max().unwrap_or(0) + 1;
        let mut inv = Invocation::keys_first(
            &SCRIPTS.ack,
            keys,
            7 + na + 2 * units + ids,
            64 + 40 * units + 24 * ids,
        );
        for (alive, _) in &pairs {
            inv.key(*alive);
        }
        for item in self.items {
            inv.key(&item.unit.lease);
        }
        for (_, acked) in &counters {
            inv.key(*acked);
        }
        inv.key(groups.as_slice());
        for item in self.items {
            inv.key(item.unit.stream(item.at));
            if item.names_state() {
                inv.key(&item.unit.state);
            }
        }
        inv.arg(self.group)
            .arg(self.now_ms)
            .arg(na)
            .arg(units)
            .arg(ns)
            .arg(counters.len())
            .arg(span);
        for (_, inc) in &pairs {
            inv.arg(*inc);
        }
        let mut spec = String::new();
        for (item, &(pair, counter, set)) in self.items.iter().zip(&placed) {
            inv.arg(item.token);
            let code = spec_code(pair, counter, counters.len(), span, item.ids.len());
            let flags = item.flags();
            if flags.is_empty() {
                inv.arg(code);
            } else {
                spec.clear();
                let groups = set.map_or(0, groups_at);
                // Writing to a String cannot fail.
                let _ = write!(spec, "{code}:{flags}:{groups}");
                inv.arg(spec.as_str());
            }
            inv.arg(item.ids);
        }
        inv
    }

    /// One outcome per item, in order, from the script's `reply` to the
    /// call [`Ack::invocation`] put together.
    pub(crate) fn answers(&self, reply: &Reply) -> Result<Vec<Acked>, Error> {
        let answers = match (&reply.status, reply.values()) {
            (Status::Done, [Value::BulkString(joined)]) => joined,
            _ => return Err(reply.unexpected()),
        };
        // The script answers in the order of the items (a call has one at
        // least), joined by commas.
        let out: Vec<Acked> = answers
            .split(|b| *b == b',')
            .map(|a| {
                match std::str::from_utf8(a)
                    .ok()
                    .and_then(|a| a.parse::<i64>().ok())
                {
                    Some(n) if n >= 0 => Ok(Acked::Acked(n as u64)),
                    Some(n) => Refusal::from_code(n)
                        .map(Acked::Refused)
                        .ok_or_else(|| reply.unexpected()),
                    None => Err(reply.unexpected()),
                }
            })
            .collect::<Result<_, _>>()?;
        if out.len() != self.items.len() {
            return Err(reply.unexpected());
        }
        Ok(out)
    }
}

/// A unit's spec as ack.lua reads it: its liveness pair, its counter (both
/// 0-based here, among `counters`) and its id count (below `span`, the
/// call's) in one number. At most 256 units with a pair and a counter each,
/// and far fewer than 2^30 ids: well within the 2^53 a Lua number holds
/// exactly.
fn spec_code(pair: usize, counter: usize, counters: usize, span: usize, ids: usize) -> u64 {
    ((pair * counters + counter) * span + ids) as u64
}
