//! The Lua scripts (`.lua` files in `lua/`), each with one typed
//! binding in this folder: an argument struct that puts every key in
//! `KEYS` and every value in `ARGV` in the order the script's header
//! lists, and a reply enum. Call sites never index `KEYS`/`ARGV` or match
//! status codes by hand.
//!
//! # Replies
//!
//! Every script replies with one array whose first element is its status,
//! followed by its values:
//!
//! | status | meaning |
//! | --- | --- |
//! | `1` | done |
//! | `2` | a read's check moved entries another consumer held pending (a replaced owner's unfenced read) to the caller: read its pending entries first |
//! | `0` | nothing done (the unit is held, not idle, the state changed) |
//! | `-1` | refused by the fence: another owner holds the lease |
//! | `-2` | refused by the fence: the lease is gone |
//! | `-3` | refused: the caller's liveness lapsed (or another process renews it) |
//! | `-4` | a key that must be a stream holds another type |
//! | a word | the operators' scripts (`head_action`, `replay`) name their outcomes (`ok`, `empty`, `changed`, ...) |
//!
//! The fence check (`lua/fence.lua`) is prepended to every fenced script.

pub(crate) mod ack;
pub(crate) mod acquire;
pub(crate) mod claim;
pub(crate) mod dead_letter;
pub(crate) mod fail;
pub(crate) mod head_action;
pub(crate) mod plain_ack;
pub(crate) mod publish;
pub(crate) mod read;
pub(crate) mod reap;
pub(crate) mod release;
pub(crate) mod replay;
pub(crate) mod rest;
pub(crate) mod save_state;

use std::borrow::Cow;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, Script, ToRedisArgs, Value};

use super::connection::{Refusals, refused};
use super::reply::{int, text};
use super::unit::Unit;
use convoy_core::error::Error;

/// Every script convoy runs.
pub(crate) struct Scripts {
    pub(crate) publish: Script,
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) read: Script,
    pub(crate) verify: Script,
    pub(crate) ack: Script,
    pub(crate) fail: Script,
    pub(crate) claim: Script,
    pub(crate) reap: Script,
    pub(crate) rest: Script,
    pub(crate) plain_ack: Script,
    pub(crate) dead_letter: Script,
    pub(crate) save_state: Script,
    pub(crate) head_action: Script,
    pub(crate) replay: Script,
    pub(crate) replay_head: Script,
}

#[cfg(feature = "testing")]
impl Scripts {
    /// A script by the stem of its file in `lua/` (for
    /// [`script_sha`](crate::script_sha)).
    pub(crate) fn by_name(&self, name: &str) -> Option<&Script> {
        Some(match name {
            "publish" => &self.publish,
            "acquire" => &self.acquire,
            "release" => &self.release,
            "read" => &self.read,
            "verify" => &self.verify,
            "ack" => &self.ack,
            "fail" => &self.fail,
            "claim" => &self.claim,
            "reap" => &self.reap,
            "rest" => &self.rest,
            "plain_ack" => &self.plain_ack,
            "dead_letter" => &self.dead_letter,
            "save_state" => &self.save_state,
            "head_action" => &self.head_action,
            "replay" => &self.replay,
            "replay_head" => &self.replay_head,
            _ => return None,
        })
    }
}

/// The fence check, prepended to every fenced script.
const FENCE: &str = include_str!("../lua/fence.lua");
/// Helpers of the fenced scripts that read or move a unit's entries.
const ENTRIES: &str = include_str!("../lua/entries.lua");

/// A script that starts with the fence check and the entries' helpers.
fn fenced(body: &str) -> Script {
    Script::new(&format!("{FENCE}\n{ENTRIES}\n{body}"))
}

/// A script that starts with the fence check alone: Redis makes a script's
/// functions again at every call, and the acknowledgement, run for nearly
/// every event, needs none of the entries' helpers.
fn fence_only(body: &str) -> Script {
    Script::new(&format!("{FENCE}\n{body}"))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    publish: Script::new(include_str!("../lua/publish.lua")),
    acquire: Script::new(include_str!("../lua/acquire.lua")),
    release: Script::new(include_str!("../lua/release.lua")),
    read: fenced(include_str!("../lua/read.lua")),
    verify: fenced(include_str!("../lua/verify.lua")),
    ack: fence_only(include_str!("../lua/ack.lua")),
    fail: fenced(include_str!("../lua/fail.lua")),
    claim: fenced(include_str!("../lua/claim.lua")),
    reap: fenced(include_str!("../lua/reap.lua")),
    rest: fenced(include_str!("../lua/rest.lua")),
    plain_ack: Script::new(include_str!("../lua/plain_ack.lua")),
    dead_letter: Script::new(include_str!("../lua/dead_letter.lua")),
    save_state: Script::new(include_str!("../lua/save_state.lua")),
    head_action: fenced(include_str!("../lua/head_action.lua")),
    replay: Script::new(include_str!("../lua/replay.lua")),
    replay_head: Script::new(include_str!("../lua/replay_head.lua")),
});

