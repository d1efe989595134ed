//! `plain_ack.lua`: acknowledges entries of an ordinary (unpartitioned)
//! stream and deletes the ones every registered group has consumed.

use redis::aio::ConnectionLike;

use super::{Invocation, SCRIPTS, Status, call};
use convoy_core::error::Error;
use convoy_core::names;

/// Acknowledges `ids` of `stream` for `group`.
#[derive(Debug)]
pub(crate) struct PlainAck<'a> {
    pub(crate) stream: &'a str,
    /// The category (names its set of registered groups).
    pub(crate) category: &'a str,
    /// The category's shard count.
    pub(crate) shards: u32,
    pub(crate) group: &'a str,
    pub(crate) ids: &'a [&'a str],
}

impl PlainAck<'_> {
    /// Returns how many entries were acknowledged.
    pub(crate) async fn run(&self, conn: &mut (impl ConnectionLike + Send)) -> Result<u64, Error> {
        let mut inv = Invocation::new(&SCRIPTS.plain_ack);
        inv.key(self.stream)
            .key(names::base_groups(self.category, self.shards))
            .arg(self.group)
            .arg(self.ids);
        let reply = call("plain_ack", &inv, conn, "ack failed").await?;
        match reply.status {
            Status::Done => Ok(reply.int(0).max(0) as u64),
            _ => Err(reply.unexpected()),
        }
    }
}
