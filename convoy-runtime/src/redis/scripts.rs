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

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    publish: Script::new(include_str!("lua/publish.lua")),
    acquire: Script::new(include_str!("lua/acquire.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    read: Script::new(include_str!("lua/read.lua")),
    ack: Script::new(include_str!("lua/ack.lua")),
    fail: Script::new(include_str!("lua/fail.lua")),
    claim: Script::new(include_str!("lua/claim.lua")),
    reap: Script::new(include_str!("lua/reap.lua")),
    plain_ack: Script::new(include_str!("lua/plain_ack.lua")),
    dead_letter: Script::new(include_str!("lua/dead_letter.lua")),
    save_state: Script::new(include_str!("lua/save_state.lua")),
    head_action: Script::new(include_str!("lua/head_action.lua")),
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

    async fn cmd(c: &mut MultiplexedConnection, args: &[&str]) {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: Value = cmd.query_async(c).await.expect("command");
    }

    async fn acquire(c: &mut MultiplexedConnection, owner: &str) -> Option<String> {
        let v: Value = SCRIPTS
            .acquire
            .key(LEASE)
            .key(UNIT)
            .arg(owner)
            .arg(1)
            .arg("g")
            .invoke_async(c)
            .await
            .expect("acquire");
        let Value::Array(items) = v else {
            panic!("{v:?}")
        };
        let Some(Value::Array(first)) = items.first() else {
            panic!("{items:?}")
        };
        first.first().and_then(super::super::reply::text)
    }

    async fn read(c: &mut MultiplexedConnection, token: &str, alive: &str) -> Vec<Value> {
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
            .invoke_async(c)
            .await
            .expect("read")
    }

    #[tokio::test]
    async fn a_stale_token_is_refused_everywhere() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("connection");
        cmd(&mut c, &["XADD", STREAM, "*", "f", "v"]).await;
        cmd(&mut c, &["SET", ALIVE_A, "1"]).await;
        cmd(&mut c, &["SET", ALIVE_B, "1"]).await;
        let old = acquire(&mut c, "a").await.expect("a takes the unit");
        assert_eq!(old, "a:1");
        assert_eq!(acquire(&mut c, "b").await, None, "held by a live owner");
        // a's liveness lapses: its token is refused even before anyone else
        // takes the unit.
        cmd(&mut c, &["DEL", ALIVE_A]).await;
        assert_eq!(read(&mut c, &old, ALIVE_A).await, vec![Value::Int(-1)]);
        // b takes over at generation 2; a comes back to life, still stale.
        let new = acquire(&mut c, "b").await.expect("b takes the unit");
        assert_eq!(new, "b:2");
        cmd(&mut c, &["SET", ALIVE_A, "1"]).await;

        assert_eq!(
            read(&mut c, &old, ALIVE_A).await,
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
            .invoke_async(&mut c)
            .await
            .expect("fail");
        assert_eq!(fail, vec![-1]);
        let claim: i64 = SCRIPTS
            .claim
            .key(LEASE)
            .key(STREAM)
            .key(ALIVE_A)
            .arg(&old)
            .arg("g")
            .invoke_async(&mut c)
            .await
            .expect("claim");
        assert_eq!(claim, -1);
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
        assert_eq!(acquire(&mut c, "a").await, None, "b is alive and holds it");

        // The current token works: it reads the entry, under its own name.
        let r = read(&mut c, &new, ALIVE_B).await;
        assert_eq!(r.first(), Some(&Value::Int(1)));
        assert_eq!(super::super::reply::entries(&r[2]).len(), 1);
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
        assert_eq!(acquire(&mut c, "a").await.as_deref(), Some("a:3"));
    }
}