/// Why a fenced script refused to act (the codes of `fence.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another owner holds the lease (`-1`).
    FencedOut,
    /// The lease is gone: an operator's `--force`, or Redis lost its state
    /// (`-2`).
    LeaseGone,
    /// This instance's liveness lapsed (or another process renewed it under
    /// the same instance id) (`-3`).
    NotAlive,
}

impl Refusal {
    /// The refusal a status code stands for, if it is one.
    pub(crate) fn from_code(code: i64) -> Option<Refusal> {
        match code {
            -1 => Some(Refusal::FencedOut),
            -2 => Some(Refusal::LeaseGone),
            -3 => Some(Refusal::NotAlive),
            _ => None,
        }
    }

    /// What it means, for logs.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Refusal::FencedOut => "fenced out: another owner holds the unit",
            Refusal::LeaseGone => {
                "the unit's lease vanished while this instance held it (an operator's --force, or Redis lost its state)"
            }
            Refusal::NotAlive => {
                "this instance's liveness lapsed (stalled or cut off past lease_ttl_ms, or another process runs under the same instance id)"
            }
        }
    }
}

/// Who calls a fenced script on a unit: what the fence checks (the lease
/// still holds `token`, and the owner's liveness key `alive` still holds
/// the `incarnation` the lease was taken in).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'a> {
    pub(crate) unit: &'a Unit,
    /// The fence token `{owner}:{generation}`, also the consumer name.
    pub(crate) token: &'a str,
    /// The owner's liveness key.
    pub(crate) alive: &'a str,
    /// The owner's incarnation when it took the lease.
    pub(crate) incarnation: &'a str,
}

/// What a script says happened: the first element of its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// `1`.
    Done,
    /// `0`.
    NotDone,
    /// `2` (the reads).
    MovedBack,
    /// `-1`, `-2`, `-3`.
    Refused(Refusal),
    /// `-4`.
    NotAStream,
    /// An operator script's outcome.
    Word(String),
}

/// A script's reply: its status and the values after it.
#[derive(Debug)]
pub(crate) struct Reply {
    script: &'static str,
    pub(crate) status: Status,
    raw: Value,
}

impl Reply {
    fn parse(script: &'static str, raw: Value) -> Result<Reply, Error> {
        let status = match &raw {
            Value::Array(items) => match items.first() {
                Some(Value::Int(1)) => Some(Status::Done),
                Some(Value::Int(0)) => Some(Status::NotDone),
                Some(Value::Int(-4)) => Some(Status::NotAStream),
                Some(Value::Int(2)) => Some(Status::MovedBack),
                Some(Value::Int(code)) => Refusal::from_code(*code).map(Status::Refused),
                Some(v @ (Value::BulkString(_) | Value::SimpleString(_))) => {
                    text(v).map(Status::Word)
                }
                _ => None,
            },
            _ => None,
        };
        match status {
            Some(status) => Ok(Reply {
                script,
                status,
                raw,
            }),
            None => Err(unexpected(script, &raw)),
        }
    }

    /// The `i`th value after the status.
    pub(crate) fn value(&self, i: usize) -> Option<&Value> {
        match &self.raw {
            Value::Array(items) => items.get(i + 1),
            _ => None,
        }
    }

    /// Takes the `i`th value after the status out of the reply (leaving
    /// `Nil` in its place), so what it holds moves rather than copies.
    pub(crate) fn take(&mut self, i: usize) -> Option<Value> {
        match &mut self.raw {
            Value::Array(items) => items.get_mut(i + 1).map(std::mem::take),
            _ => None,
        }
    }

    /// The values after the status.
    pub(crate) fn values(&self) -> &[Value] {
        match &self.raw {
            Value::Array(items) => items.get(1..).unwrap_or_default(),
            _ => &[],
        }
    }

    /// The `i`th value as text (`""` when absent).
    pub(crate) fn text(&self, i: usize) -> String {
        self.value(i).and_then(text).unwrap_or_default()
    }

    /// The `i`th value as an integer (0 when absent).
    pub(crate) fn int(&self, i: usize) -> i64 {
        self.value(i).and_then(int).unwrap_or(0)
    }

    /// The error for a reply the binding does not expect.
    pub(crate) fn unexpected(&self) -> Error {
        unexpected(self.script, &self.raw)
    }
}

fn unexpected(script: &'static str, raw: &Value) -> Error {
    Error::UnexpectedReply {
        script,
        reply: format!("{raw:?}"),
    }
}

