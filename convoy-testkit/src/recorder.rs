//! Records, in Redis, what handlers saw, so overlap is visible across OS
//! processes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use redis::aio::ConnectionManager;
use tokio::sync::OnceCell;

use super::TestingError;

/// How long an "in event" marker lives unless set with
/// [`Recorder::marker_ttl`].
pub const DEFAULT_MARKER_TTL: Duration = Duration::from_secs(30);

/// Marks `instance` as being in `event_id` for `key`, reports every other
/// live holder with a different event id as a violation, and opens a window.
///
/// KEYS: 1 active hash, 2 seen list, 3 keys set, 4 windows hash,
/// 5 violations list, 6 window counter.
/// ARGV: 1 instance, 2 event id, 3 marker ttl (ms), 4 key, 5 the window's
/// start in microseconds (empty: now).
///
/// The active hash maps `instance|event_id` to `deadline_ms:window_id`.
/// Times come from Redis `TIME`, so every process uses one clock.
/// Microseconds are built as strings: Lua numbers are doubles and print with
/// 14 significant digits only.
const ENTER_LUA: &str = r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
if ARGV[5] ~= '' then
  now_us = ARGV[5]
end
local ttl = tonumber(ARGV[3])
local me = ARGV[1] .. '|' .. ARGV[2]
local violations = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local holder = entries[i]
  local deadline = tonumber(string.match(entries[i + 1], '^(%d+):'))
  if deadline == nil or deadline <= now_ms then
    redis.call('HDEL', KEYS[1], holder)
  else
    local sep = string.find(holder, '|', 1, true)
    local instance = string.sub(holder, 1, sep - 1)
    local event = string.sub(holder, sep + 1)
    if event ~= ARGV[2] then
      violations = violations + 1
      redis.call('RPUSH', KEYS[5], 'instance ' .. ARGV[1] .. ' entered event ' .. ARGV[2] ..
        ' for key ' .. ARGV[4] .. ' while instance ' .. instance .. ' was in event ' .. event)
    end
  end
end
local window = redis.call('INCR', KEYS[6])
redis.call('HSET', KEYS[1], me, string.format('%d', now_ms + ttl) .. ':' .. window)
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[4])
redis.call('HSET', KEYS[4], window .. ':start', now_us, window .. ':event', ARGV[2],
  window .. ':instance', ARGV[1])
return {window, violations}
";

/// Clears this guard's marker if it is still the one it wrote, and closes
/// the window.
///
/// KEYS: 1 active hash, 2 windows hash. ARGV: 1 `instance|event_id`,
/// 2 window id.
const EXIT_LUA: &str = r"
local t = redis.call('TIME')
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
local value = redis.call('HGET', KEYS[1], ARGV[1])
if value and string.match(value, ':(%d+)$') == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[2] .. ':end', now_us)
return 1
";

static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(ENTER_LUA));
static EXIT: LazyLock<Script> = LazyLock::new(|| Script::new(EXIT_LUA));

/// Records what handlers saw, in Redis, so that it works across OS
/// processes.
///
/// Each handler calls [`enter`](Self::enter) before it touches the event and
/// [`ActiveGuard::exit`] after. `enter` fails the "never two same-key events
/// at once" rule when another instance is still inside a *different* event
/// of the same key: it then appends a line to
/// [`violations`](Self::violations). It also appends the event id to the
/// key's [`seen`](Self::seen) list (feed [`seen_all`](Self::seen_all) to
/// [`check_order`](super::check_order)) and opens a processing
/// [`window`](Self::windows) timed by the Redis clock.
///
/// # Crashed handlers
///
/// A handler killed with `kill -9` never exits, so its marker would block
/// the key forever. Markers therefore expire after the
/// [`marker_ttl`](Self::marker_ttl) (default [`DEFAULT_MARKER_TTL`]). In
/// crash tests set it *below* the engine's lease time: by the time another
/// instance may legitimately take the key over, the dead one's marker is
/// gone, while a live overlap within the lease is still reported. A handler
/// that runs longer than the marker ttl is no longer protected by the check.
///
/// Redis keys (all under `convoy-test:{namespace}:`): `active:{key}`,
/// `seen:{key}`, `windows:{key}`, `keys`, `violations`, `window-seq`.
/// Use a fresh namespace per test.
///
/// Clones share one connection. The connection is made on first use, in the
/// tokio runtime of that use; use a recorder within one runtime.
#[derive(Clone)]
pub struct Recorder {
    client: redis::Client,
    namespace: String,
    marker_ttl: Duration,
    connection: Arc<OnceCell<ConnectionManager>>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("namespace", &self.namespace)
            .field("marker_ttl", &self.marker_ttl)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder writing to the Redis at `redis_url` under `namespace`.
    ///
    /// Does not connect yet; the first command does.
    pub fn new(redis_url: &str, namespace: impl Into<String>) -> Result<Self, TestingError> {
        let client =
            redis::Client::open(redis_url).map_err(TestingError::redis("opening a client"))?;
        Ok(Self {
            client,
            namespace: namespace.into(),
            marker_ttl: DEFAULT_MARKER_TTL,
            connection: Arc::new(OnceCell::new()),
        })
    }

