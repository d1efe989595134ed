//! A fault-injection TCP proxy between clients and a real `redis-server`.
//!
//! The proxy parses the RESP frames in both directions, so it knows which
//! reply answers which request (clients pipeline many requests on one
//! connection; Redis answers them in order). That lets it hold or swallow
//! the reply of one chosen request while everything else flows.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::TestingError;

/// How much one read takes from a socket at most.
const CHUNK: usize = 64 * 1024;
/// Reply segments read ahead of the client writer (a held reply lets this
/// many pile up before the proxy stops reading from Redis).
const SEGMENTS: usize = 16;
/// How long a new connection waits for the upstream to accept it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`FaultProxy::cut_all`] waits for the connections to close.
const CUT_WAIT: Duration = Duration::from_secs(2);
/// How long the accept loop rests after a failed accept (e.g. no more file
/// descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
/// The longest RESP header line or inline command accepted before the
/// stream is treated as unparsable (Redis itself allows 64 KiB).
const MAX_LINE: usize = 64 * 1024;
/// Command names longer than this are not matched by [`Match::Command`].
const NAME_MAX: usize = 32;
/// Length of a SHA1 in hex.
const SHA_LEN: usize = 40;

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
    /// hashes to it. Take convoy's own SHAs from [`script_sha`], or yours
    /// from `redis::Script::get_hash`. (The body of an `EVAL` is hashed
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

/// The SHA1 (lowercase hex) of one of convoy's own Lua scripts, by its file
/// stem in `convoy-runtime/src/redis/lua/`: `"read"` (the fenced read),
/// `"ack"`, `"claim"`, `"fail"`, `"acquire"`, `"release"`, `"reap"`,
/// `"publish"`, `"plain_ack"`, `"dead_letter"`, `"save_state"`,
/// `"head_action"`, `"replay"`. `None` for an unknown name.
///
/// Use it with [`Match::Script`] to hit one step of the engine's protocol.
///
/// The hash is that of the script as the engine sends it (fenced scripts
/// carry the shared fence check in front of the file's code).
pub fn script_sha(name: &str) -> Option<String> {
    crate::redis::scripts::SCRIPTS
        .by_name(name)
        .map(|script| script.get_hash().to_owned())
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
/// An engine whose connection to Redis goes through the proxy, and whose
/// next fenced read runs in Redis (what it reads becomes pending for this
/// engine) while its reply never reaches the engine:
///
/// ```no_run
/// # // Its own names: doc tests are merged into one binary, where every
/// # // registered type name must be unique.
/// # use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # #[aggregate(category = "payment")]
/// # struct Payment;
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Payment)]
/// # struct PaymentTaken {
/// #     client_id: String,
/// # }
/// # struct Payments;
/// # #[event_handler(part_of = Payment, sequential_by = "client_id")]
/// # impl Payments {
/// #     #[handle]
/// #     async fn taken(&self, _e: PaymentTaken) -> Result<(), HandlerError> {
/// #         Ok(())
/// #     }
/// # }
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
///
/// use convoy_runtime::testing::{FaultProxy, Match, RedisServer, script_sha};
/// use convoy_runtime::{Config, Domain};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port())))?;
///
/// // The engine talks to Redis through the proxy.
/// let mut config = Config::default();
/// config.broker.url = proxy.url();
/// let domain = Domain::builder().config(config).handler(Payments).init()?;
///
/// // Swallow the reply of the next fenced read that Redis runs.
/// let read = script_sha("read").expect("convoy ships read.lua");
/// proxy.drop_reply(Match::Script(read), 1);
///
/// let engine = domain.engine().spawn();
/// let mut uow = domain.unit_of_work();
/// uow.raise(PaymentTaken { client_id: "acme".into() })?;
/// uow.commit().await?;
/// // ... wait until the handler saw the event (a `Recorder` tells) ...
/// engine.shutdown().await?;
///
/// // The fault really happened, and the engine recovered from it: check
/// // with `Recorder` and `check_order` that the event was handled, in order.
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
                move || run(shared, listener, ready_tx)
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

