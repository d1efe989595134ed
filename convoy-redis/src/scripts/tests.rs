//! The fence, script by script, against a real `redis-server`: once
//! another owner takes a unit at a newer generation, or the owner's
//! liveness lapsed, every operation of the old token is refused. And
//! `script_sha` names every script of `lua/` by the hash the engine sends.

use crate::connection::Conn;
use crate::script_sha;
use redis::Value;

use super::ack::{Ack, AckItem, Acked};
use super::acquire::{self, Acquire, Acquired};
use super::claim::{Claim, Claimed};
use super::fail::{Fail, Failed};
use super::read::{Native, Read, ReadReply, Which};
use super::reap::{Reap, Reaped};
use super::release::{Held, Release, Released};
use super::rest::{Rest, Rested};
use super::{Caller, Refusal};
use crate::unit::{At, Unit};
use convoy_testkit::RedisServer;

const LEASE: &str = "{0}convoy:lease:g:cat:k";
const STREAM: &str = "{0}cat:k";
const ALIVE_A: &str = "{0}convoy:alive:g:a";
const ALIVE_B: &str = "{0}convoy:alive:g:b";

/// The unit `k` of group `g` in category `cat` (of one shard), lanes off.
fn unit() -> Unit {
    Unit::new("g", "cat", "k", ["cat"], "backfill", false, 1)
}

const PRIMARY: At = At {
    lane: 0,
    backfill: false,
};

async fn cmd(c: &mut Conn, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(c).await.expect("command")
}

/// Takes the unit for `owner` in incarnation `inc`: its token, or `None`
/// when the unit is held or the owner is not alive.
async fn acquire(c: &mut Conn, owner: &str, inc: &str) -> Option<String> {
    let units = [unit()];
    let holders = acquire::holders(c, &units.iter().collect::<Vec<_>>(), owner)
        .await
        .expect("holders");
    let alive = format!("{{0}}convoy:alive:g:{owner}");
    let acquired = Acquire {
        group: "g",
        owner,
        incarnation: inc,
        alive: &alive,
        max: 1,
        units: &units,
        holders: &holders,
        wait: None,
    }
    .run(c)
    .await
    .expect("acquire");
    match acquired {
        Acquired::Units(mut taken) => taken.pop().flatten().map(|t| t.token),
        Acquired::NotAlive => None,
    }
}

fn generation(token: &str) -> u64 {
    token
        .rsplit(':')
        .next()
        .and_then(|g| g.parse().ok())
        .expect("a generation")
}

/// `token` of owner `alive` in incarnation `inc`, on `u`.
fn by<'a>(u: &'a Unit, token: &'a str, alive: &'a str, inc: &'a str) -> Caller<'a> {
    Caller {
        unit: u,
        token,
        alive,
        incarnation: inc,
    }
}

async fn read(c: &mut Conn, token: &str, alive: &str, inc: &str) -> ReadReply {
    read_holding(c, token, alive, inc, None, 10).await
}

/// A read of new entries returning at most `whole` of them whole.
async fn read_whole(c: &mut Conn, token: &str, whole: usize) -> ReadReply {
    read_new(c, token, ALIVE_A, "a1", None, 10, whole).await
}

/// `calls` of `command` in `INFO commandstats`.
pub(crate) async fn calls(c: &mut (impl redis::aio::ConnectionLike + Send), command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn fields_text(e: &crate::reply::Entry) -> Vec<(String, String)> {
    e.fields
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

/// A batch of new entries longer than `whole` comes back as ids and one
/// `XRANGE` reads their fields: the same entries, in order, with the same
/// fields as a read that returns them whole.
#[tokio::test]
async fn a_long_read_returns_ids_and_one_xrange_reads_the_same_entries() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    for i in 1..=6 {
        let id = format!("1-{i}");
        let v = format!("v{i}");
        cmd(&mut c, &["XADD", STREAM, &id, "f", &v, "g", &id]).await;
    }
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    let token = acquire(&mut c, "a", "a1").await.expect("a takes the unit");
    // Three whole, then three as ids.
    let ReadReply::Entries(_, whole) = read_holding(&mut c, &token, ALIVE_A, "a1", None, 3).await
    else {
        panic!("entries expected");
    };
    assert_eq!(calls(&mut c, "xrange").await, 0);
    let ReadReply::Entries(at, by_ids) = read_whole(&mut c, &token, 2).await else {
        panic!("entries expected");
    };
    assert_eq!(
        calls(&mut c, "xrange").await,
        1,
        "one XRANGE read the fields"
    );
    assert_eq!(at, PRIMARY);
    let all: Vec<_> = whole.iter().chain(&by_ids).collect();
    let ids: Vec<&str> = all.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["1-1", "1-2", "1-3", "1-4", "1-5", "1-6"]);
    for (i, e) in all.iter().enumerate() {
        let n = i + 1;
        assert_eq!(
            fields_text(e),
            [
                ("f".to_owned(), format!("v{n}")),
                ("g".to_owned(), format!("1-{n}"))
            ]
        );
    }
    // Nothing is left to read, and all six are pending for the reader.
    assert!(matches!(
        read_whole(&mut c, &token, 2).await,
        ReadReply::Empty
    ));
}

/// The fields of entries a read returned as ids: one deleted since comes
/// back without fields (as a read returns it); an entry in the range that
/// the read did not deliver is an error, never taken for a deleted one.
#[tokio::test]
async fn fields_of_ids_marks_a_deleted_entry_and_refuses_a_foreign_one() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    for id in ["1-1", "1-2", "1-3"] {
        cmd(&mut c, &["XADD", STREAM, id, "f", id]).await;
    }
    cmd(&mut c, &["XDEL", STREAM, "1-2"]).await;
    let ids = |v: &[&str]| {
        Value::Array(
            v.iter()
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .collect(),
        )
    };
    let batch = super::read::fields_of(STREAM, ids(&["1-1", "1-2", "1-3"]), &mut c)
        .await
        .expect("fields");
    let got: Vec<(&str, bool)> = batch
        .iter()
        .map(|e| (e.id.as_str(), e.fields.is_some()))
        .collect();
    assert_eq!(got, [("1-1", true), ("1-2", false), ("1-3", true)]);
    cmd(&mut c, &["XADD", STREAM, "1-4", "f", "1-4"]).await;
    cmd(&mut c, &["XADD", STREAM, "1-5", "f", "1-5"]).await;
    let foreign = super::read::fields_of(STREAM, ids(&["1-3", "1-5"]), &mut c).await;
    assert!(
        matches!(&foreign, Err(e) if e.to_string().contains("1-4")),
        "{foreign:?}"
    );
    // An id that is not text is an error, never an entry left out.
    let odd = Value::Array(vec![Value::BulkString(b"1-3".to_vec()), Value::Int(5)]);
    assert!(super::read::fields_of(STREAM, odd, &mut c).await.is_err());
}

/// A read of new entries by a caller that holds `held` pending entries
/// (checked when `Some`), every entry returned whole.
async fn read_holding(
    c: &mut Conn,
    token: &str,
    alive: &str,
    inc: &str,
    held: Option<usize>,
    count: usize,
) -> ReadReply {
    read_new(c, token, alive, inc, held, count, count).await
}

/// A read of up to `count` new entries by `read.lua` (not natively), at
/// most `whole` of them returned whole, by a caller that holds `held`
/// pending entries (checked when `Some`).
async fn read_new(
    c: &mut Conn,
    token: &str,
    alive: &str,
    inc: &str,
    held: Option<usize>,
    count: usize,
    whole: usize,
) -> ReadReply {
    Read {
        by: by(&unit(), token, alive, inc),
        which: Which::New,
        primary_count: count,
        backfill_count: count,
        whole,
        first_lane: 0,
        held: (PRIMARY, held.unwrap_or(0), None),
        resent: held.is_some(),
    }
    .scripted(c)
    .await
    .expect("read")
}

/// A read sent twice (the cluster client sends it again after a dropped
/// connection, its first reply lost): the second one reads nothing new,
/// since the first one's entry is pending unseen, and says so; a caller
/// that holds that entry (it saw it) reads on.
#[tokio::test]
async fn a_read_sent_twice_does_not_pass_over_what_the_first_delivered() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    cmd(&mut c, &["XADD", STREAM, "1-1", "f", "v"]).await;
    cmd(&mut c, &["XADD", STREAM, "1-2", "f", "v"]).await;
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    let token = acquire(&mut c, "a", "a1").await.expect("a takes the unit");
    // The first read delivers 1-1; its reply is lost.
    match read_holding(&mut c, &token, ALIVE_A, "a1", Some(0), 1).await {
        ReadReply::Entries(_, e) => assert_eq!(e[0].id, "1-1"),
        other => panic!("{other:?}"),
    }
    // Sent again: 1-1 is pending and unseen, so 1-2 is not read.
    assert!(matches!(
        read_holding(&mut c, &token, ALIVE_A, "a1", Some(0), 1).await,
        ReadReply::Unseen
    ));
    // Without the check, 1-2 would have been read past 1-1.
    // A caller that holds 1-1 (handled, not acknowledged) reads on.
    match read_holding(&mut c, &token, ALIVE_A, "a1", Some(1), 1).await {
        ReadReply::Entries(_, e) => assert_eq!(e[0].id, "1-2"),
        other => panic!("{other:?}"),
    }
}

