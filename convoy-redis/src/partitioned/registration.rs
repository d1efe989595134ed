//! The registration's pipelines, built and read by name rather than by
//! position: the group's records (its categories, its scope) in every
//! shard, and the declarations of this instance's liveness, one per shard,
//! each reply read as its shard's.

use std::time::Duration;

use redis::{Cmd, RedisResult, Value};

use crate::connection::{Conn, query_by_slot, query_each_slot};

/// The commands that record a group for its categories in every shard
/// (idempotent).
#[derive(Debug, Default)]
pub(super) struct Records {
    cmds: Vec<(String, Cmd)>,
}

impl Records {
    /// Records `group` in the set of groups `set` of a category's shard.
    pub(super) fn group(&mut self, set: String, group: &str) {
        let mut cmd = redis::cmd("SADD");
        cmd.arg(&set).arg(group);
        self.cmds.push((set, cmd));
    }

    /// Records `category` in the set of categories `set`.
    pub(super) fn category(&mut self, set: &str, category: &str) {
        let mut cmd = redis::cmd("SADD");
        cmd.arg(set).arg(category);
        self.cmds.push((set.to_owned(), cmd));
    }

    /// Records how the group names its units (`scope`) at `key`, for the
    /// operators' tools.
    pub(super) fn scope(&mut self, key: String, scope: &str) {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(scope);
        self.cmds.push((key, cmd));
    }

    /// Sends them, per hash slot; fails if any failed (none is read).
    pub(super) async fn send(self, conn: &mut Conn) -> RedisResult<()> {
        query_by_slot(conn, self.cmds).await.map(drop)
    }
}

/// The declarations of this instance's liveness: per shard, its liveness
/// key set to the shard's incarnation with the lease TTL.
#[derive(Debug, Default)]
pub(super) struct Declaration {
    cmds: Vec<(String, Cmd)>,
    /// The shard of each command, in order.
    shards: Vec<u32>,
}

impl Declaration {
    /// Declares this instance alive in `shard`: its liveness key `key`
    /// holds `incarnation` for `ttl_ms`.
    pub(super) fn alive(&mut self, shard: u32, key: &str, incarnation: &str, ttl_ms: u64) {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(incarnation).arg("PX").arg(ttl_ms);
        self.cmds.push((key.to_owned(), cmd));
        self.shards.push(shard);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Sends it, per hash slot, each slot's commands within `within`.
    pub(super) async fn send(self, conn: &mut Conn, within: Duration) -> Declared {
        let replies = query_each_slot(conn, self.cmds, within).await;
        Declared {
            replies,
            shards: self.shards,
        }
    }
}

/// The declarations' replies, each read as its shard's.
#[derive(Debug)]
pub(super) struct Declared {
    replies: Vec<RedisResult<Value>>,
    shards: Vec<u32>,
}

impl Declared {
    /// Each shard declared, and whether it answered.
    pub(super) fn shards(self) -> impl Iterator<Item = (u32, RedisResult<Value>)> {
        self.shards.into_iter().zip(self.replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_read_by_shard() {
        let mut d = Declaration::default();
        assert!(d.is_empty());
        d.alive(3, "{3}alive", "inc", 1000);
        d.alive(7, "{7}alive", "inc", 1000);
        d.alive(9, "{9}alive", "inc", 1000);
        assert_eq!(d.cmds.len(), 3);
        let down = redis::RedisError::from((redis::ErrorKind::Io, "shard down"));
        let r = Declared {
            replies: vec![Ok(Value::Okay), Err(down), Ok(Value::Okay)],
            shards: d.shards,
        };
        let answered: Vec<(u32, bool)> = r.shards().map(|(s, v)| (s, v.is_ok())).collect();
        assert_eq!(answered, vec![(3, true), (7, false), (9, true)]);
    }

    #[test]
    fn records_name_their_keys() {
        let mut r = Records::default();
        r.group("{0}groups:c".into(), "g");
        r.category("categories", "c");
        r.scope("scope:g".into(), "correlation");
        let keys: Vec<&str> = r.cmds.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["{0}groups:c", "categories", "scope:g"]);
    }
}
