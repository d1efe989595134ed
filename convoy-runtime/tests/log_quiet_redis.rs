//! `log::quiet_redis` against the real Redis client: while a cluster node
//! is down, a process using the cluster writes a bounded number of the
//! client's lines, however many it logs.
#![cfg(feature = "testing")]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use convoy_runtime::testing::RedisCluster;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::prelude::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

// The only test of this binary: it installs the global subscriber (the
// client logs from the runtime's worker threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_writes_a_bounded_number_of_the_redis_client_s_lines() {
    let raw = Captured::default();
    let quiet = Captured::default();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(raw.clone())
                .with_ansi(false)
                .with_filter(LevelFilter::WARN),
        )
        .with(
            convoy_runtime::log::quiet_redis(
                tracing_subscriber::fmt::layer()
                    .with_writer(quiet.clone())
                    .with_ansi(false),
            )
            .with_filter(LevelFilter::WARN),
        )
        .init();
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("join")
        .expect("cluster");
    let client = redis::cluster::ClusterClientBuilder::new(cluster.node_urls())
        .response_timeout(Duration::from_millis(500))
        .connection_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let mut c = client.get_async_connection().await.expect("connection");
    let down = cluster.master_of_key("{q}").expect("master");
    tokio::task::block_in_place(|| cluster.node_mut(down).kill()).expect("kill");
    let started = Instant::now();
    let mut i = 0u64;
    while started.elapsed() < Duration::from_secs(12) {
        let _: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("{{q}}{i}"))
            .arg(i)
            .query_async(&mut c)
            .await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(target: "convoy_runtime::engine", "convoy's own line");
    let is_client = |l: &&String| l.contains(" redis::");
    let raw_lines: Vec<String> = raw.lines();
    let quiet_lines: Vec<String> = quiet.lines();
    let raw_n = raw_lines.iter().filter(is_client).count();
    let quiet_n = quiet_lines.iter().filter(is_client).count();
    let notes = quiet_lines
        .iter()
        .filter(|l| l.contains("lines left out"))
        .count();
    eprintln!("client lines: {raw_n} without the filter, {quiet_n} with it, {notes} notes");
    // 12 s: two windows per source at most, one line each, plus the first.
    assert!(raw_n > quiet_n, "{raw_n} vs {quiet_n}");
    assert!(quiet_n <= 10, "{quiet_lines:#?}");
    assert!(
        quiet_lines.iter().any(|l| l.contains("convoy's own line")),
        "{quiet_lines:#?}"
    );
}