fn refusal(r: &ReadReply) -> Option<Refusal> {
    match r {
        ReadReply::Refused(why) => Some(*why),
        _ => None,
    }
}

async fn ack(
    c: &mut Conn,
    token: &str,
    alive: &str,
    inc: &str,
    ids: &[String],
    trim_only: bool,
) -> Vec<Acked> {
    let u = unit();
    let items = [AckItem {
        unit: &u,
        at: PRIMARY,
        token,
        incarnation: inc,
        alive,
        ids,
        clear_head: !trim_only,
        touch: !trim_only,
        trim: true,
    }];
    Ack {
        group: "g",
        now_ms: 1,
        items: &items,
    }
    .run(c, None)
    .await
    .expect("ack")
}

async fn release(c: &mut Conn, token: &str) -> Released {
    Release {
        unit: &unit(),
        held: Held::Token(token),
    }
    .run(c)
    .await
    .expect("release")
}

#[tokio::test]
async fn a_stale_token_is_refused_everywhere() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
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
        refusal(&read(&mut c, &old, ALIVE_A, "a1").await),
        Some(Refusal::NotAlive)
    );
    // A lapsed instance takes nothing until it registers again.
    assert_eq!(acquire(&mut c, "a", "a1").await, None);
    // b takes over at a newer generation; a comes back to life (a new
    // incarnation), still stale.
    let new = acquire(&mut c, "b", "b1").await.expect("b takes the unit");
    assert!(generation(&new) > generation(&old), "{old} then {new}");
    cmd(&mut c, &["SET", ALIVE_A, "a2"]).await;

    assert_eq!(
        refusal(&read(&mut c, &old, ALIVE_A, "a2").await),
        Some(Refusal::FencedOut),
        "stale read refused"
    );
    let acked = ack(&mut c, &old, ALIVE_A, "a2", &["0-1".to_owned()], false).await;
    assert_eq!(
        acked,
        vec![Acked::Refused(Refusal::FencedOut)],
        "stale ack refused"
    );
    let u = unit();
    let failed = Fail {
        by: by(&u, &old, ALIVE_A, "a2"),
        entry: "0-1",
        error: "err",
        max_retries: 3,
        now_ms: 1,
        known: 0,
        halt: None,
    }
    .run(&mut c)
    .await
    .expect("fail");
    assert_eq!(failed, Failed::Refused(Refusal::FencedOut));
    let claimed = Claim {
        by: by(&u, &old, ALIVE_A, "a2"),
        stream: STREAM,
    }
    .run(&mut c)
    .await
    .expect("claim");
    assert_eq!(claimed, Claimed::Refused(Refusal::FencedOut));
    let reaped = Reap {
        by: by(&u, &old, ALIVE_A, "a2"),
        idle_ms: 0,
        now_ms: u64::MAX / 2,
    }
    .run(&mut c)
    .await
    .expect("reap");
    assert_eq!(reaped, Reaped::Refused(Refusal::FencedOut));
    assert_eq!(
        release(&mut c, &old).await,
        Released::NotHeld,
        "a stale release leaves the new lease alone"
    );
    assert_eq!(
        acquire(&mut c, "a", "a2").await,
        None,
        "b is alive and holds it"
    );

    // The current token works: it reads the entry, under its own name.
    match read(&mut c, &new, ALIVE_B, "b1").await {
        ReadReply::Entries(at, entries) => {
            assert_eq!(at, PRIMARY);
            assert_eq!(entries.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    // b's token in an earlier incarnation of b is refused as not alive.
    assert_eq!(
        refusal(&read(&mut c, &new, ALIVE_B, "b0").await),
        Some(Refusal::NotAlive)
    );
    // The generation counter survives a release and keeps growing.
    assert_eq!(release(&mut c, &new).await, Released::Released);
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
        refusal(&read(&mut c, &third, ALIVE_A, "a2").await),
        Some(Refusal::LeaseGone)
    );
}

#[tokio::test]
async fn a_lease_of_an_earlier_incarnation_is_free() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
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

/// With `wait_acks`, taking leases waits for the replicas: on a server
/// without one, the take is not confirmed (`NotReplicated`), and taking
/// again works once it is.
#[tokio::test]
async fn taking_leases_with_wait_is_confirmed_only_by_the_replicas() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    let units = [unit()];
    let holders = [None];
    let taking = |wait| Acquire {
        group: "g",
        owner: "a",
        incarnation: "a1",
        alive: ALIVE_A,
        max: 1,
        units: &units,
        holders: &holders,
        wait,
    };
    let waited = taking(Some(super::Replicated {
        replicas: 1,
        timeout_ms: 20,
    }))
    .run(&mut c)
    .await;
    assert!(
        matches!(
            waited,
            Err(convoy_core::error::Error::NotReplicated {
                wanted: 1,
                acked: 0
            })
        ),
        "{waited:?}"
    );
    // It ran on the master: the same owner takes it over at a newer
    // generation (what the coordinator does after the refusal).
    let lease: Option<String> = redis::cmd("GET")
        .arg(LEASE)
        .query_async(&mut c)
        .await
        .expect("GET");
    let first = lease.expect("the lease was written");
    let Acquired::Units(taken) = taking(None).run(&mut c).await.expect("acquire") else {
        panic!("a is alive");
    };
    let token = taken[0].as_ref().expect("taken").token.clone();
    assert!(
        generation(&token) > generation(&first),
        "{first} then {token}"
    );
}

/// Owner `c` tries to take the unit, having seen `holders`.
async fn c_takes(c: &mut Conn, holders: &[Option<String>]) -> Acquired {
    Acquire {
        group: "g",
        owner: "c",
        incarnation: "c1",
        alive: "{0}convoy:alive:g:c",
        max: 1,
        units: &[unit()],
        holders,
        wait: None,
    }
    .run(c)
    .await
    .expect("acquire")
}

#[tokio::test]
async fn a_lease_that_changed_hands_since_it_was_read_counts_as_held() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    cmd(&mut c, &["SET", ALIVE_B, "b1"]).await;
    cmd(&mut c, &["SET", "{0}convoy:alive:g:c", "c1"]).await;
    // c saw the unit free (so it passes no holder's liveness key), but a
    // took it meanwhile: held.
    let units = [unit()];
    let seen_free = acquire::holders(&mut c, &units.iter().collect::<Vec<_>>(), "c")
        .await
        .expect("holders");
    assert_eq!(seen_free, vec![None]);
    acquire(&mut c, "a", "a1").await.expect("a takes the unit");
    assert_eq!(
        c_takes(&mut c, &seen_free).await,
        Acquired::Units(vec![None])
    );
    // a's liveness lapses, b saw a holding it: b takes it over. c, which
    // still thinks a holds it, finds another holder: held.
    let seen_a = acquire::holders(&mut c, &units.iter().collect::<Vec<_>>(), "c")
        .await
        .expect("holders");
    assert_eq!(seen_a, vec![Some("a".to_owned())]);
    cmd(&mut c, &["DEL", ALIVE_A]).await;
    acquire(&mut c, "b", "b1")
        .await
        .expect("b takes the dead lease");
    assert_eq!(c_takes(&mut c, &seen_a).await, Acquired::Units(vec![None]));
}

#[tokio::test]
async fn generations_never_repeat_when_the_unit_state_is_lost() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
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
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    cmd(&mut c, &["SADD", "{0}convoy:groups:cat", "g"]).await;
    let token = acquire(&mut c, "a", "a1").await.expect("taken");
    let u = unit();
    let fail = |known: u32| Fail {
        by: by(&u, &token, ALIVE_A, "a1"),
        entry: "1-1",
        error: "boom",
        max_retries: 3,
        now_ms: 1,
        known,
        halt: None,
    };
    let recorded = |failures| Failed::Recorded {
        failures,
        halted: false,
    };
    let r = fail(0).run(&mut c).await.expect("fail");
    assert_eq!(r, recorded(1));
    let r = fail(0).run(&mut c).await.expect("fail again");
    assert_eq!(
        r,
        recorded(1),
        "the same failure, sent again after a lost reply"
    );
    let r = fail(1).run(&mut c).await.expect("next failure");
    assert_eq!(r, recorded(2));

    // Three entries; all three read (delivered, pending), only the last
    // handled and acknowledged (the reply of the read of the first two
    // was lost, say): the trim must keep the first two.
    for id in ["1-1", "1-2", "1-3"] {
        cmd(&mut c, &["XADD", STREAM, id, "f", "v"]).await;
    }
    match read(&mut c, &token, ALIVE_A, "a1").await {
        ReadReply::Entries(_, entries) => assert_eq!(entries.len(), 3),
        other => panic!("{other:?}"),
    }
    let acked = ack(&mut c, &token, ALIVE_A, "a1", &["1-3".to_owned()], true).await;
    assert_eq!(acked, vec![Acked::Acked(1)]);
    let len: i64 = redis::cmd("XLEN")
        .arg(STREAM)
        .query_async(&mut c)
        .await
        .expect("xlen");
    // Only a prefix can be trimmed: the pending 1-1 keeps everything.
    assert_eq!(len, 3, "the unhandled pending entries survive the trim");
}

