//! The operators' tools (`convoy_runtime::redis::admin`) against a real
//! `redis-server`, with the owner's state written by hand in the key's
//! shard (as an engine would, for the shard count recorded in Redis): skip,
//! dead-letter and replay check the fence and write the audit stream;
//! undelivered heads and several groups; partitions over every shard; an
//! unreachable Redis.

use std::collections::BTreeMap;

use convoy_runtime::redis::admin::{Admin, AdminError, HeadOp, HeadRequest};
use convoy_runtime::redis::keys;
use convoy_runtime::testing::{RedisServer, free_port};
use convoy_runtime::{Envelope, Priority};
use redis::AsyncCommands;

/// A stream entry as XRANGE returns it: its id and its fields.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

const G: &str = "app::Ledger";

/// The shard count recorded for `cat` (not the default: the tools must use
/// the recorded one).
const SHARDS: u32 = 5;

/// The shard of `cat`'s key `k`.
fn shard() -> u32 {
    keys::shard_of("k", SHARDS)
}

/// `cat`'s partition stream of `k`.
fn stream() -> String {
    keys::partition_stream(shard(), "cat", "k")
}

/// `group`'s unit state hash of `k`.
fn unit(group: &str) -> String {
    keys::unit(shard(), group, "cat", "k")
}

/// `G`'s lease of `k`.
fn lease_key() -> String {
    keys::lease(shard(), G, "cat", "k")
}

/// Records `shards` as `category`'s shard count and registers `groups`
/// in every shard's group set, as an engine does.
async fn register(
    c: &mut redis::aio::MultiplexedConnection,
    category: &str,
    shards: u32,
    groups: &[&str],
) {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(keys::shards(category))
        .arg(shards)
        .ignore();
    for s in 0..shards {
        pipe.cmd("SADD")
            .arg(keys::groups(s, category))
            .arg(groups)
            .ignore();
    }
    let _: () = pipe.query_async(c).await.expect("register");
}

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
        origin: Some(convoy_runtime::Origin {
            producer: "outbox".into(),
            seq: u64::from(seq),
        }),
        replay: None,
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