/// The proxy thread: its own runtime, the accept loop, and on shutdown the
/// runtime is dropped with every connection task.
fn run(
    shared: Arc<Shared>,
    listener: StdTcpListener,
    ready: std_mpsc::Sender<Result<(), TestingError>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(source) => {
            let _ = ready.send(Err(TestingError::Proxy {
                action: "starting its tokio runtime",
                source,
            }));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(source) => {
                let _ = ready.send(Err(TestingError::Proxy {
                    action: "setting up its listening socket",
                    source,
                }));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        accept_loop(shared, listener).await;
    });
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            biased;
            () = shared.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let generation = Arc::clone(&lock(&shared.generation));
                tokio::spawn(serve(Arc::clone(&shared), generation, client));
            }
            Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
        }
    }
}

/// Counts a connection as open while it lives.
struct OpenGuard<'a>(&'a AtomicUsize);

impl<'a> OpenGuard<'a> {
    fn new(open: &'a AtomicUsize) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Self(open)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One client connection, until either side closes or it is cut.
async fn serve(shared: Arc<Shared>, generation: Arc<Generation>, client: TcpStream) {
    let _open = OpenGuard::new(&shared.open);
    tokio::select! {
        biased;
        () = generation.cut.cancelled() => {}
        () = relay(&shared, client) => {}
    }
    // The sockets are closed (the relay future is gone) before the
    // generation is released, which is what `cut_all` waits for.
    drop(generation);
}

/// What the reply side expects next, queued by the request side in order.
enum Expect {
    /// One reply to this request.
    Reply(RequestKey),
    /// From the next reply on, stop tracking (e.g. after `MONITOR`).
    Untrack,
}

async fn relay(shared: &Shared, mut client: TcpStream) {
    let mut paused = shared.paused.subscribe();
    resumed(&mut paused).await;
    let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(shared.upstream));
    let Ok(Ok(mut upstream)) = connect.await else {
        // Unreachable: closing the client tells it so.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    let expected = Mutex::new(VecDeque::new());
    let requests = async {
        let forwarded = forward_requests(
            shared,
            client_read,
            upstream_write,
            &expected,
            shared.paused.subscribe(),
        )
        .await;
        if forwarded.is_ok() {
            // The client finished sending; its replies may still come.
            std::future::pending::<()>().await;
        }
    };
    let replies = forward_replies(shared, upstream_read, client_write, &expected, paused);
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}

/// Waits while the proxy is paused.
async fn resumed(paused: &mut watch::Receiver<bool>) {
    let _ = paused.wait_for(|paused| !*paused).await;
}

/// What the request side knows about a connection.
struct RequestState {
    tracked: bool,
    resp3: bool,
}

impl RequestState {
    fn untrack(&mut self, expected: &Mutex<VecDeque<Expect>>) {
        self.tracked = false;
        lock(expected).push_back(Expect::Untrack);
    }
}

/// Client to upstream: forwards every chunk as it comes, after noting each
/// complete request in `expected` (before its last byte reaches Redis, so
/// the reply side always finds it). Returns `Ok` when the client is done
/// sending.
async fn forward_requests(
    shared: &Shared,
    mut client: ReadHalf<'_>,
    mut upstream: WriteHalf<'_>,
    expected: &Mutex<VecDeque<Expect>>,
    mut paused: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(CHUNK);
    let mut scanner = FrameScanner::requests();
    let mut state = RequestState {
        tracked: true,
        resp3: false,
    };
    loop {
        buf.reserve(CHUNK);
        let old = buf.len();
        if client.read_buf(&mut buf).await? == 0 {
            resumed(&mut paused).await;
            return upstream.shutdown().await;
        }
        // `buf[..done]` holds complete requests; the rest is the start of
        // the next one.
        let mut done = 0;
        while state.tracked {
            match scanner.scan(&buf[done..]) {
                Ok(Some(frame)) => {
                    note_request(shared, &mut state, &buf[done..done + frame.len], expected);
                    done += frame.len;
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%error, "fault proxy: requests are not RESP; no more faults on this connection");
                    state.untrack(expected);
                }
            }
        }
        if !state.tracked {
            done = buf.len();
        }
        resumed(&mut paused).await;
        upstream.write_all(&buf[old..]).await?;
        buf.drain(..done);
    }
}

const SUBSCRIBES: [&str; 3] = ["SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE"];
const UNSUBSCRIBES: [&str; 3] = ["UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE"];

/// Queues what the reply side should expect for one complete request.
fn note_request(
    shared: &Shared,
    state: &mut RequestState,
    frame: &[u8],
    expected: &Mutex<VecDeque<Expect>>,
) {
    let request = Request::parse(frame);
    if request.argc == 0 {
        // Redis ignores an empty request and sends no reply.
        return;
    }
    let is = |name: &str| request.name.eq_ignore_ascii_case(name.as_bytes());
    let arg1_is = |arg: &str| {
        request
            .arg1
            .is_some_and(|arg1| arg1.eq_ignore_ascii_case(arg.as_bytes()))
    };
    if is("HELLO") {
        if arg1_is("3") {
            state.resp3 = true;
        } else if arg1_is("2") {
            state.resp3 = false;
        }
    } else if is("RESET") {
        state.resp3 = false;
    } else if (SUBSCRIBES.iter().any(|name| is(name)) && request.argc >= 2)
        || UNSUBSCRIBES.iter().any(|name| is(name))
    {
        if state.resp3 {
            // Confirmed by push frames, not by a reply.
            return;
        }
        // RESP2: one reply per channel, then messages; not trackable.
        state.untrack(expected);
        return;
    } else if is("MONITOR") || (is("CLIENT") && arg1_is("REPLY")) {
        state.untrack(expected);
        return;
    }
    let key = RequestKey::new(&request, shared.has_rules.load(Ordering::SeqCst));
    lock(expected).push_back(Expect::Reply(key));
}

/// A request as much as the rules need: its name and, for scripts, the
/// SHA1. Fixed size, so queueing it allocates nothing.
#[derive(Clone, Copy)]
struct RequestKey {
    name: [u8; NAME_MAX],
    /// 0 also for a name too long to keep.
    name_len: u8,
    sha: [u8; SHA_LEN],
    has_sha: bool,
}

impl RequestKey {
    /// `hash_eval`: hash the body of an `EVAL` (only worth it while rules
    /// exist).
    fn new(request: &Request<'_>, hash_eval: bool) -> Self {
        let mut key = Self {
            name: [0; NAME_MAX],
            name_len: 0,
            sha: [0; SHA_LEN],
            has_sha: false,
        };
        if request.name.len() <= NAME_MAX {
            key.name[..request.name.len()].copy_from_slice(request.name);
            key.name.make_ascii_uppercase();
            key.name_len = request.name.len() as u8;
        }
        let name = key.name();
        let arg1 = request.arg1.unwrap_or_default();
        if name == b"EVALSHA" || name == b"EVALSHA_RO" {
            key.set_sha(arg1);
        } else if hash_eval
            && (name == b"EVAL" || name == b"EVAL_RO")
            && let Ok(body) = std::str::from_utf8(arg1)
        {
            key.set_sha(redis::Script::new(body).get_hash().as_bytes());
        }
        key
    }

