//! The `convoy` binary against a real `redis-server` and a running engine:
//! a poison event halts its partition, the command line lists and inspects
//! it, skips and dead-letters the head, lists and replays dead letters, and
//! the partition resumes in order with nothing lost; `--force` on a running
//! partition fences its owner without reordering; an unreachable Redis is
//! exit code 2 and one line; the same commands on a Redis Cluster, by a
//! `redis+cluster://` URL.

mod common;
#[path = "../../tests/support/halting_ledger.rs"]
mod halting_ledger;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use convoy_runtime::redis::keys;
use convoy_runtime::testing::RedisServer;
use convoy_runtime::{Aggregate, Domain, Event, HandlerError, event_handler};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use common::{Run, run_convoy, wait_until};
use halting_ledger::{Posted, SHARDS, Seen, Setup, WAIT, config, ids, posted, setup};
use serde_json::Value;

/// `ledger`'s partition stream of `key`, in the key's shard.
fn stream(key: &str) -> String {
    keys::partition_stream(keys::shard_of(key, SHARDS), "ledger", key)
}

/// `key`'s dead letter stream.
fn dlq(key: &str) -> String {
    keys::partition_dlq(keys::shard_of(key, SHARDS), "ledger", key)
}

impl Setup {
    /// Runs `convoy ARGS --redis-url URL` as user `test-op`, stdin closed.
    async fn convoy(&self, args: &[&str]) -> Run {
        convoy(self.server.dir(), args, Some(&self.url)).await
    }
}

async fn convoy(dir: &std::path::Path, args: &[&str], url: Option<&str>) -> Run {
    let mut args = args.to_vec();
    if let Some(url) = url {
        args.extend(["--redis-url", url]);
    }
    run_convoy(dir, &args, &[]).await
}

