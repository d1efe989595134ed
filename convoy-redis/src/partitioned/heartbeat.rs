//! The heartbeat's one pipeline, built and read by name rather than by
//! position: per shard the liveness renewal, the instance registration
//! (and the list of live instances), per category and shard the counts
//! (partitions, published, finished), and commands whose replies are not
//! read (the pause marker). One command list, sent per hash slot.

use std::time::Duration;

use redis::{Cmd, RedisResult, Value};

use super::super::loss;
use crate::connection::{Conn, query_each_slot};
use crate::reply::int;

/// Where a (category, shard)'s three count replies start.
#[derive(Debug, Clone, Copy)]
struct CountsAt {
    category: usize,
    shard: u32,
    at: usize,
}

/// The heartbeat's commands, with where each reply to read will be.
#[derive(Debug, Default)]
pub(super) struct Pipeline {
    cmds: Vec<(String, Cmd)>,
    /// The shards renewed, in the order of their replies (from 0).
    renewals: Vec<u32>,
    /// The `ZRANGE` of the live instances.
    instances: Option<usize>,
    counts: Vec<CountsAt>,
}

impl Pipeline {
    /// Renews the liveness key `key` of `shard` if it still exists (`SET
    /// .. XX PX ttl GET`: the reply is the value it held).
    pub(super) fn renew(&mut self, shard: u32, key: &str, incarnation: &str, ttl_ms: u64) {
        debug_assert!(self.cmds.len() == self.renewals.len(), "renewals first");
        let mut c = redis::cmd("SET");
        c.arg(key)
            .arg(incarnation)
            .arg("XX")
            .arg("PX")
            .arg(ttl_ms)
            .arg("GET");
        self.cmds.push((key.to_owned(), c));
        self.renewals.push(shard);
    }

    /// Registers `owner` as live in the sorted set `set` until `now_ms +
    /// ttl_ms`, drops the instances whose registration ran out, and reads
    /// the live ones.
    pub(super) fn register(&mut self, set: &str, owner: &str, now_ms: u64, ttl_ms: u64) {
        let mut c = redis::cmd("ZADD");
        c.arg(set).arg(now_ms + ttl_ms).arg(owner);
        self.cmds.push((set.to_owned(), c));
        let mut c = redis::cmd("ZREMRANGEBYSCORE");
        c.arg(set).arg("-inf").arg(now_ms);
        self.cmds.push((set.to_owned(), c));
        let mut c = redis::cmd("ZRANGE");
        c.arg(set).arg(0).arg(-1);
        self.instances = Some(self.cmds.len());
        self.cmds.push((set.to_owned(), c));
    }

    /// Reads the counts of the `category`-th subscribed category in
    /// `shard`: the size of its partition index, its published counter
    /// and this handler's finished counter.
    pub(super) fn counts(
        &mut self,
        category: usize,
        shard: u32,
        index: String,
        published: String,
        acked: String,
    ) {
        self.counts.push(CountsAt {
            category,
            shard,
            at: self.cmds.len(),
        });
        for (key, op) in [(index, "SCARD"), (published, "GET"), (acked, "GET")] {
            let mut c = redis::cmd(op);
            c.arg(&key);
            self.cmds.push((key, c));
        }
    }

    /// A command whose reply is not read.
    pub(super) fn also(&mut self, key: String, cmd: Cmd) {
        self.cmds.push((key, cmd));
    }

    /// Sends it, per hash slot, each slot's commands within `within`.
    pub(super) async fn send(self, conn: &mut Conn, within: Duration) -> Replies {
        let replies = query_each_slot(conn, self.cmds, within).await;
        Replies {
            replies,
            renewals: self.renewals,
            instances: self.instances,
            counts: self.counts,
        }
    }
}

/// The heartbeat's replies, read by what they answer.
#[derive(Debug)]
pub(super) struct Replies {
    replies: Vec<RedisResult<Value>>,
    renewals: Vec<u32>,
    instances: Option<usize>,
    counts: Vec<CountsAt>,
}

impl Replies {
    /// Each renewed shard and its reply (the value its liveness key held,
    /// nil when it was gone).
    pub(super) fn renewals(&self) -> impl Iterator<Item = (u32, &RedisResult<Value>)> {
        self.renewals.iter().copied().zip(&self.replies)
    }

    /// The live instances' reply.
    pub(super) fn instances(&self) -> Option<&RedisResult<Value>> {
        self.replies.get(self.instances?)
    }