    fn set_sha(&mut self, sha: &[u8]) {
        if sha.len() == SHA_LEN {
            self.sha.copy_from_slice(sha);
            self.sha.make_ascii_lowercase();
            self.has_sha = true;
        }
    }

    fn name(&self) -> &[u8] {
        &self.name[..usize::from(self.name_len)]
    }

    fn sha(&self) -> Option<&[u8]> {
        self.has_sha.then_some(&self.sha[..])
    }
}

/// What the reply side sends the client writer.
enum Out {
    Bytes(Vec<u8>),
    /// Write nothing more before this instant.
    Hold(Instant),
    /// Close the client connection (after everything before it).
    Close,
}

/// Upstream to client: a reader that splits the replies into frames and
/// decides their fate, and a writer that applies it.
async fn forward_replies(
    shared: &Shared,
    upstream: ReadHalf<'_>,
    client: WriteHalf<'_>,
    expected: &Mutex<VecDeque<Expect>>,
    paused: watch::Receiver<bool>,
) {
    let (tx, rx) = mpsc::channel(SEGMENTS);
    let reader = read_replies(shared, upstream, expected, tx);
    let writer = write_replies(client, rx, paused);
    tokio::pin!(writer);
    tokio::select! {
        // The reader is done (the upstream closed, or a reply is dropped):
        // the writer passes on what is left, then closes the client.
        () = reader => (&mut writer).await,
        () = &mut writer => {}
    }
}

async fn read_replies(
    shared: &Shared,
    mut upstream: ReadHalf<'_>,
    expected: &Mutex<VecDeque<Expect>>,
    tx: mpsc::Sender<Out>,
) {
    let mut buf = Vec::with_capacity(CHUNK);
    let mut scanner = FrameScanner::replies();
    let mut tracked = true;
    loop {
        buf.reserve(CHUNK);
        match upstream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let arrived = Instant::now();
        // `buf[..done]`: complete frames; `buf[..sent]`: handed on.
        let mut done = 0;
        let mut sent = 0;
        while tracked {
            let frame = match scanner.scan(&buf[done..]) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%error, "fault proxy: replies are not RESP; no more faults on this connection");
                    tracked = false;
                    break;
                }
            };
            let fate = reply_fate(
                shared,
                expected,
                frame.kind,
                &buf[done..done + frame.len],
                &mut tracked,
            );
            match fate {
                Fate::Pass => {}
                Fate::Hold(delay) => {
                    if !send(&tx, &buf[sent..done]).await
                        || tx
                            .send(Out::Hold(hold_until(arrived, delay)))
                            .await
                            .is_err()
                    {
                        return;
                    }
                    sent = done;
                }
                Fate::Drop => {
                    if send(&tx, &buf[sent..done]).await {
                        let _ = tx.send(Out::Close).await;
                    }
                    return;
                }
            }
            done += frame.len;
        }
        if !tracked {
            done = buf.len();
        }
        if !send(&tx, &buf[sent..done]).await {
            return;
        }
        buf.drain(..done);
    }
}

