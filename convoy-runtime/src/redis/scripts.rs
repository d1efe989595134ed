//! The Lua scripts, kept as `.lua` files beside this one.

use std::sync::LazyLock;

use redis::Script;

/// Every script convoy runs.
pub(crate) struct Scripts {
    pub(crate) publish: Script,
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) read: Script,
    pub(crate) ack: Script,
    pub(crate) fail: Script,
    pub(crate) claim: Script,
    pub(crate) reap: Script,
    pub(crate) plain_ack: Script,
    pub(crate) dead_letter: Script,
    pub(crate) save_state: Script,
    pub(crate) head_action: Script,
    pub(crate) replay: Script,
}

#[cfg(feature = "testing")]
impl Scripts {
    /// A script by the stem of its file in `lua/` (for the testing kit's
    /// fault proxy).
    pub(crate) fn by_name(&self, name: &str) -> Option<&Script> {
        Some(match name {
            "publish" => &self.publish,
            "acquire" => &self.acquire,
            "release" => &self.release,
            "read" => &self.read,
            "ack" => &self.ack,
            "fail" => &self.fail,
            "claim" => &self.claim,
            "reap" => &self.reap,
            "plain_ack" => &self.plain_ack,
            "dead_letter" => &self.dead_letter,
            "save_state" => &self.save_state,
            "head_action" => &self.head_action,
            "replay" => &self.replay,
            _ => return None,
        })
    }
}

/// Why a fenced script refused to act (the codes of `fence.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another owner holds the lease.
    FencedOut,
    /// The lease is gone: an operator's `--force`, or Redis lost its state.
    LeaseGone,
    /// This instance's liveness lapsed (or another process renewed it under
    /// the same instance id).
    NotAlive,
}

impl Refusal {
    /// The refusal a script's status code stands for, if it is one.
    pub(crate) fn from_code(code: i64) -> Option<Refusal> {
        match code {
            -1 => Some(Refusal::FencedOut),
            -2 => Some(Refusal::LeaseGone),
            -3 => Some(Refusal::NotAlive),
            _ => None,
        }
    }

    /// What it means, for logs.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Refusal::FencedOut => "fenced out: another owner holds the unit",
            Refusal::LeaseGone => {
                "the unit's lease vanished while this instance held it (an operator's --force, or Redis lost its state)"
            }
            Refusal::NotAlive => {
                "this instance's liveness lapsed (stalled or cut off past lease_ttl_ms, or another process runs under the same instance id)"
            }
        }
    }
}

/// The status code that says a stream key holds another type.
pub(crate) const NOT_A_STREAM: i64 = -4;

/// The fence check and shared helpers, prepended to every fenced script.
const FENCE: &str = include_str!("lua/fence.lua");

