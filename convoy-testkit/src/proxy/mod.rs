//! A fault-injection TCP proxy between clients and a real `redis-server`.
//!
//! The proxy parses the RESP frames in both directions, so it knows which
//! reply answers which request (clients pipeline many requests on one
//! connection; Redis answers them in order). That lets it hold or swallow
//! the reply of one chosen request while everything else flows.
//!
//! This module holds the public API ([`FaultProxy`], [`Match`]) and the
//! fault rules the control side adds and the relay uses up; `relay` is the
//! proxy thread (accepting connections, forwarding bytes both ways), `resp`
//! the RESP parser (where frames end, what a request is).

mod relay;
mod resp;

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::TestingError;
use resp::RequestKey;

/// How long [`FaultProxy::cut_all`] waits for the connections to close.
const CUT_WAIT: Duration = Duration::from_secs(2);

/// Which requests a fault rule applies to.
///
/// Rules are checked when the reply of a request arrives from Redis, in the
/// order they were added; the first one that matches (and has uses left)
/// fires.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Match {
    /// Any request whose command name is this (case-insensitive), e.g.
    /// `"XADD"`, `"SET"`, `"EVALSHA"`.
    Command(String),
    /// An `EVALSHA` (or `EVALSHA_RO`) of this script SHA1 (hex,
    /// case-insensitive), and an `EVAL` (or `EVAL_RO`) whose script body
    /// hashes to it. Take convoy's own SHAs from
    /// `convoy_runtime::testing::script_sha`, yours from
    /// `redis::Script::get_hash`. (The body of an `EVAL` is hashed
    /// only while some rule is pending, so add the rule before the `EVAL`
    /// is sent.)
    ///
    /// A `NOSCRIPT` error reply does not count: Redis ran nothing, and
    /// redis-rs answers it with `SCRIPT LOAD` and the same `EVALSHA` again,
    /// whose reply is the one that matches.
    Script(String),
    /// Any request, including the handshake commands clients send when
    /// they connect (`HELLO`, `AUTH`, `SELECT`, `CLIENT SETINFO`, ...).
    Any,
}

impl Match {
    fn matches(&self, request: &RequestKey) -> bool {
        match self {
            Self::Command(name) => request.name().eq_ignore_ascii_case(name.as_bytes()),
            Self::Script(sha) => request
                .sha()
                .is_some_and(|got| got.eq_ignore_ascii_case(sha.as_bytes())),
            Self::Any => true,
        }
    }
}

