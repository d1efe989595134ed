//! `convoy outbox` against a real PostgreSQL and a real `redis-server`: rows
//! whose key is invalid at publish time are abandoned with their reason,
//! the command lists them with the backlog, `retry` makes one pending again
//! (and it publishes once its key is valid), `discard` deletes one, both
//! are refused for a row that is not abandoned, and both are in the audit
//! stream with who did what. The PostgreSQL URL comes from the flag, the
//! environment or `domain.toml`; an unreachable server is exit code 2 and
//! one line without the password.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use convoy_runtime::postgres::PgOutbox;
use convoy_runtime::testing::{PgServer, RedisServer, free_port};
use convoy_runtime::{Aggregate, Config, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

use common::{Run, run_convoy, wait_until};

const WAIT: Duration = Duration::from_secs(60);

#[derive(Aggregate)]
#[aggregate(category = "ledger")]
struct Ledger;

/// One posting; `seq` counts per client from 0.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Ledger)]
struct Posted {
    client_id: String,
    seq: u64,
}

fn posted(client: &str, seq: u64) -> Posted {
    Posted {
        client_id: client.to_owned(),
        seq,
    }
}

/// What the handler saw, per key, in order (`c1#3`).
type Seen = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

struct Recorder {
    seen: Seen,
}

#[event_handler(part_of = Ledger, sequential_by = "client_id")]
impl Recorder {
    #[handle]
    async fn posted(&self, e: Posted) -> Result<(), HandlerError> {
        self.seen
            .lock()
            .expect("lock")
            .entry(e.client_id.clone())
            .or_default()
            .push(format!("{}#{}", e.client_id, e.seq));
        Ok(())
    }
}

fn seen_of(seen: &Seen, key: &str) -> Vec<String> {
    seen.lock()
        .expect("lock")
        .get(key)
        .cloned()
        .unwrap_or_default()
}

/// Redis, the outbox in `db_url`, fast timings, and the backfill lane
/// suffix `suffix` (a reserved key value).
fn config(redis_url: &str, db_url: &str, suffix: &str) -> Config {
    let mut c = Config::default();
    c.broker.url = redis_url.to_owned();
    c.server.partitioning.lease_ttl_ms = 2000;
    c.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    c.server.priority_lanes.backfill_suffix = suffix.to_owned();
    c.outbox.postgres_url = Some(db_url.to_owned());
    c.outbox.leader_timeout_ms = 1000;
    c.outbox.poll_interval_ms = 200;
    c
}

fn engine_domain(config: Config, instance: &str, seen: &Seen) -> Domain {
    Domain::builder()
        .config(config)
        .instance_id(instance)
        .handler(Recorder { seen: seen.clone() })
        .init()
        .expect("domain init")
}

/// Runs `convoy ARGS` in `dir` as user `test-op`, stdin closed, with only
/// the connection variables of `env`.
async fn convoy(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_convoy(dir, args, env).await
}

/// The status of outbox row `id` (`None` once deleted).
/// `convoy outbox ARGS` with `flags` (the PostgreSQL URL, the Redis one)
/// after them.
async fn outbox(dir: &Path, args: &[&str], flags: &[&[&str]]) -> Run {
    let mut all = vec!["outbox"];
    all.extend_from_slice(args);
    for f in flags {
        all.extend_from_slice(f);
    }
    convoy(dir, &all, &[]).await
}

fn status(pg: &PgServer, id: u64) -> Option<i64> {
    let out = pg
        .psql(
            "app",
            &format!("SELECT status FROM convoy_outbox WHERE id = {id}"),
        )
        .expect("row status");
    (!out.is_empty()).then(|| out.parse().expect("a status"))
}

fn abandoned_count(pg: &PgServer) -> u64 {
    pg.psql("app", "SELECT count(*) FROM convoy_outbox WHERE status = 2")
        .expect("count")
        .parse()
        .expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_rows_are_listed_retried_and_discarded_and_audited() {
    let redis = RedisServer::start().expect("start redis-server");
    let pg = PgServer::start().expect("start PostgreSQL");
    let db = pg.create_database("app").expect("create database");
    let redis_url = redis.url();
    let dir = redis.dir();
    let normal = config(&redis_url, &db, "backfill");
    PgOutbox::from_config(&normal.outbox)
        .expect("outbox")
        .migrate()
        .await
        .expect("migrate");

    // Committed while `slow` was an ordinary key...
    let seen = Seen::default();
    let writer = engine_domain(normal.clone(), "writer", &seen);
    let mut uow = writer.unit_of_work();
    for e in [posted("ok", 0), posted("slow", 0), posted("slow", 1)] {
        uow.raise(e).expect("raise");
    }
    uow.commit().await.expect("commit to the PostgreSQL outbox");

    // ... and relayed by an engine whose backfill lane suffix is `slow`:
    // invalid at publish time, so abandoned with the reason, never
    // retried by itself, never holding up other keys.
    let relay = engine_domain(config(&redis_url, &db, "slow"), "relay-a", &seen);
    let engine = relay.engine().spawn();
    wait_until(
        WAIT,
        "ok published and both slow rows abandoned",
        || async { seen_of(&seen, "ok") == ["ok#0"] && abandoned_count(&pg) == 2 },
    )
    .await;
    engine.shutdown().await.expect("shutdown");

    let pg_flag = ["--postgres-url", db.as_str()];
    let report = outbox(dir, &["--json"], &[&pg_flag]).await.ok().json();
    assert_eq!(report["outbox"], "\"public\".\"convoy_outbox\"");
    assert_eq!(report["pending"], 0);
    assert_eq!(report["abandoned"], 2);
    let rows = report["abandoned_rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{report}");
    for r in rows {
        assert_eq!(r["envelope"]["partition_key"], "slow");
        let reason = r["reason"].as_str().expect("a reason");
        assert!(
            reason.contains("invalid partition key \"slow\"") && reason.contains("backfill"),
            "the reason says what is wrong: {reason}"
        );
    }
    let id = |i: usize| rows[i]["id"].as_u64().expect("an id");
    let (first, second) = (id(0), id(1));
    assert!(first < second, "the oldest first");
    let text = outbox(dir, &[], &[&pg_flag]).await.ok().stdout;
    assert!(
        text.starts_with(
            "outbox \"public\".\"convoy_outbox\": nothing pending; 2 rows abandoned\n"
        ),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{first} ")))
        .unwrap_or_else(|| panic!("no row {first} in\n{text}"));
    assert!(
        line.contains("ledger:slow") && line.contains("Posted") && line.contains("reserved"),
        "{line}"
    );

    // Retry: refused without confirmation (no terminal), then done.
    let first_s = first.to_string();
    let second_s = second.to_string();
    let with_redis = ["--redis-url", redis_url.as_str()];
    let run = outbox(dir, &["retry", &first_s], &[&pg_flag, &with_redis]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("pass --yes"), "{run:?}");
    assert_eq!(status(&pg, first), Some(2), "nothing changed");
    let run = outbox(dir, &["retry", &first_s, "--yes"], &[&pg_flag, &with_redis])
        .await
        .ok();
    assert!(run.stdout.contains("is pending again"), "{run:?}");
    assert!(run.stdout.contains("audit record "), "{run:?}");
    assert_eq!(status(&pg, first), Some(0), "pending again");
    let report = outbox(dir, &["--json"], &[&pg_flag]).await.ok().json();
    assert_eq!(report["pending"], 1);
    assert_eq!(report["abandoned"], 1);
    assert!(
        report["oldest_pending_age_ms"].as_u64().is_some(),
        "{report}"
    );

    // Discard the other; a pending row or a missing one is refused.
    let run = outbox(dir, &["discard", &second_s, "-y"], &[&pg_flag, &with_redis])
        .await
        .ok();
    assert!(run.stdout.contains("never published"), "{run:?}");
    assert_eq!(status(&pg, second), None, "deleted");
    let run = outbox(dir, &["discard", &first_s, "-y"], &[&pg_flag, &with_redis]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("is not abandoned: it is pending"),
        "{run:?}"
    );
    assert_eq!(status(&pg, first), Some(0), "still pending");
    let run = outbox(dir, &["retry", "999999", "-y"], &[&pg_flag, &with_redis]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("no such row"), "{run:?}");
    // Without a Redis for the audit record nothing is changed.
    let run = outbox(dir, &["retry", &first_s, "-y"], &[&pg_flag]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("convoy:audit"), "{run:?}");

    // Both actions are in the audit stream: who, what, which row, why.
    let audit = convoy(
        dir,
        &["audit", "--json"],
        &[("CONVOY_REDIS_URL", &redis_url)],
    )
    .await
    .ok()
    .json();
    let records = audit.as_array().expect("records");
    assert_eq!(records.len(), 2, "{audit}");
    for (r, op, id) in [
        (&records[0], "outbox_retry", first),
        (&records[1], "outbox_discard", second),
    ] {
        let f = &r["fields"];
        assert_eq!(f["op"], op, "{r}");
        assert_eq!(f["entry"], id.to_string(), "{r}");
        assert_eq!(f["operator"], "test-op");
        assert_eq!(f["category"], "ledger");
        assert_eq!(f["key"], "slow");
        assert_eq!(f["type"], "Posted");
        assert_eq!(f["outbox"], "\"public\".\"convoy_outbox\"");
        assert!(
            f["reason"].as_str().is_some_and(|s| s.contains("backfill")),
            "{r}"
        );
        assert!(f["time"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
    }
    let text = convoy(dir, &["audit"], &[("CONVOY_REDIS_URL", &redis_url)])
        .await
        .ok()
        .stdout;
    assert!(
        text.contains(&format!("outbox row {first}")) && text.contains("outbox_discard"),
        "{text}"
    );

    // With the key valid again, the retried row publishes.
    let engine = engine_domain(normal.clone(), "relay-b", &seen)
        .engine()
        .spawn();
    wait_until(WAIT, "the retried row handled", || async {
        seen_of(&seen, "slow") == ["slow#0"]
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    assert_eq!(seen_of(&seen, "ok"), ["ok#0"], "nothing handled twice");

    // The URL from CONVOY_POSTGRES_URL, or from domain.toml.
    let text = convoy(dir, &["outbox"], &[("CONVOY_POSTGRES_URL", &db)])
        .await
        .ok()
        .stdout;
    assert_eq!(
        text,
        "outbox \"public\".\"convoy_outbox\": nothing pending; 0 rows abandoned\n"
    );
    let configured = dir.join("configured");
    std::fs::create_dir_all(&configured).expect("dir");
    std::fs::write(
        configured.join("domain.toml"),
        format!("[broker]\nurl = \"{redis_url}\"\n\n[outbox]\npostgres_url = \"{db}\"\n"),
    )
    .expect("write domain.toml");
    let report = convoy(&configured, &["outbox", "--json"], &[])
        .await
        .ok()
        .json();
    assert_eq!(report["abandoned"], 0);

    // An unreachable PostgreSQL: exit 2, one line, no password.
    let port = free_port().expect("a free port");
    let url = format!("postgres://app:hunter2@127.0.0.1:{port}/app");
    let run = convoy(dir, &["outbox", "--postgres-url", &url], &[]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(!run.stderr.contains("hunter2"), "{run:?}");
    assert!(run.stderr.contains("cannot connect to"), "{run:?}");
}