fn row<'a>(report: &'a Value, key: &str) -> &'a Value {
    report["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["key"] == key)
        .unwrap_or_else(|| panic!("no row for {key}: {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halt_inspect_skip_dead_letter_and_replay_resume_in_order() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    let mut events = Vec::new();
    for seq in 0..10 {
        for key in ["c0", "c1", "c2"] {
            events.push(posted(key, seq, key == "c1" && (seq == 3 || seq == 6)));
        }
    }
    s.publish(&events).await;
    wait_until(WAIT, "c0 and c2 finish, c1 halts", || async {
        s.seen("c0").len() == 10 && s.seen("c2").len() == 10 && s.halted_on("c1").await.is_some()
    })
    .await;
    assert_eq!(
        s.seen("c1"),
        ids("c1", &[0, 1, 2]),
        "nothing after the poison ran"
    );

    // 1. The listing shows the owner, the generation and the halt.
    let report = s
        .convoy(&["partitions", "ledger", "--json"])
        .await
        .ok()
        .json();
    let c1 = row(&report, "c1");
    assert_eq!(c1["group"], s.group.as_str());
    assert_eq!(c1["owner"], "e0");
    assert_eq!(c1["owner_alive"], true);
    assert!(c1["generation"].as_u64().is_some_and(|g| g >= 1), "{c1}");
    assert!(
        c1["lease_ms_left"].as_u64().is_some_and(|ms| ms <= 2000),
        "{c1}"
    );
    assert_eq!(c1["halted"], true);
    assert_eq!(c1["halt_reason"], "max_retries exceeded");
    assert!(
        c1["halt_error"]
            .as_str()
            .is_some_and(|e| e.contains("poison event c1#3")),
        "{c1}"
    );
    assert_eq!(c1["length"], 7, "the head and everything behind it stay");
    assert_eq!(row(&report, "c0")["halted"], false);
    assert_eq!(report["totals"]["partitions"], 3);
    assert_eq!(report["totals"]["halted"], 1);
    assert_eq!(report["totals"]["owned"], 3);
    let table = s.convoy(&["partitions", "ledger"]).await.ok().stdout;
    let line = table
        .lines()
        .find(|l| l.starts_with("c1 "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains(" 7  yes, 6 behind  ") && line.contains("max_retries exceeded"),
        "the lag is the head and the six behind it: {table}"
    );
    assert!(
        table.contains("3 partitions, 1 handler, 3 owned, 1 halted"),
        "{table}"
    );

    // The head, decoded, with its delivery count and the last error.
    let i = s
        .convoy(&["inspect", "ledger", "c1", "--json"])
        .await
        .ok()
        .json();
    let head = &i["head"];
    assert_eq!(head["envelope"]["type_name"], "Posted");
    let payload: Value =
        serde_json::from_str(head["envelope"]["payload"].as_str().expect("payload"))
            .expect("payload json");
    assert_eq!(
        (payload["seq"].as_u64(), payload["poison"].as_bool()),
        (Some(3), Some(true))
    );
    assert_eq!(head["pending"], true);
    assert!(
        head["delivery_count"].as_u64().is_some_and(|n| n >= 1),
        "{i}"
    );
    assert_eq!(
        i["status"]["attempts"], 3,
        "1 attempt + max_retries = 2 retries"
    );
    assert!(
        i["status"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("poison event c1#3")),
        "{i}"
    );
    let text = s.convoy(&["inspect", "ledger", "c1"]).await.ok().stdout;
    assert!(text.contains("HALTED since"), "{text}");
    assert!(text.contains("\"poison\": true"), "{text}");

    // Without --yes and without a terminal: refused, nothing changed.
    let r = s.convoy(&["skip", "ledger", "c1"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("pass --yes"), "{r:?}");
    let halt_entry = s.halted_on("c1").await.expect("still halted");

    // 2. Skip: the partition resumes with its next event, in order.
    let r = s.convoy(&["skip", "ledger", "c1", "--yes"]).await.ok();
    assert!(
        r.stdout.contains(&format!("skipped entry {halt_entry}")),
        "{r:?}"
    );
    wait_until(WAIT, "c1 runs up to its second poison event", || async {
        s.seen("c1").len() == 5 && s.halted_on("c1").await.is_some_and(|e| e != halt_entry)
    })
    .await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 4, 5]));
    let mut c = s.redis().await;
    let audit: Vec<redis::streams::StreamId> = c
        .xrange_all::<_, redis::streams::StreamRangeReply>(keys::audit(keys::shard_of(
            "c1", SHARDS,
        )))
        .await
        .expect("audit")
        .ids;
    assert_eq!(audit.len(), 1);
    let a = &audit[0];
    let field = |k: &str| a.get::<String>(k).unwrap_or_default();
    assert_eq!(
        (
            field("op"),
            field("key"),
            field("entry"),
            field("operator"),
            field("forced")
        ),
        (
            "skip".into(),
            "c1".into(),
            halt_entry.clone(),
            "test-op".into(),
            "0".into()
        )
    );
    assert_eq!(field("group"), s.group);

    // 3. Dead-letter the second poison event: moved aside, the rest runs.
    let second = s.halted_on("c1").await.expect("halted");
    let r = s
        .convoy(&["dead-letter", "ledger", "c1", "--yes"])
        .await
        .ok();
    assert!(r.stdout.contains(&format!("to {}", dlq("c1"))), "{r:?}");
    wait_until(WAIT, "c1 finishes", || async { s.seen("c1").len() == 8 }).await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 4, 5, 7, 8, 9]));
    assert_eq!(s.halted_on("c1").await, None);
    let letters = s
        .convoy(&["dlq", "ledger", "c1", "--json"])
        .await
        .ok()
        .json();
    let letters = letters.as_array().expect("array");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let l = &letters[0];
    assert_eq!(l["entry"], second.as_str());
    assert_eq!(l["group"], s.group.as_str());
    assert_eq!(l["operator"], "test-op");
    assert!(
        l["error"]
            .as_str()
            .is_some_and(|e| e.contains("poison event c1#6")),
        "{l}"
    );
    assert!(
        l["envelope"]["payload"]
            .as_str()
            .is_some_and(|p| p.contains("\"seq\":6")),
        "{l}"
    );
    let dlq_id = l["dlq_id"].as_str().expect("dlq id").to_owned();
    let table = s.convoy(&["dlq", "ledger", "c1"]).await.ok().stdout;
    assert!(
        table.contains(&dlq_id) && table.contains(&format!("1 dead letter in {}", dlq("c1"))),
        "{table}"
    );

    // Replay: back at the tail; still poison, so the partition halts on it.
    let r = s
        .convoy(&["replay", "ledger", "c1", &dlq_id, "--yes"])
        .await
        .ok();
    assert!(
        r.stdout
            .contains(&format!("to the tail of {} as entry", stream("c1"))),
        "{r:?}"
    );
    wait_until(WAIT, "the replayed poison event halts c1", || async {
        s.halted_on("c1").await.is_some()
    })
    .await;
    let replayed = s.halted_on("c1").await.expect("halted");
    assert!(
        replayed.as_str() > second.as_str(),
        "a new entry at the tail"
    );
    let empty = s
        .convoy(&["dlq", "ledger", "c1", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(empty, Value::Array(Vec::new()));

    // Dead-letter it again, cure the poison, replay: it runs, last.
    s.convoy(&["dead-letter", "ledger", "c1", "--yes"])
        .await
        .ok();
    let letters = s
        .convoy(&["dlq", "ledger", "c1", "--json"])
        .await
        .ok()
        .json();
    let dlq_id = letters[0]["dlq_id"].as_str().expect("dlq id").to_owned();
    s.poison.store(false, Ordering::SeqCst);
    // --all-handlers names a replay at the tail; not with --at head.
    let e = s
        .convoy(&[
            "replay",
            "ledger",
            "c1",
            &dlq_id,
            "--all-handlers",
            "--at",
            "head",
            "--yes",
        ])
        .await;
    assert!(
        e.stderr.contains("--all-handlers replays at the tail"),
        "{e:?}"
    );
    let r = s
        .convoy(&["replay", "ledger", "c1", &dlq_id, "--all-handlers", "--yes"])
        .await
        .ok();
    assert!(
        r.stdout.contains(&format!(", for {},", s.group)),
        "named to every handler of the category: {r:?}"
    );
    wait_until(WAIT, "the replayed event is handled", || async {
        s.seen("c1").len() == 9
    })
    .await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 4, 5, 7, 8, 9, 6]));
    assert_eq!(s.seen("c0"), ids("c0", &(0..10).collect::<Vec<_>>()));
    assert_eq!(s.seen("c2"), ids("c2", &(0..10).collect::<Vec<_>>()));

    let audit = s.convoy(&["audit", "--json"]).await.ok().json();
    let ops: Vec<&str> = audit
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["fields"]["op"].as_str().expect("op"))
        .collect();
    assert_eq!(
        ops,
        ["skip", "dead_letter", "replay", "dead_letter", "replay"]
    );
    let table = s.convoy(&["audit"]).await.ok().stdout;
    assert!(table.contains("dead_letter  ledger:c1"), "{table}");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_on_a_running_partition_fences_its_owner_without_reordering() {
    let s = setup(Duration::from_millis(150));
    let engine = s.domain.engine().spawn();
    let events: Vec<Posted> = (0..20).map(|seq| posted("c0", seq, false)).collect();
    s.publish(&events).await;
    wait_until(WAIT, "c0 is running", || async { s.seen("c0").len() >= 3 }).await;
    let before = s
        .convoy(&["partitions", "ledger", "--json"])
        .await
        .ok()
        .json();
    let generation = row(&before, "c0")["generation"]
        .as_u64()
        .expect("generation");

    // 4. Not halted: refused without --force, with a message saying so.
    let r = s.convoy(&["skip", "ledger", "c0", "--yes"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("is not halted"), "{r:?}");
    assert!(r.stderr.contains("pass --force"), "{r:?}");
    assert_eq!(r.stderr.lines().count(), 1, "{r:?}");

    // --force fences the owner out; the next owner is a newer generation.
    let r = s
        .convoy(&["skip", "ledger", "c0", "--force", "--yes"])
        .await
        .ok();
    assert!(r.stderr.contains("WARNING: --force"), "{r:?}");
    assert!(r.stderr.contains("may still take effect"), "{r:?}");
    assert!(
        r.stdout
            .contains(&format!("fenced out the owner's lease e0:{generation}")),
        "{r:?}"
    );
    wait_until(WAIT, "c0 drains", || async {
        let mut c = s.redis().await;
        let len: u64 = c.xlen(stream("c0")).await.expect("xlen");
        len == 0 && s.seen("c0").len() >= 19
    })
    .await;
    let after = s
        .convoy(&["partitions", "ledger", "--json"])
        .await
        .ok()
        .json();
    let c0 = row(&after, "c0");
    assert!(
        c0["generation"]
            .as_u64()
            .is_some_and(|g| g >= generation + 2),
        "bumped by the fence, then taken at a newer one: {c0}"
    );
    assert!(
        c0["durable_generation"]
            .as_u64()
            .is_some_and(|g| g >= generation + 2)
    );
    assert_eq!(c0["pending"], 0);

    // In order, nothing twice; at most the skipped event is missing (it
    // may also have run, as the old owner's event in flight).
    let seen: Vec<u64> = s
        .seen("c0")
        .iter()
        .map(|id| id.rsplit('#').next().expect("seq").parse().expect("number"))
        .collect();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "reordered or run twice: {seen:?}"
    );
    assert!(
        seen.len() >= 19,
        "more than the skipped event is missing: {seen:?}"
    );
    let audit = s.convoy(&["audit", "--json"]).await.ok().json();
    let record = &audit[0]["fields"];
    assert_eq!(record["forced"], "1");
    assert_eq!(record["fenced"], format!("e0:{generation}"));
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_must_be_named_when_ambiguous() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let mut c = server.connection().await.expect("connection");
    // Registered as an engine does, in every shard (of the default count:
    // none is recorded).
    for s in 0..keys::DEFAULT_SHARDS {
        let _: () = c
            .sadd(keys::groups(s, "ledger"), &["app::One", "app::Two"])
            .await
            .expect("sadd");
    }
    let r = convoy(server.dir(), &["inspect", "ledger", "c1"], Some(&url)).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("app::One, app::Two"), "{r:?}");
    assert!(r.stderr.contains("pass --handler"), "{r:?}");
    // The handler resolves; the key is one the category never had, and
    // is named as such (not shown as an unowned partition).
    let r = convoy(
        server.dir(),
        &["inspect", "ledger", "c1", "--handler", "Two"],
        Some(&url),
    )
    .await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("category ledger has no partition \"c1\""),
        "{r:?}"
    );
    // So is a category no engine ever ran a handler of (a typo).
    let r = convoy(server.dir(), &["partitions", "ledgre"], Some(&url)).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("no category \"ledgre\" here"), "{r:?}");
    let r = convoy(
        server.dir(),
        &["skip", "ledger", "c1", "--handler", "Three", "--yes"],
        Some(&url),
    )
    .await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("handler Three is not registered"),
        "{r:?}"
    );
    let r = convoy(server.dir(), &["partitions", "ledger"], Some(&url))
        .await
        .ok();
    assert!(r.stdout.contains("no live partitions"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_exits_2_with_one_line() {
    let port = convoy_runtime::testing::free_port().expect("port");
    let url = format!("redis://operator:s3cret@127.0.0.1:{port}/");
    let dir = std::env::temp_dir().join(format!("convoy-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for args in [
        &["partitions", "ledger"][..],
        &["skip", "ledger", "c1", "--yes"],
        &["dlq", "ledger"],
    ] {
        let r = convoy(&dir, args, Some(&url)).await;
        assert_eq!(r.code, 2, "{r:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
        assert!(
            r.stderr
                .starts_with("convoy: redis: cannot connect to redis://operator:***@127.0.0.1:"),
            "{r:?}"
        );
        assert!(!r.stderr.contains("s3cret"), "{r:?}");
        assert!(!r.stderr.contains("panicked"), "{r:?}");
        assert!(r.stdout.is_empty(), "{r:?}");
    }
    // From the environment too; its value is not shown in the help either.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_convoy"))
        .args(["partitions", "ledger"])
        .current_dir(&dir)
        .env("CONVOY_REDIS_URL", &url)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let help = tokio::process::Command::new(env!("CARGO_BIN_EXE_convoy"))
        .arg("--help")
        .env("CONVOY_REDIS_URL", &url)
        .output()
        .await
        .expect("run");
    assert!(help.status.success());
    assert!(!String::from_utf8_lossy(&help.stdout).contains("s3cret"));
    // A usage mistake is not confused with an unreachable Redis.
    let r = convoy(&dir, &["skip", "ledger"], Some(&url)).await;
    assert_eq!(r.code, 64, "{r:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_key_that_is_not_a_stream_halts_with_its_reason_shown() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    s.publish(&[posted("c0", 0, false)]).await;
    wait_until(WAIT, "c0 runs", || async { s.seen("c0").len() == 1 }).await;
    // A foreign program's hash where the partition stream `{s}ledger:bad`
    // belongs, with the key in the index.
    {
        let mut c = s.redis().await;
        let _: () = c.hset(stream("bad"), "f", "v").await.expect("hset");
        let index = keys::partition_index(keys::shard_of("bad", SHARDS), "ledger");
        let _: () = c.sadd(index, "bad").await.expect("sadd");
    }
    wait_until(WAIT, "bad halts", || async {
        s.unit_state("bad")
            .await
            .get("halt_reason")
            .map(String::as_str)
            == Some("not a stream")
    })
    .await;
    // It stays halted: not released and re-taken over and over.
    let generation = s.unit_state("bad").await["gen"].clone();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        s.unit_state("bad").await["gen"],
        generation,
        "the lease is kept"
    );

    let report = s
        .convoy(&["partitions", "ledger", "--json"])
        .await
        .ok()
        .json();
    let bad = row(&report, "bad");
    assert_eq!(bad["halted"], true, "{bad}");
    assert_eq!(bad["halt_reason"], "not a stream", "{bad}");
    let error = bad["halt_error"].as_str().expect("halt_error");
    assert!(
        error.contains(&format!("{} holds a hash", stream("bad"))),
        "{error}"
    );
    let table = s.convoy(&["partitions", "ledger"]).await.ok().stdout;
    assert!(table.contains("not a stream"), "{table}");

    // skip while the key is still a hash: refused, naming the key.
    let r = s.convoy(&["skip", "ledger", "bad", "--yes"]).await;
    assert_ne!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("holds a hash, not a stream"), "{r:?}");

    // The operator removes the hash; events published since are kept and
    // run once the halt is cleared.
    {
        let mut c = s.redis().await;
        let _: () = c.del(stream("bad")).await.expect("del");
    }
    s.publish(&[posted("bad", 0, false), posted("bad", 1, false)])
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.seen("bad").is_empty(), "halted: nothing runs yet");
    s.convoy(&["skip", "ledger", "bad", "--yes"]).await.ok();
    wait_until(WAIT, "bad resumes with nothing skipped", || async {
        s.seen("bad") == ids("bad", &[0, 1])
    })
    .await;
    engine.shutdown().await.expect("shutdown");
}

/// The hexadecimal of a key's UTF-8 bytes, as `--key-hex` takes it.
fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Whether `out` holds a character a terminal would act on (other than
/// the newlines ending its lines).
fn raw_controls(out: &str) -> Vec<char> {
    out.chars()
        .filter(|&c| c != '\n' && convoy_runtime::key::needs_escape(c))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_are_escaped_cut_and_named_with_key_hex() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    // A terminal escape, CR/LF, a right-to-left override and a NUL; and a
    // 16 KiB key.
    let evil = "ev\u{1b}[2J\r\nil\u{202e}txt.exe\0";
    let long = "L".repeat(16 * 1024);
    s.publish(&[
        posted(evil, 0, true),
        posted(evil, 1, false),
        posted(&long, 0, false),
    ])
    .await;
    wait_until(WAIT, "the evil key halts", || async {
        s.halted_on(evil).await.is_some() && s.seen(&long).len() == 1
    })
    .await;

    let table = s.convoy(&["partitions", "ledger"]).await.ok().stdout;
    assert_eq!(raw_controls(&table), Vec::<char>::new(), "{table:?}");
    assert!(
        table.contains("ev\\u{1b}[2J\\r\\nil\\u{202e}txt.exe\\0  "),
        "{table}"
    );
    assert!(
        table.lines().all(|l| l.chars().count() < 300),
        "a long key pads no row: {table}"
    );
    assert!(table.contains("`--key-hex` lists them whole"), "{table}");
    let listed = s
        .convoy(&["partitions", "ledger", "--key-hex"])
        .await
        .ok()
        .stdout;
    assert!(listed.contains(&hex(evil)), "{listed}");
    let json = s.convoy(&["partitions", "ledger", "--json"]).await.ok();
    assert_eq!(raw_controls(&json.stdout), Vec::<char>::new());
    row(&json.json(), evil);

    let inspect = s
        .convoy(&["inspect", "ledger", &hex(evil), "--key-hex"])
        .await
        .ok()
        .stdout;
    assert_eq!(raw_controls(&inspect), Vec::<char>::new(), "{inspect:?}");
    assert!(inspect.contains("HALTED"), "{inspect}");
    let skip = s
        .convoy(&["skip", "ledger", &hex(evil), "--key-hex", "--yes"])
        .await
        .ok();
    assert_eq!(raw_controls(&skip.stdout), Vec::<char>::new(), "{skip:?}");
    assert_eq!(raw_controls(&skip.stderr), Vec::<char>::new(), "{skip:?}");
    wait_until(WAIT, "the evil key resumes after the skip", || async {
        s.seen(evil) == vec![format!("{evil}#1")]
    })
    .await;
    // A key that is not hexadecimal UTF-8 is a usage error.
    let r = s.convoy(&["inspect", "ledger", "ff", "--key-hex"]).await;
    assert_eq!(r.code, 64, "{r:?}");
    assert!(r.stderr.contains("not UTF-8"), "{r:?}");
    // An error quoting the key escapes it too.
    let r = s
        .convoy(&["skip", "ledger", &hex(evil), "--key-hex", "--yes"])
        .await;
    assert_ne!(r.code, 0, "{r:?}");
    assert_eq!(raw_controls(&r.stderr), Vec::<char>::new(), "{r:?}");
    assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_acl_rule_is_enough_for_the_command_line() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    s.publish(&[posted("c1", 0, true), posted("c1", 1, false)])
        .await;
    wait_until(WAIT, "c1 halts", || async {
        s.halted_on("c1").await.is_some()
    })
    .await;

    let dir = s.server.dir().to_owned();
    let printed = convoy(&dir, &["acl", "ledger", "--user", "ops"], None)
        .await
        .ok()
        .stdout;
    let line = printed
        .lines()
        .find(|l| l.starts_with("ACL SETUSER "))
        .unwrap_or_else(|| panic!("{printed}"));
    let mut cmd = redis::cmd("ACL");
    for word in line
        .replace(">PASSWORD", ">op-s3cret")
        .split_whitespace()
        .skip(1)
    {
        cmd.arg(word);
    }
    let _: () = cmd
        .query_async(&mut s.redis().await)
        .await
        .expect("the rule");
    let url = format!("redis://ops:op-s3cret@127.0.0.1:{}/", s.server.port());
    for args in [
        &["partitions", "ledger"][..],
        &["inspect", "ledger", "c1"],
        &["dead-letter", "ledger", "c1", "--yes"],
        &["dlq", "ledger", "c1"],
        &["audit"],
    ] {
        convoy(&dir, args, Some(&url)).await.ok();
    }
    wait_until(WAIT, "c1 resumes", || async {
        s.seen("c1") == ids("c1", &[1])
    })
    .await;
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut s.redis().await)
        .await
        .expect("ACL LOG");
    assert!(log.is_empty(), "Redis denied the operator: {log:?}");
    // A category that would reach convoy's own keys is refused.
    let r = convoy(&dir, &["acl", "convoy"], None).await;
    assert_eq!(r.code, 64, "{r:?}");
    let r = convoy(&dir, &["skip", "convoy", "audit", "--yes"], Some(&url)).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("`convoy` is reserved"), "{r:?}");
    engine.shutdown().await.expect("shutdown");
}

/// An event of `ledger`'s key `key`, as the publisher writes it.
fn entry(key: &str, seq: u64) -> convoy_runtime::Envelope {
    convoy_runtime::Envelope {
        id: format!("{key}-m{seq}"),
        type_name: "Posted".into(),
        category: "ledger".into(),
        partition_key: Some(key.into()),
        time_ms: 1_764_424_280_000 + seq,
        priority: convoy_runtime::Priority::Normal,
        correlation_id: None,
        payload: format!("{{\"client_id\":\"{key}\",\"seq\":{seq},\"poison\":false}}"),
        origin: None,
        replay: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_works_on_a_redis_cluster() {
    let cluster = convoy_runtime::testing::RedisCluster::start(3, 0).expect("cluster");
    let url = cluster.url();
    assert!(url.starts_with("redis+cluster://"), "{url}");
    let mut c = redis::cluster::ClusterClient::new(cluster.node_urls())
        .expect("client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    // What an engine with `SHARDS` shards and one handler registers, and
    // events of keys in several shards (so in several hash slots).
    let _: () = c.set(keys::shards("ledger"), SHARDS).await.expect("set");
    for s in 0..SHARDS {
        let _: () = c
            .sadd(keys::groups(s, "ledger"), "app::One")
            .await
            .expect("sadd");
    }
    let busy = ["c0", "c1", "c2"];
    let shards: std::collections::BTreeSet<u32> =
        busy.iter().map(|k| keys::shard_of(k, SHARDS)).collect();
    assert_eq!(shards.len(), 3, "three shards");
    let mut first = BTreeMap::new();
    for k in busy {
        for seq in 0..2 {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(stream(k)).arg("*");
            for (f, v) in entry(k, seq).to_fields() {
                cmd.arg(f).arg(v);
            }
            let id: String = cmd.query_async(&mut c).await.expect("xadd");
            first.entry(k).or_insert(id);
        }
        let index = keys::partition_index(keys::shard_of(k, SHARDS), "ledger");
        let _: () = c.sadd(index, k).await.expect("sadd");
    }
    let dir = cluster.nodes()[0].dir().to_owned();
    let run = |args: &'static [&'static str]| {
        let (dir, url) = (dir.clone(), url.clone());
        async move { convoy(&dir, args, Some(&url)).await.ok() }
    };

    let report = run(&["partitions", "ledger", "--json"]).await.json();
    assert_eq!(report["totals"]["partitions"], 3, "{report}");
    for k in busy {
        let p = row(&report, k);
        assert_eq!(p["length"], 2, "{p}");
        assert_eq!(p["shard"], keys::shard_of(k, SHARDS), "{p}");
    }
    let i = run(&["inspect", "ledger", "c1", "--json"]).await.json();
    assert_eq!(i["head"]["entry_id"], first["c1"].as_str(), "{i}");
    assert_eq!(i["head"]["stream"], stream("c1"), "{i}");
    let r = run(&["skip", "ledger", "c1", "--force", "--yes"]).await;
    assert!(
        r.stdout.contains(&format!("skipped entry {}", first["c1"])),
        "{r:?}"
    );
    let r = run(&["dead-letter", "ledger", "c2", "--force", "--yes"]).await;
    assert!(r.stdout.contains(&dlq("c2")), "{r:?}");
    let letters = run(&["dlq", "ledger", "c2", "--json"]).await.json();
    let dlq_id = letters[0]["dlq_id"].as_str().expect("dlq id").to_owned();
    let r = convoy(
        &dir,
        &["replay", "ledger", "c2", &dlq_id, "--yes"],
        Some(&url),
    )
    .await
    .ok();
    assert!(r.stdout.contains(&stream("c2")), "{r:?}");
    let audit = run(&["audit", "--json"]).await.json();
    let ops: Vec<(&str, &str)> = audit
        .as_array()
        .expect("array")
        .iter()
        .map(|a| {
            (
                a["fields"]["op"].as_str().expect("op"),
                a["fields"]["key"].as_str().expect("key"),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [("skip", "c1"), ("dead_letter", "c2"), ("replay", "c2")]
    );
}

/// The CLI reads the configuration as the engine does: the environment
/// overrides `CONVOY__SECTION__KEY` (and `CONVOY_BROKER_URL`) apply, with
/// or without a configuration file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_applies_the_engine_s_environment_overrides() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let dir = server.dir();
    let lists = |var: &'static str| {
        let url = url.clone();
        async move {
            // It reached the server: an empty one knows no category.
            let r = run_convoy(dir, &["partitions", "ledger"], &[(var, &url)]).await;
            assert!(
                r.stderr.contains("no category \"ledger\" here"),
                "{var}: {r:?}"
            );
        }
    };
    // No --redis-url, no domain.toml: the URL from the environment.
    lists("CONVOY__BROKER__URL").await;
    lists("CONVOY_BROKER_URL").await;
    // Over a file that names the inline broker.
    std::fs::write(dir.join("domain.toml"), "[broker]\nurl = \"inline\"\n").expect("write");
    let r = run_convoy(dir, &["partitions", "ledger"], &[]).await;
    assert_eq!(r.code, 1, "the file alone names no Redis: {r:?}");
    lists("CONVOY__BROKER__URL").await;
    // An override that is not a key is the engine's error too.
    let r = run_convoy(
        dir,
        &["partitions", "ledger"],
        &[("CONVOY__BROKER__NO_SUCH_KEY", "1")],
    )
    .await;
    assert_ne!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("no_such_key"), "{r:?}");
    std::fs::remove_file(dir.join("domain.toml")).ok();
}

/// After the bug that halted a key is fixed, `convoy retry` runs the halted
/// head again in place: the key resumes in order, the head handled (not
/// skipped, not moved). `--all-halted` does it for every halted partition
/// of a handler. Each retry is audited; a running partition is refused
/// without --force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_runs_a_fixed_head_again_in_place_and_the_key_resumes_in_order() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    let keys = ["c0", "c1", "c2", "c3"];
    let mut events = Vec::new();
    for seq in 0..6 {
        for key in keys {
            events.push(posted(key, seq, key != "c0" && seq == 2));
        }
    }
    s.publish(&events).await;
    wait_until(WAIT, "c1, c2 and c3 halt on their #2", || async {
        let mut all = s.seen("c0").len() == 6;
        for key in ["c1", "c2", "c3"] {
            all &= s.halted_on(key).await.is_some() && s.seen(key).len() == 2;
        }
        all
    })
    .await;

    // Not confirmed: refused, nothing changed. A key that is not halted
    // (drained here): refused.
    let r = s.convoy(&["retry", "ledger", "c1"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("pass --yes"), "{r:?}");
    let r = s.convoy(&["retry", "ledger", "c0", "--yes"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("has no event to act on"), "{r:?}");

    // The fix is deployed: the handler no longer fails on the poison.
    s.poison.store(false, Ordering::SeqCst);
    let r = s.convoy(&["retry", "ledger", "c1", "--yes"]).await.ok();
    assert!(r.stderr.contains("head "), "the head is shown: {r:?}");
    assert!(r.stdout.contains("cleared the halt"), "{r:?}");
    assert!(r.stdout.contains("runs entry"), "{r:?}");
    let retry_all = &[
        "retry",
        "ledger",
        "--all-halted",
        "--handler",
        "Recorder",
        "--yes",
    ];
    let in_order = |key: &str| (0..6).map(|n| format!("{key}#{n}")).collect::<Vec<_>>();
    wait_until(WAIT, "c1 resumes with its #2", || async {
        s.seen("c1") == in_order("c1")
    })
    .await;
    assert!(s.halted_on("c1").await.is_none());

    let r = s.convoy(retry_all).await.ok();
    assert!(r.stdout.contains("retried 2 halted partitions"), "{r:?}");
    wait_until(WAIT, "c2 and c3 resume in order", || async {
        s.seen("c2") == in_order("c2") && s.seen("c3") == in_order("c3")
    })
    .await;
    for key in keys {
        assert_eq!(s.seen(key), in_order(key), "{key}: each once, in order");
    }
    let r = s.convoy(retry_all).await.ok();
    assert!(
        r.stdout.contains("no partition of ledger is halted"),
        "{r:?}"
    );

    let audit = s.convoy(&["audit", "--json"]).await.ok().json();
    let retries: Vec<&Value> = audit
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["fields"]["op"] == "retry")
        .collect();
    assert_eq!(retries.len(), 3, "{audit}");
    for r in retries {
        assert_eq!(r["fields"]["operator"], "test-op", "{r}");
        assert_eq!(r["fields"]["forced"], "0", "{r}");
        assert!(
            r["fields"]["entry"].as_str().is_some_and(|e| !e.is_empty()),
            "{r}"
        );
    }
    engine.shutdown().await.expect("shutdown");
}

#[derive(Aggregate)]
#[aggregate(category = "tab")]
struct Tab;

/// One note of a tab; the handler always fails on a poison one.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Tab)]
struct Noted {
    key: String,
    seq: u64,
    poison: bool,
}

/// A handler whose poisoned heads go to the key's dead letters with a
/// recorded gap (the key goes on); it notes the gap its next event sees.
struct Lenient {
    seen: Seen,
}

#[event_handler(part_of = Tab, sequential_by = "key", on_poison = "dead_letter")]
impl Lenient {
    #[handle]
    async fn noted(&self, e: Noted, ctx: &convoy_runtime::Context) -> Result<(), HandlerError> {
        if e.poison {
            return Err(HandlerError::msg(format!(
                "poison note {}#{}",
                e.key, e.seq
            )));
        }
        let mark = match ctx.gap() {
            Some(g) => format!("{}#{} after a gap ({})", e.key, e.seq, g.reason),
            None => format!("{}#{}", e.key, e.seq),
        };
        self.seen
            .lock()
            .expect("lock")
            .entry(e.key.clone())
            .or_default()
            .push(mark);
        Ok(())
    }
}

/// `on_poison = "dead_letter"`: the poisoned head goes to the key's dead
/// letters (audited), a gap is recorded, the key goes on and its next
/// event sees the gap; `convoy gaps` lists it and `--ack` clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_on_poison_records_a_gap_and_the_key_goes_on() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let seen = Seen::default();
    let domain = Domain::builder()
        .config(config(&url))
        .instance_id("e0")
        .handler(Lenient { seen: seen.clone() })
        .without_discovery()
        .init()
        .expect("init");
    let engine = domain.engine().spawn();
    let mut uow = domain.unit_of_work();
    for seq in 0..5 {
        for key in ["t0", "t1"] {
            uow.raise(Noted {
                key: key.to_owned(),
                seq,
                poison: key == "t0" && seq == 2,
            })
            .expect("raise");
        }
    }
    uow.commit().await.expect("commit");
    let got = |key: &str| {
        seen.lock()
            .expect("lock")
            .get(key)
            .cloned()
            .unwrap_or_default()
    };
    wait_until(WAIT, "both keys go on", || async {
        got("t0").len() == 4 && got("t1").len() == 5
    })
    .await;
    assert_eq!(
        got("t0"),
        [
            "t0#0",
            "t0#1",
            "t0#3 after a gap (poison note t0#2)",
            "t0#4"
        ]
    );
    assert_eq!(got("t1"), ["t1#0", "t1#1", "t1#2", "t1#3", "t1#4"]);

    let dir = server.dir();
    let run = |args: &'static [&'static str]| {
        let url = url.clone();
        async move { convoy(dir, args, Some(&url)).await }
    };
    let dlq = run(&["dlq", "tab", "t0", "--json"]).await.ok().json();
    let letters = dlq.as_array().expect("dead letters");
    assert_eq!(letters.len(), 1, "{dlq}");
    let gaps = run(&["gaps", "tab"]).await.ok().stdout;
    assert!(
        gaps.contains("t0") && gaps.contains("poison note t0#2"),
        "{gaps}"
    );
    assert!(gaps.contains("1 gaps recorded"), "{gaps}");
    let partitions = run(&["partitions", "tab"]).await.ok().stdout;
    assert!(partitions.contains("no (gap)"), "{partitions}");
    let acked = run(&["gaps", "tab", "t0", "--ack", "--yes"])
        .await
        .ok()
        .stdout;
    assert!(acked.contains("acknowledged"), "{acked}");
    let gaps = run(&["gaps", "tab"]).await.ok().stdout;
    assert!(gaps.contains("no gaps recorded"), "{gaps}");
    let audit = run(&["audit", "--json"]).await.ok().json();
    let ops: Vec<(String, String)> = audit
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r["fields"]["op"].as_str().unwrap_or_default().to_owned(),
                r["fields"]["operator"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            (
                "dead_letter".to_owned(),
                "convoy (on_poison = dead_letter)".to_owned()
            ),
            ("gap_ack".to_owned(), "test-op".to_owned())
        ]
    );
    assert!(engine.health().await.halted_units == 0);
    engine.shutdown().await.expect("shutdown");
}