/// A script call being put together: its keys and its values, each list
/// kept in one buffer, sent as one `EVALSHA`. (`redis::ScriptInvocation`
/// allocates a buffer per key and per value, and copies them all again into
/// the command: for an acknowledgement call that was about a dozen heap
/// allocations per acknowledged unit.) A call that knows how many keys it
/// has and gives every one before its first value
/// ([`Invocation::keys_first`]) is written as the command itself, copied
/// no more.
pub(crate) struct Invocation {
    script: &'static Script,
    built: Built,
}

/// How an [`Invocation`] is being written.
enum Built {
    /// Keys and values apart, put together by [`Invocation::command`].
    Apart { keys: Cmd, args: Cmd },
    /// The command itself: `EVALSHA`, the hash, the key count `declared`,
    /// the `written` keys so far, then the values.
    Whole {
        cmd: Cmd,
        declared: usize,
        written: usize,
    },
}

impl Invocation {
    /// A call of `script`, with no keys or values yet.
    pub(crate) fn new(script: &'static Script) -> Self {
        Invocation {
            script,
            built: Built::Apart {
                keys: Cmd::new(),
                args: Cmd::new(),
            },
        }
    }

    /// A call of `script` with `keys` keys, every one of them given before
    /// the first value, and room for about `args` values of `bytes` bytes:
    /// written as the command itself. (Another number of keys, or a key
    /// after a value, still makes the right command, at the cost of a
    /// copy.)
    pub(crate) fn keys_first(
        script: &'static Script,
        keys: usize,
        args: usize,
        bytes: usize,
    ) -> Self {
        let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + keys * KEY_BYTES + bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Invocation {
            script,
            built: Built::Whole {
                cmd,
                declared: keys,
                written: 0,
            },
        }
    }

    /// Appends a key (`KEYS[i]`; one per element for a list).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        if matches!(&self.built, Built::Whole { cmd, written, .. } if cmd.args_iter().len() > 3 + written)
        {
            // A key after a value.
            self.apart();
        }
        match &mut self.built {
            Built::Apart { keys, .. } => {
                keys.arg(key);
            }
            Built::Whole { cmd, written, .. } => {
                let before = cmd.args_iter().len();
                cmd.arg(key);
                *written += cmd.args_iter().len() - before;
            }
        }
        self
    }

    /// Appends a value (`ARGV[i]`; one per element for a list).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        if matches!(&self.built, Built::Whole { declared, written, .. } if written != declared) {
            // Not the keys the call was written for.
            self.apart();
        }
        match &mut self.built {
            Built::Apart { args, .. } => {
                args.arg(arg);
            }
            Built::Whole { cmd, .. } => {
                cmd.arg(arg);
            }
        }
        self
    }

    /// Turns a call written as the command back into keys and values
    /// apart.
    fn apart(&mut self) {
        let Built::Whole { cmd, written, .. } = &self.built else {
            return;
        };
        let (mut keys, mut args) = (Cmd::new(), Cmd::new());
        // After `EVALSHA`, the hash and the key count.
        for (i, a) in cmd.args_iter().enumerate().skip(3) {
            if let redis::Arg::Simple(bytes) = a {
                if i < 3 + written {
                    keys.arg(bytes);
                } else {
                    args.arg(bytes);
                }
            }
        }
        self.built = Built::Apart { keys, args };
    }

    /// The `EVALSHA` command: the script's hash, the key count, the keys,
    /// the values.
    fn command(&self) -> Cow<'_, Cmd> {
        match &self.built {
            Built::Whole {
                cmd,
                declared,
                written,
            } if written == declared => Cow::Borrowed(cmd),
            // Keys only, not as many as declared.
            Built::Whole { cmd, written, .. } => {
                Cow::Owned(evalsha(self.script, *written, cmd.args_iter().skip(3)))
            }
            Built::Apart { keys, args } => Cow::Owned(evalsha(
                self.script,
                keys.args_iter().len(),
                keys.args_iter().chain(args.args_iter()),
            )),
        }
    }

    /// The command, without a copy where it was written as one (for a
    /// pipeline, which keeps its commands).
    fn into_command(self) -> Cmd {
        match self.built {
            Built::Whole {
                cmd,
                declared,
                written,
            } if declared == written => cmd,
            _ => self.command().into_owned(),
        }
    }
}

/// `EVALSHA` of `script` with `keys` keys, then `args`: the keys and the
/// values. (Keys and values are plain arguments: `Arg::Cursor` is `SCAN`'s,
/// never one of them.)
fn evalsha<'a>(
    script: &Script,
    keys: usize,
    args: impl Iterator<Item = redis::Arg<&'a [u8]>> + Clone,
) -> Cmd {
    let mut cmd = Cmd::with_capacity(
        3 + args.clone().count(),
        64 + args.clone().map(arg_len).sum::<usize>(),
    );
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    for a in args {
        if let redis::Arg::Simple(bytes) = a {
            cmd.arg(bytes);
        }
    }
    cmd
}