    /// Each (category, shard) read, with its counts: `None` when the
    /// shard did not answer all three.
    pub(super) fn counts(&self) -> impl Iterator<Item = (usize, u32, Option<Counts>)> + '_ {
        self.counts.iter().map(|c| {
            let read = |i: usize| match self.replies.get(c.at + i) {
                Some(Ok(v)) => Some(int(v).unwrap_or(0)),
                _ => None,
            };
            let counts = match (read(0), read(1), read(2)) {
                (Some(n), Some(p), Some(a)) => Some(Counts {
                    partitions: n.max(0) as u64,
                    published: p,
                    acked: a,
                }),
                _ => None,
            };
            (c.category, c.shard, counts)
        })
    }
}

/// What one heartbeat read of a category's shard.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    /// Live partitions in the shard's index.
    pub(super) partitions: u64,
    /// Partitioned events ever published to the shard.
    pub(super) published: i64,
    /// Of those, the ones this handler finished.
    pub(super) acked: i64,
}

impl Counts {
    /// The published and finished counts only grow: seeing one go back
    /// means the shard's master lost writes it had acknowledged (a failover
    /// to a replica, or a restart, without them). Reported as an ERROR
    /// naming the shard and the range, and counted in
    /// `convoy_replication_lost_total`. A first reading (all zero before)
    /// compares with nothing.
    pub(super) fn check_lost(&self, now: &Counts, group: &'static str, category: &str, shard: u32) {
        if *self == Counts::default() {
            return;
        }
        if now.published < self.published {
            let lost = (self.published - now.published) as u64;
            loss::reported(
                category,
                shard,
                "published",
                lost,
                group,
                &format!(
                    "Redis lost published events: shard {shard} of {category} counted {} publishes and now counts {}, so the last {lost} events published there are gone from Redis (its master failed over to a replica, or restarted, without them): those not handled before will never be; the publisher's own ERROR names their outbox seqs; set [broker] wait_replicas = 1 to wait for a replica on every publish",
                    self.published, now.published
                ),
            );
        }
        if now.acked < self.acked {
            let lost = (self.acked - now.acked) as u64;
            loss::reported(
                category,
                shard,
                "acked",
                lost,
                group,
                &format!(
                    "Redis lost acknowledgements: shard {shard} of {category} counted {} events finished by {group} and now counts {}, so up to {lost} events may run again, after later events of their key (its master failed over to a replica, or restarted, without them); make external effects exactly-once by the event's origin (AppliedEvents), or set [broker] wait_acks = true with wait_replicas = 1",
                    self.acked, now.acked
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies as `send` would return them, for a built pipeline.
    fn answered(p: Pipeline, replies: Vec<RedisResult<Value>>) -> Replies {
        assert_eq!(p.cmds.len(), replies.len());
        Replies {
            replies,
            renewals: p.renewals,
            instances: p.instances,
            counts: p.counts,
        }
    }

    #[test]
    fn replies_are_read_by_what_they_answer() {
        let mut p = Pipeline::default();
        p.renew(3, "{3}alive", "inc", 1000);
        p.renew(7, "{7}alive", "inc", 1000);
        p.register("instances", "e0", 5, 1000);
        p.counts(0, 3, "i3".into(), "p3".into(), "a3".into());
        p.counts(1, 7, "i7".into(), "p7".into(), "a7".into());
        p.also("paused".into(), redis::cmd("DEL"));
        let ok = |v: Value| -> RedisResult<Value> { Ok(v) };
        let down = || -> RedisResult<Value> {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "shard down",
            )))
        };
        let r = answered(
            p,
            vec![
                ok(Value::BulkString(b"inc".to_vec())),
                down(),
                ok(Value::Int(1)),
                ok(Value::Int(0)),
                ok(Value::Array(vec![Value::BulkString(b"e0".to_vec())])),
                ok(Value::Int(4)),
                ok(Value::BulkString(b"10".to_vec())),
                ok(Value::Nil),
                ok(Value::Int(2)),
                down(),
                ok(Value::Int(1)),
                ok(Value::Int(1)),
            ],
        );
        let renewed: Vec<(u32, bool)> = r.renewals().map(|(s, v)| (s, v.is_ok())).collect();
        assert_eq!(renewed, vec![(3, true), (7, false)]);
        assert!(matches!(r.instances(), Some(Ok(Value::Array(a))) if a.len() == 1));
        type Read = (usize, u32, Option<(u64, i64, i64)>);
        let counts: Vec<Read> = r
            .counts()
            .map(|(c, s, n)| (c, s, n.map(|n| (n.partitions, n.published, n.acked))))
            .collect();
        assert_eq!(counts, vec![(0, 3, Some((4, 10, 0))), (1, 7, None)]);
    }
}