/// A dead letter put back at the head restores the key's order: a head
/// dead-lettered by mistake (the key then halts on the next event, which
/// needed it) goes back before that event, and the key resumes in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_at_head_restores_the_order_after_a_mistaken_dead_letter() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    let events: Vec<Posted> = (0..7).map(|n| posted("c1", n, n == 3 || n == 4)).collect();
    s.publish(&events).await;
    wait_until(WAIT, "c1 halts on #3", || async {
        s.halted_on("c1").await.is_some() && s.seen("c1").len() == 3
    })
    .await;
    s.convoy(&["dead-letter", "ledger", "c1", "--yes"])
        .await
        .ok();
    wait_until(WAIT, "c1 halts again, on #4", || async {
        let h = s.halted_on("c1").await;
        h.is_some() && h != Some(String::new()) && s.seen("c1").len() == 3
    })
    .await;
    // The fix: #3 and #4 no longer fail; #3 must run before #4.
    s.poison.store(false, Ordering::SeqCst);
    let letters = s
        .convoy(&["dlq", "ledger", "c1", "--json"])
        .await
        .ok()
        .json();
    let id = letters[0]["dlq_id"].as_str().expect("dlq id").to_owned();
    let r = s
        .convoy(&["replay", "ledger", "c1", &id, "--at", "head", "--yes"])
        .await
        .ok();
    assert!(r.stdout.contains("to the head"), "{r:?}");
    wait_until(WAIT, "c1 resumes in order", || async {
        s.seen("c1").len() == 7
    })
    .await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 3, 4, 5, 6]));
    let audit = s.convoy(&["audit", "--json"]).await.ok().json();
    let replays: Vec<&Value> = audit
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["fields"]["op"] == "replay")
        .collect();
    assert_eq!(replays.len(), 1, "{audit}");
    assert_eq!(replays[0]["fields"]["at"], "head", "{audit}");
    assert!(
        s.convoy(&["dlq", "ledger", "c1", "--json"])
            .await
            .ok()
            .json()[0]
            .is_null()
    );
    engine.shutdown().await.expect("shutdown");
}