/// A publication of `seq` for key `key` of category `cat`.
pub(crate) fn publication(seq: u64, key: &str) -> convoy_core::broker::Publication {
    let envelope = convoy_core::envelope::Envelope {
        id: format!("m{seq}"),
        type_name: "T".into(),
        category: "cat".into(),
        partition_key: Some(key.into()),
        time_ms: 0,
        priority: convoy_core::envelope::Priority::Normal,
        correlation_id: None,
        payload: format!("{{\"seq\":{seq}}}"),
        origin: None,
        replay: None,
    };
    convoy_core::broker::Publication {
        seq,
        envelope: std::sync::Arc::new(envelope),
    }
}

/// `p` as a consumer reads it back once producer `pg/x` published it.
fn sent(p: &convoy_core::broker::Publication) -> convoy_core::envelope::Envelope {
    p.delivered(&convoy_core::broker::Producer {
        name: "pg/x".into(),
        epoch: 1,
    })
}

async fn publish(
    c: &mut Conn,
    epoch: u64,
    batch: &[convoy_core::broker::Publication],
) -> Result<u64, convoy_core::error::Error> {
    let producer = convoy_core::broker::Producer {
        name: "pg/x".into(),
        epoch,
    };
    // Every record in shard 0, whatever its key's shard would be.
    let batch: Vec<crate::routing::Routed<'_>> = batch
        .iter()
        .map(|p| {
            let key = p.envelope.partition_key.as_deref();
            crate::routing::Routed {
                publication: p,
                stream: format!("{{0}}cat:{}", key.unwrap_or_default()),
                partition: key,
            }
        })
        .collect();
    super::publish::Publish {
        producer: &producer,
        shard: 0,
        floor: batch.first().map_or(0, |r| r.publication.seq),
        call: "test",
        behind: None,
        batch: &batch,
        wakes: false,
    }
    .run(c, None)
    .await
    .map(|p| p.written)
}

async fn xlen(c: &mut Conn, stream: &str) -> i64 {
    int_of(c, &["XLEN", stream]).await
}

/// `batch` routed to shard 0, each record to `{0}{category}:{key}`.
fn routed(batch: &[convoy_core::broker::Publication]) -> Vec<crate::routing::Routed<'_>> {
    batch
        .iter()
        .map(|p| crate::routing::Routed {
            publication: p,
            stream: format!(
                "{{0}}{}:{}",
                p.envelope.category,
                p.envelope.partition_key.as_deref().unwrap_or_default()
            ),
            partition: p.envelope.partition_key.as_deref(),
        })
        .collect()
}

/// Publishes `routed` in one call, as producer `pg/x` in epoch 1.
async fn publish_routed(
    c: &mut Conn,
    routed: &[crate::routing::Routed<'_>],
) -> super::publish::Published {
    let producer = convoy_core::broker::Producer {
        name: "pg/x".into(),
        epoch: 1,
    };
    super::publish::Publish {
        producer: &producer,
        shard: 0,
        floor: 1,
        call: "test",
        behind: None,
        batch: routed,
        wakes: false,
    }
    .run(c, None)
    .await
    .expect("published")
}

/// One call of producer `pg/x` (epoch 1) in shard 0: `batch` from `floor`,
/// as call `call`, sent behind `behind`.
async fn publish_call(
    c: &mut Conn,
    batch: &[convoy_core::broker::Publication],
    floor: u64,
    call: &str,
    behind: Option<&str>,
) -> Result<u64, convoy_core::error::Error> {
    publish_waking(c, batch, floor, call, behind, false)
        .await
        .map(|p| p.written)
}

/// [`publish_call`], the script writing the wake-ups with `wakes`.
async fn publish_waking(
    c: &mut Conn,
    batch: &[convoy_core::broker::Publication],
    floor: u64,
    call: &str,
    behind: Option<&str>,
    wakes: bool,
) -> Result<super::publish::Published, convoy_core::error::Error> {
    let producer = convoy_core::broker::Producer {
        name: "pg/x".into(),
        epoch: 1,
    };
    let routed = routed(batch);
    super::publish::Publish {
        producer: &producer,
        shard: 0,
        floor,
        call,
        behind,
        batch: &routed,
        wakes,
    }
    .run(c, None)
    .await
}

/// The keys each entry of a wake stream names, oldest entry first.
async fn wake_entries(c: &mut Conn, stream: &str) -> Vec<Vec<String>> {
    crate::reply::entries(cmd(c, &["XRANGE", stream, "-", "+"]).await)
        .iter()
        .map(|e| {
            fields_text(e)
                .into_iter()
                .map(|(k, v)| {
                    assert_eq!(k, "k", "a wake-up names keys only");
                    v
                })
                .collect()
        })
        .collect()
}

/// On one server the script writes the wake-ups itself, atomic with the
/// records: one entry per category naming each key it wrote to, in the
/// order the keys' streams first appear; nothing for a batch it dropped
/// as sent before, nor for a call refused out of turn; and nothing at all
/// when the caller writes them (a cluster).
#[tokio::test]
async fn on_one_server_the_publish_script_writes_the_wake_ups_of_the_keys_it_wrote() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let batch: Vec<_> = [(1, "a"), (2, "b"), (3, "a")]
        .into_iter()
        .map(|(seq, key)| publication(seq, key))
        .collect();
    let wake = convoy_core::names::wake_stream("cat");
    assert_eq!(
        publish_waking(&mut c, &batch, 1, "a", None, true)
            .await
            .expect("written")
            .written,
        3
    );
    assert_eq!(wake_entries(&mut c, &wake).await, [vec!["a", "b"]]);
    assert_eq!(
        publish_waking(&mut c, &batch, 1, "b", None, true)
            .await
            .expect("dropped")
            .written,
        0
    );
    publish_waking(&mut c, &[publication(4, "c")], 1, "c", Some("x"), true)
        .await
        .expect_err("out of turn");
    assert_eq!(
        wake_entries(&mut c, &wake).await.len(),
        1,
        "nothing written, nobody woken"
    );
    assert_eq!(
        publish_waking(&mut c, &[publication(4, "c")], 1, "d", None, false)
            .await
            .expect("written")
            .written,
        1
    );
    assert_eq!(wake_entries(&mut c, &wake).await.len(), 1);
    assert_eq!(
        publish_waking(&mut c, &[publication(5, "c")], 1, "e", None, true)
            .await
            .expect("written")
            .written,
        1
    );
    assert_eq!(
        wake_entries(&mut c, &wake).await,
        [vec!["a", "b"], vec!["c"]]
    );
    // A wake stream that cannot be written fails nothing: the records are
    // written once, and a batch sent again is still dropped whole.
    cmd(&mut c, &["DEL", &wake]).await;
    cmd(&mut c, &["SET", &wake, "not a stream"]).await;
    let sixth = [publication(6, "c")];
    for (call, written, failed) in [("f", 1, 1), ("g", 0, 0)] {
        let published = publish_waking(&mut c, &sixth, 1, call, None, true)
            .await
            .expect("published without its wake-up");
        assert_eq!(
            (published.written, published.wake_failures),
            (written, failed)
        );
    }
    assert_eq!(xlen(&mut c, "{0}cat:c").await, 3);
}

/// Records of two categories in one call, of both shapes: each category's
/// wake stream names its own keys only, and every record lands whole in
/// its own stream.
#[tokio::test]
async fn the_publish_script_wakes_each_category_with_its_own_keys() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let of = |seq: u64, category: &str, key: &str| {
        let mut p = publication(seq, key);
        std::sync::Arc::make_mut(&mut p.envelope).category = category.into();
        p
    };
    let batch = [
        of(1, "dog", "d1"),
        of(2, "emu", "e1"),
        of(3, "dog", "d2"),
        of(4, "emu", "e1"),
    ];
    // The last one sent field by field: routed as of no partition.
    let mut routed = routed(&batch);
    routed[3].partition = None;
    let producer = convoy_core::broker::Producer {
        name: "pg/x".into(),
        epoch: 1,
    };
    let published = super::publish::Publish {
        producer: &producer,
        shard: 0,
        floor: 1,
        call: "a",
        behind: None,
        batch: &routed,
        wakes: true,
    }
    .run(&mut c, None)
    .await
    .expect("written");
    assert_eq!(published.written, 4);
    let dog = convoy_core::names::wake_stream("dog");
    let emu = convoy_core::names::wake_stream("emu");
    assert_eq!(wake_entries(&mut c, &dog).await, [vec!["d1", "d2"]]);
    assert_eq!(wake_entries(&mut c, &emu).await, [vec!["e1"]]);
    for (stream, records) in [
        ("{0}dog:d1", &batch[..1]),
        ("{0}emu:e1", &[batch[1].clone(), batch[3].clone()][..]),
    ] {
        let entries = crate::reply::entries(cmd(&mut c, &["XRANGE", stream, "-", "+"]).await);
        let got: Vec<Vec<(String, String)>> = entries.iter().map(fields_text).collect();
        let want: Vec<Vec<(String, String)>> = records
            .iter()
            .map(|p| {
                sent(p)
                    .to_fields()
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect()
            })
            .collect();
        assert_eq!(got, want, "{stream}");
    }
    assert_eq!(xlen(&mut c, "{0}dog:d2").await, 1);
}