    /// How long an "in event" marker lives if the handler never exits
    /// (default [`DEFAULT_MARKER_TTL`]; rounded down to milliseconds, at
    /// least 1 ms). See "Crashed handlers" above.
    pub fn marker_ttl(mut self, ttl: Duration) -> Self {
        self.marker_ttl = ttl;
        self
    }

    /// The namespace given to [`new`](Self::new).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Records that `instance` starts handling `event_id` of `key`.
    ///
    /// Reports a violation if another instance is inside a different event
    /// of `key` (an unexpired marker). `instance` must not contain `|`.
    pub async fn enter(
        &self,
        key: &str,
        event_id: &str,
        instance: &str,
    ) -> Result<ActiveGuard, TestingError> {
        self.enter_window(key, event_id, instance, None).await
    }

    /// Like [`enter`](Self::enter), but the window starts at `dispatched_at`
    /// (the engine's `convoy_runtime::Context::dispatched_at`,
    /// read before its last lease check) rather than when this call reaches
    /// Redis.
    ///
    /// A process stopped between the engine's dispatch and this call runs it
    /// only once resumed; that is the attempt it already had in flight, and
    /// its window must say so. Both clocks are the host's wall clock, so this
    /// is meant for processes on the Redis server's machine.
    pub async fn enter_dispatched(
        &self,
        key: &str,
        event_id: &str,
        instance: &str,
        dispatched_at: SystemTime,
    ) -> Result<ActiveGuard, TestingError> {
        let us = dispatched_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.enter_window(key, event_id, instance, Some(us)).await
    }

    async fn enter_window(
        &self,
        key: &str,
        event_id: &str,
        instance: &str,
        start_us: Option<u64>,
    ) -> Result<ActiveGuard, TestingError> {
        if instance.contains('|') {
            return Err(TestingError::InvalidInstance {
                instance: instance.to_string(),
            });
        }
        let ttl_ms = u64::try_from(self.marker_ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut connection = self.connection().await?;
        let (window, _violations): (u64, u64) = ENTER
            .key(self.redis_key(&format!("active:{key}")))
            .key(self.redis_key(&format!("seen:{key}")))
            .key(self.redis_key("keys"))
            .key(self.redis_key(&format!("windows:{key}")))
            .key(self.redis_key("violations"))
            .key(self.redis_key("window-seq"))
            .arg(instance)
            .arg(event_id)
            .arg(ttl_ms)
            .arg(key)
            .arg(start_us.map(|us| us.to_string()).unwrap_or_default())
            .invoke_async(&mut connection)
            .await
            .map_err(TestingError::redis("recording a handler entry"))?;
        Ok(ActiveGuard {
            recorder: self.clone(),
            key: key.to_string(),
            holder: format!("{instance}|{event_id}"),
            window,
        })
    }

    /// The event ids handled for `key`, in the order the handlers entered
    /// them (re-runs included).
    pub async fn seen(&self, key: &str) -> Result<Vec<String>, TestingError> {
        let mut connection = self.connection().await?;
        redis::cmd("LRANGE")
            .arg(self.redis_key(&format!("seen:{key}")))
            .arg(0)
            .arg(-1)
            .query_async(&mut connection)
            .await
            .map_err(TestingError::redis("reading the seen events"))
    }

    /// [`seen`](Self::seen) for every key that was entered at least once.
    pub async fn seen_all(&self) -> Result<BTreeMap<String, Vec<String>>, TestingError> {
        let mut connection = self.connection().await?;
        let keys: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.redis_key("keys"))
            .query_async(&mut connection)
            .await
            .map_err(TestingError::redis("reading the recorded keys"))?;
        let mut all = BTreeMap::new();
        for key in keys {
            let seen = self.seen(&key).await?;
            all.insert(key, seen);
        }
        Ok(all)
    }

    /// Every overlap found so far, one line each: "instance X entered event
    /// E for key K while instance Y was in event F".
    pub async fn violations(&self) -> Result<Vec<String>, TestingError> {
        let mut connection = self.connection().await?;
        redis::cmd("LRANGE")
            .arg(self.redis_key("violations"))
            .arg(0)
            .arg(-1)
            .query_async(&mut connection)
            .await
            .map_err(TestingError::redis("reading the violations"))
    }

    /// The processing windows of `key` in the order they were entered:
    /// `(start_us, end_us, event_id)`, in microseconds of the Redis clock.
    ///
    /// A window whose handler never exited (crashed, or still running) has
    /// `end_us == u64::MAX`.
    pub async fn windows(&self, key: &str) -> Result<Vec<(u64, u64, String)>, TestingError> {
        Ok(self
            .windows_of(key)
            .await?
            .into_iter()
            .map(|w| (w.start_us, w.end_us, w.event))
            .collect())
    }

    /// The processing windows of `key` with the instance that entered each.
    pub async fn windows_of(&self, key: &str) -> Result<Vec<Window>, TestingError> {
        let redis_key = self.redis_key(&format!("windows:{key}"));
        let mut connection = self.connection().await?;
        let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(&redis_key)
            .query_async(&mut connection)
            .await
            .map_err(TestingError::redis("reading the processing windows"))?;
        parse_windows(&redis_key, &fields)
    }