/// `convoy pause`, `pauses`, `partitions` and `resume`: a paused key runs
/// no new event and shows as paused with its reason; resumed, it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_a_key_from_the_command_line() {
    let s = setup(Duration::from_millis(1));
    let engine = s.domain.engine().spawn();
    s.publish(&[posted("c0", 0, false), posted("c1", 0, false)])
        .await;
    wait_until(WAIT, "both keys handled", || async {
        s.seen("c0").len() == 1 && s.seen("c1").len() == 1
    })
    .await;
    let r = s
        .convoy(&["pause", "ledger", "c1", "--reason", "fixing data", "--yes"])
        .await
        .ok();
    assert!(
        r.stdout
            .starts_with("paused key \"c1\" of category ledger for every handler"),
        "{r:?}"
    );
    let r = s.convoy(&["pauses", "ledger"]).await.ok();
    assert!(
        r.stdout.contains("key \"c1\"")
            && r.stdout.contains("test-op")
            && r.stdout.contains("fixing data"),
        "{r:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.publish(&[posted("c0", 1, false), posted("c1", 1, false)])
        .await;
    wait_until(WAIT, "c0 goes on", || async { s.seen("c0").len() == 2 }).await;
    let r = s.convoy(&["partitions", "ledger"]).await.ok();
    assert!(
        r.stdout.contains("  paused  paused by test-op since"),
        "{r:?}"
    );
    assert_eq!(s.seen("c1"), ids("c1", &[0]));
    let e = s.convoy(&["pause", "ledger", "c1", "--yes"]).await;
    assert_eq!(e.code, 1, "{e:?}");
    assert!(e.stderr.contains("paused already"), "{e:?}");
    s.convoy(&["resume", "ledger", "c1", "--yes"]).await.ok();
    wait_until(WAIT, "c1 resumed", || async { s.seen("c1").len() == 2 }).await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1]));
    let e = s.convoy(&["resume", "ledger", "c1", "--yes"]).await;
    assert!(e.stderr.contains("is not paused"), "{e:?}");
    engine.shutdown().await.expect("shutdown");
}

/// Without `--operator`, `$USER` or `$LOGNAME` (a container, a cron job),
/// the audit record still says who acted: the process's uid and host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_without_a_user_name_is_audited_as_uid_at_host() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let mut c = server.connection().await.expect("connection");
    for s in 0..keys::DEFAULT_SHARDS {
        let _: () = c
            .sadd(keys::groups(s, "ledger"), "app::One")
            .await
            .expect("sadd");
    }
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_convoy"))
        .args(["pause", "ledger", "c1", "--yes", "--redis-url", &url])
        .current_dir(server.dir())
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env_remove("CONVOY_REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run convoy");
    assert!(out.status.success(), "{out:?}");
    let audit = convoy(server.dir(), &["audit", "--json"], Some(&url))
        .await
        .ok()
        .json();
    let operator = audit[0]["fields"]["operator"].as_str().unwrap_or_default();
    assert!(
        operator.starts_with("uid ") && operator.contains('@'),
        "{audit}"
    );
}
