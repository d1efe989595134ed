//! `acquire.lua`: takes the leases of several units at once, at a new
//! generation each.
//!
//! Taking leases is two steps, because the script must be given every key
//! it reads: [`holders`] reads who holds each lease, then [`Acquire`] runs
//! the script with those holders' liveness keys. A lease that changes hands
//! in between counts as held (the script checks), so the caller tries again
//! later.

use redis::Value;
use redis::aio::ConnectionLike;

use super::{Invocation, Refusal, Replicated, SCRIPTS, Status, call_replicated};
use crate::connection::{Conn, query_by_slot};
use crate::reply::{int, text};
use crate::unit::Unit;
use convoy_core::error::Error;
use convoy_core::names;

/// The owner named by a fence token `{owner}:{generation}`.
pub(crate) fn token_owner(token: &str) -> Option<&str> {
    let (owner, generation) = token.rsplit_once(':')?;
    (!generation.is_empty() && generation.bytes().all(|b| b.is_ascii_digit())).then_some(owner)
}

/// Who holds each unit's lease, other than `me`: the first step of taking
/// leases. Nothing is changed, so a failure means nothing was taken.
pub(crate) async fn holders(
    conn: &mut Conn,
    units: &[&Unit],
    me: &str,
) -> Result<Vec<Option<String>>, Error> {
    let cmds = units
        .iter()
        .map(|u| {
            let mut c = redis::cmd("GET");
            c.arg(&u.lease);
            (u.lease.clone(), c)
        })
        .collect();
    let tokens = query_by_slot(conn, cmds)
        .await
        .map_err(|e| Error::redis("failed to read the leases to take", e))?;
    Ok(tokens
        .iter()
        .map(|t| {
            text(t)
                .as_deref()
                .and_then(token_owner)
                .filter(|owner| *owner != me)
                .map(str::to_owned)
        })
        .collect())
}

/// Takes up to `max` of `units` for `owner`.
#[derive(Debug)]
pub(crate) struct Acquire<'a> {
    /// The consumer group (names the holders' liveness keys).
    pub(crate) group: &'a str,
    /// This engine instance.
    pub(crate) owner: &'a str,
    /// Its current incarnation.
    pub(crate) incarnation: &'a str,
    /// Its liveness key in the units' shard.
    pub(crate) alive: &'a str,
    /// The most units to take.
    pub(crate) max: usize,
    /// The units to try, all in one shard.
    pub(crate) units: &'a [Unit],
    /// The owner seen holding each unit's lease (from [`holders`]).
    pub(crate) holders: &'a [Option<String>],
    /// With `[broker] wait_acks`: the replicas that must have the leases
    /// and generations taken before they count (a failover then cannot
    /// lose a lease a worker starts from).
    pub(crate) wait: Option<Replicated>,
}

/// A lease taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The fence token `{owner}:{generation}`.
    pub(crate) token: String,
    /// Its generation.
    pub(crate) generation: u64,
    /// The unit is halted.
    pub(crate) halted: bool,
    /// The head entry with failures recorded, and how many.
    pub(crate) head: Option<(String, u32)>,
}

/// What [`Acquire`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// Per unit, in order: taken, or `None` when held (by a live owner, by
    /// another owner than the one seen, or over the limit).
    Units(Vec<Option<Taken>>),
    /// This instance's liveness lapsed: it takes nothing until it has
    /// registered again.
    NotAlive,
}

impl Acquire<'_> {
    /// Runs the script. An error means it may have run: any unit may now
    /// be leased to this owner.
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Acquired, Error> {
        let mut inv = Invocation::new(&SCRIPTS.acquire);
        for (u, holder) in self.units.iter().zip(self.holders) {
            // With no holder seen, the caller's own liveness key stands
            // in (the script then ignores it): every key is named.
            let alive = holder
                .as_deref()
                .map(|h| names::alive(u.shard, self.group, h))
                .unwrap_or_else(|| self.alive.to_owned());
            inv.key(&u.lease).key(&u.state).key(alive);
        }
        inv.key(self.alive)
            .arg(self.owner)
            .arg(self.max)
            .arg(self.incarnation);
        for holder in self.holders.iter().take(self.units.len()) {
            inv.arg(holder.as_deref().unwrap_or(""));
        }
        let reply =
            call_replicated("acquire", &inv, conn, "failed to take leases", self.wait).await?;
        match reply.status {
            Status::Done => {
                let Some(Value::Array(units)) = reply.value(0) else {
                    return Err(reply.unexpected());
                };
                Ok(Acquired::Units(units.iter().map(taken).collect()))
            }
            Status::Refused(Refusal::NotAlive) => Ok(Acquired::NotAlive),
            _ => Err(reply.unexpected()),
        }
    }
}

/// One unit's answer: `{token, halted, head, attempts}`, or `{false, holder}`.
fn taken(v: &Value) -> Option<Taken> {
    let Value::Array(fields) = v else {
        return None;
    };
    let token = fields.first().and_then(text)?;
    let generation = token.rsplit(':').next()?.parse::<u64>().ok()?;
    let head = fields.get(2).and_then(text).filter(|h| !h.is_empty());
    let failures = fields.get(3).and_then(int).unwrap_or(0).max(0) as u32;
    Some(Taken {
        halted: fields.get(1).and_then(text).as_deref() == Some("1"),
        head: head.map(|h| (h, failures)),
        token,
        generation,
    })
}