/// `arrived + delay`, or a year from `arrived` if that is out of range.
fn hold_until(arrived: Instant, delay: Duration) -> Instant {
    arrived
        .checked_add(delay)
        .unwrap_or_else(|| arrived + Duration::from_secs(365 * 24 * 3600))
}

/// Hands `bytes` (if any) to the writer; false if it is gone.
async fn send(tx: &mpsc::Sender<Out>, bytes: &[u8]) -> bool {
    bytes.is_empty() || tx.send(Out::Bytes(bytes.to_vec())).await.is_ok()
}

fn reply_fate(
    shared: &Shared,
    expected: &Mutex<VecDeque<Expect>>,
    kind: u8,
    frame: &[u8],
    tracked: &mut bool,
) -> Fate {
    if kind == b'>' {
        // A push (RESP3) answers no request.
        return Fate::Pass;
    }
    let next = lock(expected).pop_front();
    match next {
        Some(Expect::Reply(request)) => shared.take(&request, frame),
        Some(Expect::Untrack) => {
            *tracked = false;
            Fate::Pass
        }
        None => Fate::Pass,
    }
}

async fn write_replies(
    mut client: WriteHalf<'_>,
    mut segments: mpsc::Receiver<Out>,
    mut paused: watch::Receiver<bool>,
) {
    while let Some(out) = segments.recv().await {
        match out {
            Out::Bytes(bytes) => {
                resumed(&mut paused).await;
                if client.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Out::Hold(until) => tokio::time::sleep_until(until).await,
            Out::Close => break,
        }
    }
    resumed(&mut paused).await;
    let _ = client.shutdown().await;
}

/// One request, as far as the proxy looks into it.
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    /// How many words (command name included).
    argc: usize,
    /// The command name (empty if it could not be read).
    name: &'a [u8],
    /// The first argument.
    arg1: Option<&'a [u8]>,
}

impl<'a> Request<'a> {
    /// Reads one complete request frame, as [`FrameScanner::requests`]
    /// delimits them.
    fn parse(frame: &'a [u8]) -> Self {
        if frame.first() == Some(&b'*') {
            Self::parse_multibulk(frame)
        } else {
            Self::parse_inline(frame)
        }
    }

    fn parse_multibulk(frame: &'a [u8]) -> Self {
        let mut request = Request {
            argc: 0,
            name: b"",
            arg1: None,
        };
        let Some((header, mut rest)) = split_line(&frame[1..]) else {
            return request;
        };
        request.argc = match parse_len(header) {
            Ok(Some(argc)) => argc,
            _ => return request,
        };
        let mut words = [None; 2];
        for word in words.iter_mut().take(request.argc) {
            let Some(after) = rest.strip_prefix(b"$") else {
                break;
            };
            let Some((len, data)) = split_line(after) else {
                break;
            };
            let Ok(Some(len)) = parse_len(len) else {
                break;
            };
            let Some(bytes) = data.get(..len) else {
                break;
            };
            *word = Some(bytes);
            rest = data.get(len + 2..).unwrap_or_default();
        }
        request.name = words[0].unwrap_or_default();
        request.arg1 = words[1];
        request
    }

