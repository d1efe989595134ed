//! The proxy thread: its own tokio runtime, the accept loop, and one relay
//! per client connection that forwards bytes both ways as they come. The
//! request side notes each complete request (with the RESP parser) so that
//! the reply side knows which reply answers which request, asks the fault
//! rules for its fate, and holds or drops it.

use std::collections::VecDeque;
use std::io;
use std::net::TcpListener as StdTcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::resp::{FrameScanner, Request, RequestKey};
use super::{Fate, Generation, Shared, lock};
use crate::TestingError;

/// How much one read takes from a socket at most.
const CHUNK: usize = 64 * 1024;
/// Reply segments read ahead of the client writer (a held reply lets this
/// many pile up before the proxy stops reading from Redis).
const SEGMENTS: usize = 16;
/// How long a new connection waits for the upstream to accept it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the accept loop rests after a failed accept (e.g. no more file
/// descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// The proxy thread: its own runtime, the accept loop, and on shutdown the
/// runtime is dropped with every connection task.
pub(super) fn run(
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
