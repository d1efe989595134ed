//! A real PostgreSQL server child process, with fault injection.
//!
//! [`PgServer::start`] runs `initdb` into a temporary directory and starts
//! `postgres` on a free `127.0.0.1` port (trust authentication, user
//! `postgres`), so each test owns its database server and can stop,
//! restart, kill or freeze it. PostgreSQL refuses to run as root: when the
//! test runs as root, the server binaries run as the `postgres` system user
//! (created by the Debian package), with the data directory handed to it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, User, chown};

use super::TestingError;
use super::process::{ChildEngine, free_port};
use super::server::make_temp_dir;

/// How long a start waits for the server to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop()` waits for a fast shutdown before `SIGKILL`.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
const LOG_FILE: &str = "postgres.log";
const DATA: &str = "data";
const PORT_ATTEMPTS: usize = 5;

/// A PostgreSQL server owned by a test: its own data directory, its own
/// port, killed and removed on `Drop`.
///
/// The methods block the calling thread while they wait; call them from
/// multi-threaded tokio tests.
#[derive(Debug)]
pub struct PgServer {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// The user the server runs as, when the test runs as root.
    run_as: Option<User>,
    child: Option<ChildEngine>,
}

impl PgServer {
    /// Initializes a new cluster in a temporary directory and starts it on
    /// a free port.
    ///
    /// Fails with [`TestingError::PostgresNotFound`] when the server
    /// binaries (`initdb`, `postgres`) are not installed.
    pub fn start() -> Result<PgServer, TestingError> {
        let bin = find_bindir()?;
        let dir = make_temp_dir("postgres")?;
        let run_as = if nix::unistd::geteuid().is_root() {
            Some(
                User::from_name("postgres")
                    .ok()
                    .flatten()
                    .ok_or(TestingError::PostgresUser)?,
            )
        } else {
            None
        };
        let mut server = PgServer {
            dir,
            bin,
            port: 0,
            run_as,
            child: None,
        };
        server.initdb()?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e @ TestingError::PortTaken { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(TestingError::PortTaken { port: server.port }))
    }