    fn parse_inline(frame: &'a [u8]) -> Self {
        let mut words = frame
            .split(u8::is_ascii_whitespace)
            .filter(|word| !word.is_empty());
        let name = words.next();
        let arg1 = words.next();
        Request {
            argc: usize::from(name.is_some()) + usize::from(arg1.is_some()) + words.count(),
            name: name.unwrap_or_default(),
            arg1,
        }
    }
}

/// One complete RESP frame found by [`FrameScanner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    /// Its length in bytes.
    len: usize,
    /// Its type byte (`*`, `$`, `>`, ...; the value's, after an attribute),
    /// or [`INLINE`].
    kind: u8,
}

/// [`Frame::kind`] of an inline command (a request that is a plain line).
const INLINE: u8 = b' ';

/// Why bytes are not RESP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProtocolError(&'static str);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Finds where RESP2/RESP3 frames end in a byte stream, incrementally: fed
/// the same frame again with more bytes after [`scan`](Self::scan) returned
/// `None`, it resumes where it stopped instead of starting over, so a huge
/// reply arriving in many chunks is scanned once.
#[derive(Debug)]
struct FrameScanner {
    /// Requests: a frame not starting with `*` is an inline command.
    requests: bool,
    /// Where scanning resumes, from the start of the frame.
    pos: usize,
    /// For each open aggregate, innermost last: values still to come.
    open: Vec<usize>,
    /// The frame began with an attribute; its value follows.
    top_attribute: bool,
    /// The type byte of the top-level value (0 until it is read).
    kind: u8,
}

impl FrameScanner {
    fn requests() -> Self {
        Self::new(true)
    }

    fn replies() -> Self {
        Self::new(false)
    }

    fn new(requests: bool) -> Self {
        Self {
            requests,
            pos: 0,
            open: Vec::new(),
            top_attribute: false,
            kind: 0,
        }
    }

    /// The next frame of `buf`, which starts where the previous frame
    /// ended; `None` while it is incomplete (call again with more bytes
    /// appended to the same frame).
    fn scan(&mut self, buf: &[u8]) -> Result<Option<Frame>, ProtocolError> {
        loop {
            let Some(&ty) = buf.get(self.pos) else {
                return Ok(None);
            };
            let top = self.open.is_empty();
            if top && self.requests && !self.top_attribute && ty != b'*' {
                let rest = &buf[self.pos..];
                let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
                    return if rest.len() > MAX_LINE {
                        Err(ProtocolError("an inline command is too long"))
                    } else {
                        Ok(None)
                    };
                };
                self.pos += newline + 1;
                return Ok(Some(self.finish(INLINE)));
            }
            let rest = &buf[self.pos + 1..];
            let Some((line, after)) = split_line(rest) else {
                return if rest.len() > MAX_LINE {
                    Err(ProtocolError("a header line is too long"))
                } else {
                    Ok(None)
                };
            };
            let next = buf.len() - after.len();
            let (end, children) = match ty {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => (next, 0),
                b'$' | b'!' | b'=' => match parse_len(line)? {
                    None => (next, 0),
                    Some(len) => {
                        let end = next
                            .checked_add(len)
                            .and_then(|end| end.checked_add(2))
                            .ok_or(ProtocolError("a bulk string is too long"))?;
                        let Some(data) = buf.get(next..end) else {
                            return Ok(None);
                        };
                        if !data.ends_with(b"\r\n") {
                            return Err(ProtocolError("a bulk string does not end with CRLF"));
                        }
                        (end, 0)
                    }
                },
                b'*' | b'~' | b'>' => (next, parse_len(line)?.unwrap_or(0)),
                b'%' | b'|' => {
                    let values = parse_len(line)?
                        .unwrap_or(0)
                        .checked_mul(2)
                        .ok_or(ProtocolError("a map is too long"))?;
                    // A nested attribute is followed by the value it
                    // annotates, which is what its parent counts; so it
                    // ends after that value. On top, the frame goes on after
                    // it (see `complete`).
                    let annotated = usize::from(ty == b'|' && !top);
                    (next, values + annotated)
                }
                _ => return Err(ProtocolError("an unknown RESP type byte")),
            };
            if top {
                if ty == b'|' {
                    self.top_attribute = true;
                } else {
                    self.kind = ty;
                }
            }
            self.pos = end;
            if children > 0 {
                self.open.push(children);
            } else if let Some(frame) = self.complete() {
                return Ok(Some(frame));
            }
        }
    }

    /// A value just ended: counts it in its parents; the frame if it was
    /// the top-level value.
    fn complete(&mut self) -> Option<Frame> {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return None;
            }
            self.open.pop();
        }
        if self.top_attribute && self.kind == 0 {
            // A top-level attribute ended; the value it annotates follows.
            return None;
        }
        Some(self.finish(self.kind))
    }

    fn finish(&mut self, kind: u8) -> Frame {
        let frame = Frame {
            len: self.pos,
            kind,
        };
        self.pos = 0;
        self.open.clear();
        self.top_attribute = false;
        self.kind = 0;
        frame
    }
}

