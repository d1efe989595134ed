//! The Lua scripts, kept as `.lua` files beside this one.

use std::sync::LazyLock;

use redis::Script;

/// Every script convoy runs.
pub(crate) struct Scripts {
    pub(crate) publish: Script,
    pub(crate) acquire: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) read: Script,
    pub(crate) ack: Script,
    pub(crate) fail: Script,
    pub(crate) claim: Script,
    pub(crate) reap: Script,
    pub(crate) plain_ack: Script,
    pub(crate) dead_letter: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    publish: Script::new(include_str!("lua/publish.lua")),
    acquire: Script::new(include_str!("lua/acquire.lua")),
    renew: Script::new(include_str!("lua/renew.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    read: Script::new(include_str!("lua/read.lua")),
    ack: Script::new(include_str!("lua/ack.lua")),
    fail: Script::new(include_str!("lua/fail.lua")),
    claim: Script::new(include_str!("lua/claim.lua")),
    reap: Script::new(include_str!("lua/reap.lua")),
    plain_ack: Script::new(include_str!("lua/plain_ack.lua")),
    dead_letter: Script::new(include_str!("lua/dead_letter.lua")),
});

#[cfg(all(test, feature = "testing"))]
mod tests {
    //! The fence, script by script, against a real `redis-server`: once
    //! another owner takes a unit at a newer generation, every operation of
    //! the old token is refused.

    use redis::Value;

    use super::SCRIPTS;
    use crate::testing::RedisServer;

    const LEASE: &str = "convoy:lease:g:cat:k";
    const UNIT: &str = "convoy:unit:g:cat:k";
    const STREAM: &str = "cat:k";

    async fn acquire(c: &mut redis::aio::MultiplexedConnection, owner: &str) -> Option<String> {
        let v: Value = SCRIPTS
            .acquire
            .key(LEASE)
            .key(UNIT)
            .arg(owner)
            .arg(60_000)
            .arg(1)
            .invoke_async(c)
            .await
            .expect("acquire");
        let Value::Array(items) = v else { panic!("{v:?}") };
        let Some(Value::Array(first)) = items.first() else { panic!("{items:?}") };
        first.first().and_then(super::super::reply::text)
    }

    #[tokio::test]
    async fn a_stale_token_is_refused_everywhere() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("connection");
        let _: String = redis::cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("f")
            .arg("v")
            .query_async(&mut c)
            .await
            .expect("xadd");
        let old = acquire(&mut c, "a").await.expect("a takes the unit");
        assert_eq!(old, "a:1");
        assert_eq!(acquire(&mut c, "b").await, None, "held by a");
        // a's lease lapses (simulated) and b takes over at generation 2.
        let _: i64 = redis::cmd("DEL").arg(LEASE).query_async(&mut c).await.expect("del");
        let new = acquire(&mut c, "b").await.expect("b takes the unit");
        assert_eq!(new, "b:2");

        let read: Vec<Value> = SCRIPTS
            .read
            .key(LEASE)
            .key(STREAM)
            .key("")
            .arg(&old)
            .arg("g")
            .arg(10)
            .arg(10)
            .arg(">")
            .invoke_async(&mut c)
            .await
            .expect("read");
        assert_eq!(read, vec![Value::Int(-1)], "stale read refused");
        let ack: i64 = SCRIPTS
            .ack
            .key(LEASE)
            .key(STREAM)
            .key(UNIT)
            .key("convoy:groups:cat")
            .arg(&old)
            .arg("g")
            .arg(1)
            .arg("0-1")
            .invoke_async(&mut c)
            .await
            .expect("ack");
        assert_eq!(ack, -1, "stale ack refused");
        let fail: Vec<i64> = SCRIPTS
            .fail
            .key(LEASE)
            .key(UNIT)
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
            .arg(&old)
            .arg("g")
            .invoke_async(&mut c)
            .await
            .expect("claim");
        assert_eq!(claim, -1);
        let reap: i64 = SCRIPTS
            .reap
            .key(LEASE)
            .key("cat:__partitions__")
            .key(STREAM)
            .key("cat:k:backfill")
            .key(UNIT)
            .arg(&old)
            .arg("k")
            .arg(0)
            .arg(u64::MAX / 2)
            .invoke_async(&mut c)
            .await
            .expect("reap");
        assert_eq!(reap, -1);
        let renew: Vec<i64> = SCRIPTS
            .renew
            .key(LEASE)
            .key(UNIT)
            .arg(60_000)
            .arg(&old)
            .invoke_async(&mut c)
            .await
            .expect("renew");
        assert_eq!(renew, vec![0], "stale renew refused");
        let release: i64 = SCRIPTS
            .release
            .key(LEASE)
            .arg(&old)
            .invoke_async(&mut c)
            .await
            .expect("release");
        assert_eq!(release, 0, "a stale release leaves the new lease alone");

        // The current token works: it reads the entry, under its own name.
        let read: Vec<Value> = SCRIPTS
            .read
            .key(LEASE)
            .key(STREAM)
            .key("")
            .arg(&new)
            .arg("g")
            .arg(10)
            .arg(10)
            .arg(">")
            .invoke_async(&mut c)
            .await
            .expect("read");
        assert_eq!(read.first(), Some(&Value::Int(1)));
        let entries = super::super::reply::entries(&read[2]);
        assert_eq!(entries.len(), 1);
        // The generation counter survives a release and keeps growing.
        let released: i64 = SCRIPTS
            .release
            .key(LEASE)
            .arg(&new)
            .invoke_async(&mut c)
            .await
            .expect("release");
        assert_eq!(released, 1);
        assert_eq!(acquire(&mut c, "c").await.as_deref(), Some("c:3"));
    }
}