    /// `postgres://postgres@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        self.database_url("postgres")
    }

    /// The URL of database `name` on this server.
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory (data directory and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.join(LOG_FILE)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Runs one SQL command with `psql` against database `db` and returns
    /// what it printed (unaligned, tuples only).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, TestingError> {
        let out = Command::new(self.tool("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .arg("-d")
            .arg(self.database_url(db))
            .arg("-c")
            .arg(sql)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TestingError::Spawn {
                program: "psql".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(TestingError::Sql {
                sql: sql.to_owned(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Creates a fresh database and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String, TestingError> {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""))?;
        Ok(self.database_url(name))
    }

    /// Shuts the server down (fast shutdown: open transactions roll back)
    /// and waits for it; `SIGKILL` after 15 seconds. A frozen server is
    /// thawed first. Does nothing if it is not running.
    pub fn stop(&mut self) -> Result<(), TestingError> {
        if let Some(mut child) = self.child.take() {
            let _ = self.group_signal(&child, Signal::SIGCONT);
            let _ = self.group_signal(&child, Signal::SIGINT);
            if child.wait_timeout(STOP_TIMEOUT)?.is_none() {
                let _ = self.group_signal(&child, Signal::SIGKILL);
                child.kill9()?;
            }
        }
        Ok(())
    }

    /// Crashes the server: `SIGKILL` to the postmaster and every backend.
    /// Committed transactions survive (the write-ahead log is synced).
    pub fn kill(&mut self) -> Result<(), TestingError> {
        if let Some(mut child) = self.child.take() {
            let _ = self.group_signal(&child, Signal::SIGKILL);
            child.kill9()?;
        }
        Ok(())
    }

    /// Starts it again on the same port with the same data (stops it first
    /// if it is running).
    pub fn restart(&mut self) -> Result<(), TestingError> {
        self.stop()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Err(TestingError::PortTaken { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                // Backends of a killed server still exiting (they die a
                // moment after the postmaster, holding its shared memory).
                Err(TestingError::PostgresExited { log_tail, .. })
                    if log_tail.contains("pre-existing shared memory block")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// Stalls the server and every backend with `SIGSTOP`.
    pub fn freeze(&mut self) -> Result<(), TestingError> {
        let child = self.child.as_ref().ok_or(TestingError::ServerNotRunning)?;
        self.group_signal(child, Signal::SIGSTOP)
    }

    /// Resumes a frozen server with `SIGCONT`.
    pub fn thaw(&mut self) -> Result<(), TestingError> {
        let child = self.child.as_ref().ok_or(TestingError::ServerNotRunning)?;
        self.group_signal(child, Signal::SIGCONT)
    }

    fn group_signal(&self, child: &ChildEngine, signal: Signal) -> Result<(), TestingError> {
        let pid = child.pid();
        let raw = i32::try_from(pid).map_err(|_| TestingError::Signal {
            signal: signal.as_str(),
            pid,
            source: nix::errno::Errno::ESRCH,
        })?;
        killpg(Pid::from_raw(raw), signal).map_err(|source| TestingError::Signal {
            signal: signal.as_str(),
            pid,
            source,
        })
    }

    fn tool(&self, name: &str) -> PathBuf {
        let p = self.bin.join(name);
        if p.exists() { p } else { PathBuf::from(name) }
    }

    /// A command for a server binary, as the `postgres` user when root.
    fn server_command(&self, binary: &str) -> Command {
        let program = self.bin.join(binary);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .arg("--init-groups")
                    .arg("--reset-env")
                    .arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn initdb(&self) -> Result<(), TestingError> {
        if let Some(user) = &self.run_as {
            chown(&self.dir, Some(user.uid), Some(user.gid)).map_err(|source| {
                TestingError::TempDir {
                    dir: self.dir.clone(),
                    source: source.into(),
                }
            })?;
        }
        let out = self
            .server_command("initdb")
            .arg("-D")
            .arg(self.dir.join(DATA))
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TestingError::Spawn {
                program: "initdb".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(TestingError::PostgresInit {
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    fn launch(&mut self) -> Result<(), TestingError> {
        use std::os::unix::process::CommandExt;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG_FILE))
            .map_err(|source| TestingError::TempDir {
                dir: self.dir.clone(),
                source,
            })?;
        if let Some(user) = &self.run_as {
            let _ = chown(&self.dir.join(LOG_FILE), Some(user.uid), Some(user.gid));
        }
        let err = log.try_clone().map_err(|source| TestingError::TempDir {
            dir: self.dir.clone(),
            source,
        })?;
        let mut command = self.server_command("postgres");
        command
            .arg("-D")
            .arg(self.dir.join(DATA))
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-h", "127.0.0.1", "-k"])
            .arg(&self.dir)
            .args(["-c", "fsync=on", "-c", "max_connections=200"])
            // Commit timestamps let tests read the true commit order.
            .args(["-c", "track_commit_timestamp=on"])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let mut child = ChildEngine::spawn(&mut command).map_err(|e| match e {
            TestingError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                TestingError::PostgresNotFound
            }
            e => e,
        })?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_status()? {
                let tail = self.log_tail();
                return Err(
                    if tail.contains("could not bind") || tail.contains("already in use") {
                        TestingError::PortTaken { port: self.port }
                    } else {
                        TestingError::PostgresExited {
                            port: self.port,
                            status,
                            log_tail: tail,
                        }
                    },
                );
            }
            let ready = Command::new(self.tool("pg_isready"))
                .args(["-q", "-U", "postgres", "-d", "postgres", "-h", "127.0.0.1"])
                .args(["-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                self.child = Some(child);
                return Ok(());
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                return Err(TestingError::PostgresExited {
                    port: self.port,
                    status: child.kill9()?,
                    log_tail: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let _ = self.group_signal(child, Signal::SIGKILL);
        }
        self.child = None;
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Where the server binaries are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `PATH`.
fn find_bindir() -> Result<PathBuf, TestingError> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("postgres").exists() && dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut versions: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("postgres").exists() && d.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some(dir) = versions.pop() {
        return Ok(dir);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if dir.join("postgres").exists() && dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    Err(TestingError::PostgresNotFound)
}
