//! The operators' tools (`convoy_runtime::redis::admin`) against a real
//! `redis-server`, with the owner's state written by hand: skip,
//! dead-letter and replay check the fence and write the audit stream;
//! undelivered heads and several groups; an unreachable Redis.

use std::collections::BTreeMap;

use convoy_runtime::redis::admin::{Admin, AdminError, HeadOp, HeadRequest};
use convoy_runtime::redis::keys;
use convoy_runtime::testing::{RedisServer, free_port};
use convoy_runtime::{Envelope, Priority};
use redis::AsyncCommands;

/// A stream entry as XRANGE returns it: its id and its fields.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

const G: &str = "app::Ledger";

fn envelope(seq: u32) -> Envelope {
    Envelope {
        id: format!("m{seq}"),
        type_name: "Posted".into(),
        category: "cat".into(),
        partition_key: Some("k".into()),
        time_ms: 1_700_000_000_000 + u64::from(seq),
        priority: Priority::Normal,
        correlation_id: None,
        payload: format!("{{\"seq\":{seq}}}"),
    }
}

async fn publish(c: &mut redis::aio::MultiplexedConnection, stream: &str, seq: u32) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in envelope(seq).to_fields() {
        cmd.arg(k).arg(v);
    }
    cmd.query_async(c).await.expect("xadd")
}

/// Three entries of `cat:k`, all delivered to `owner:1` of group G,
/// which holds the lease at generation 1.
async fn running(server: &RedisServer) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let mut c = server.connection().await.expect("conn");
    let mut ids = Vec::new();
    for seq in 0..3 {
        ids.push(publish(&mut c, "cat:k", seq).await);
    }
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg("convoy:groups:cat")
        .arg(G)
        .ignore()
        .cmd("SADD")
        .arg("cat:__partitions__")
        .arg("k")
        .ignore()
        .cmd("XGROUP")
        .arg("CREATE")
        .arg("cat:k")
        .arg(G)
        .arg("0")
        .ignore()
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg(G)
        .arg("owner:1")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg("cat:k")
        .arg(">")
        .ignore()
        .cmd("SET")
        .arg(keys::lease(G, "cat", "k"))
        .arg("owner:1")
        .ignore()
        .cmd("SET")
        .arg(keys::alive(G, "owner"))
        .arg(1)
        .arg("PX")
        .arg(60_000)
        .ignore()
        .cmd("HSET")
        .arg(keys::unit(G, "cat", "k"))
        .arg("gen")
        .arg(1)
        .ignore()
        .query_async(&mut c)
        .await
        .expect("setup");
    (c, ids)
}

async fn halt_on(c: &mut redis::aio::MultiplexedConnection, entry: &str) {
    let _: () = c
        .hset_multiple(
            keys::unit(G, "cat", "k"),
            &[
                ("halted", "1"),
                ("halt_reason", "max_retries exceeded"),
                ("halt_error", "boom"),
                ("halt_since", "1700000000000"),
                ("halt_entry", entry),
                ("head", entry),
                ("attempts", "3"),
                ("last_error", "boom"),
            ],
        )
        .await
        .expect("hset");
}

