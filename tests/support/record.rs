//! The handlers' side of the record server for the fault-schedule test:
//! enter and exit records that survive the handler's own process being
//! stalled.
//!
//! It writes the layout the testing kit's `Recorder` reads
//! (`convoy-test:{ns}:windows:{key}`, `seen:{key}`, `keys`, `window-seq`),
//! so `Recorder::windows_of` and `Recorder::seen_all` read it back. It does
//! not use `Recorder::enter` because that goes through a connection with
//! redis-rs's default 500 ms response timeout: a handler stopped with
//! `SIGSTOP` right after its enter script ran sees that call fail when it is
//! resumed, although the window was opened, and cannot retry it (the
//! window would be opened twice). Here both scripts are idempotent (an enter
//! carries a token naming its window; an exit only sets the end once) and
//! every call is retried until it is answered, within a bound.
//!
//! A window starts when the engine dispatched the attempt and ends when the
//! handler's work is over, both read by the engine's clock (the machine's
//! clock, which the record server's `TIME` reads too). Both ends come from
//! the handler's own process: an end read by the record server's `TIME`
//! was once found 36 µs later than the engine's dispatch of the key's next
//! event, which the engine can only have read after that exit's reply
//! came (the gap is about 150 µs otherwise): two readings of one clock in
//! two processes are not ordered as the events they time, and the check
//! took it for two handlers of one key at once.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

/// Longer than any stall a schedule makes, so a reply that arrives after
/// the process is resumed is still read.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a record call keeps retrying.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// KEYS: 1 windows hash, 2 seen list, 3 keys set, 4 window counter,
/// 5 tokens hash. ARGV: 1 token, 2 event id, 3 label, 4 key, 5 when the
/// handler was invoked (µs since the epoch, the engine's clock: the same
/// machine clock as the record server's `TIME`).
const ENTER_LUA: &str = r"
local have = redis.call('HGET', KEYS[5], ARGV[1])
if have then return tonumber(have) end
local now_us = ARGV[5]
local window = redis.call('INCR', KEYS[4])
redis.call('HSET', KEYS[5], ARGV[1], window)
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[4])
redis.call('HSET', KEYS[1], window .. ':start', now_us, window .. ':event', ARGV[2],
  window .. ':instance', ARGV[3])
return window
";

/// KEYS: 1 windows hash. ARGV: 1 window id, 2 when the handler's work
/// ended (µs since the epoch, the engine's clock).
const EXIT_LUA: &str = r"
redis.call('HSETNX', KEYS[1], ARGV[1] .. ':end', ARGV[2])
return 1
";

static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(ENTER_LUA));
static EXIT: LazyLock<Script> = LazyLock::new(|| Script::new(EXIT_LUA));

/// Writes enter/exit records for one engine process.
pub struct Record {
    client: redis::Client,
    ns: String,
    /// Makes enter tokens unique across processes.
    process: String,
    next: AtomicU64,
    conn: OnceCell<ConnectionManager>,
}

/// An open window.
#[derive(Debug)]
pub struct Entered {
    key: String,
    window: u64,
}

impl Record {
    pub fn new(url: &str, ns: &str, process: &str) -> Result<Self, redis::RedisError> {
        Ok(Record {
            client: redis::Client::open(url)?,
            ns: ns.to_owned(),
            process: process.to_owned(),
            next: AtomicU64::new(0),
            conn: OnceCell::new(),
        })
    }

    fn key(&self, suffix: &str) -> String {
        format!("convoy-test:{}:{suffix}", self.ns)
    }

    /// Whether the handlers' dependency is down now (the schedule's
    /// dependency outage: a key with a TTL in the record server). An
    /// unanswered check says "up": the record server is never faulted.
    pub async fn dependency_down(&self) -> bool {
        let Ok(mut c) = self.conn().await else {
            return false;
        };
        let down: Result<Option<String>, _> = redis::cmd("GET")
            .arg(self.key("dependency-down"))
            .query_async(&mut c)
            .await;
        matches!(down, Ok(Some(_)))
    }

    async fn conn(&self) -> Result<ConnectionManager, redis::RedisError> {
        self.conn
            .get_or_try_init(|| {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_connection_timeout(Some(Duration::from_secs(2)));
                ConnectionManager::new_with_config(self.client.clone(), config)
            })
            .await
            .cloned()
    }

    /// Opens a window: `label` is in `event` of `key` since `invoked` (the
    /// handler's first line; a stop between it and this record still counts
    /// the handler as in flight before the stop).
    pub async fn enter(
        &self,
        key: &str,
        event: &str,
        label: &str,
        invoked: SystemTime,
    ) -> Result<Entered, String> {
        let invoked_us = invoked
            .duration_since(UNIX_EPOCH)
            .map_err(|e| format!("the clock is before 1970: {e}"))?
            .as_micros();
        let token = format!(
            "{}:{}",
            self.process,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut invocation = ENTER.prepare_invoke();
        invocation
            .key(self.key(&format!("windows:{key}")))
            .key(self.key(&format!("seen:{key}")))
            .key(self.key("keys"))
            .key(self.key("window-seq"))
            .key(self.key("tokens"))
            .arg(&token)
            .arg(event)
            .arg(label)
            .arg(key)
            .arg(invoked_us.to_string());
        let window: u64 = self.retry("enter", &invocation).await?;
        Ok(Entered {
            key: key.to_owned(),
            window,
        })
    }

    /// Closes the window: the handler's work ended at `worked` (read after
    /// it, before this call; the first exit that ran sets the end).
    pub async fn exit(&self, entered: Entered, worked: SystemTime) -> Result<(), String> {
        let worked_us = worked
            .duration_since(UNIX_EPOCH)
            .map_err(|e| format!("the clock is before 1970: {e}"))?
            .as_micros();
        let mut invocation = EXIT.prepare_invoke();
        invocation
            .key(self.key(&format!("windows:{}", entered.key)))
            .arg(entered.window)
            .arg(worked_us.to_string());
        let _: i64 = self.retry("exit", &invocation).await?;
        Ok(())
    }

    async fn retry<T: redis::FromRedisValue>(
        &self,
        what: &str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < RETRY_FOR {
            match self.conn().await {
                Ok(mut c) => match invocation.invoke_async(&mut c).await {
                    Ok(v) => return Ok(v),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "recording {what} failed for {RETRY_FOR:?} on the record server: {last}"
        ))
    }
}
