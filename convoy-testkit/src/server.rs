//! A real `redis-server` child process, with fault injection.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::TestingError;
use super::process::{ChildEngine, free_port};

/// How long [`RedisServerBuilder::start`] and [`RedisServer::restart`] wait
/// for the server to answer `PING` unless told otherwise.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable choosing the server every [`RedisServer`] (and
/// so every [`RedisCluster`](super::RedisCluster) node) runs: `redis`
/// (the default), `valkey` or `redis8`.
pub const SERVER_ENV: &str = "CONVOY_TEST_SERVER";
/// The environment variable naming the `valkey-server` binary (default:
/// `valkey-server` on `PATH`).
pub const VALKEY_BINARY_ENV: &str = "CONVOY_VALKEY_SERVER";
/// The environment variable naming the Redis 8 `redis-server` binary
/// (default: `redis8-server` on `PATH`; `bash .ci/redis8.sh` installs the
/// pinned one and prints its path).
pub const REDIS8_BINARY_ENV: &str = "CONVOY_REDIS8_SERVER";

/// Which server a [`RedisServer`] runs. Both speak the same protocol and
/// take the same flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerKind {
    /// `redis-server`.
    Redis,
    /// `valkey-server` (`$CONVOY_VALKEY_SERVER`, else on `PATH`).
    Valkey,
    /// A Redis 8 `redis-server` (`$CONVOY_REDIS8_SERVER`, else
    /// `redis8-server` on `PATH`), beside the machine's own `redis-server`.
    Redis8,
}

impl ServerKind {
    /// The kind `CONVOY_TEST_SERVER` names (`redis` when it is not set).
    pub fn from_env() -> Result<ServerKind, TestingError> {
        match std::env::var(SERVER_ENV) {
            Err(_) => Ok(ServerKind::Redis),
            Ok(v) => match v.to_ascii_lowercase().as_str() {
                "" | "redis" => Ok(ServerKind::Redis),
                "valkey" => Ok(ServerKind::Valkey),
                "redis8" => Ok(ServerKind::Redis8),
                _ => Err(TestingError::UnknownServer { value: v }),
            },
        }
    }

    /// The binary it runs: a name looked up on `PATH`, or a path.
    pub fn binary(self) -> PathBuf {
        match self {
            ServerKind::Redis => PathBuf::from("redis-server"),
            ServerKind::Valkey => std::env::var_os(VALKEY_BINARY_ENV)
                .map_or_else(|| PathBuf::from("valkey-server"), PathBuf::from),
            ServerKind::Redis8 => std::env::var_os(REDIS8_BINARY_ENV)
                .map_or_else(|| PathBuf::from("redis8-server"), PathBuf::from),
        }
    }

    /// Its name as the test kit reports it (`redis`, `valkey`, `redis8`).
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
            ServerKind::Redis8 => "redis8",
        }
    }
}
/// How long a restart keeps trying to bind the same port.
const RESTART_BIND_WINDOW: Duration = Duration::from_secs(5);
/// How long `stop()` waits after `SIGTERM` before `SIGKILL`.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports a first start tries.
const PORT_ATTEMPTS: usize = 5;
const LOG_FILE: &str = "redis.log";
const STDIO_FILE: &str = "redis-stdio.log";
const LOG_TAIL_LINES: usize = 20;
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
const PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// Options for starting a [`RedisServer`]; made by [`RedisServer::builder`].
#[derive(Debug, Clone)]
pub struct RedisServerBuilder {
    binary: Option<PathBuf>,
    kind: Option<ServerKind>,
    append_only: bool,
    startup_timeout: Duration,
    extra_args: Vec<OsString>,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        Self {
            binary: None,
            kind: None,
            append_only: false,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            extra_args: Vec::new(),
        }
    }
}

impl RedisServerBuilder {
    /// Turns on the append-only file with `appendfsync always`, so every
    /// acknowledged write survives [`RedisServer::kill`] and
    /// [`RedisServer::restart`]. Off by default: without it a restart starts
    /// empty (`--save ""` disables snapshots).
    pub fn append_only(mut self, on: bool) -> Self {
        self.append_only = on;
        self
    }

