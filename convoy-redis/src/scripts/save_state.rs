//! `save_state.lua`: saves a process-manager instance if its version is
//! still the one the caller loaded.

use redis::aio::ConnectionLike;

use super::{Invocation, SCRIPTS, Status, call};
use convoy_core::error::Error;
use convoy_core::names;

/// Saves instance `id` of process manager `pm`.
#[derive(Debug)]
pub(crate) struct SaveState<'a> {
    pub(crate) pm: &'a str,
    pub(crate) id: &'a str,
    /// The version the caller loaded (0 for a new instance).
    pub(crate) expected: u64,
    /// The state, as JSON.
    pub(crate) state: &'a str,
    pub(crate) ended: bool,
    /// The ids of the latest applied events, as a JSON list.
    pub(crate) applied: &'a str,
}

/// What [`SaveState`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Saved {
    /// Saved: the version is now `expected + 1`.
    Saved,
    /// Someone saved the instance in between: nothing written.
    Conflict,
}

impl SaveState<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Saved, Error> {
        let mut inv = Invocation::new(&SCRIPTS.save_state);
        inv.key(names::pm_state(self.pm, self.id))
            .arg(self.expected)
            .arg(self.state)
            .arg(if self.ended { "1" } else { "0" })
            .arg(self.applied);
        let reply = call(
            "save_state",
            &inv,
            conn,
            "failed to save a process-manager instance",
        )
        .await?;
        match reply.status {
            Status::Done => Ok(Saved::Saved),
            Status::NotDone => Ok(Saved::Conflict),
            _ => Err(reply.unexpected()),
        }
    }
}