/// A TCP proxy between clients (engines, often in other OS processes) and a
/// real `redis-server`, which injects network faults on request.
///
/// [`start`](Self::start) listens on `127.0.0.1` on a free port; point the
/// clients at [`url`](Self::url) instead of the server. Every accepted
/// connection gets its own connection to the upstream server, and bytes are
/// forwarded as they come until a fault is injected. For an engine in a
/// child process ([`ChildEngine`](super::ChildEngine)), hand it the URL,
/// for example in an environment variable.
///
///
/// - [`delay_reply`](Self::delay_reply): the reply of a matching request is
///   held for a while (a slow server, a response timeout);
/// - [`drop_reply`](Self::drop_reply): Redis runs the request but the reply
///   is swallowed and the connection closed ("the script may have run");
/// - [`cut_all`](Self::cut_all): every connection is closed now;
/// - [`pause`](Self::pause) / [`resume`](Self::resume): nothing moves in
///   either direction (a network partition that heals).
///
/// It runs on a thread of its own with its own tokio runtime, so it works
/// the same for synchronous tests and for tests on any tokio runtime.
/// Dropping it stops the thread and closes every connection.
///
/// When the upstream is unreachable or closes a connection, the proxy
/// closes the client's connection too; clients reconnect through the proxy
/// and get through again once the server is back on the same port (for
/// example after [`RedisServer::restart`](super::RedisServer::restart)).
///
/// Reply tracking is switched off (everything is forwarded untouched, and
/// no rule fires) on a connection after `MONITOR`, `CLIENT REPLY`, a
/// `SUBSCRIBE` in RESP2 (RESP3 subscriptions are fine) or bytes that are not
/// RESP.
///
/// # Example
///
/// A client whose connection to Redis goes through the proxy, and whose
/// next call of a script runs in Redis while its reply never reaches the
/// client (`convoy_runtime::testing` shows the same fault on an engine's
/// fenced read):
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
///
/// use convoy_testkit::{FaultProxy, Match, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port())))?;
///
/// // The client talks to Redis through the proxy.
/// let client = redis::Client::open(proxy.url())?;
/// let mut connection = client.get_multiplexed_async_connection().await?;
///
/// // Swallow the reply of the next run of this script.
/// let script = redis::Script::new("return redis.call('INCR', KEYS[1])");
/// proxy.drop_reply(Match::Script(script.get_hash().to_owned()), 1);
///
/// // The script ran, but the client only sees a broken connection.
/// let reply: redis::RedisResult<i64> = script.key("runs").invoke_async(&mut connection).await;
/// assert!(reply.is_err());
/// assert_eq!(proxy.fired(), 1);
/// # Ok(())
/// # }
/// ```
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1` on a free port and forwards every accepted
    /// connection to `upstream` (e.g. `127.0.0.1:6379`).
    ///
    /// The upstream does not need to be up yet: each client connection
    /// connects to it when it is accepted (and is closed if that fails).
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy, TestingError> {
        let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(TestingError::proxy("binding a port on 127.0.0.1"))?;
        listener
            .set_nonblocking(true)
            .map_err(TestingError::proxy("setting up its listening socket"))?;
        let addr = listener
            .local_addr()
            .map_err(TestingError::proxy("setting up its listening socket"))?;
        let shared = Arc::new(Shared::new(upstream));
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("convoy-fault-proxy-{}", addr.port()))
            .spawn({
                let shared = Arc::clone(&shared);
                move || relay::run(shared, listener, ready_tx)
            })
            .map_err(TestingError::proxy("starting its thread"))?;
        // From here on Drop stops and joins the thread on every path.
        let proxy = FaultProxy {
            shared,
            addr,
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(proxy),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(TestingError::Proxy {
                action: "starting its thread",
                source: io::Error::other("the proxy thread ended before it was ready"),
            }),
        }
    }

    /// The port the proxy listens on (on `127.0.0.1`).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The upstream server's address, as given to [`start`](Self::start).
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The connection URL for clients, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// The next `times` replies to requests matching `m` are held for
    /// `delay` (counted from when the reply arrives from Redis) before
    /// being passed on. Other replies on that connection queue behind them,
    /// as in real Redis pipelining; other connections are not affected.
    ///
    /// The rule is checked when a reply arrives, so it may also catch the
    /// reply of a matching request that was already on its way. `times ==
    /// 0` does nothing.
    pub fn delay_reply(&self, m: Match, delay: Duration, times: usize) {
        self.shared.add_rule(m, Effect::Delay(delay), times);
    }

    /// The next `times` requests matching `m` are forwarded (Redis runs
    /// them) but their reply is discarded and that client connection is
    /// closed right after, so the client sees a broken connection after the
    /// effect happened ("the script may have run").
    ///
    /// Replies to earlier requests on that connection are still passed on;
    /// requests pipelined behind it may have run too. Like
    /// [`delay_reply`](Self::delay_reply), the rule is checked when a reply
    /// arrives.
    pub fn drop_reply(&self, m: Match, times: usize) {
        self.shared.add_rule(m, Effect::Drop, times);
    }

    /// Closes every open client connection now (and its upstream
    /// connection); new ones are accepted.
    ///
    /// Returns once they are closed (or after two seconds). A connection
    /// the kernel has queued but the proxy has not accepted yet is not cut.
    pub fn cut_all(&self) {
        let fresh = Arc::new(Generation {
            cut: self.shared.shutdown.child_token(),
        });
        let old = std::mem::replace(&mut *lock(&self.shared.generation), fresh);
        old.cut.cancel();
        let deadline = std::time::Instant::now() + CUT_WAIT;
        while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops forwarding bytes in both directions until
    /// [`resume`](Self::resume). Nothing is lost: what arrives meanwhile is
    /// held (and delayed replies whose time is up wait too). New
    /// connections are accepted but not served (not even connected to the
    /// upstream) meanwhile.
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    /// Forwards again after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Whether the proxy is [`pause`](Self::pause)d.
    pub fn is_paused(&self) -> bool {
        *self.shared.paused.borrow()
    }

    /// Forgets every pending delay/drop rule. Replies already being held
    /// are still passed on when their time is up.
    pub fn clear(&self) {
        let mut rules = lock(&self.shared.rules);
        rules.clear();
        self.shared.has_rules.store(false, Ordering::SeqCst);
    }

    /// How many times a delay or drop rule fired so far, that is how many
    /// replies were held or dropped (to assert that a test really injected
    /// the fault).
    pub fn fired(&self) -> usize {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Client connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("connections", &self.connections())
            .field("open_connections", &self.open_connections())
            .field("fired", &self.fired())
            .field("paused", &self.is_paused())
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            // The thread drops its runtime, and with it every connection.
            let _ = thread.join();
        }
    }
}

impl TestingError {
    fn proxy(action: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Proxy { action, source }
    }
}

/// What the control side and the proxy thread share.
struct Shared {
    upstream: SocketAddr,
    rules: Mutex<Vec<Rule>>,
    /// `!rules.is_empty()`, readable without the lock.
    has_rules: AtomicBool,
    fired: AtomicUsize,
    accepted: AtomicUsize,
    open: AtomicUsize,
    paused: watch::Sender<bool>,
    /// The connections accepted since the last cut hold this.
    generation: Mutex<Arc<Generation>>,
    shutdown: CancellationToken,
}

struct Generation {
    cut: CancellationToken,
}

struct Rule {
    m: Match,
    effect: Effect,
    remaining: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Delay(Duration),
    Drop,
}

/// What happens to one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pass,
    Hold(Duration),
    Drop,
}