/// About how long a key's name is, for [`Invocation::keys_first`].
const KEY_BYTES: usize = 48;

/// The length of one argument of a command being put together.
fn arg_len(a: redis::Arg<&[u8]>) -> usize {
    match a {
        redis::Arg::Simple(bytes) => bytes.len(),
        _ => 0,
    }
}

/// Whether Redis did not know the script (restarted, flushed, or a new
/// node): it is loaded and the call sent again.
fn no_script(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Runs a prepared invocation of `script`; `doing` says what for errors.
async fn call(
    script: &'static str,
    inv: &Invocation,
    conn: &mut (impl ConnectionLike + Send),
    doing: &str,
) -> Result<Reply, Error> {
    let cmd = inv.command();
    // A script Redis refused before running it (a cluster's redirection
    // during a failover or slot migration, a replica's READONLY) is sent
    // again for a while; one Redis did not know is loaded and sent again;
    // any other outcome is the call's.
    let mut refusals = Refusals::new();
    let mut loaded = false;
    let raw: Value = loop {
        match cmd.query_async(conn).await {
            Err(e) if refused(&e) => {
                if !refusals.again(&e).await {
                    return Err(Error::redis(doing, e));
                }
            }
            Err(e) if !loaded && no_script(&e) => {
                loaded = true;
                load(script, inv.script, conn).await?;
            }
            r => break r.map_err(|e| Error::redis(doing, e))?,
        }
    };
    Reply::parse(script, raw)
}

/// Loads `code`, the script named `script` (on a cluster, on every
/// master).
async fn load(
    script: &'static str,
    code: &Script,
    conn: &mut (impl ConnectionLike + Send),
) -> Result<(), Error> {
    code.load_async(conn)
        .await
        .map(drop)
        .map_err(|e| Error::redis(format!("failed to load the {script} script"), e))
}

/// Replicas that must have what a script wrote before it counts as done
/// (`[broker] wait_replicas`): how many, and how long to wait (ms).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replicated {
    pub(crate) replicas: u32,
    pub(crate) timeout_ms: u64,
}

impl Replicated {
    /// What a publish waits for (`wait_replicas`; none when 0).
    pub(crate) fn publishing(b: &convoy_core::config::BrokerConfig) -> Option<Self> {
        (b.wait_replicas > 0).then_some(Replicated {
            replicas: b.wait_replicas,
            timeout_ms: b.wait_timeout_ms,
        })
    }

    /// What an acknowledgement waits for (the same, with `wait_acks`).
    pub(crate) fn acknowledging(b: &convoy_core::config::BrokerConfig) -> Option<Self> {
        Self::publishing(b).filter(|_| b.wait_acks)
    }
}

/// [`call`], then, with `wait`, `WAIT` in one pipeline with the script, on
/// the connection that wrote (a `WAIT` on another connection would count
/// replicas without covering the write): a script that ran but reached
/// fewer replicas in time fails with [`Error::NotReplicated`] (its caller
/// sends it again; convoy's scripts are idempotent).
async fn call_replicated(
    script: &'static str,
    inv: &Invocation,
    conn: &mut (impl ConnectionLike + Send),
    doing: &str,
    wait: Option<Replicated>,
) -> Result<Reply, Error> {
    let Some(w) = wait else {
        return call(script, inv, conn, doing).await;
    };
    let mut pipe = redis::pipe();
    pipe.add_command(inv.command().into_owned())
        .cmd("WAIT")
        .arg(w.replicas)
        .arg(w.timeout_ms);
    let mut refusals = Refusals::new();
    let mut loaded = false;
    let (raw, acked) = loop {
        let sent: redis::RedisResult<(Value, i64)> = pipe.query_async(conn).await;
        match sent {
            Ok(r) => break r,
            Err(e) if refused(&e) => {
                if !refusals.again(&e).await {
                    return Err(Error::redis(doing, e));
                }
            }
            Err(e) if !loaded && no_script(&e) => {
                loaded = true;
                load(script, inv.script, conn).await?;
            }
            Err(e) => return Err(Error::redis(doing, e)),
        }
    };
    let reply = Reply::parse(script, raw)?;
    let acked = acked.max(0) as u32;
    if reply.status == Status::Done && acked < w.replicas {
        return Err(Error::NotReplicated {
            wanted: w.replicas,
            acked,
        });
    }
    Ok(reply)
}

#[cfg(all(test, feature = "testing"))]
pub(crate) mod tests;
