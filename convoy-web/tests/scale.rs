//! The operator page at 100,000 partitions (`CONVOY_WEB_SCALE_KEYS`
//! changes the count): the Redis commands and the time of each page view,
//! counted by Redis itself (`CONFIG RESETSTAT`, then `INFO commandstats`),
//! and the background snapshot's cost. No view may use `KEYS` or read a
//! partition index whole (`SMEMBERS`); the listing's commands are bounded
//! by the page size, not by the number of partitions.
//!
//! Prints one line per view; the README quotes them (debug build).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::get;
use convoy_runtime::redis::admin::Admin;
use convoy_runtime::redis::keys;
use convoy_runtime::testing::RedisServer;
use convoy_web::{OperatorPage, Settings};

const SHARDS: u32 = 16;
const GROUP: &str = "app::Ledger";

/// Calls per command since the last reset, without the counting itself.
async fn calls(c: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("info");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let n = rest
                .split(',')
                .next()?
                .strip_prefix("calls=")?
                .parse()
                .ok()?;
            Some((name.to_owned(), n))
        })
        .filter(|(name, _)| name != "config" && name != "info" && !name.starts_with("config|"))
        .collect()
}

async fn reset(c: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(c)
        .await
        .expect("resetstat");
}

/// 100,000 partitions of `ledger` over 16 shards, each with 1 to 3
/// entries; every 100th halted.
async fn populate(c: &mut redis::aio::MultiplexedConnection, n: usize) {
    let mut pipe = redis::pipe();
    pipe.cmd("SADD")
        .arg(keys::CATEGORIES)
        .arg("ledger")
        .ignore();
    pipe.cmd("SET")
        .arg(keys::shards("ledger"))
        .arg(SHARDS)
        .ignore();
    pipe.cmd("SET")
        .arg(keys::key_field("ledger"))
        .arg("client_id")
        .ignore();
    for s in 0..SHARDS {
        pipe.cmd("SADD")
            .arg(keys::groups(s, "ledger"))
            .arg(GROUP)
            .ignore();
    }
    let _: () = pipe.query_async(c).await.expect("register");
    for chunk in (0..n).collect::<Vec<_>>().chunks(5_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let key = format!("k{i:06}");
            let shard = keys::shard_of(&key, SHARDS);
            pipe.cmd("SADD")
                .arg(keys::partition_index(shard, "ledger"))
                .arg(&key)
                .ignore();
            for _ in 0..(1 + i % 3) {
                pipe.cmd("XADD")
                    .arg(keys::partition_stream(shard, "ledger", &key))
                    .arg("*")
                    .arg("f")
                    .arg("v")
                    .ignore();
            }
            if i % 100 == 0 {
                pipe.cmd("HSET")
                    .arg(keys::unit(shard, GROUP, "ledger", &key))
                    .arg("halted")
                    .arg(1)
                    .arg("halt_entry")
                    .arg("1-1")
                    .arg("halt_reason")
                    .arg("max_retries exceeded")
                    .ignore();
            }
        }
        let _: () = pipe.query_async(c).await.expect("populate");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_views_are_bounded_at_100k_partitions() {
    let n: usize = std::env::var("CONVOY_WEB_SCALE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let server = RedisServer::start().expect("start redis-server");
    let mut c = server.connection().await.expect("connection");
    populate(&mut c, n).await;
    let admin = Admin::connect(&server.url()).await.expect("admin");
    let page = OperatorPage::new(
        admin,
        Settings {
            snapshot_keys_per_second: 10_000_000,
            ..common::settings()
        },
    );
    let router = page.router();

    // The background snapshot: every partition, in chunks.
    reset(&mut c).await;
    let started = Instant::now();
    page.refresh_snapshot().await;
    let took = started.elapsed();
    let snap: u64 = calls(&mut c).await.values().sum();
    println!(
        "snapshot of {n} partitions: {took:?}, {snap} Redis commands (in the background, at most --snapshot-rate partitions a second)"
    );

    // The first live page, to find the second page's cursor.
    let first = get(&router, "/c/ledger").await.ok();
    let at = first.body.find("cursor=").expect("a next page") + "cursor=".len();
    let cursor: String = first.body[at..]
        .chars()
        .take_while(|c| *c != '"' && *c != '&')
        .collect();

    let views = [
        ("overview", "/".to_owned()),
        (
            "partitions, first page (live, index order)",
            "/c/ledger".to_owned(),
        ),
        (
            "partitions, next page (live, by cursor)",
            format!("/c/ledger?cursor={cursor}"),
        ),
        (
            "search by key prefix (snapshot)",
            "/c/ledger?prefix=k04211".to_owned(),
        ),
        (
            "search by key prefix (live index)",
            "/c/ledger?prefix=k04211&live=1".to_owned(),
        ),
        (
            "filter: halted (snapshot)",
            "/c/ledger?state=halted".to_owned(),
        ),
        ("sort by lag (snapshot)", "/c/ledger?sort=lag".to_owned()),
        ("a key", "/c/ledger/key?key=k000042".to_owned()),
    ];
    let mut worst = 0;
    for (what, path) in &views {
        reset(&mut c).await;
        let started = Instant::now();
        let r = get(&router, path).await.ok();
        let took = started.elapsed();
        let per = calls(&mut c).await;
        let total: u64 = per.values().sum();
        println!("{what}: {took:?}, {total} Redis commands {per:?}");
        assert!(!per.contains_key("keys"), "{what} used KEYS: {per:?}");
        assert!(
            per.get("smembers").copied().unwrap_or(0) <= 2,
            "{what} read whole sets: {per:?}"
        );
        assert!(
            per.get("sscan").copied().unwrap_or(0) <= 8,
            "{what}: {per:?}"
        );
        assert!(total < 2_000, "{what}: {total} commands: {per:?}");
        assert!(took < Duration::from_secs(5), "{what} took {took:?}");
        if path.contains("prefix=k04211") && !path.contains("live") {
            for k in ["k042110", "k042119"] {
                assert!(r.body.contains(&format!(">{k}</a>")), "{what}: {k}");
            }
        }
        if path.contains("state=halted") {
            assert!(r.body.contains(">k000000</a>") && !r.body.contains(">k000001</a>"));
        }
        if path.contains("sort=lag") {
            assert!(r.body.find(">k000002</a>").is_some(), "a lag-3 key first");
            assert!(
                !r.body.contains(">k000000</a>"),
                "lag 1 is not on the first page"
            );
        }
        worst = worst.max(total);
    }
    println!("at most {worst} Redis commands per page view at {n} partitions");
}