/// A batch sent behind another whose reply had not come runs only if that
/// one was the producer's last call to run in the shard: behind a call
/// that failed (never ran), it writes nothing and is refused as out of
/// turn, so none of its records can land ahead of an earlier one of its
/// key. Sent again behind the call that ran, or behind none, it is
/// written. A floor below the batch (an earlier batch still in flight)
/// keeps that batch's seqs in the dedup set, so a re-sent one is dropped.
#[tokio::test]
async fn a_batch_sent_behind_a_call_that_did_not_run_writes_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let first: Vec<_> = (1..=3).map(|seq| publication(seq, "k")).collect();
    let second: Vec<_> = (4..=6).map(|seq| publication(seq, "k")).collect();
    let stream = "{0}cat:k";
    assert_eq!(
        publish_call(&mut c, &first, 1, "a", None).await.expect("a"),
        3
    );
    // Behind "b", which never ran: refused, nothing written.
    let e = publish_call(&mut c, &second, 1, "c", Some("b"))
        .await
        .expect_err("out of turn");
    assert!(
        matches!(e, convoy_core::error::Error::PublishedOutOfTurn),
        "{e}"
    );
    assert_eq!(xlen(&mut c, stream).await, 3);
    // Behind "a", the last call that ran: written, with the floor of the
    // batch in flight before it (1), so "a"'s seqs stay known.
    assert_eq!(
        publish_call(&mut c, &second, 1, "d", Some("a"))
            .await
            .expect("d"),
        3
    );
    assert_eq!(xlen(&mut c, stream).await, 6);
    assert_eq!(
        publish_call(&mut c, &first, 1, "e", None)
            .await
            .expect("a re-sent"),
        0,
        "the first batch, sent again, is dropped: its seqs were not trimmed"
    );
    // Behind "d", which is no longer the last call to run ("e" ran since).
    let e = publish_call(&mut c, &second, 4, "f", Some("d"))
        .await
        .expect_err("out of turn");
    assert!(
        matches!(e, convoy_core::error::Error::PublishedOutOfTurn),
        "{e}"
    );
    assert_eq!(xlen(&mut c, stream).await, 6);
    // A call that fails half-way (a key of another type where a stream
    // belongs: Redis keeps the writes before the error) is not taken as
    // run: the call behind it is refused.
    cmd(&mut c, &["SET", "{0}cat:bad", "x"]).await;
    let half: Vec<_> = [publication(7, "k"), publication(8, "bad")].into();
    publish_call(&mut c, &half, 7, "g", None)
        .await
        .expect_err("WRONGTYPE half-way");
    let behind: Vec<_> = [publication(9, "k")].into();
    let e = publish_call(&mut c, &behind, 7, "h", Some("g"))
        .await
        .expect_err("out of turn");
    assert!(
        matches!(e, convoy_core::error::Error::PublishedOutOfTurn),
        "{e}"
    );
}

/// A call's records go as runs of one stream and shape: convoy's usual
/// entry (its origin the producer's, written back by the script) and any
/// other entry interleaved in one stream, and two streams interleaved,
/// keep each stream's order and every field.
#[tokio::test]
async fn records_of_both_shapes_interleaved_keep_their_streams_order_and_fields() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let batch: Vec<_> = (1..=8)
        .map(|seq| publication(seq, if seq % 4 == 0 { "j" } else { "k" }))
        .collect();
    // Every third one sent field by field: routed as of no partition.
    let mut routed = routed(&batch);
    for r in routed.iter_mut().filter(|r| r.publication.seq % 3 == 0) {
        r.partition = None;
    }
    assert_eq!(publish_routed(&mut c, &routed).await.written, 8);
    for (stream, key, seqs) in [
        ("{0}cat:k", "k", vec![1, 2, 3, 5, 6, 7]),
        ("{0}cat:j", "j", vec![4, 8]),
    ] {
        let Value::Array(entries) = cmd(&mut c, &["XRANGE", stream, "-", "+"]).await else {
            panic!("entries of {stream}");
        };
        let got: Vec<convoy_core::envelope::Envelope> = entries
            .into_iter()
            .map(|e| {
                let Value::Array(pair) = e else {
                    panic!("an entry")
                };
                let id = super::super::reply::text(&pair[0]).expect("an id");
                let Value::Array(kv) = &pair[1] else {
                    panic!("fields")
                };
                let kv: Vec<(String, Vec<u8>)> = kv
                    .chunks(2)
                    .map(|f| {
                        let name = super::super::reply::text(&f[0]).expect("a name");
                        let Value::BulkString(v) = &f[1] else {
                            panic!("a value")
                        };
                        (name, v.clone())
                    })
                    .collect();
                convoy_core::envelope::Envelope::from_fields(
                    stream,
                    &id,
                    kv.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
                )
                .expect("an envelope")
            })
            .collect();
        let want: Vec<_> = seqs
            .iter()
            .map(|&seq| sent(&batch[seq as usize - 1]))
            .collect();
        assert_eq!(got, want, "{key}: in order, every field");
    }
}

/// A batch of more records in one shard than Lua can unpack at once (about
/// 8000 values: the index's `SADD` takes one per key) is written whole: the
/// list goes in chunks. The dedup set gets one member for the call.
#[tokio::test]
async fn a_batch_longer_than_lua_can_unpack_is_published_whole() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    const RECORDS: u64 = 8_100;
    let batch: Vec<_> = (1..=RECORDS)
        .map(|seq| publication(seq, &format!("k{seq}")))
        .collect();
    assert_eq!(
        publish(&mut c, 1, &batch).await.expect("published"),
        RECORDS
    );
    let count = |v: Value| match v {
        Value::Int(n) => n as u64,
        other => panic!("a count: {other:?}"),
    };
    let index = convoy_core::names::partition_index(0, "cat");
    assert_eq!(count(cmd(&mut c, &["SCARD", &index]).await), RECORDS);
    let sent = convoy_core::names::producer_sent(0, "pg/x");
    assert_eq!(count(cmd(&mut c, &["ZCARD", &sent]).await), 1);
    // Sent again, every record is known.
    assert_eq!(publish(&mut c, 1, &batch).await.expect("re-sent"), 0);
}

/// A call whose records are of several categories names each category's
/// index and count once: every record lands in its own category's stream,
/// index and count, in order.
#[tokio::test]
async fn a_batch_of_interleaved_categories_indexes_and_counts_each_record_in_its_own() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let of = |seq: u64, category: &str, key: &str| {
        let mut p = publication(seq, key);
        std::sync::Arc::make_mut(&mut p.envelope).category = category.into();
        p
    };
    let batch = [
        of(1, "a", "x"),
        of(2, "b", "y"),
        of(3, "a", "z"),
        of(4, "b", "y"),
    ];
    let published = publish_routed(&mut c, &routed(&batch)).await;
    assert_eq!(published.written, 4);
    let mut counts = published.counts.clone();
    counts.sort();
    assert_eq!(
        counts,
        [
            (convoy_core::names::published(0, "a"), 2, 2),
            (convoy_core::names::published(0, "b"), 2, 2)
        ]
    );
    let members = |v: Value| match v {
        Value::Array(items) => {
            let mut keys: Vec<String> = items
                .into_iter()
                .filter_map(|i| redis::from_redis_value(i).ok())
                .collect();
            keys.sort();
            keys
        }
        other => panic!("a set: {other:?}"),
    };
    let index_a = convoy_core::names::partition_index(0, "a");
    let index_b = convoy_core::names::partition_index(0, "b");
    assert_eq!(
        members(cmd(&mut c, &["SMEMBERS", &index_a]).await),
        ["x", "z"]
    );
    assert_eq!(members(cmd(&mut c, &["SMEMBERS", &index_b]).await), ["y"]);
    assert_eq!(xlen(&mut c, "{0}a:x").await, 1);
    assert_eq!(xlen(&mut c, "{0}a:z").await, 1);
    assert_eq!(xlen(&mut c, "{0}b:y").await, 2);
}

/// Records of convoy's usual entry (sent as values only) and of any other
/// shape (sent with their field names: a key field that is not the
/// partition) in one call: each entry holds exactly the published
/// envelope's fields (its origin the producer's), in order, and reads back
/// as it.
#[tokio::test]
async fn entries_of_every_shape_hold_the_envelopes_fields_in_order() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let batch = [
        publication(1, "a"),
        publication(2, "b"),
        publication(3, "c"),
    ];
    let mut routed = routed(&batch);
    // Record 3 goes to a stream of no partition: its key field is not the
    // partition's, so it is sent whole.
    routed[2].stream = "{0}cat".into();
    routed[2].partition = None;
    let published = publish_routed(&mut c, &routed).await;
    assert_eq!(published.written, 3);
    for r in &routed {
        let Value::Array(entries) = cmd(&mut c, &["XRANGE", &r.stream, "-", "+"]).await else {
            panic!("XRANGE")
        };
        assert_eq!(entries.len(), 1, "{}", r.stream);
        let Value::Array(entry) = &entries[0] else {
            panic!("an entry")
        };
        let stored: Vec<String> = match &entry[1] {
            Value::Array(items) => items
                .iter()
                .map(|i| redis::from_redis_value(i.clone()).expect("a field"))
                .collect(),
            other => panic!("fields: {other:?}"),
        };
        let expected: Vec<String> = sent(r.publication)
            .fields()
            .into_iter()
            .flat_map(|(k, v)| [k.to_owned(), v.into_owned()])
            .collect();
        assert_eq!(stored, expected, "{}", r.stream);
        let read = convoy_core::envelope::Envelope::from_fields(
            &r.stream,
            "1-0",
            stored
                .chunks_exact(2)
                .map(|p| (p[0].as_str(), p[1].as_bytes())),
        )
        .expect("reads back");
        assert_eq!(read, sent(r.publication));
    }
}