/// Splits `bytes` at its first CRLF: the line before it and the rest after.
fn split_line(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.windows(2).position(|pair| pair == b"\r\n")?;
    Some((&bytes[..end], &bytes[end + 2..]))
}

/// A RESP length: `None` for `-1` (a RESP2 null).
fn parse_len(line: &[u8]) -> Result<Option<usize>, ProtocolError> {
    if line == b"-1" {
        return Ok(None);
    }
    if line.is_empty() {
        return Err(ProtocolError("empty length"));
    }
    let mut len: usize = 0;
    for &digit in line {
        if !digit.is_ascii_digit() {
            return Err(ProtocolError("bad length"));
        }
        len = len
            .checked_mul(10)
            .and_then(|len| len.checked_add(usize::from(digit - b'0')))
            .ok_or(ProtocolError("length too large"))?;
    }
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every frame of `bytes`, scanned in one go.
    fn frames(requests: bool, bytes: &[u8]) -> Result<Vec<Frame>, ProtocolError> {
        let mut scanner = FrameScanner::new(requests);
        let mut start = 0;
        let mut found = Vec::new();
        while let Some(frame) = scanner.scan(&bytes[start..])? {
            found.push(frame);
            start += frame.len;
        }
        assert_eq!(start, bytes.len(), "trailing bytes in {bytes:?}");
        Ok(found)
    }

    /// The same, fed one byte more at a time (as if every byte arrived in a
    /// read of its own).
    fn frames_bytewise(requests: bool, bytes: &[u8]) -> Vec<Frame> {
        let mut scanner = FrameScanner::new(requests);
        let mut start = 0;
        let mut found = Vec::new();
        for end in 1..=bytes.len() {
            while let Some(frame) = scanner.scan(&bytes[start..end]).expect("valid RESP") {
                found.push(frame);
                start += frame.len;
            }
        }
        assert_eq!(start, bytes.len());
        found
    }

    fn kinds(found: &[Frame]) -> Vec<u8> {
        found.iter().map(|frame| frame.kind).collect()
    }

    const REPLIES: &[&[u8]] = &[
        b"+OK\r\n",
        b"-ERR wrong\r\n",
        b":42\r\n",
        b"$5\r\nhello\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"$6\r\na\r\nb\r\n\r\n",
        b"*2\r\n$3\r\nfoo\r\n*2\r\n:1\r\n*1\r\n+deep\r\n",
        b"_\r\n",
        b",3.14\r\n",
        b"#t\r\n",
        b"(3492890328409238509324850943850943825024385\r\n",
        b"!21\r\nSYNTAX invalid syntax\r\n",
        b"=15\r\ntxt:Some string\r\n",
        b"%2\r\n+first\r\n:1\r\n+second\r\n*2\r\n:2\r\n:3\r\n",
        b"~3\r\n+a\r\n+b\r\n+c\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
        b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*2\r\n:2039123\r\n:9543892\r\n",
        b"*3\r\n:1\r\n|1\r\n+ttl\r\n:3600\r\n:2\r\n:3\r\n",
        b"%0\r\n",
    ];

    const REPLY_KINDS: &[u8] = b"+-:$$$**$*_,#(!=%~>**%";

    #[test]
    fn every_resp_type_is_one_frame() {
        for (reply, kind) in REPLIES.iter().zip(REPLY_KINDS) {
            let found = frames(false, reply).expect("valid RESP");
            assert_eq!(
                found,
                [Frame {
                    len: reply.len(),
                    kind: *kind
                }],
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn incomplete_input_resumes_at_every_split() {
        let all: Vec<u8> = REPLIES.concat();
        let at_once = frames(false, &all).expect("valid RESP");
        assert_eq!(kinds(&at_once), REPLY_KINDS);
        assert_eq!(frames_bytewise(false, &all), at_once);
        // Every prefix that stops inside a frame is incomplete, not wrong.
        for reply in REPLIES {
            for end in 0..reply.len() {
                let mut scanner = FrameScanner::replies();
                assert_eq!(scanner.scan(&reply[..end]), Ok(None), "{reply:?}[..{end}]");
            }
        }
    }

    #[test]
    fn a_huge_reply_in_many_chunks_is_one_frame() {
        let mut reply = b"*100000\r\n".to_vec();
        for i in 0..100_000 {
            reply.extend_from_slice(format!("$5\r\n{:05}\r\n", i % 100_000).as_bytes());
        }
        reply.extend_from_slice(b"+next\r\n");
        let mut scanner = FrameScanner::replies();
        let mut found = Vec::new();
        let mut start = 0;
        for end in (0..reply.len()).step_by(1000).chain([reply.len()]) {
            while let Some(frame) = scanner.scan(&reply[start..end]).expect("valid RESP") {
                found.push(frame);
                start += frame.len;
            }
        }
        assert_eq!(kinds(&found), b"*+");
        assert_eq!(found[0].len, reply.len() - b"+next\r\n".len());
    }

    #[test]
    fn pipelined_requests_are_split_and_read() {
        let bytes = b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nset\r\n$1\r\nk\r\n$2\r\nv\n\r\n\
                      *2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING hi\r\n\r\n*0\r\n";
        let found = frames(true, bytes).expect("valid RESP");
        assert_eq!(kinds(&found), b"***  *");
        assert_eq!(frames_bytewise(true, bytes), found);
        let mut start = 0;
        let mut requests = Vec::new();
        for frame in &found {
            requests.push(Request::parse(&bytes[start..start + frame.len]));
            start += frame.len;
        }
        let read =
            |argc, name: &'static [u8], arg1: Option<&'static [u8]>| Request { argc, name, arg1 };
        assert_eq!(
            requests,
            [
                read(1, b"PING", None),
                read(3, b"set", Some(b"k")),
                read(2, b"GET", Some(b"k")),
                read(2, b"PING", Some(b"hi")),
                read(0, b"", None),
                read(0, b"", None),
            ]
        );
    }

    #[test]
    fn bytes_that_are_not_resp_are_an_error() {
        for bad in [
            &b"?what\r\n"[..],
            b"$3\r\nabcd\r\n",
            b"$x\r\n",
            b"*-2\r\n",
            b":1\r\n*1\r\n@\r\n",
        ] {
            assert!(frames(false, bad).is_err(), "{bad:?}");
        }
        let mut long = vec![b'+'; MAX_LINE + 10];
        long[0] = b'+';
        assert!(FrameScanner::replies().scan(&long).is_err());
        assert!(FrameScanner::requests().scan(&long[1..]).is_err());
    }

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
        let sha = script_sha("read").expect("read.lua");
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

    #[test]
    fn every_lua_file_has_its_script_sha() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/redis/lua");
        for entry in std::fs::read_dir(dir).expect("the lua directory") {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_none_or(|ext| ext != "lua") {
                continue;
            }
            let stem = path
                .file_stem()
                .and_then(|stem| stem.to_str())
                .expect("a name");
            if stem == "fence" {
                // The prelude of the fenced scripts, not a script.
                continue;
            }
            let code = std::fs::read_to_string(&path).expect("a readable script");
            let sha = script_sha(stem).unwrap_or_else(|| panic!("{stem}.lua has no script_sha"));
            let fenced = format!("{}\n{code}", include_str!("../redis/lua/fence.lua"));
            assert!(
                sha == redis::Script::new(&code).get_hash()
                    || sha == redis::Script::new(&fenced).get_hash(),
                "{stem}.lua: script_sha is not the hash of the script the engine sends"
            );
        }
        assert_eq!(script_sha("nope"), None);
        assert_eq!(script_sha("read.lua"), None);
    }
}
