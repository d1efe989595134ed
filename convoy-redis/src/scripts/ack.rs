//! `ack.lua`: fenced acknowledgements of one or more units in one call
//! (the workers of an instance that finish events at the same moment share
//! the round trip).

use std::fmt::Write as _;

use redis::aio::ConnectionLike;
use smallvec::{Array, SmallVec};

use super::{Invocation, Refusal, Replicated, Reply, SCRIPTS, Status, call_replicated};
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

/// Where an item goes in the call: its run (liveness pair, counter), its
/// groups set (for a trim) and its position among the items.
type Sent = ((usize, usize), Option<usize>, usize);

/// Where each item of an [`Ack`] went in its call, in the order the script
/// answers.
#[derive(Debug)]
pub(crate) struct Placed(SmallVec<[Sent; 8]>);

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
        let (inv, sent) = self.invocation();
        let reply =
            call_replicated("ack", &inv, conn, "fenced acknowledgement failed", wait).await?;
        self.answers(&reply, &sent)
    }

    /// The script call, and where each item went in it (for
    /// [`Ack::answers`]).
    pub(crate) fn invocation(&self) -> (Invocation, Placed) {
        // What the units share is named once per call (see ack.lua): the
        // (liveness key, incarnation) pairs, the acknowledged counters and
        // the groups sets; the units go in runs that share a pair and a
        // counter.
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
        let mut sent: SmallVec<[Sent; 8]> = SmallVec::with_capacity(self.items.len());
        for (i, item) in self.items.iter().enumerate() {
            let lane = item.unit.lane(item.at);
            let pair = index_of(&mut pairs, (item.alive, item.incarnation));
            let category = index_of_by(&mut counters, (&lane.category, &lane.acked), |a, b| {
                a.0 == b.0
            });
            let set = item
                .trim
                .then(|| index_of(&mut groups, lane.groups.as_str()));
            sent.push(((pair, category), set, i));
        }
        // Stable: the units of a run keep their order.
        sent.sort_by_key(|&(run, _, _)| run);
        let (na, units) = (pairs.len(), self.items.len());
        // 1-based KEYS indexes of the shared keys.
        let counter_at = |c: usize| na + units + 1 + c;
        let groups_at = |g: usize| na + units + counters.len() + 1 + g;
        // Every key first (the call is written as the command itself):
        // the shared ones, then per unit its stream and, with 'h' or 'a',
        // its state hash; then the values.
        let ns = na + units + counters.len() + groups.len();
        let keys = ns + units + self.items.iter().filter(|i| i.names_state()).count();
        // Per unit a run's three values at most, its token, spec and ids.
        let ids: usize = self.items.iter().map(|i| i.ids.len()).sum();
        let mut inv = Invocation::keys_first(
            &SCRIPTS.ack,
            keys,
            5 + na + 5 * units + ids,
            64 + 40 * units + 24 * ids,
        );
        for (alive, _) in &pairs {
            inv.key(*alive);
        }
        for &(_, _, i) in &sent {
            inv.key(&self.items[i].unit.lease);
        }
        for (_, acked) in &counters {
            inv.key(*acked);
        }
        inv.key(groups.as_slice());
        for &(_, _, i) in &sent {
            let item = &self.items[i];
            inv.key(item.unit.stream(item.at));
            if item.names_state() {
                inv.key(&item.unit.state);
            }
        }
        inv.arg(self.group)
            .arg(self.now_ms)
            .arg(na)
            .arg(units)
            .arg(ns);
        for (_, inc) in &pairs {
            inv.arg(*inc);
        }
        let mut spec = String::new();
        for (at, &((pair, counter), set, i)) in sent.iter().enumerate() {
            if at == 0 || sent[at - 1].0 != (pair, counter) {
                let m = sent[at..]
                    .iter()
                    .take_while(|s| s.0 == (pair, counter))
                    .count();
                inv.arg(pair + 1).arg(counter_at(counter)).arg(m);
            }
            let item = &self.items[i];
            inv.arg(item.token);
            let flags = item.flags();
            if flags.is_empty() {
                inv.arg(item.ids.len());
            } else {
                spec.clear();
                let groups = set.map_or(0, groups_at);
                // Writing to a String cannot fail.
                let _ = write!(spec, "{}:{flags}:{groups}", item.ids.len());
                inv.arg(spec.as_str());
            }
            inv.arg(item.ids);
        }
        (inv, Placed(sent))
    }

    /// One outcome per item, in order, from the script's `reply` to the
    /// call [`Ack::invocation`] put together.
    pub(crate) fn answers(&self, reply: &Reply, placed: &Placed) -> Result<Vec<Acked>, Error> {
        let sent = &placed.0;
        if reply.status != Status::Done || reply.values().len() != self.items.len() {
            return Err(reply.unexpected());
        }
        // The script answers in the order the units were sent.
        let mut out = vec![Acked::Acked(0); self.items.len()];
        for (v, &(_, _, i)) in reply.values().iter().zip(sent) {
            out[i] = match int(v) {
                Some(n) if n >= 0 => Acked::Acked(n as u64),
                Some(n) => Refusal::from_code(n)
                    .map(Acked::Refused)
                    .ok_or_else(|| reply.unexpected())?,
                None => return Err(reply.unexpected()),
            };
        }
        Ok(out)
    }
}