    /// True if some processing window of `key_a` overlaps some window of
    /// `key_b` in time (windows that only touch do not overlap).
    pub async fn overlapping_keys(&self, key_a: &str, key_b: &str) -> Result<bool, TestingError> {
        let a = self.windows(key_a).await?;
        let b = self.windows(key_b).await?;
        Ok(a.iter().any(|(start_a, end_a, _)| {
            b.iter()
                .any(|(start_b, end_b, _)| start_a < end_b && start_b < end_a)
        }))
    }

    async fn connection(&self) -> Result<ConnectionManager, TestingError> {
        self.connection
            .get_or_try_init(|| ConnectionManager::new(self.client.clone()))
            .await
            .cloned()
            .map_err(TestingError::redis("connecting the recorder"))
    }

    fn redis_key(&self, suffix: &str) -> String {
        format!("convoy-test:{}:{suffix}", self.namespace)
    }
}

/// One processing window: a handler was in `event` for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// When it was entered, µs of the Redis clock.
    pub start_us: u64,
    /// When it was left, or `u64::MAX` if never.
    pub end_us: u64,
    /// The event id.
    pub event: String,
    /// The instance that entered it.
    pub instance: String,
}

fn parse_windows(
    redis_key: &str,
    fields: &BTreeMap<String, String>,
) -> Result<Vec<Window>, TestingError> {
    #[derive(Default)]
    struct Partial {
        start: Option<u64>,
        end: Option<u64>,
        event: Option<String>,
        instance: String,
    }
    let malformed = |detail: String| TestingError::MalformedRecord {
        redis_key: redis_key.to_string(),
        detail,
    };
    let number = |field: &str, value: &str| {
        value
            .parse::<u64>()
            .map_err(|_| malformed(format!("field `{field}` is `{value}`, not a number")))
    };
    let mut windows: BTreeMap<u64, Partial> = BTreeMap::new();
    for (field, value) in fields {
        let (id, part) = field
            .split_once(':')
            .ok_or_else(|| malformed(format!("unexpected field `{field}`")))?;
        let window = windows.entry(number(field, id)?).or_default();
        match part {
            "start" => window.start = Some(number(field, value)?),
            "end" => window.end = Some(number(field, value)?),
            "event" => window.event = Some(value.clone()),
            "instance" => window.instance = value.clone(),
            _ => return Err(malformed(format!("unexpected field `{field}`"))),
        }
    }
    windows
        .into_iter()
        .map(|(id, window)| match (window.start, window.event) {
            (Some(start), Some(event)) => Ok(Window {
                start_us: start,
                end_us: window.end.unwrap_or(u64::MAX),
                event,
                instance: window.instance,
            }),
            _ => Err(malformed(format!("window {id} has no start or no event"))),
        })
        .collect()
}

/// Proof that a handler is inside an event; made by [`Recorder::enter`].
///
/// Call [`exit`](Self::exit) when the handler is done. Dropping the guard
/// without it (as a crash does) leaves the marker until the recorder's
/// marker ttl expires and leaves the window open.
#[derive(Debug)]
#[must_use = "call `exit().await` when the handler is done"]
pub struct ActiveGuard {
    recorder: Recorder,
    key: String,
    holder: String,
    window: u64,
}

impl ActiveGuard {
    /// Records that the handler is done: clears its marker (only if it is
    /// still the one this guard wrote) and closes its window.
    pub async fn exit(self) -> Result<(), TestingError> {
        let recorder = &self.recorder;
        let mut connection = recorder.connection().await?;
        let _: i64 = EXIT
            .key(recorder.redis_key(&format!("active:{}", self.key)))
            .key(recorder.redis_key(&format!("windows:{}", self.key)))
            .arg(&self.holder)
            .arg(self.window)
            .invoke_async(&mut connection)
            .await
            .map_err(TestingError::redis("recording a handler exit"))?;
        Ok(())
    }

    /// The key this guard is in.
    pub fn key(&self) -> &str {
        &self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_open_and_closed_windows() {
        let fields: BTreeMap<String, String> = [
            ("1:start", "10"),
            ("1:end", "20"),
            ("1:event", "a"),
            ("1:instance", "x"),
            ("2:start", "15"),
            ("2:event", "b"),
            ("2:instance", "y"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let windows = parse_windows("k", &fields).unwrap();
        let w = |start_us, end_us, event: &str, instance: &str| Window {
            start_us,
            end_us,
            event: event.to_string(),
            instance: instance.to_string(),
        };
        assert_eq!(
            windows,
            vec![w(10, 20, "a", "x"), w(15, u64::MAX, "b", "y")]
        );
    }

    #[test]
    fn rejects_malformed_windows() {
        let fields: BTreeMap<String, String> = [("1:start", "ten")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let error = parse_windows("k", &fields).unwrap_err();
        assert!(error.to_string().contains("not a number"), "{error}");
    }
}