    /// Runs this kind of server rather than the one `CONVOY_TEST_SERVER`
    /// names ([`ServerKind::from_env`]).
    pub fn server(mut self, kind: ServerKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Runs this `redis-server` binary instead of the one found on `PATH`.
    ///
    /// A bare name is looked up on `PATH`; a path is used as it is.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// How long to wait for the server to answer `PING` (default
    /// [`DEFAULT_STARTUP_TIMEOUT`]).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Passes one more command-line argument to `redis-server`, for example
    /// `.arg("--maxmemory").arg("10mb")`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Starts the server on a free port in a new temporary directory and
    /// waits until it answers `PING`.
    ///
    /// Blocks the calling thread while it waits. If the port is taken before
    /// the server binds it, a new port is tried.
    pub fn start(mut self) -> Result<RedisServer, TestingError> {
        if self.binary.is_none() {
            let kind = match self.kind {
                Some(k) => k,
                None => ServerKind::from_env()?,
            };
            self.kind = Some(kind);
        }
        let dir = make_temp_dir("redis")?;
        // From here on `server`'s Drop removes the directory on every path.
        let mut server = RedisServer {
            config: self,
            dir,
            port: 0,
            child: None,
        };
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(Launch::PortTaken(error)) => last_error = Some(error),
                Err(Launch::Failed(error)) => return Err(error),
            }
        }
        Err(last_error.unwrap_or(TestingError::PortTaken { port: server.port }))
    }
}

/// A `redis-server` child process owned by a test.
///
/// It listens on `127.0.0.1` on a port of its own, keeps its files in a
/// temporary directory of its own and saves no snapshots (`--save ""`).
/// Dropping it kills the process and removes the directory.
///
/// The methods that wait ([`start`](RedisServerBuilder::start),
/// [`stop`](Self::stop), [`restart`](Self::restart)) block the calling
/// thread; use them from multi-threaded tokio tests.
#[derive(Debug)]
pub struct RedisServer {
    config: RedisServerBuilder,
    dir: PathBuf,
    port: u16,
    child: Option<ChildEngine>,
}

enum Launch {
    /// Another process has the port; retrying (later, or elsewhere) may work.
    PortTaken(TestingError),
    Failed(TestingError),
}

impl RedisServer {
    /// Options for a new server; finish with
    /// [`start`](RedisServerBuilder::start).
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// Starts a server with the default options (no append-only file).
    pub fn start() -> Result<Self, TestingError> {
        Self::builder().start()
    }