/// Three entries of `{s}cat:k`, all delivered to `owner:1` of group G,
/// which holds the lease at generation 1.
async fn running(server: &RedisServer) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let mut c = server.connection().await.expect("conn");
    register(&mut c, "cat", SHARDS, &[G]).await;
    let mut ids = Vec::new();
    for seq in 0..3 {
        ids.push(publish(&mut c, &stream(), seq).await);
    }
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg(keys::partition_index(shard(), "cat"))
        .arg("k")
        .ignore()
        .cmd("XGROUP")
        .arg("CREATE")
        .arg(stream())
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
        .arg(stream())
        .arg(">")
        .ignore()
        .cmd("SET")
        .arg(lease_key())
        .arg("owner:1")
        .ignore()
        .cmd("SET")
        .arg(keys::alive(shard(), G, "owner"))
        .arg(1)
        .arg("PX")
        .arg(60_000)
        .ignore()
        .cmd("HSET")
        .arg(unit(G))
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
            unit(G),
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
    assert_eq!((p.key.as_str(), p.shard), ("k", shard()));
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

    assert_eq!(p.paused_since_ms, None);
    // The owner's handler paused (an outage of its dependency): its
    // heartbeat writes when the pause started; the partition shows it.
    let _: () = c
        .set(keys::paused(G, "owner"), 1_700_000_000_000u64)
        .await
        .expect("set");
    let i = admin.inspect("cat", "k", G).await.expect("inspect");
    assert_eq!(i.status.paused_since_ms, Some(1_700_000_000_000));
    let _: () = c.del(keys::paused(G, "owner")).await.expect("del");
    let i = admin.inspect("cat", "k", G).await.expect("inspect");
    assert_eq!(i.status.paused_since_ms, None);
    assert_eq!(i.status.shard, shard());
    assert!(i.status.owner_alive);
    let head = i.head.expect("head");
    assert_eq!(head.entry_id, ids[0]);
    assert_eq!(head.stream, stream());
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
        expect_generation: None,
    };
    let e = admin
        .act_on_head(HeadOp::Skip, &req)
        .await
        .expect_err("changed");
    assert!(matches!(e, AdminError::HeadChanged { .. }), "{e}");

    // The right head, but the unit moved to another generation since the
    // operator looked (another owner took it): refused, nothing changed.
    let seen_generation = i.status.durable_generation;
    let stale = HeadRequest {
        expect_entry: Some(&ids[0]),
        expect_generation: Some(seen_generation + 1),
        ..req
    };
    let e = admin
        .act_on_head(HeadOp::Skip, &stale)
        .await
        .expect_err("generation moved");
    assert!(
        matches!(e, AdminError::GenerationMoved { expected, generation, .. } if expected == seen_generation + 1 && generation == seen_generation),
        "{e}"
    );
    assert!(e.is_refusal());
    let pending: redis::streams::StreamPendingReply =
        c.xpending(stream(), G).await.expect("xpending");
    assert_eq!(pending.count(), 3, "nothing acknowledged");

    let req = HeadRequest {
        expect_entry: Some(&ids[0]),
        expect_generation: Some(seen_generation),
        ..req
    };
    let out = admin.act_on_head(HeadOp::Skip, &req).await.expect("skip");
    assert_eq!(out.entry_id, ids[0]);
    assert_eq!(out.stream, stream());
    assert!(!out.forced && out.was_pending && out.deleted);
    assert_eq!(out.fenced, None);
    let state: BTreeMap<String, String> = c.hgetall(unit(G)).await.expect("unit");
    for gone in ["halted", "halt_entry", "halt_error", "head", "attempts"] {
        assert!(!state.contains_key(gone), "{gone} in {state:?}");
    }
    assert_eq!(state["gen"], "1", "no fencing when halted");
    let len: u64 = c.xlen(stream()).await.expect("xlen");
    assert_eq!(len, 2);
    let acked: u64 = c.get(keys::acked(shard(), G, "cat")).await.expect("acked");
    assert_eq!(acked, 1, "counted in the key's shard");
    let lease: Option<String> = c.get(lease_key()).await.expect("get");
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
    let lease: Option<String> = c.get(lease_key()).await.expect("get");
    assert_eq!(lease, None);
    let generation: String = c.hget(unit(G), "gen").await.expect("gen");
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
    let dlq = keys::partition_dlq(shard(), "cat", "k");
    assert_eq!(l.stream, dlq);
    assert_eq!(admin.dlq_stream("cat", Some("k")).await.expect("name"), dlq);
    assert_eq!(l.dlq_id, dlq_id);
    assert_eq!(l.group.as_deref(), Some(G));
    assert_eq!(l.entry.as_deref(), Some(ids[2].as_str()));
    assert_eq!(l.operator.as_deref(), Some("alice"));
    assert_eq!(l.source.as_deref(), Some(stream().as_str()));
    assert_eq!(l.envelope.as_ref().expect("envelope"), &envelope(2));
    let e = admin
        .skip("cat", "k", G, true, "op")
        .await
        .expect_err("empty");
    assert!(matches!(e, AdminError::NothingToDo { .. }), "{e}");

    // Replay: back at the tail, index and wake-up written, letter gone.
    let index = keys::partition_index(shard(), "cat");
    let _: () = c.srem(&index, "k").await.expect("srem");
    let published: Option<u64> = c
        .get(keys::published(shard(), "cat"))
        .await
        .expect("published");
    let r = admin
        .replay("cat", "k", &dlq_id, "bob")
        .await
        .expect("replay");
    assert_eq!(r.stream, stream());
    let after: u64 = c
        .get(keys::published(shard(), "cat"))
        .await
        .expect("published");
    assert_eq!(after, published.unwrap_or(0) + 1, "one more to handle");
    let tail: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(stream())
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .expect("xrange");
    assert_eq!(tail.len(), 1);
    assert_eq!(tail[0].0, r.entry_id);
    let fields = tail[0].1.iter().map(|(k, v)| (k.as_str(), v.as_slice()));
    assert_eq!(
        Envelope::from_fields(&stream(), &tail[0].0, fields).expect("envelope"),
        Envelope {
            replay: Some(convoy_runtime::Replay {
                by: Some(G.to_owned()),
                to: vec![G.to_owned()],
            }),
            ..envelope(2)
        },
        "the replayed copy keeps its identity (message id and origin), for the handler that dead-lettered it"
    );
    assert_eq!(r.handlers, [G]);
    assert!(tail[0].1.iter().all(|(k, _)| !k.starts_with("dlq_")));
    let member: bool = c.sismember(&index, "k").await.expect("sismember");
    assert!(member);
    let wake: u64 = c.xlen(keys::wake_stream("cat")).await.expect("xlen");
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
    assert!(
        audit.iter().all(|a| a.stream == keys::audit(shard())),
        "in the key's shard: {audit:?}"
    );
    assert_eq!(audit[0].fields["entry"], ids[0]);
    assert_eq!(audit[1].fields["fenced"], "owner:1");
    assert_eq!(audit[2].fields["dlq_entry"], dlq_id);
    assert_eq!(audit[3].fields["entry"], r.entry_id);
    assert_eq!(
        audit[3].fields["to"], G,
        "the audit names the handlers it reaches"
    );
}