/// A script that starts with the fence check.
fn fenced(body: &str) -> Script {
    Script::new(&format!("{FENCE}\n{body}"))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    publish: Script::new(include_str!("lua/publish.lua")),
    acquire: Script::new(include_str!("lua/acquire.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    read: fenced(include_str!("lua/read.lua")),
    ack: fenced(include_str!("lua/ack.lua")),
    fail: fenced(include_str!("lua/fail.lua")),
    claim: fenced(include_str!("lua/claim.lua")),
    reap: fenced(include_str!("lua/reap.lua")),
    plain_ack: Script::new(include_str!("lua/plain_ack.lua")),
    dead_letter: Script::new(include_str!("lua/dead_letter.lua")),
    save_state: Script::new(include_str!("lua/save_state.lua")),
    head_action: fenced(include_str!("lua/head_action.lua")),
    replay: Script::new(include_str!("lua/replay.lua")),
});

#[cfg(all(test, feature = "testing"))]
mod tests {
    //! The fence, script by script, against a real `redis-server`: once
    //! another owner takes a unit at a newer generation, or the owner's
    //! liveness lapsed, every operation of the old token is refused.

    use redis::Value;
    use redis::aio::MultiplexedConnection;

    use super::SCRIPTS;
    use crate::testing::RedisServer;

    const LEASE: &str = "convoy:lease:g:cat:k";
    const UNIT: &str = "convoy:unit:g:cat:k";
    const STREAM: &str = "cat:k";
    const ALIVE_A: &str = "convoy:alive:g:a";
    const ALIVE_B: &str = "convoy:alive:g:b";

    async fn cmd(c: &mut MultiplexedConnection, args: &[&str]) -> Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(c).await.expect("command")
    }

    /// Takes the unit for `owner` in incarnation `inc`: its token, or
    /// `None` when the unit is held, or `Err` status when refused.
    async fn acquire(c: &mut MultiplexedConnection, owner: &str, inc: &str) -> Option<String> {
        let v: Value = SCRIPTS
            .acquire
            .key(LEASE)
            .key(UNIT)
            .key(format!("convoy:alive:g:{owner}"))
            .arg(owner)
            .arg(1)
            .arg("g")
            .arg(inc)
            .invoke_async(c)
            .await
            .expect("acquire");
        let Value::Array(items) = v else {
            panic!("{v:?}")
        };
        let Some(Value::Array(units)) = items.get(1) else {
            return None;
        };
        let Some(Value::Array(first)) = units.first() else {
            panic!("{units:?}")
        };
        first.first().and_then(super::super::reply::text)
    }

    fn generation(token: &str) -> u64 {
        token
            .rsplit(':')
            .next()
            .and_then(|g| g.parse().ok())
            .expect("a generation")
    }

    async fn read(
        c: &mut MultiplexedConnection,
        token: &str,
        alive: &str,
        inc: &str,
    ) -> Vec<Value> {
        SCRIPTS
            .read
            .key(LEASE)
            .key(STREAM)
            .key("")
            .key(alive)
            .arg(token)
            .arg("g")
            .arg(10)
            .arg(10)
            .arg(">")
            .arg(1)
            .arg(0)
            .arg(inc)
            .invoke_async(c)
            .await
            .expect("read")
    }

    #[tokio::test]
    async fn a_stale_token_is_refused_everywhere() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("connection");
        cmd(&mut c, &["XADD", STREAM, "*", "f", "v"]).await;
        cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
        cmd(&mut c, &["SET", ALIVE_B, "b1"]).await;
        let old = acquire(&mut c, "a", "a1").await.expect("a takes the unit");
        assert!(old.starts_with("a:"), "{old}");
        assert_eq!(
            acquire(&mut c, "b", "b1").await,
            None,
            "held by a live owner"
        );
        // a's liveness lapses: its token is refused even before anyone else
        // takes the unit.
        cmd(&mut c, &["DEL", ALIVE_A]).await;
        assert_eq!(
            read(&mut c, &old, ALIVE_A, "a1").await,
            vec![Value::Int(-3)]
        );
        // A lapsed instance takes nothing until it registers again.
        assert_eq!(acquire(&mut c, "a", "a1").await, None);
        // b takes over at a newer generation; a comes back to life (a new
        // incarnation), still stale.
        let new = acquire(&mut c, "b", "b1").await.expect("b takes the unit");
        assert!(generation(&new) > generation(&old), "{old} then {new}");
        cmd(&mut c, &["SET", ALIVE_A, "a2"]).await;

        assert_eq!(
            read(&mut c, &old, ALIVE_A, "a2").await,
            vec![Value::Int(-1)],
            "stale read refused"
        );
        let ack: Vec<i64> = SCRIPTS
            .ack
            .key(LEASE)
            .key(STREAM)
            .key(UNIT)
            .key("convoy:groups:cat")
            .key("convoy:acked:g:cat")
            .key(ALIVE_A)
            .arg("g")
            .arg(1)
            .arg(&old)
            .arg("a2")
            .arg("hat")
            .arg(1)
            .arg("0-1")
            .invoke_async(&mut c)
            .await
            .expect("ack");
        assert_eq!(ack, vec![-1], "stale ack refused");
        let fail: Vec<i64> = SCRIPTS
            .fail
            .key(LEASE)
            .key(UNIT)
            .key(ALIVE_A)
            .arg(&old)
            .arg("0-1")
            .arg("err")
            .arg(3)
            .arg(1)
            .arg(0)
            .arg("a2")
            .arg("")
            .invoke_async(&mut c)
            .await
            .expect("fail");
        assert_eq!(fail, vec![-1]);
        let claim: Vec<i64> = SCRIPTS
            .claim
            .key(LEASE)
            .key(STREAM)
            .key(ALIVE_A)
            .arg(&old)
            .arg("g")
            .arg("a2")
            .invoke_async(&mut c)
            .await
            .expect("claim");
        assert_eq!(claim, vec![-1]);
        let reap: i64 = SCRIPTS
            .reap
            .key(LEASE)
            .key(UNIT)
            .key("cat:__partitions__")
            .key(STREAM)
            .key("cat:k:backfill")
            .key(ALIVE_A)
            .arg(&old)
            .arg("k")
            .arg(0)
            .arg(u64::MAX / 2)
            .arg(1)
            .arg("a2")
            .invoke_async(&mut c)
            .await
            .expect("reap");
        assert_eq!(reap, -1);
        let release: i64 = SCRIPTS
            .release
            .key(LEASE)
            .key("cat:__wake__")
            .arg(&old)
            .arg("k")
            .arg(1000)
            .invoke_async(&mut c)
            .await
            .expect("release");
        assert_eq!(release, 0, "a stale release leaves the new lease alone");
        assert_eq!(
            acquire(&mut c, "a", "a2").await,
            None,
            "b is alive and holds it"
        );

        // The current token works: it reads the entry, under its own name.
        let r = read(&mut c, &new, ALIVE_B, "b1").await;
        assert_eq!(r.first(), Some(&Value::Int(1)));
        assert_eq!(super::super::reply::entries(&r[2]).len(), 1);
        // b's token in an earlier incarnation of b is refused as not alive.
        assert_eq!(
            read(&mut c, &new, ALIVE_B, "b0").await,
            vec![Value::Int(-3)]
        );
        // The generation counter survives a release and keeps growing.
        let released: i64 = SCRIPTS
            .release
            .key(LEASE)
            .key("cat:__wake__")
            .arg(&new)
            .arg("k")
            .arg(1000)
            .invoke_async(&mut c)
            .await
            .expect("release");
        assert_eq!(released, 1);
        let woken: i64 = redis::cmd("XLEN")
            .arg("cat:__wake__")
            .query_async(&mut c)
            .await
            .expect("xlen");
        assert_eq!(
            woken, 1,
            "a release wakes the other instances; a refused one does not"
        );
        let third = acquire(&mut c, "a", "a2").await.expect("free again");
        assert!(generation(&third) > generation(&new), "{new} then {third}");
        // The lease is gone (an operator's --force): refused as such.
        cmd(&mut c, &["DEL", LEASE]).await;
        assert_eq!(
            read(&mut c, &third, ALIVE_A, "a2").await,
            vec![Value::Int(-2)]
        );
    }

    #[tokio::test]
    async fn a_lease_of_an_earlier_incarnation_is_free() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("connection");
        cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
        cmd(&mut c, &["SET", ALIVE_B, "b1"]).await;
        let old = acquire(&mut c, "a", "a1").await.expect("a takes the unit");
        // a lapses and registers again: its liveness key exists, in a new
        // incarnation, and the lease it took before is dead for b.
        cmd(&mut c, &["SET", ALIVE_A, "a2"]).await;
        let new = acquire(&mut c, "b", "b1")
            .await
            .expect("b takes the dead lease");
        assert!(generation(&new) > generation(&old));
    }

    #[tokio::test]
    async fn generations_never_repeat_when_the_unit_state_is_lost() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("connection");
        cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
        let first = acquire(&mut c, "a", "a1").await.expect("taken");
        cmd(&mut c, &["DEL", LEASE]).await;
        let second = acquire(&mut c, "a", "a1").await.expect("taken");
        assert!(generation(&second) > generation(&first));
        // Everything convoy knew is gone (FLUSHALL, or a restart without
        // persistence): the next generation is still newer.
        cmd(&mut c, &["FLUSHALL"]).await;
        cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
        let third = acquire(&mut c, "a", "a1").await.expect("taken");
        assert!(
            generation(&third) > generation(&second),
            "{second} then {third}: a fence token handed out twice"
        );
    }

    #[tokio::test]
    async fn a_repeated_failure_record_counts_once_and_a_trim_keeps_pending_entries() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("connection");
        cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
        cmd(&mut c, &["SADD", "convoy:groups:cat", "g"]).await;
        let token = acquire(&mut c, "a", "a1").await.expect("taken");
        let fail = |known: u32| {
            let mut inv = SCRIPTS.fail.prepare_invoke();
            inv.key(LEASE)
                .key(UNIT)
                .key(ALIVE_A)
                .arg(&token)
                .arg("1-1")
                .arg("boom")
                .arg(3)
                .arg(1)
                .arg(known)
                .arg("a1")
                .arg("");
            inv
        };
        let r: Vec<i64> = fail(0).invoke_async(&mut c).await.expect("fail");
        assert_eq!(r, vec![1, 0]);
        let r: Vec<i64> = fail(0).invoke_async(&mut c).await.expect("fail again");
        assert_eq!(
            r,
            vec![1, 0],
            "the same failure, sent again after a lost reply"
        );
        let r: Vec<i64> = fail(1).invoke_async(&mut c).await.expect("next failure");
        assert_eq!(r, vec![2, 0]);

        // Three entries; all three read (delivered, pending), only the last
        // handled and acknowledged (the reply of the read of the first two
        // was lost, say): the trim must keep the first two.
        for id in ["1-1", "1-2", "1-3"] {
            cmd(&mut c, &["XADD", STREAM, id, "f", "v"]).await;
        }
        let r = read(&mut c, &token, ALIVE_A, "a1").await;
        assert_eq!(super::super::reply::entries(&r[2]).len(), 3);
        let ack: Vec<i64> = SCRIPTS
            .ack
            .key(LEASE)
            .key(STREAM)
            .key(UNIT)
            .key("convoy:groups:cat")
            .key("convoy:acked:g:cat")
            .key(ALIVE_A)
            .arg("g")
            .arg(1)
            .arg(&token)
            .arg("a1")
            .arg("t")
            .arg(1)
            .arg("1-3")
            .invoke_async(&mut c)
            .await
            .expect("ack");
        assert_eq!(ack, vec![1]);
        let len: i64 = redis::cmd("XLEN")
            .arg(STREAM)
            .query_async(&mut c)
            .await
            .expect("xlen");
        // Only a prefix can be trimmed: the pending 1-1 keeps everything.
        assert_eq!(len, 3, "the unhandled pending entries survive the trim");
    }
}