    /// The connection URL, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port (kept across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (its log and append-only files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The OS process id, or `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildEngine::pid)
    }

    /// Whether the process is running (a frozen one counts as running).
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(ChildEngine::is_running)
    }

    /// The last lines of the server's log and of its stdout/stderr.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir)
    }

    /// A client for this server.
    pub fn client(&self) -> Result<redis::Client, TestingError> {
        redis::Client::open(self.url()).map_err(TestingError::redis("opening a client"))
    }

    /// A new multiplexed connection with the redis client's default
    /// timeouts.
    pub async fn connection(&self) -> Result<redis::aio::MultiplexedConnection, TestingError> {
        self.client()?
            .get_multiplexed_async_connection()
            .await
            .map_err(TestingError::redis("connecting"))
    }

    /// A new multiplexed connection whose commands fail after
    /// `response_timeout` (useful against a [`freeze`](Self::freeze)d server).
    pub async fn connection_with_timeout(
        &self,
        response_timeout: Duration,
    ) -> Result<redis::aio::MultiplexedConnection, TestingError> {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(response_timeout));
        self.client()?
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(TestingError::redis("connecting"))
    }

    /// Shuts the server down with `SIGTERM` and waits for it to exit
    /// (`SIGKILL` after 10 seconds). A frozen server is thawed first so it
    /// can shut down. Does nothing if it is not running.
    pub fn stop(&mut self) -> Result<(), TestingError> {
        if let Some(mut child) = self.child.take() {
            child.terminate(STOP_TIMEOUT)?;
        }
        Ok(())
    }

    /// Crashes the server with `SIGKILL` (works on a frozen server too).
    /// Writes not yet in the append-only file are lost. Does nothing if it
    /// is not running.
    pub fn kill(&mut self) -> Result<(), TestingError> {
        if let Some(mut child) = self.child.take() {
            child.kill9()?;
        }
        Ok(())
    }

    /// Starts the server again on the same port with the same directory and
    /// options, so an append-only file written before is loaded again.
    /// Stops it first ([`stop`](Self::stop)) if it is running.
    ///
    /// Keeps trying to bind the port for a few seconds, then fails with
    /// [`TestingError::PortTaken`].
    pub fn restart(&mut self) -> Result<(), TestingError> {
        self.stop()?;
        let deadline = Instant::now() + RESTART_BIND_WINDOW;
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(Launch::PortTaken(error)) => {
                    if Instant::now() >= deadline {
                        return Err(error);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(Launch::Failed(error)) => return Err(error),
            }
        }
    }

    /// Stalls the server with `SIGSTOP`: connections stay open but nothing
    /// is answered until [`thaw`](Self::thaw).
    pub fn freeze(&mut self) -> Result<(), TestingError> {
        self.running_child()?.stop()
    }

    /// Resumes a frozen server with `SIGCONT`.
    pub fn thaw(&mut self) -> Result<(), TestingError> {
        self.running_child()?.cont()
    }

    fn running_child(&mut self) -> Result<&mut ChildEngine, TestingError> {
        self.child.as_mut().ok_or(TestingError::ServerNotRunning)
    }

    fn binary(&self) -> PathBuf {
        match (&self.config.binary, self.config.kind) {
            (Some(path), _) => path.clone(),
            (None, kind) => kind.unwrap_or(ServerKind::Redis).binary(),
        }
    }

    /// The kind of server it runs (`Redis` for a binary given by path).
    pub fn kind(&self) -> ServerKind {
        self.config.kind.unwrap_or(ServerKind::Redis)
    }

    /// Spawns the process on `self.port` and waits for `PING`.
    fn launch(&mut self) -> Result<(), Launch> {
        let binary = self.binary();
        let log_sizes = log_sizes(&self.dir);
        let stdio = open_stdio_log(&self.dir).map_err(Launch::Failed)?;
        let mut command = Command::new(&binary);
        command
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join(LOG_FILE))
            .arg("--daemonize")
            .arg("no");
        if self.config.append_only {
            command
                .args(["--appendonly", "yes"])
                .args(["--appendfsync", "always"]);
        }
        command
            .args(&self.config.extra_args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio.0)
            .stderr(stdio.1);
        let child = match command.spawn() {
            Ok(child) => child,
            Err(source) if source.kind() == io::ErrorKind::NotFound => {
                return Err(Launch::Failed(match (&self.config.binary, self.kind()) {
                    (None, ServerKind::Redis) => TestingError::RedisServerNotFound,
                    (None, ServerKind::Valkey) => {
                        TestingError::ValkeyServerNotFound { path: binary }
                    }
                    (None, ServerKind::Redis8) => {
                        TestingError::Redis8ServerNotFound { path: binary }
                    }
                    (Some(_), _) => TestingError::BinaryNotFound { path: binary },
                }));
            }
            Err(source) => {
                return Err(Launch::Failed(TestingError::Spawn {
                    program: binary.display().to_string(),
                    source,
                }));
            }
        };
        let mut child = ChildEngine::from_child(child);
        match self.wait_ready(&mut child, &log_sizes) {
            Ok(()) => {
                self.child = Some(child);
                Ok(())
            }
            Err(error) => {
                // Dropping `child` kills it if it is still running.
                drop(child);
                Err(error)
            }
        }
    }

    fn wait_ready(&self, child: &mut ChildEngine, log_sizes: &[u64; 2]) -> Result<(), Launch> {
        let started = Instant::now();
        let timeout = self.config.startup_timeout;
        loop {
            if let Some(status) = child.try_status().map_err(Launch::Failed)? {
                let log_tail = log_tail(&self.dir);
                return Err(
                    if new_log_text(&self.dir, log_sizes).contains("Address already in use") {
                        Launch::PortTaken(TestingError::PortTaken { port: self.port })
                    } else {
                        Launch::Failed(TestingError::ServerExited {
                            port: self.port,
                            status,
                            log_tail,
                        })
                    },
                );
            }
            match probe(self.port) {
                Ok(Some(pid)) if pid == child.pid() => return Ok(()),
                // Someone else's server answers on our port: ours will fail
                // to bind (or already has).
                Ok(Some(_)) => {
                    return Err(Launch::PortTaken(TestingError::PortTaken {
                        port: self.port,
                    }));
                }
                Ok(None) | Err(_) => {}
            }
            if started.elapsed() >= timeout {
                return Err(Launch::Failed(TestingError::ServerNotReady {
                    port: self.port,
                    waited: timeout,
                    log_tail: log_tail(&self.dir),
                }));
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Drop of ChildEngine sends SIGKILL and reaps the process.
        self.child = None;
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Asks the server on `port` for its process id, then pings it.
///
/// `Ok(None)`: something answered but is not ready (for example still
/// loading the append-only file). `Err`: nothing answered.
fn probe(port: u16) -> redis::RedisResult<Option<u32>> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut connection = client.get_connection_with_timeout(PROBE_TIMEOUT)?;
    connection.set_read_timeout(Some(PROBE_TIMEOUT))?;
    connection.set_write_timeout(Some(PROBE_TIMEOUT))?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut connection)?;
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse::<u32>().ok());
    let Some(pid) = pid else {
        return Ok(None);
    };
    match redis::cmd("PING").query::<String>(&mut connection) {
        Ok(pong) if pong == "PONG" => Ok(Some(pid)),
        _ => Ok(None),
    }
}