#[tokio::test]
async fn skip_dead_letter_and_replay_check_fence_and_audit() {
    let server = RedisServer::start().expect("redis-server");
    let (mut c, ids) = running(&server).await;
    let admin = Admin::connect(&server.url()).await.expect("admin");

    // A running partition is refused without force.
    let e = admin
        .skip("cat", "k", G, false, "op")
        .await
        .expect_err("running");
    assert!(matches!(e, AdminError::NotHalted { .. }), "{e}");
    assert!(e.to_string().contains("--force"), "{e}");
    assert!(e.is_refusal());

    // Halted on another entry than the head: refused.
    halt_on(&mut c, &ids[1]).await;
    let e = admin
        .skip("cat", "k", G, false, "op")
        .await
        .expect_err("moved");
    assert!(matches!(e, AdminError::HeadMoved { .. }), "{e}");

    halt_on(&mut c, &ids[0]).await;
    let report = admin.partitions("cat").await.expect("partitions");
    assert_eq!(report.groups, vec![G.to_owned()]);
    let p = &report.partitions[0];
    assert_eq!(p.owner.as_deref(), Some("owner"));
    assert!(p.owner_alive);
    assert_eq!(p.generation, Some(1));
    assert_eq!(p.durable_generation, 1);
    assert!(p.lease_ms_left.is_some_and(|ms| ms > 50_000), "{p:?}");
    // Halted on the first of three read together: all three are pending,
    // none undelivered; the lag is all three, two behind the head.
    assert_eq!(
        (p.length, p.pending, p.undelivered, p.lag, p.behind_halt),
        (3, 3, Some(0), Some(3), Some(2))
    );
    assert!(p.halted);
    assert_eq!(p.halt_reason.as_deref(), Some("max_retries exceeded"));
    assert_eq!(p.halt_entry.as_deref(), Some(ids[0].as_str()));
    assert_eq!(report.totals.halted, 1);
    assert_eq!(report.totals.owned, 1);

    let i = admin.inspect("cat", "k", G).await.expect("inspect");
    let head = i.head.expect("head");
    assert_eq!(head.entry_id, ids[0]);
    assert!(head.pending);
    assert_eq!(head.delivery_count, 1);
    assert_eq!(head.consumer.as_deref(), Some("owner:1"));
    assert_eq!(head.envelope.expect("envelope").payload, "{\"seq\":0}");
    assert_eq!(i.status.attempts, 3);
    assert_eq!(i.status.last_error.as_deref(), Some("boom"));

    // The operator confirmed another entry: refused, nothing changed.
    let req = HeadRequest {
        category: "cat",
        key: "k",
        group: G,
        force: false,
        operator: "op",
        expect_entry: Some(&ids[1]),
    };
    let e = admin
        .act_on_head(HeadOp::Skip, &req)
        .await
        .expect_err("changed");
    assert!(matches!(e, AdminError::HeadChanged { .. }), "{e}");

    let req = HeadRequest {
        expect_entry: Some(&ids[0]),
        ..req
    };
    let out = admin.act_on_head(HeadOp::Skip, &req).await.expect("skip");
    assert_eq!(out.entry_id, ids[0]);
    assert!(!out.forced && out.was_pending && out.deleted);
    assert_eq!(out.fenced, None);
    let unit: BTreeMap<String, String> = c.hgetall(keys::unit(G, "cat", "k")).await.expect("unit");
    for gone in ["halted", "halt_entry", "halt_error", "head", "attempts"] {
        assert!(!unit.contains_key(gone), "{gone} in {unit:?}");
    }
    assert_eq!(unit["gen"], "1", "no fencing when halted");
    let len: u64 = c.xlen("cat:k").await.expect("xlen");
    assert_eq!(len, 2);
    let lease: Option<String> = c.get(keys::lease(G, "cat", "k")).await.expect("get");
    assert_eq!(
        lease.as_deref(),
        Some("owner:1"),
        "the owner keeps its lease"
    );

    // Running again: force fences the owner out.
    let e = admin
        .skip("cat", "k", G, false, "op")
        .await
        .expect_err("running");
    assert!(matches!(e, AdminError::NotHalted { .. }), "{e}");
    let out = admin
        .skip("cat", "k", G, true, "op")
        .await
        .expect("forced skip");
    assert_eq!(out.entry_id, ids[1]);
    assert!(out.forced);
    assert_eq!(out.fenced.as_deref(), Some("owner:1"));
    let lease: Option<String> = c.get(keys::lease(G, "cat", "k")).await.expect("get");
    assert_eq!(lease, None);
    let generation: String = c.hget(keys::unit(G, "cat", "k"), "gen").await.expect("gen");
    assert_eq!(generation, "2");

    // Dead-letter the last one (no lease now: nothing to fence).
    let out = admin
        .dead_letter("cat", "k", G, true, "alice")
        .await
        .expect("dead letter");
    assert_eq!(out.entry_id, ids[2]);
    assert_eq!(out.fenced, None);
    let dlq_id = out.dlq_id.expect("dlq id");
    let letters = admin.dlq("cat", Some("k")).await.expect("dlq");
    assert_eq!(letters.len(), 1);
    let l = &letters[0];
    assert_eq!(l.dlq_id, dlq_id);
    assert_eq!(l.group.as_deref(), Some(G));
    assert_eq!(l.entry.as_deref(), Some(ids[2].as_str()));
    assert_eq!(l.operator.as_deref(), Some("alice"));
    assert_eq!(l.source.as_deref(), Some("cat:k"));
    assert_eq!(l.envelope.as_ref().expect("envelope"), &envelope(2));
    let e = admin
        .skip("cat", "k", G, true, "op")
        .await
        .expect_err("empty");
    assert!(matches!(e, AdminError::NothingToDo { .. }), "{e}");

    // Replay: back at the tail, index and wake-up written, letter gone.
    let _: () = c.srem("cat:__partitions__", "k").await.expect("srem");
    let r = admin
        .replay("cat", "k", &dlq_id, "bob")
        .await
        .expect("replay");
    let tail: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg("cat:k")
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .expect("xrange");
    assert_eq!(tail.len(), 1);
    assert_eq!(tail[0].0, r.entry_id);
    let fields = tail[0].1.iter().map(|(k, v)| (k.as_str(), v.as_slice()));
    assert_eq!(
        Envelope::from_fields("cat:k", &tail[0].0, fields).expect("envelope"),
        envelope(2)
    );
    assert!(tail[0].1.iter().all(|(k, _)| !k.starts_with("dlq_")));
    let member: bool = c
        .sismember("cat:__partitions__", "k")
        .await
        .expect("sismember");
    assert!(member);
    let wake: u64 = c.xlen("cat:__wake__").await.expect("xlen");
    assert_eq!(wake, 4, "every action wakes the key's owner");
    assert!(admin.dlq("cat", Some("k")).await.expect("dlq").is_empty());
    let e = admin
        .replay("cat", "k", &dlq_id, "bob")
        .await
        .expect_err("gone");
    assert!(matches!(e, AdminError::NoSuchDeadLetter { .. }), "{e}");

    let audit = admin.audit(10).await.expect("audit");
    let ops: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|a| {
            (
                a.fields["op"].as_str(),
                a.fields["operator"].as_str(),
                a.fields["forced"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        vec![
            ("skip", "op", "0"),
            ("skip", "op", "1"),
            ("dead_letter", "alice", "1"),
            ("replay", "bob", "0"),
        ]
    );
    assert_eq!(audit[0].fields["entry"], ids[0]);
    assert_eq!(audit[1].fields["fenced"], "owner:1");
    assert_eq!(audit[2].fields["dlq_entry"], dlq_id);
    assert_eq!(audit[3].fields["entry"], r.entry_id);
}

#[tokio::test]
async fn undelivered_heads_and_several_groups() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = server.connection().await.expect("conn");
    let a = publish(&mut c, "cat:k", 0).await;
    let b = publish(&mut c, "cat:k", 1).await;
    let _: () = c
        .sadd("convoy:groups:cat", &["app::A", "app::B"])
        .await
        .expect("sadd");
    let admin = Admin::connect(&server.url()).await.expect("admin");

    // Nothing delivered yet: the head is the first entry.
    let i = admin.inspect("cat", "k", "app::A").await.expect("inspect");
    let head = i.head.expect("head");
    assert_eq!((head.entry_id.as_str(), head.pending), (a.as_str(), false));
    assert_eq!(head.delivery_count, 0);
    assert_eq!(
        (i.status.pending, i.status.undelivered, i.status.lag),
        (0, Some(2), Some(2))
    );

    let out = admin
        .skip("cat", "k", "app::A", true, "op")
        .await
        .expect("skip");
    assert_eq!(out.entry_id, a);
    assert!(!out.was_pending);
    assert!(!out.deleted, "another group still reads it");
    let len: u64 = c.xlen("cat:k").await.expect("xlen");
    assert_eq!(len, 2);
    let i = admin.inspect("cat", "k", "app::A").await.expect("inspect");
    assert_eq!(i.head.expect("head").entry_id, b, "A moved past the first");
    let i = admin.inspect("cat", "k", "app::B").await.expect("inspect");
    assert_eq!(i.head.expect("head").entry_id, a, "B still has it");

    // Handler resolution.
    let e = admin
        .resolve_group("cat", Some("k"), None)
        .await
        .expect_err("two groups");
    assert!(matches!(e, AdminError::AmbiguousHandler { .. }), "{e}");
    assert!(e.to_string().contains("app::A, app::B"), "{e}");
    let _: () = c
        .hset(keys::unit("app::B", "cat", "k"), "halted", "1")
        .await
        .expect("hset");
    assert_eq!(
        admin
            .resolve_group("cat", Some("k"), None)
            .await
            .expect("halted one"),
        "app::B"
    );
    assert_eq!(
        admin
            .resolve_group("cat", None, Some("A"))
            .await
            .expect("suffix"),
        "app::A"
    );
    let e = admin
        .resolve_group("cat", None, Some("C"))
        .await
        .expect_err("unknown");
    assert!(matches!(e, AdminError::UnknownHandler { .. }), "{e}");
    let e = admin
        .resolve_group("other", None, None)
        .await
        .expect_err("none");
    assert!(matches!(e, AdminError::NoHandlers { .. }), "{e}");
}

#[tokio::test]
async fn unreachable_redis_is_reported_as_such() {
    let port = free_port().expect("port");
    let e = Admin::connect(&format!("redis://user:secret@127.0.0.1:{port}/"))
        .await
        .expect_err("nothing listens");
    assert!(e.is_unreachable(), "{e:?}");
    // The error and its causes.
    let first: &(dyn std::error::Error + 'static) = &e;
    let text: Vec<String> = std::iter::successors(Some(first), |e| e.source())
        .map(ToString::to_string)
        .collect();
    let text = text.join(": ");
    assert!(text.contains("cannot connect"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}