/// The dedup set as an earlier convoy left it (a member per seq) drops a
/// record it names just as a member per call does.
#[tokio::test]
async fn a_dedup_set_of_one_member_per_seq_still_drops_what_it_names() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let sent = convoy_core::names::producer_sent(0, "pg/x");
    cmd(&mut c, &["ZADD", &sent, "7", "7", "9", "9"]).await;
    let batch = [
        publication(7, "a"),
        publication(8, "a"),
        publication(9, "a"),
    ];
    assert_eq!(publish(&mut c, 1, &batch).await.expect("published"), 1);
    assert_eq!(xlen(&mut c, "{0}cat:a").await, 1);
    // And the call's member, next to them, drops 8 the same way.
    assert_eq!(publish(&mut c, 1, &batch).await.expect("re-sent"), 0);
}

#[tokio::test]
async fn publish_drops_a_resent_record_by_its_own_seq_and_refuses_a_replaced_publisher() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(
        server
            .client()
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect"),
    );
    // Row 5 of key a commits first; row 3 of key b (inserted earlier,
    // committed later) comes next: not above a high-water mark of 5, but
    // new, so it is written.
    assert_eq!(
        publish(&mut c, 1, &[publication(5, "a")]).await.expect("5"),
        1
    );
    assert_eq!(
        publish(&mut c, 1, &[publication(3, "b")]).await.expect("3"),
        1
    );
    // A re-send (a lost reply, or a crash before the rows were marked
    // published) is dropped by the rows' own ids, whatever else it holds.
    let resent = [
        publication(3, "b"),
        publication(5, "a"),
        publication(6, "a"),
    ];
    assert_eq!(publish(&mut c, 1, &resent).await.expect("re-send"), 1);
    assert_eq!(xlen(&mut c, "{0}cat:a").await, 2);
    assert_eq!(xlen(&mut c, "{0}cat:b").await, 1);
    // A newer publisher (epoch 2) took over; the replaced one is refused
    // and writes nothing, even a new row.
    assert_eq!(
        publish(&mut c, 2, &[publication(7, "a")]).await.expect("7"),
        1
    );
    let err = publish(&mut c, 1, &[publication(8, "a")])
        .await
        .expect_err("replaced");
    assert!(
        matches!(
            err,
            convoy_core::error::Error::PublisherReplaced {
                epoch: 1,
                newer: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(xlen(&mut c, "{0}cat:a").await, 3);
    // Seqs below a batch's first were settled: the set forgets them, so
    // it holds about one batch.
    let members = cmd(&mut c, &["ZCARD", "{0}convoy:producer:pg/x:sent"]).await;
    assert_eq!(members, Value::Int(1), "only row 7 is kept");
}

/// The consumers of group `g` on the unit's stream.
async fn consumers(c: &mut Conn) -> usize {
    match cmd(c, &["XINFO", "CONSUMERS", STREAM, "g"]).await {
        Value::Array(items) => items.len(),
        other => panic!("XINFO CONSUMERS: {other:?}"),
    }
}

/// `a` (incarnation `a1`) takes the unit with one entry in its stream and
/// reads it: the token and the entries read.
async fn taken_and_read(c: &mut Conn) -> (String, Vec<crate::reply::Entry>) {
    cmd(c, &["SET", ALIVE_A, "a1"]).await;
    cmd(c, &["XADD", STREAM, "*", "f", "v"]).await;
    let token = acquire(c, "a", "a1").await.expect("a takes the unit");
    let ReadReply::Entries(_, entries) = read(c, &token, ALIVE_A, "a1").await else {
        panic!("an entry to read");
    };
    (token, entries)
}

#[tokio::test]
async fn a_drained_unit_rests_without_its_consumer_and_keeps_one_with_pending_entries() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let (token, entries) = taken_and_read(&mut c).await;
    let u = unit();
    let rest = |c: &mut Conn, token: String| {
        let mut c = c.clone();
        let u = u.clone();
        async move {
            Rest {
                by: by(&u, &token, ALIVE_A, "a1"),
            }
            .run(&mut c)
            .await
            .expect("rest")
        }
    };
    // Delivered, not acknowledged: the consumer holds it, and stays.
    assert_eq!(rest(&mut c, token.clone()).await, Rested::Rested(0));
    assert_eq!(consumers(&mut c).await, 1);
    let ids: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
    ack(&mut c, &token, ALIVE_A, "a1", &ids, false).await;
    // Drained: the consumer goes; the group and its position stay.
    assert_eq!(rest(&mut c, token.clone()).await, Rested::Rested(1));
    assert_eq!(consumers(&mut c).await, 0);
    // The next read creates it again and sees only what is new.
    cmd(&mut c, &["XADD", STREAM, "*", "f", "w"]).await;
    match read(&mut c, &token, ALIVE_A, "a1").await {
        ReadReply::Entries(_, e) => assert_eq!(e.len(), 1, "only the new entry"),
        other => panic!("{other:?}"),
    }
    assert_eq!(consumers(&mut c).await, 1);
    // A stale owner is refused.
    cmd(&mut c, &["SET", ALIVE_A, "a2"]).await;
    assert_eq!(
        rest(&mut c, token).await,
        Rested::Refused(Refusal::NotAlive)
    );
}

#[test]
fn every_lua_file_has_its_script_sha() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/lua");
    for entry in std::fs::read_dir(dir).expect("the lua directory") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|ext| ext != "lua") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("a name");
        if stem == "fence" || stem == "entries" {
            // Preludes of the fenced scripts, not scripts.
            continue;
        }
        let code = std::fs::read_to_string(&path).expect("a readable script");
        let sha = script_sha(stem).unwrap_or_else(|| panic!("{stem}.lua has no script_sha"));
        let fence = include_str!("../lua/fence.lua");
        let fence_only = format!("{fence}\n{code}");
        let fenced = format!("{fence}\n{}\n{code}", include_str!("../lua/entries.lua"));
        assert!(
            sha == redis::Script::new(&code).get_hash()
                || sha == redis::Script::new(&fence_only).get_hash()
                || sha == redis::Script::new(&fenced).get_hash(),
            "{stem}.lua: script_sha is not the hash of the script the engine sends"
        );
    }
    assert_eq!(script_sha("nope"), None);
    assert_eq!(script_sha("read.lua"), None);
}

/// An acknowledgement of `ids` of `u` in incarnation `a1`, without flags.
fn plain_ack<'a>(u: &'a Unit, token: &'a str, alive: &'a str, ids: &'a [String]) -> AckItem<'a> {
    AckItem {
        unit: u,
        at: PRIMARY,
        token,
        incarnation: "a1",
        alive,
        ids,
        clear_head: false,
        touch: false,
        trim: false,
    }
}

/// Runs one acknowledgement call of `items`.
async fn ack_call(
    c: &mut Conn,
    items: &[AckItem<'_>],
    wait: Option<super::Replicated>,
) -> Result<Vec<Acked>, convoy_core::error::Error> {
    Ack {
        group: "g",
        now_ms: 1,
        items,
    }
    .run(c, wait)
    .await
}

/// `n` entries added to `u`'s stream and read by `a:1` (holding the
/// lease, alive in incarnation `a1` under `alive`): their ids.
async fn read_by_a(c: &mut Conn, u: &Unit, alive: &str, n: usize) -> Vec<String> {
    let stream = u.stream(PRIMARY);
    let mut ids = Vec::new();
    for _ in 0..n {
        let Value::BulkString(id) = cmd(c, &["XADD", stream, "*", "f", "v"]).await else {
            panic!("XADD")
        };
        ids.push(String::from_utf8(id).expect("id"));
    }
    cmd(c, &["XGROUP", "CREATE", stream, "g", "0"]).await;
    cmd(
        c,
        &["XREADGROUP", "GROUP", "g", "a:1", "STREAMS", stream, ">"],
    )
    .await;
    cmd(c, &["SET", &u.lease, "a:1"]).await;
    cmd(c, &["SET", alive, "a1"]).await;
    ids
}

/// One call acknowledging units of one category in several shards (one
/// server: a call may span shards) adds them all to one shard's
/// acknowledged count, with one `INCRBY`; the counts summed over the shards
/// (what lag and the loss check read) are the units acknowledged.
#[tokio::test]
async fn one_call_counts_a_category_once_whatever_the_shards_of_its_units() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    const SHARDS: u32 = 16;
    // Keys in distinct shards.
    let mut units: Vec<Unit> = Vec::new();
    for k in 0.. {
        let u = Unit::new(
            "g",
            "cat",
            &format!("k{k}"),
            ["cat"],
            "backfill",
            false,
            SHARDS,
        );
        if units.iter().all(|o| o.shard != u.shard) {
            units.push(u);
        }
        if units.len() == 3 {
            break;
        }
    }
    let alive: Vec<String> = units
        .iter()
        .map(|u| convoy_core::names::alive(u.shard, "g", "a"))
        .collect();
    let mut ids = Vec::new();
    for (u, alive) in units.iter().zip(&alive) {
        ids.push(read_by_a(&mut c, u, alive, 1).await);
    }
    let items: Vec<AckItem<'_>> = units
        .iter()
        .zip(&alive)
        .zip(&ids)
        .map(|((u, alive), ids)| plain_ack(u, "a:1", alive, ids))
        .collect();
    let before = calls(&mut c, "incrby").await;
    let acked = ack_call(&mut c, &items, None).await.expect("ack");
    assert_eq!(acked, vec![Acked::Acked(1); 3]);
    assert_eq!(calls(&mut c, "incrby").await - before, 1);
    let mut sum = 0;
    for u in &units {
        if let Value::BulkString(n) = cmd(&mut c, &["GET", &u.lanes[0].acked]).await {
            sum += String::from_utf8(n)
                .expect("count")
                .parse::<i64>()
                .expect("count");
        }
    }
    assert_eq!(sum, 3, "the shards' counts sum to the units acknowledged");
}

