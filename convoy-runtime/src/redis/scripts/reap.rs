//! `reap.lua`: retires a drained, idle unit (its index entries, its empty
//! streams and its lease go together; its generation stays).

use redis::aio::ConnectionLike;

use super::{Refusal, SCRIPTS, Status, call};
use crate::error::Error;
use crate::redis::unit::Unit;

/// Retires `unit` if it is empty and idle for `idle_ms`.
#[derive(Debug)]
pub(crate) struct Reap<'a> {
    pub(crate) unit: &'a Unit,
    /// The owner's liveness key.
    pub(crate) alive: &'a str,
    /// The fence token.
    pub(crate) token: &'a str,
    /// The owner's incarnation the lease was taken in.
    pub(crate) incarnation: &'a str,
    pub(crate) idle_ms: u64,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
}

/// What [`Reap`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reaped {
    /// Retired.
    Retired,
    /// Not empty, or not idle long enough: kept.
    Kept,
    /// The fence refused the caller.
    Refused(Refusal),
}

impl Reap<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Reaped, Error> {
        let mut inv = SCRIPTS.reap.prepare_invoke();
        inv.key(&self.unit.lease).key(&self.unit.state);
        for l in &self.unit.lanes {
            inv.key(&l.index).key(&l.primary).key(&l.backfill_always);
        }
        inv.key(self.alive)
            .arg(self.token)
            .arg(&self.unit.key)
            .arg(self.idle_ms)
            .arg(self.now_ms)
            .arg(self.unit.lanes.len())
            .arg(self.incarnation);
        let reply = call("reap", &inv, conn, "reap failed").await?;
        match reply.status {
            Status::Done => Ok(Reaped::Retired),
            Status::NotDone => Ok(Reaped::Kept),
            Status::Refused(why) => Ok(Reaped::Refused(why)),
            _ => Err(reply.unexpected()),
        }
    }
}
