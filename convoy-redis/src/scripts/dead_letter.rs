//! `dead_letter.lua`: moves an entry an ordinary handler gave up on to the
//! category's dead letter stream and acknowledges it, together.

use redis::aio::ConnectionLike;

use super::{Invocation, SCRIPTS, Status, call};
use crate::reply::Entry;
use convoy_core::error::Error;
use convoy_core::names;

/// Dead-letters `entry` of `stream` for `group`.
#[derive(Debug)]
pub(crate) struct DeadLetter<'a> {
    pub(crate) stream: &'a str,
    /// The category (names its dead letter stream).
    pub(crate) category: &'a str,
    /// The category's shard count.
    pub(crate) shards: u32,
    pub(crate) group: &'a str,
    pub(crate) entry: &'a Entry,
    /// The handler's last error, rendered.
    pub(crate) error: &'a str,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
}

impl DeadLetter<'_> {
    /// Returns the dead letter's id.
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<String, Error> {
        let mut inv = Invocation::new(&SCRIPTS.dead_letter);
        inv.key(self.stream)
            .key(names::category_dlq(self.category, self.shards))
            .arg(self.group)
            .arg(&self.entry.id)
            .arg(self.error)
            .arg(self.now_ms);
        for f in self.entry.flat_fields() {
            inv.arg(f);
        }
        let reply = call("dead_letter", &inv, conn, "failed to dead-letter an entry").await?;
        match reply.status {
            Status::Done => Ok(reply.text(0)),
            _ => Err(reply.unexpected()),
        }
    }
}