/// A server that forgot convoy's scripts (restarted, flushed, a new node)
/// gets the script loaded again, and the call goes through, with and
/// without waiting for replicas.
#[tokio::test]
async fn a_script_the_server_forgot_is_loaded_and_the_call_sent_again() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let (token, got) = taken_and_read(&mut c).await;
    let ids: Vec<String> = got.iter().map(|e| e.id.clone()).collect();
    let u = unit();
    for wait in [
        None,
        Some(super::Replicated {
            replicas: 0,
            timeout_ms: 10,
        }),
    ] {
        cmd(&mut c, &["SCRIPT", "FLUSH"]).await;
        let items = [plain_ack(&u, &token, ALIVE_A, &ids)];
        let acked = ack_call(&mut c, &items, wait)
            .await
            .expect("acknowledged after loading the script again");
        assert!(matches!(acked[..], [Acked::Acked(_)]), "{acked:?}");
    }
}

/// Reads an integer reply (a missing key as 0).
async fn int_of(c: &mut Conn, args: &[&str]) -> i64 {
    match cmd(c, args).await {
        Value::Int(n) => n,
        Value::BulkString(b) => String::from_utf8(b)
            .expect("utf-8")
            .parse()
            .expect("a number"),
        Value::Nil => 0,
        other => panic!("{args:?} replied {other:?}"),
    }
}

/// One call whose units differ in every way the script shares keys by
/// (shards, so liveness keys; categories, so counters and groups sets;
/// incarnations; flags, so which units pass their state hash) answers
/// each unit by its own fence and acts on its own keys: the refused ones
/// are left as they were, wherever they sit among the others.
#[tokio::test]
async fn a_mixed_call_answers_each_unit_by_its_own_fence_and_keys() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    const SHARDS: u32 = 4;
    // Categories alternate; shards follow the keys.
    let units: Vec<Unit> = (0..5)
        .map(|k| {
            let category = if k % 2 == 0 { "ca" } else { "cb" };
            Unit::new(
                "g",
                category,
                &format!("key{k}"),
                [category],
                "backfill",
                false,
                SHARDS,
            )
        })
        .collect();
    assert!(
        units.iter().any(|u| u.shard != units[0].shard),
        "the units span shards"
    );
    let alive: Vec<String> = units
        .iter()
        .map(|u| convoy_core::names::alive(u.shard, "g", "a"))
        .collect();
    let mut ids: Vec<Vec<String>> = Vec::new();
    for (u, alive) in units.iter().zip(&alive) {
        ids.push(read_by_a(&mut c, u, alive, 3).await);
        cmd(&mut c, &["SADD", &u.lanes[0].groups, "g"]).await;
        cmd(&mut c, &["HSET", &u.state, "head", "x", "attempts", "2"]).await;
    }
    // Unit 3's lease went to another owner.
    cmd(&mut c, &["SET", &units[3].lease, "b:9"]).await;
    let item = |i: usize, n: usize, inc: &'static str, flags: (bool, bool, bool)| AckItem {
        unit: &units[i],
        at: PRIMARY,
        token: "a:1",
        incarnation: inc,
        alive: &alive[i],
        ids: &ids[i][..n],
        clear_head: flags.0,
        touch: flags.1,
        trim: flags.2,
    };
    let items = [
        item(0, 1, "a1", (false, false, false)),
        item(1, 2, "a1", (true, true, false)),
        // A lease taken in an earlier incarnation, with every flag: its
        // state hash is among the keys, and nothing of it is touched.
        item(2, 3, "a0", (true, true, true)),
        item(3, 1, "a1", (true, false, false)),
        item(4, 3, "a1", (false, false, true)),
    ];
    let before = calls(&mut c, "incrby").await;
    let acked = ack_call(&mut c, &items, None).await.expect("ack");
    assert_eq!(
        acked,
        vec![
            Acked::Acked(1),
            Acked::Acked(2),
            Acked::Refused(Refusal::NotAlive),
            Acked::Refused(Refusal::FencedOut),
            Acked::Acked(3),
        ]
    );
    assert_eq!(
        calls(&mut c, "incrby").await - before,
        2,
        "one count per category"
    );
    let mut pending = Vec::new();
    let mut length = Vec::new();
    let mut head = Vec::new();
    for u in &units {
        let stream = u.stream(PRIMARY);
        let Value::Array(summary) = cmd(&mut c, &["XPENDING", stream, "g"]).await else {
            panic!("XPENDING")
        };
        pending.push(match &summary[0] {
            Value::Int(n) => *n,
            other => panic!("XPENDING count {other:?}"),
        });
        length.push(xlen(&mut c, stream).await);
        head.push(int_of(&mut c, &["HEXISTS", &u.state, "head"]).await);
    }
    assert_eq!(pending, vec![2, 1, 3, 3, 0], "pending entries per unit");
    assert_eq!(length, vec![3, 3, 3, 3, 0], "only unit 4 trimmed");
    assert_eq!(head, vec![1, 0, 1, 1, 1], "only unit 1's head cleared");
    assert_eq!(
        int_of(&mut c, &["HEXISTS", &units[1].state, "active"]).await,
        1
    );
    assert_eq!(
        int_of(&mut c, &["HEXISTS", &units[2].state, "active"]).await,
        0
    );
    // Each category counted on one of its units' counters (units of one
    // category and shard share one).
    let mut counters: Vec<(usize, &str)> = units
        .iter()
        .map(|u| {
            (
                usize::from(u.lanes[0].category == "cb"),
                u.lanes[0].acked.as_str(),
            )
        })
        .collect();
    counters.sort_unstable();
    counters.dedup();
    let mut sums = [0, 0];
    for (category, key) in counters {
        sums[category] += int_of(&mut c, &["GET", key]).await;
    }
    assert_eq!(sums, [4, 2], "acknowledged per category");
}

/// A read of up to `count` new entries of the primary lane by `by`, who
/// holds `held` entries pending.
fn new_read<'a>(by: Caller<'a>, count: usize, held: usize, oldest: Option<&'a str>) -> Read<'a> {
    Read {
        by,
        which: Which::New,
        primary_count: count,
        backfill_count: count,
        whole: count,
        first_lane: 0,
        held: (PRIMARY, held, oldest),
        resent: false,
    }
}

/// A native read of up to `count` new entries (a plain `XREADGROUP` checked
/// by `verify.lua`) by a caller that holds `held` pending entries: `None`
/// when it needs the script instead.
async fn read_native(
    c: &mut Conn,
    token: &str,
    alive: &str,
    inc: &str,
    held: usize,
    count: usize,
) -> Option<ReadReply> {
    read_native_holding(c, token, alive, inc, (held, None), count).await
}

/// [`read_native`] by a caller that holds `held.0` pending entries, the
/// oldest `held.1`.
async fn read_native_holding(
    c: &mut Conn,
    token: &str,
    alive: &str,
    inc: &str,
    held: (usize, Option<&str>),
    count: usize,
) -> Option<ReadReply> {
    let u = unit();
    let native = new_read(by(&u, token, alive, inc), count, held.0, held.1)
        .native(c, None)
        .await
        .expect("native read")
        .0
        .expect("native read checked");
    match native {
        Native::Read(reply) => Some(reply),
        Native::Script => None,
        Native::Refused => panic!("refused before running"),
    }
}

/// The ids of a read's entries, or what it replied instead.
fn ids_of(r: Option<ReadReply>) -> Vec<String> {
    match r {
        Some(ReadReply::Entries(at, e)) => {
            assert_eq!(at, PRIMARY);
            e.into_iter().map(|e| e.id).collect()
        }
        other => panic!("entries, not {other:?}"),
    }
}