impl Shared {
    fn new(upstream: SocketAddr) -> Self {
        let shutdown = CancellationToken::new();
        Self {
            upstream,
            rules: Mutex::new(Vec::new()),
            has_rules: AtomicBool::new(false),
            fired: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            paused: watch::Sender::new(false),
            generation: Mutex::new(Arc::new(Generation {
                cut: shutdown.child_token(),
            })),
            shutdown,
        }
    }

    fn add_rule(&self, m: Match, effect: Effect, times: usize) {
        if times == 0 {
            return;
        }
        let mut rules = lock(&self.rules);
        rules.push(Rule {
            m,
            effect,
            remaining: times,
        });
        self.has_rules.store(true, Ordering::SeqCst);
    }

    /// Decides the fate of `reply`, the reply to `request`, using up one
    /// use of the first rule that matches.
    fn take(&self, request: &RequestKey, reply: &[u8]) -> Fate {
        if !self.has_rules.load(Ordering::SeqCst) {
            return Fate::Pass;
        }
        let not_run = reply.starts_with(b"-NOSCRIPT");
        let mut rules = lock(&self.rules);
        let Some(index) = rules.iter().position(|rule| {
            rule.m.matches(request) && !(not_run && matches!(rule.m, Match::Script(_)))
        }) else {
            return Fate::Pass;
        };
        let rule = &mut rules[index];
        rule.remaining -= 1;
        let effect = rule.effect;
        if rule.remaining == 0 {
            rules.remove(index);
        }
        self.has_rules.store(!rules.is_empty(), Ordering::SeqCst);
        self.fired.fetch_add(1, Ordering::SeqCst);
        match effect {
            Effect::Delay(delay) => Fate::Hold(delay),
            Effect::Drop => Fate::Drop,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::resp::{NAME_MAX, Request};
    use super::*;

    fn key(frame: &[u8], hash_eval: bool) -> RequestKey {
        RequestKey::new(&Request::parse(frame), hash_eval)
    }

    fn command(words: &[&str]) -> Vec<u8> {
        let mut frame = format!("*{}\r\n", words.len()).into_bytes();
        for word in words {
            frame.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
        }
        frame
    }

    #[test]
    fn requests_match_by_name_and_by_script() {
        let body = "return redis.call('GET', KEYS[1])";
        let sha = redis::Script::new(body).get_hash().to_owned();
        let get = key(&command(&["get", "k"]), false);
        let evalsha = key(&command(&["EVALSHA", &sha.to_uppercase(), "1", "k"]), false);
        let eval = key(&command(&["eval", body, "1", "k"]), true);
        let eval_unhashed = key(&command(&["eval", body, "1", "k"]), false);
        let by_name = Match::Command("GET".into());
        let by_script = Match::Script(sha.clone());
        assert!(by_name.matches(&get));
        assert!(!by_name.matches(&evalsha));
        assert!(Match::Command("evalsha".into()).matches(&evalsha));
        assert!(by_script.matches(&evalsha));
        assert!(by_script.matches(&eval));
        assert!(!by_script.matches(&eval_unhashed));
        assert!(!by_script.matches(&get));
        assert!(!Match::Script("0".repeat(40)).matches(&evalsha));
        for request in [&get, &evalsha, &eval] {
            assert!(Match::Any.matches(request));
        }
        let too_long = key(&command(&["X".repeat(NAME_MAX + 1).as_str()]), false);
        assert!(!Match::Command("X".repeat(NAME_MAX + 1)).matches(&too_long));
    }

    #[test]
    fn rules_are_used_up_in_order_and_noscript_does_not_count() {
        let shared = Shared::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 1)));
        let sha = redis::Script::new("return 1").get_hash().to_owned();
        let evalsha = key(&command(&["EVALSHA", &sha, "0"]), false);
        let get = key(&command(&["GET", "k"]), false);
        assert_eq!(shared.take(&get, b"$-1\r\n"), Fate::Pass);
        shared.add_rule(Match::Script(sha), Effect::Drop, 1);
        shared.add_rule(
            Match::Command("GET".into()),
            Effect::Delay(Duration::from_millis(5)),
            2,
        );
        shared.add_rule(Match::Any, Effect::Drop, 0);
        assert_eq!(
            shared.take(&evalsha, b"-NOSCRIPT No matching script\r\n"),
            Fate::Pass
        );
        assert_eq!(shared.take(&evalsha, b"*1\r\n:-1\r\n"), Fate::Drop);
        assert_eq!(shared.take(&evalsha, b"*1\r\n:-1\r\n"), Fate::Pass);
        assert_eq!(
            shared.take(&get, b"$-1\r\n"),
            Fate::Hold(Duration::from_millis(5))
        );
        assert!(shared.has_rules.load(Ordering::SeqCst));
        assert_eq!(
            shared.take(&get, b"$-1\r\n"),
            Fate::Hold(Duration::from_millis(5))
        );
        assert!(!shared.has_rules.load(Ordering::SeqCst));
        assert_eq!(shared.take(&get, b"$-1\r\n"), Fate::Pass);
        assert_eq!(shared.fired.load(Ordering::SeqCst), 3);
    }
}