#[tokio::test]
async fn undelivered_heads_and_several_groups() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = server.connection().await.expect("conn");
    register(&mut c, "cat", SHARDS, &["app::A", "app::B"]).await;
    let a = publish(&mut c, &stream(), 0).await;
    let b = publish(&mut c, &stream(), 1).await;
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
    let len: u64 = c.xlen(stream()).await.expect("xlen");
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
    let _: () = c.hset(unit("app::B"), "halted", "1").await.expect("hset");
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
        .resolve_group("othre", None, None)
        .await
        .expect_err("a typo");
    assert!(matches!(e, AdminError::UnknownCategory { .. }), "{e}");
    // A category an engine ran once, whose handlers are gone.
    let _: () = c.sadd(keys::CATEGORIES, "other").await.expect("sadd");
    let e = admin
        .resolve_group("other", None, None)
        .await
        .expect_err("none");
    assert!(matches!(e, AdminError::NoHandlers { .. }), "{e}");
    assert!(
        e.to_string().contains(&keys::groups(0, "other")),
        "names the set read: {e}"
    );
}

/// A key of `category` (of `shards` shards) in shard `at` or above.
fn key_in_shard_from(category: &str, shards: u32, at: u32) -> String {
    (0..)
        .map(|i| format!("{category}-{i}"))
        .find(|k| keys::shard_of(k, shards) >= at)
        .expect("some key is there")
}