/// A read sent ahead counts the batch it goes beside as held, the oldest
/// first. Held up on its way until after that batch was acknowledged, it
/// finds the batch gone; when as many entries an earlier read delivered
/// unseen make up the count, the oldest pending is not the oldest held, and
/// the caller reads its pending entries first rather than passing over
/// them. Nor does it fall back to the scripted read.
#[tokio::test]
async fn a_read_run_after_what_it_held_was_acknowledged_sends_the_caller_to_its_pending_entries() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    let a = acquire(&mut c, "a", "a1").await.expect("a takes the unit");
    // No stream yet: the script reads (and Redis loads the check).
    assert!(read_native(&mut c, &a, ALIVE_A, "a1", 0, 1).await.is_none());
    // A read sent ahead never falls back to the script (whose check only
    // looks for more pending than held): it sends the caller to its
    // pending entries instead.
    let u = unit();
    let ahead = new_read(by(&u, &a, ALIVE_A, "a1"), 1, 0, None)
        .ahead(&mut c)
        .await;
    assert!(matches!(ahead, Ok(ReadReply::Unseen)), "{ahead:?}");
    for i in 1..=6 {
        cmd(&mut c, &["XADD", STREAM, &format!("1-{i}"), "f", "v"]).await;
    }
    cmd(&mut c, &["XGROUP", "CREATE", STREAM, "g", "0"]).await;
    // The batch in hand: 1-1 and 1-2.
    assert_eq!(
        ids_of(read_native(&mut c, &a, ALIVE_A, "a1", 0, 2).await),
        ["1-1", "1-2"]
    );
    // A read whose reply was lost delivered 1-3 and 1-4, unseen.
    cmd(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            &a,
            "COUNT",
            "2",
            "STREAMS",
            STREAM,
            ">",
        ],
    )
    .await;
    // The batch is acknowledged before the read sent beside it runs.
    let batch = ["1-1".to_owned(), "1-2".to_owned()];
    assert_eq!(
        ack(&mut c, &a, ALIVE_A, "a1", &batch, false).await,
        vec![Acked::Acked(2)]
    );
    // It delivers 1-5 and 1-6: 4 pending, as the 2 held and 2 delivered
    // would be; but the oldest is 1-3, not 1-1.
    let late = read_native_holding(&mut c, &a, ALIVE_A, "a1", (2, Some("1-1")), 2).await;
    assert!(matches!(late, Some(ReadReply::Unseen)), "{late:?}");
    let Value::Array(summary) = cmd(&mut c, &["XPENDING", STREAM, "g"]).await else {
        panic!("XPENDING")
    };
    assert_eq!(summary[0], Value::Int(4), "the count alone would pass");
    // The pending entries come first, in order.
    let pending = Read {
        which: Which::Pending,
        ..new_read(by(&u, &a, ALIVE_A, "a1"), 10, 0, None)
    };
    let read = pending.run(&mut c).await.expect("pending read");
    assert_eq!(ids_of(Some(read)), ["1-3", "1-4", "1-5", "1-6"]);
}

/// The native read is safe without a fence of its own: `verify.lua`,
/// behind it in the same pipeline, refuses a replaced owner (which then
/// handles nothing), sees a read whose reply was lost, and moves what a
/// replaced owner read back to the current owner, whose pending read then
/// delivers it in order before anything newer; an entry deleted meanwhile
/// is reported, not skipped quietly.
#[tokio::test]
async fn a_native_read_is_checked_after_it_and_a_replaced_owner_s_read_is_moved_back() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    cmd(&mut c, &["SET", ALIVE_A, "a1"]).await;
    cmd(&mut c, &["SET", ALIVE_B, "b1"]).await;
    let old = acquire(&mut c, "a", "a1").await.expect("a takes the unit");
    // No stream yet, then no group: the script reads (and creates it).
    assert!(
        read_native(&mut c, &old, ALIVE_A, "a1", 0, 1)
            .await
            .is_none()
    );
    for i in 1..=6 {
        cmd(&mut c, &["XADD", STREAM, &format!("1-{i}"), "f", "v"]).await;
    }
    assert!(
        read_native(&mut c, &old, ALIVE_A, "a1", 0, 1)
            .await
            .is_none()
    );
    cmd(&mut c, &["XGROUP", "CREATE", STREAM, "g", "0"]).await;

    assert_eq!(
        ids_of(read_native(&mut c, &old, ALIVE_A, "a1", 0, 1).await),
        ["1-1"]
    );
    // Sent again, its reply lost: 1-2 was delivered too, unseen.
    assert!(matches!(
        read_native(&mut c, &old, ALIVE_A, "a1", 0, 1).await,
        Some(ReadReply::Unseen)
    ));
    // Holding both (handled, not acknowledged), the caller reads on.
    assert_eq!(
        ids_of(read_native(&mut c, &old, ALIVE_A, "a1", 2, 1).await),
        ["1-3"]
    );

    // a stalls past its lease; b takes over and reclaims 1-1 .. 1-3, then
    // handles and acknowledges them.
    cmd(&mut c, &["DEL", ALIVE_A]).await;
    let new = acquire(&mut c, "b", "b1").await.expect("b takes the unit");
    let u = unit();
    let claimed = Claim {
        by: by(&u, &new, ALIVE_B, "b1"),
        stream: STREAM,
    }
    .run(&mut c)
    .await
    .expect("claim");
    assert_eq!(
        claimed,
        Claimed::Done {
            count: 3,
            gone: vec![]
        }
    );
    let handled: Vec<String> = (1..=3).map(|i| format!("1-{i}")).collect();
    assert_eq!(
        ack(&mut c, &new, ALIVE_B, "b1", &handled, false).await,
        vec![Acked::Acked(3)]
    );
    // a wakes and reads natively: the read moves 1-4 and 1-5 to a's
    // consumer, and the check refuses a, which handles neither.
    cmd(&mut c, &["SET", ALIVE_A, "a2"]).await;
    assert_eq!(
        read_native(&mut c, &old, ALIVE_A, "a2", 0, 2)
            .await
            .as_ref()
            .and_then(refusal),
        Some(Refusal::FencedOut)
    );
    assert_eq!(consumers(&mut c).await, 2);
    cmd(&mut c, &["XDEL", STREAM, "1-4"]).await;
    // b's next read (1-6) finds them: moved to b, 1-4 reported as gone.
    match read_native(&mut c, &new, ALIVE_B, "b1", 0, 1).await {
        Some(ReadReply::Reclaimed {
            stream,
            moved,
            missing,
        }) => {
            assert_eq!(
                (stream.as_str(), moved, missing),
                (STREAM, 1, vec!["1-4".to_owned()])
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(consumers(&mut c).await, 1, "a's consumer is deleted");
    // b reads its pending entries first: 1-5 before 1-6.
    let pending = Read {
        by: by(&u, &new, ALIVE_B, "b1"),
        which: Which::Pending,
        primary_count: 10,
        backfill_count: 10,
        whole: 10,
        first_lane: 0,
        held: (PRIMARY, 0, None),
        resent: false,
    };
    let read = pending.run(&mut c).await.expect("pending read");
    assert_eq!(ids_of(Some(read)), ["1-5", "1-6"]);
    // Nothing else is pending anywhere, and nothing new is left.
    assert!(matches!(
        read_native(&mut c, &new, ALIVE_B, "b1", 2, 1).await,
        Some(ReadReply::Empty)
    ));

    // a reads natively once more (1-7), and b's next read is by the script
    // (its native read failed, say, before its check ran): the script
    // moves 1-7 back too, and b's pending read has it after 1-5 and 1-6.
    cmd(&mut c, &["XADD", STREAM, "1-7", "f", "v"]).await;
    let refused = read_native(&mut c, &old, ALIVE_A, "a2", 0, 1).await;
    assert_eq!(refused.as_ref().and_then(refusal), Some(Refusal::FencedOut));
    match pending.run(&mut c).await.expect("pending read") {
        ReadReply::Reclaimed { moved, missing, .. } => assert_eq!((moved, missing.len()), (1, 0)),
        other => panic!("{other:?}"),
    }
    let read = pending.run(&mut c).await.expect("pending read");
    assert_eq!(ids_of(Some(read)), ["1-5", "1-6", "1-7"]);
}

/// The unit, taken by `a` alive in incarnation `a1`: its token.
async fn taken_by_a(c: &mut Conn) -> String {
    cmd(c, &["SET", ALIVE_A, "a1"]).await;
    acquire(c, "a", "a1").await.expect("a takes the unit")
}

/// `a1`'s acknowledgement of `ids` sent in front of its native read of up
/// to `count` new entries (holding none after it).
async fn after_ack(
    c: &mut Conn,
    token: &str,
    ids: &[String],
    count: usize,
) -> super::read::AckedRead {
    let u = unit();
    let items = [AckItem {
        unit: &u,
        at: PRIMARY,
        token,
        incarnation: "a1",
        alive: ALIVE_A,
        ids,
        clear_head: false,
        touch: false,
        trim: true,
    }];
    let ack = Ack {
        group: "g",
        now_ms: 1,
        items: &items,
    };
    new_read(by(&u, token, ALIVE_A, "a1"), count, 0, None)
        .after_ack(&ack, c)
        .await
        .expect("acknowledged and read")
}

/// A unit that finished its batch sends its acknowledgement in front of its
/// next read, in one pipeline: Redis runs the acknowledgement first (and its
/// trim), so the read's check counts only what the read delivered; scripts
/// the server forgot are loaded and the pipeline sent again, the first
/// read's entries then found pending and unseen; a replaced owner is
/// refused both.
#[tokio::test]
async fn an_acknowledgement_in_front_of_a_native_read_runs_first() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let token = taken_by_a(&mut c).await;
    for i in 1..=5 {
        cmd(&mut c, &["XADD", STREAM, &format!("1-{i}"), "f", "v"]).await;
    }
    // No group yet: nothing read (and verify.lua loaded).
    assert!(
        read_native(&mut c, &token, ALIVE_A, "a1", 0, 2)
            .await
            .is_none()
    );
    cmd(&mut c, &["XGROUP", "CREATE", STREAM, "g", "0"]).await;
    assert_eq!(
        ids_of(read_native(&mut c, &token, ALIVE_A, "a1", 0, 2).await),
        ["1-1", "1-2"]
    );
    // Redis knows ack.lua (a worker's first acknowledgement is on its own
    // unless it is in front of a read: see below for one it does not know).
    let _: String = super::SCRIPTS
        .ack
        .load_async(&mut c)
        .await
        .expect("load ack.lua");
    let handled = ["1-1".to_owned(), "1-2".to_owned()];
    let got = after_ack(&mut c, &token, &handled, 2).await;
    assert_eq!(got.acked.expect("acknowledged"), [Acked::Acked(2)]);
    assert_eq!(ids_of(got.read.map(|r| r.expect("read"))), ["1-3", "1-4"]);
    // Acknowledged and trimmed before the read: only what it delivered is
    // pending, and the stream holds nothing acknowledged.
    assert_eq!(int_of(&mut c, &["XLEN", STREAM]).await, 3);
    match cmd(&mut c, &["XPENDING", STREAM, "g"]).await {
        Value::Array(summary) => assert_eq!(summary.first(), Some(&Value::Int(2))),
        other => panic!("{other:?}"),
    }

    // Redis forgot both scripts: the first pipeline's read delivered 1-5
    // with neither script run; sent again after loading them, the
    // acknowledgement runs and the check sees 1-5 pending, unseen.
    cmd(&mut c, &["SCRIPT", "FLUSH"]).await;
    let handled = ["1-3".to_owned(), "1-4".to_owned()];
    let got = after_ack(&mut c, &token, &handled, 2).await;
    assert_eq!(got.acked.expect("acknowledged"), [Acked::Acked(2)]);
    assert!(
        matches!(got.read, Some(Ok(ReadReply::Unseen))),
        "{:?}",
        got.read
    );
    assert_eq!(pending_of_a(&mut c, &token).await, ["1-5"]);

    // An owner whose liveness lapsed is refused both, and the read's check
    // hands it nothing.
    cmd(&mut c, &["XADD", STREAM, "1-6", "f", "v"]).await;
    cmd(&mut c, &["DEL", ALIVE_A]).await;
    let handled = ["1-5".to_owned()];
    let got = after_ack(&mut c, &token, &handled, 2).await;
    assert!(
        matches!(got.acked.as_deref(), Ok([Acked::Refused(_)])),
        "{:?}",
        got.acked
    );
    assert!(
        got.read
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .and_then(refusal)
            .is_some(),
        "{:?}",
        got.read
    );
}

/// The ids of `a1`'s pending entries, read with the fence.
async fn pending_of_a(c: &mut Conn, token: &str) -> Vec<String> {
    let pending = Read {
        by: by(&unit(), token, ALIVE_A, "a1"),
        which: Which::Pending,
        primary_count: 10,
        backfill_count: 10,
        whole: 10,
        first_lane: 0,
        held: (PRIMARY, 0, None),
        resent: false,
    }
    .run(c)
    .await
    .expect("pending read");
    ids_of(Some(pending))
}

/// Redis forgot one of the two scripts of an acknowledgement in front of a
/// read. Only the acknowledgement: it goes on its own and the read's
/// outcome stands (one read, its entry pending and unseen; sending the
/// pipeline again would read a second and lose the first check's outcome).
/// Only the check: the pipeline again, the acknowledgement running twice
/// (the second finds nothing left to acknowledge), and both reads' entries
/// found pending and unseen.
#[tokio::test]
async fn an_acknowledgement_redis_forgot_in_front_of_a_read_goes_on_its_own() {
    let server = RedisServer::start().expect("redis-server");
    let mut c = Conn::Node(server.connection().await.expect("connection"));
    let token = taken_by_a(&mut c).await;
    for i in 1..=6 {
        cmd(&mut c, &["XADD", STREAM, &format!("1-{i}"), "f", "v"]).await;
    }
    cmd(&mut c, &["XGROUP", "CREATE", STREAM, "g", "0"]).await;
    // Redis knows verify.lua, not ack.lua.
    let _: String = super::SCRIPTS
        .verify
        .load_async(&mut c)
        .await
        .expect("load verify.lua");
    assert_eq!(
        ids_of(read_native(&mut c, &token, ALIVE_A, "a1", 0, 1).await),
        ["1-1"]
    );
    let got = after_ack(&mut c, &token, &["1-1".to_owned()], 1).await;
    assert_eq!(got.acked.expect("acknowledged"), [Acked::Acked(1)]);
    assert!(
        matches!(got.read, Some(Ok(ReadReply::Unseen))),
        "{:?}",
        got.read
    );
    assert_eq!(pending_of_a(&mut c, &token).await, ["1-2"]);

    // Only verify.lua forgotten.
    cmd(&mut c, &["SCRIPT", "FLUSH"]).await;
    let _: String = super::SCRIPTS
        .ack
        .load_async(&mut c)
        .await
        .expect("load ack.lua");
    let got = after_ack(&mut c, &token, &["1-2".to_owned()], 1).await;
    // The pipeline was sent again: its acknowledgement finds 1-2 done.
    assert_eq!(got.acked.expect("acknowledged"), [Acked::Acked(0)]);
    assert!(
        matches!(got.read, Some(Ok(ReadReply::Unseen))),
        "{:?}",
        got.read
    );
    assert_eq!(pending_of_a(&mut c, &token).await, ["1-3", "1-4"]);
}

/// A command's arguments, as text.
fn words(cmd: &redis::Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<not a plain argument>".to_owned(),
        })
        .collect()
}

