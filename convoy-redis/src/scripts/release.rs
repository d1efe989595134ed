//! `release.lua`: releases a lease still held by the caller; then wakes the
//! other instances so one with room takes the unit at once.

use super::{Invocation, SCRIPTS, Status, call};
use crate::connection::Conn;
use crate::tracing;
use crate::unit::Unit;
use crate::wake;
use convoy_core::error::Error;

/// Which lease counts as the caller's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held<'a> {
    /// Held with exactly this fence token.
    Token(&'a str),
    /// Held by this owner, at any generation (a lease the instance may
    /// hold without a worker, after a lost reply).
    Owner(&'a str),
}

/// Releases `unit`'s lease if it is the caller's.
#[derive(Debug)]
pub(crate) struct Release<'a> {
    pub(crate) unit: &'a Unit,
    pub(crate) held: Held<'a>,
}

/// What [`Release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Released (and the other instances woken).
    Released,
    /// Not held by the caller: nothing changed.
    NotHeld,
}

impl Release<'_> {
    pub(crate) async fn run(&self, conn: &mut Conn) -> Result<Released, Error> {
        let (held, mode) = match self.held {
            Held::Token(token) => (token.to_owned(), ""),
            Held::Owner(owner) => (format!("{owner}:"), "prefix"),
        };
        let mut inv = Invocation::new(&SCRIPTS.release);
        inv.key(&self.unit.lease).arg(held).arg(mode);
        let reply = call("release", &inv, conn, "lease release failed").await?;
        match reply.status {
            Status::Done => {
                let category = self.unit.lanes.first().map_or("", |l| l.category.as_str());
                if let Err(e) = wake::hint(conn, [(category, self.unit.key.as_str())], true).await {
                    // Released: the others find the unit free at their
                    // next heartbeat.
                    tracing::debug!(error = %convoy_core::error::chain(&e), "released, but the wake-up failed");
                }
                Ok(Released::Released)
            }
            Status::NotDone => Ok(Released::NotHeld),
            _ => Err(reply.unexpected()),
        }
    }
}