#[tokio::test]
async fn partitions_and_audit_cover_every_shard() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = server.connection().await.expect("conn");
    // Keys in the index without a stream yet, about 2400 a shard: more
    // than one SSCAN page of each; and keys with entries in a few shards.
    register(&mut c, "cat", SHARDS, &[G]).await;
    let many: Vec<String> = (0..12_000).map(|i| format!("idle-{i}")).collect();
    let mut pipe = redis::pipe();
    for k in &many {
        pipe.cmd("SADD")
            .arg(keys::partition_index(keys::shard_of(k, SHARDS), "cat"))
            .arg(k)
            .ignore();
    }
    let _: () = pipe.query_async(&mut c).await.expect("index");
    let busy = ["a", "b", "c", "d", "e", "f"];
    for (n, k) in busy.iter().enumerate() {
        let s = keys::shard_of(k, SHARDS);
        for seq in 0..=n as u32 {
            publish(&mut c, &keys::partition_stream(s, "cat", k), seq).await;
        }
        let _: () = c
            .sadd(keys::partition_index(s, "cat"), *k)
            .await
            .expect("sadd");
    }
    let shards: std::collections::BTreeSet<u32> =
        busy.iter().map(|k| keys::shard_of(k, SHARDS)).collect();
    assert!(shards.len() > 2, "the keys are spread: {shards:?}");

    let admin = Admin::connect(&server.url()).await.expect("admin");
    let report = admin.partitions("cat").await.expect("partitions");
    assert_eq!(report.totals.partitions, many.len() + busy.len());
    assert_eq!(report.partitions.len(), many.len() + busy.len());
    let keys_: Vec<&str> = report.partitions.iter().map(|p| p.key.as_str()).collect();
    assert!(keys_.windows(2).all(|w| w[0] < w[1]), "sorted, once each");
    for p in &report.partitions {
        assert_eq!(p.shard, keys::shard_of(&p.key, SHARDS), "{p:?}");
    }
    for (n, k) in busy.iter().enumerate() {
        let p = report
            .partitions
            .iter()
            .find(|p| p.key == *k)
            .expect("listed");
        assert_eq!(
            (p.length, p.lag),
            (n as u64 + 1, Some(n as u64 + 1)),
            "{p:?}"
        );
    }
    assert_eq!(report.totals.length, 21);
    assert_eq!(report.totals.lag, 21);

    // A category of more shards than the default, registered as an
    // engine does: an action on a key in a shard past the default's is in
    // the audit too.
    let wide = 20;
    register(&mut c, "wide", wide, &[G]).await;
    let _: () = c.sadd(keys::CATEGORIES, "wide").await.expect("sadd");
    let far = key_in_shard_from("wide", wide, keys::DEFAULT_SHARDS);
    let s = keys::shard_of(&far, wide);
    let id = publish(&mut c, &keys::partition_stream(s, "wide", &far), 0).await;
    admin
        .skip("wide", &far, G, true, "op")
        .await
        .expect("forced skip");
    admin
        .skip("cat", "a", G, true, "op")
        .await
        .expect("forced skip");
    let audit = admin.audit(10).await.expect("audit");
    let seen: Vec<(&str, &str)> = audit
        .iter()
        .map(|a| (a.fields["key"].as_str(), a.stream.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (far.as_str(), keys::audit(s).as_str()),
            ("a", keys::audit(keys::shard_of("a", SHARDS)).as_str())
        ]
    );
    assert_eq!(audit[0].fields["entry"], id);
    assert_eq!(admin.audit(1).await.expect("audit").len(), 1);
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

/// A page of partition keys never holds more keys than asked, even when
/// one `SSCAN` reply (a prefix search with a large `COUNT`) brings many
/// more: the next page reads that call again and skips what was shown,
/// so walking the pages gives every key once.
#[tokio::test]
async fn a_page_of_keys_holds_no_more_than_asked_and_the_pages_give_every_key() {
    use convoy_runtime::redis::admin::ScanCursor;
    let server = RedisServer::start().expect("redis");
    let mut c = server.connection().await.expect("conn");
    let shards = keys::DEFAULT_SHARDS;
    let mut all = std::collections::BTreeSet::new();
    for i in 0..3000 {
        let key = format!("k{i:04}");
        let index = keys::partition_index(keys::shard_of(&key, shards), "order");
        let _: i64 = c.sadd(&index, &key).await.expect("SADD");
        all.insert(key);
    }
    let admin = Admin::connect(&server.url()).await.expect("admin");
    let mut at = ScanCursor::default();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = admin
            .partition_keys_page("order", at, "k", 50, 1000, 8)
            .await
            .expect("page");
        assert!(page.keys.len() <= 50, "a page of {} keys", page.keys.len());
        seen.extend(page.keys);
        pages += 1;
        match page.next {
            Some(next) => at = next,
            None => break,
        }
    }
    assert!(pages >= 60, "{pages} pages");
    let unique: std::collections::BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no key twice");
    assert_eq!(unique, all, "every key");
}
