//! Child OS processes for crash and stall tests, and a free-port helper.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::TestingError;

/// How often waits poll the child for its exit.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// How long [`ChildEngine::stop`] waits for every thread to be stopped.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A process started by a test (typically a second engine instance) that the
/// test can crash, stall and resume with real signals.
///
/// Build the [`Command`] yourself: a binary built by cargo
/// (`Command::new(env!("CARGO_BIN_EXE_name"))`) or the current test binary
/// re-executed with [`current_test_command`] plus an environment variable
/// that tells the re-executed test which role to play.
///
/// The process is only ever reaped by this type, so its pid cannot be reused
/// by another process while a signal may still be sent to it.
///
/// Dropping a `ChildEngine` kills the process (`SIGKILL`) and reaps it.
#[derive(Debug)]
pub struct ChildEngine {
    child: Child,
    exited: Option<ExitStatus>,
}

impl ChildEngine {
    /// Spawns `command` and wraps the child.
    pub fn spawn(command: &mut Command) -> Result<Self, TestingError> {
        let child = command.spawn().map_err(|source| TestingError::Spawn {
            program: command.get_program().to_string_lossy().into_owned(),
            source,
        })?;
        Ok(Self::from_child(child))
    }

    /// Wraps a child the caller spawned.
    pub fn from_child(child: Child) -> Self {
        Self {
            child,
            exited: None,
        }
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The wrapped child, for example to take its `stdout`.
    ///
    /// Do not wait on it directly: use [`wait_timeout`](Self::wait_timeout),
    /// so this type knows when the process is gone.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether the process is still running (a stopped process counts as
    /// running).
    pub fn is_running(&mut self) -> bool {
        matches!(self.poll(), Ok(None))
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>, TestingError> {
        self.poll()
    }

    /// Crashes the process like `kill -9` and waits for it to be gone.
    ///
    /// Returns the exit status (the earlier one if it had already exited).
    pub fn kill9(&mut self) -> Result<ExitStatus, TestingError> {
        if let Some(status) = self.poll()? {
            return Ok(status);
        }
        self.signal(Signal::SIGKILL)?;
        self.wait()
    }

    /// Stalls the process with `SIGSTOP` (it cannot catch or ignore it) and
    /// returns once every thread of it is stopped, so a clock read after
    /// this call is later than anything the process did.
    ///
    /// Resume it with [`cont`](Self::cont).
    pub fn stop(&mut self) -> Result<(), TestingError> {
        self.signal_running(Signal::SIGSTOP)?;
        let deadline = Instant::now() + STOP_WAIT;
        while !all_threads_stopped(self.pid()) {
            if Instant::now() >= deadline {
                // Not a Linux /proc, or a thread that will not stop (in
                // uninterruptible sleep): the signal is sent all the same.
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Resumes a stalled process with `SIGCONT`.
    pub fn cont(&mut self) -> Result<(), TestingError> {
        self.signal_running(Signal::SIGCONT)
    }

    /// Asks the process to shut down with `SIGTERM`, waits up to `timeout`,
    /// then kills it with `SIGKILL`.
    ///
    /// A stopped process is resumed so that it can handle `SIGTERM`.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, TestingError> {
        if let Some(status) = self.poll()? {
            return Ok(status);
        }
        self.signal(Signal::SIGTERM)?;
        self.signal(Signal::SIGCONT)?;
        match self.wait_timeout(timeout)? {
            Some(status) => Ok(status),
            None => self.kill9(),
        }
    }

    /// Waits up to `timeout` for the process to exit on its own.
    ///
    /// Returns `None` if it is still running after `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, TestingError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn wait(&mut self) -> Result<ExitStatus, TestingError> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        let status = self.child.wait().map_err(|source| TestingError::Wait {
            pid: self.pid(),
            source,
        })?;
        self.exited = Some(status);
        Ok(status)
    }

    fn poll(&mut self) -> Result<Option<ExitStatus>, TestingError> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().map_err(|source| TestingError::Wait {
                pid: self.child.id(),
                source,
            })?;
        }
        Ok(self.exited)
    }

    fn signal_running(&mut self, signal: Signal) -> Result<(), TestingError> {
        if let Some(status) = self.poll()? {
            return Err(TestingError::ProcessExited {
                pid: self.pid(),
                status,
            });
        }
        self.signal(signal)
    }

    /// Sends `signal`. Only called while the child is not reaped, so the pid
    /// still names it (at worst a zombie, which ignores signals).
    fn signal(&self, signal: Signal) -> Result<(), TestingError> {
        send_signal(self.pid(), signal)
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in
/// `/proc/{pid}/task/*/stat`). False when `/proc` cannot tell.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // `pid (comm) S ...`: the state follows the last `)`, as comm may
        // hold anything.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state != Some("T") {
            return false;
        }
        any = true;
    }
    any
}

impl Drop for ChildEngine {
    fn drop(&mut self) {
        if let Ok(None) = self.poll() {
            let _ = self.signal(Signal::SIGKILL);
            let _ = self.wait();
        }
    }
}

fn send_signal(pid: u32, signal: Signal) -> Result<(), TestingError> {
    let error = |source| TestingError::Signal {
        signal: signal.as_str(),
        pid,
        source,
    };
    let raw = i32::try_from(pid).map_err(|_| error(nix::errno::Errno::ESRCH))?;
    kill(Pid::from_raw(raw), signal).map_err(error)
}

/// A port on `127.0.0.1` that was free a moment ago.
///
/// Found by binding port 0 and releasing it, so another process may take it
/// before you use it: be ready to retry with a new one.
pub fn free_port() -> Result<u16, TestingError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|source| TestingError::FreePort { source })?;
    let port = listener
        .local_addr()
        .map_err(|source| TestingError::FreePort { source })?
        .port();
    Ok(port)
}

/// A command that re-executes the current test binary and runs only the
/// test named `test_name` (its full path inside the test binary, for example
/// `child_role` or `module::child_role`).
///
/// Add an environment variable that the named test checks to decide whether
/// it plays the child role, then spawn the command with
/// [`ChildEngine::spawn`]. Output is not captured (`--nocapture`).
pub fn current_test_command(test_name: &str) -> Result<Command, TestingError> {
    let exe = std::env::current_exe().map_err(|source| TestingError::CurrentExe { source })?;
    let mut command = Command::new(exe);
    command.args([test_name, "--exact", "--nocapture", "--test-threads=1"]);
    Ok(command)
}