fn open_stdio_log(dir: &Path) -> Result<(File, File), TestingError> {
    let path = dir.join(STDIO_FILE);
    let error = |source| TestingError::TempDir {
        dir: dir.to_path_buf(),
        source,
    };
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(error)?;
    let err = out.try_clone().map_err(error)?;
    Ok((out, err))
}

/// The current sizes of the log files, so that a launch reads only what it
/// wrote itself.
fn log_sizes(dir: &Path) -> [u64; 2] {
    [LOG_FILE, STDIO_FILE].map(|name| fs::metadata(dir.join(name)).map_or(0, |meta| meta.len()))
}

/// What the log files gained since `sizes` were taken.
fn new_log_text(dir: &Path, sizes: &[u64; 2]) -> String {
    let mut text = String::new();
    for (name, size) in [LOG_FILE, STDIO_FILE].into_iter().zip(sizes) {
        if let Ok(bytes) = fs::read(dir.join(name)) {
            let start = usize::try_from(*size)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            text.push_str(&String::from_utf8_lossy(&bytes[start..]));
        }
    }
    text
}

/// The last lines of the log file and of the captured stdout/stderr.
fn log_tail(dir: &Path) -> String {
    let mut tail = String::new();
    for name in [LOG_FILE, STDIO_FILE] {
        let Ok(text) = fs::read_to_string(dir.join(name)) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(LOG_TAIL_LINES);
        for line in &lines[start..] {
            tail.push_str("    ");
            tail.push_str(line);
            tail.push('\n');
        }
    }
    if tail.is_empty() {
        tail.push_str("    (the log is empty)\n");
    }
    tail
}

/// A new directory under the system's temporary directory, named for
/// `kind` (`redis`, `postgres`).
pub(super) fn make_temp_dir(kind: &str) -> Result<PathBuf, TestingError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("convoy-{kind}-{}-{nanos}-{n}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(TestingError::TempDir { dir: base, source }),
        }
    }
}