/// A call written keys first is the same `EVALSHA` as one written keys and
/// values apart, whatever number of keys it was sized for and even when a
/// key comes after a value; the key count is what was given.
#[test]
fn a_call_written_keys_first_is_the_same_command_however_its_keys_come() {
    use super::{Invocation, SCRIPTS};
    let script = &SCRIPTS.ack;
    let hash = script.get_hash();
    let mut apart = Invocation::new(script);
    apart
        .key("k1")
        .arg("v1")
        .key(["k2", "k3"].as_slice())
        .arg(7);
    let mut first = Invocation::keys_first(script, 3, 2, 8);
    first
        .key("k1")
        .key(["k2", "k3"].as_slice())
        .arg("v1")
        .arg(7);
    // Sized for one key, given three, one of them after a value.
    let mut late = Invocation::keys_first(script, 1, 2, 8);
    late.key("k1")
        .key(Vec::<String>::new())
        .arg("v1")
        .key(["k2", "k3"].as_slice())
        .arg(7);
    let want = ["EVALSHA", hash, "3", "k1", "k2", "k3", "v1", "7"];
    for inv in [&apart, &first, &late] {
        assert_eq!(words(&inv.command()), want);
    }
    assert_eq!(words(&first.into_command()), want);
    assert_eq!(words(&late.into_command()), want);
    let mut keys_only = Invocation::keys_first(script, 0, 0, 0);
    keys_only.key("k1");
    assert_eq!(words(&keys_only.command()), ["EVALSHA", hash, "1", "k1"]);
    let mut none = Invocation::keys_first(script, 2, 1, 8);
    none.arg("v1");
    assert_eq!(words(&none.into_command()), ["EVALSHA", hash, "0", "v1"]);
}

/// ack.lua answers a call's units in one string, in order: each number is
/// the unit's acknowledged count, or its refusal; a string of another
/// length or with something else in it is an unexpected reply, never
/// taken for answers.
#[test]
fn an_acknowledgement_calls_answers_are_read_from_one_string_in_order() {
    let u = unit();
    let ids = ["1-1".to_owned()];
    let items = [
        plain_ack(&u, "a:1", "alive", &ids),
        plain_ack(&u, "a:1", "alive", &ids),
    ];
    let ack = Ack {
        group: "g",
        now_ms: 1,
        items: &items,
    };
    let reply =
        |v: Vec<Value>| super::Reply::parse("ack", Value::Array(v)).map(|r| ack.answers(&r));
    let joined = |s: &str| {
        reply(vec![
            Value::Int(1),
            Value::BulkString(s.as_bytes().to_vec()),
        ])
    };
    assert_eq!(
        joined("3,-1").expect("a reply").expect("answers"),
        vec![Acked::Acked(3), Acked::Refused(Refusal::FencedOut)]
    );
    for wrong in ["3", "3,1,1", "3,x", "", "3,,1"] {
        assert!(
            joined(wrong).expect("a reply").is_err(),
            "{wrong:?} taken for answers"
        );
    }
    // One value per unit (the earlier shape) is not read as answers.
    assert!(
        reply(vec![Value::Int(1), Value::Int(3), Value::Int(1)])
            .expect("a reply")
            .is_err()
    );
}
