//! The command line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const AFTER_HELP: &str = "\
Connection: --redis-url, else $CONVOY_REDIS_URL, else [broker] url of --config
as the engine reads it: the file with the engine's environment overrides
($CONVOY_BROKER_URL, and $CONVOY__SECTION__KEY for any key, for example
$CONVOY__BROKER__URL or $CONVOY__SERVER__PRIORITY_LANES__BACKFILL_SUFFIX).
redis://host:port/ (rediss:// for TLS), or a Redis Cluster by one or more of its
nodes, redis+cluster://host1:port1,host2:port2/ (rediss+cluster:// for TLS).
The outbox commands: --postgres-url, else $CONVOY_POSTGRES_URL, else [outbox]
postgres_url of --config (and its schema and table), overrides applied.

Exit codes: 0 done; 1 refused, declined or failed (nothing was changed unless
the message says so); 2 Redis (or the outbox's PostgreSQL) cannot be reached;
64 bad arguments.";

/// Inspect and unwedge convoy's per-key partitions on Redis.
///
/// A partition halts when its head event fails past `max_retries`: the head
/// stays pending and nothing behind it runs. Look at it with `inspect`, then
/// `skip` it or move it to the key's dead letter stream with `dead-letter`;
/// the owner resumes with the next event, in order. `outbox` shows the
/// PostgreSQL outbox's backlog and abandoned rows, and retries or discards
/// them. Every action is recorded in an audit stream (a partition's in its
/// shard's `{s}convoy:audit`, the outbox's in `convoy:audit`).
#[derive(Debug, Parser)]
#[command(name = "convoy", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Where Redis is and who is acting.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Connection and identity options (accepted before or after the command).
#[derive(Debug, Args)]
pub struct Connection {
    /// Redis URL: redis:// or rediss:// (user, password and db in the
    /// URL), or redis+cluster://host1:port1,host2:port2/ for a Redis
    /// Cluster (rediss+cluster:// with TLS).
    #[arg(
        long,
        global = true,
        env = "CONVOY_REDIS_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub redis_url: Option<String>,
    /// The domain configuration: broker URL, TLS CA, backfill lane suffix,
    /// the outbox (`[outbox] postgres_url`, `schema`, `table`).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        default_value = "domain.toml"
    )]
    pub config: PathBuf,
    /// Who is acting, recorded in the audit stream [default: $USER, else
    /// $LOGNAME, else uid N at the host].
    #[arg(long, global = true, value_name = "NAME")]
    pub operator: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List a category's live partitions for every handler: owner,
    /// generation, lease left, length, pending, lag, halt; with totals.
    Partitions(PartitionsArgs),
    /// Show a partition's head event (decoded), its delivery count, the
    /// unit's attempts and last error.
    Inspect(InspectArgs),
    /// Acknowledge a halted partition's head without running it; the
    /// partition resumes with its next event.
    Skip(HeadArgs),
    /// Move a halted partition's head to the key's dead letter stream
    /// (`{s}{category}:{key}:dlq`, `s` the key's shard) and acknowledge
    /// it; the partition resumes with its next event.
    DeadLetter(HeadArgs),
    /// Run a halted partition's head again, in place, after fixing what
    /// made it fail: the halt and the head's failure count are cleared and
    /// nothing is acknowledged, so the owner runs that same head (as its
    /// first attempt) and then the events behind it: the key's order is
    /// kept (skip and dead-letter move past the head instead). With
    /// `--all-halted` and `--handler`, every partition of the category
    /// halted for that handler, after one confirmation.
    Retry(RetryArgs),
    /// List the gaps `on_poison = "dead_letter"` recorded (a poisoned
    /// head moved to its key's dead letters while the key went on): key,
    /// handler, skipped entry and message id, reason, dead letter id. With
    /// `--ack` and a key, acknowledge the key's gap once reconciled (the
    /// record is cleared and audited; the dead letter stays).
    Gaps(GapsArgs),
    /// List dead letters: the key's `{s}{category}:{key}:dlq` with a key,
    /// else the category's `{s}{category}:dlq` (ordinary handlers').
    Dlq(DlqArgs),
    /// Hold a key (or, with `--prefix`, every key starting so: a tenant's,
    /// including keys that appear later) of a category on purpose, for one
    /// handler (`--handler`) or all: its owner starts no new event of it
    /// (the event in flight finishes) until `convoy resume`; it keeps its
    /// place and its lease, and the pause survives restarts and owner
    /// changes. Audited.
    Pause(PauseArgs),
    /// Lift a pause (`convoy pause`, same key or prefix and handler): the
    /// key goes on with its next event, in order. Audited.
    Resume(PauseArgs),
    /// List the pauses of a category's keys and prefixes: handler, key or
    /// prefix, reason, who, since when.
    Pauses(PausesArgs),
    /// Put a dead letter back into its partition, on purpose, for the
    /// handler that dead-lettered it (the other handlers acknowledge it
    /// without running it; `--all-handlers` names them all). `--at tail`
    /// (the default): after the events already in the partition; it runs
    /// out of its original order. `--at head`: before every event the handler that
    /// dead-lettered it (or --handler) has not finished, so the key's order
    /// is restored (after a mistaken dead-letter); refused when another
    /// handler already read those events, or when the partition has an
    /// event in flight and is not halted on it (unless --force).
    Replay(ReplayArgs),
    /// Print the least-privilege Redis ACL rule for a domain: the
    /// `ACL SETUSER` command of a user limited to the categories' keys,
    /// convoy's own keys and the commands convoy runs (for the engines,
    /// publishers and this command line). Needs no connection.
    Acl(AclArgs),
    /// The PostgreSQL outbox: backlog, oldest pending age, abandoned rows
    /// with their reasons; `retry` or `discard` an abandoned row.
    Outbox(OutboxArgs),
    /// Serve the operator page in the browser: every category, partition
    /// and key live and searchable, with the same confirmed, fenced and
    /// audited head actions (skip, dead-letter, retry, retry all halted,
    /// replay). Loopback only unless authentication is configured: a token
    /// (--token-file, or $CONVOY_WEB_TOKEN) or basic credentials
    /// (--basic-file with `user:password` lines, or $CONVOY_WEB_BASIC),
    /// never given on the command line. --operator (or $USER) is the audit
    /// identity without basic credentials.
    Serve(ServeArgs),
    /// Show the latest operator actions (every shard's `{s}convoy:audit`
    /// and `convoy:audit`, merged by time).
    Audit(AuditArgs),
}

/// Arguments of `partitions`.
#[derive(Debug, Args)]
pub struct PartitionsArgs {
    /// The category (aggregate stream name), e.g. `order`.
    pub category: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show each key whole, in hexadecimal (its UTF-8 bytes), to name
    /// it with `--key-hex` (the table otherwise shows keys escaped and
    /// cut to fit).
    #[arg(long)]
    pub key_hex: bool,
}

/// Arguments of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The partition.
    #[command(flatten)]
    pub partition: PartitionArg,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gaps`.
#[derive(Debug, Args)]
pub struct GapsArgs {
    /// The category.
    pub category: String,
    /// Only this partition key.
    pub key: Option<String>,
    /// KEY is hexadecimal: the key's UTF-8 bytes.
    #[arg(long, requires = "key")]
    pub key_hex: bool,
    /// The handler (consumer group), for `--ack`.
    #[command(flatten)]
    pub handler: HandlerArg,
    /// Acknowledge the key's gap.
    #[arg(long, requires = "key")]
    pub ack: bool,
    /// Do not ask for confirmation (`--ack`).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `dlq`.
#[derive(Debug, Args)]
pub struct DlqArgs {
    /// The category.
    pub category: String,
    /// The partition key.
    pub key: Option<String>,
    /// KEY is hexadecimal: the key's UTF-8 bytes.
    #[arg(long, requires = "key")]
    pub key_hex: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The category.
    pub category: String,
    /// The partition key.
    #[command(flatten)]
    pub key: KeyArg,
    /// The dead letter's id (from `convoy dlq`).
    pub entry_id: String,
    /// Where it goes: `tail` or `head`.
    #[arg(long, value_parser = ["tail", "head"], default_value = "tail")]
    pub at: String,
    /// The handler it is replayed to (with `--at head`: the one it goes
    /// before the events of); by default the one that dead-lettered it.
    /// The other handlers acknowledge it without running it.
    #[command(flatten)]
    pub handler: HandlerArg,
    /// Replay it to every handler of the category (at the tail): each one
    /// that handled the event already runs it again, unless its effects
    /// are exactly-once by the event's origin (`AppliedEvents`). The
    /// confirmation names them.
    #[arg(long, conflicts_with = "handler")]
    pub all_handlers: bool,
    /// With `--at head`: fence a running owner out first.
    #[arg(long)]
    pub force: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Arguments of `pause` and `resume`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The category.
    pub category: String,
    /// The partition key (hexadecimal with --key-hex); or --prefix.
    #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
    pub key: Option<String>,
    /// KEY is hexadecimal: the key's UTF-8 bytes.
    #[arg(long, requires = "key")]
    pub key_hex: bool,
    /// Every key that starts with this (a tenant's), including keys that
    /// appear after the pause.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Only this handler (consumer group), by full name or last `::`
    /// segment; by default every handler of the category.
    #[command(flatten)]
    pub handler: HandlerArg,
    /// Why (with `pause`), shown beside the paused key.
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Arguments of `pauses`.
#[derive(Debug, Args)]
pub struct PausesArgs {
    /// The category.
    pub category: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `acl`.
#[derive(Debug, Args)]
pub struct AclArgs {
    /// Every category of the domain (aggregate stream names).
    #[arg(required = true, value_name = "CATEGORY")]
    pub categories: Vec<String>,
    /// The Redis user's name.
    #[arg(long, default_value = "convoy", value_name = "NAME")]
    pub user: String,
}

/// Arguments of `audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// How many records.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `convoy serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on; a non-loopback one needs authentication.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
    pub listen: std::net::SocketAddr,
    /// Show everything, act on nothing: actions are hidden and refused
    /// (HTTP 405).
    #[arg(long)]
    pub read_only: bool,
    /// Hide event payloads (they may hold personal data).
    #[arg(long)]
    pub hide_payloads: bool,
    /// A file whose first line is the bearer token (at least 16
    /// characters); else $CONVOY_WEB_TOKEN.
    #[arg(long, value_name = "FILE", conflicts_with = "basic_file")]
    pub token_file: Option<PathBuf>,
    /// A file of `user:password` lines for basic authentication; else
    /// $CONVOY_WEB_BASIC (`user:password`).
    #[arg(long, value_name = "FILE")]
    pub basic_file: Option<PathBuf>,
    /// Also answer to this `Host` (name:port) without authentication
    /// (loopback names always are).
    #[arg(long, value_name = "HOST")]
    pub allowed_host: Vec<String>,
    /// Seconds between two live refreshes of an open page (at least 1).
    #[arg(long, default_value_t = 2)]
    pub live_seconds: u64,
    /// Seconds between two background snapshots of every partition (for
    /// sorting by lag and filtering by state).
    #[arg(long, default_value_t = 30)]
    pub snapshot_seconds: u64,
    /// At most this many partitions read per second by the snapshot.
    #[arg(long, default_value_t = 20_000)]
    pub snapshot_rate: usize,
}

/// `convoy outbox [retry|discard ID]`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct OutboxArgs {
    /// The outbox's database (`postgres://user:password@host/db`).
    #[arg(
        long,
        global = true,
        env = "CONVOY_POSTGRES_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub postgres_url: Option<String>,
    /// How many abandoned rows to list, the oldest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Retry or discard an abandoned row (without: show the outbox).
    #[command(subcommand)]
    pub action: Option<OutboxAction>,
}

/// What to do with an abandoned outbox row.
#[derive(Debug, Subcommand)]
pub enum OutboxAction {
    /// Make an abandoned row pending again: the relay publishes it after
    /// the rows of its key published meanwhile (or abandons it again if
    /// its key is still invalid).
    Retry(RowArgs),
    /// Delete an abandoned row: its event is never published.
    Discard(RowArgs),
}

/// An abandoned outbox row.
#[derive(Debug, Args)]
pub struct RowArgs {
    /// The row's id (from `convoy outbox`).
    pub id: u64,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// `--handler`.
#[derive(Debug, Args)]
pub struct HandlerArg {
    /// The handler (consumer group), by full name or last `::` segment;
    /// optional when the category has one handler, or one halted for the
    /// key.
    #[arg(long, value_name = "NAME")]
    pub handler: Option<String>,
}

/// A partition key argument: as text, or as the hexadecimal of its UTF-8
/// bytes with `--key-hex` (for keys a shell cannot pass, such as one with
/// a NUL or a newline).
#[derive(Debug, Args)]
pub struct KeyArg {
    /// The partition key, e.g. a client id (hexadecimal with --key-hex).
    pub key: String,
    /// KEY is hexadecimal: the key's UTF-8 bytes (`convoy partitions
    /// CATEGORY --key-hex` lists keys so).
    #[arg(long)]
    pub key_hex: bool,
}

impl KeyArg {
    /// The key itself.
    pub fn value(&self) -> Result<String, String> {
        key_value(&self.key, self.key_hex)
    }
}

/// `key`, decoded from hexadecimal when `hex`.
pub fn key_value(key: &str, hex: bool) -> Result<String, String> {
    if !hex {
        return Ok(key.to_owned());
    }
    let digits: Vec<u8> = key.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!(
            "--key-hex: {} hexadecimal digits: give two per byte",
            digits.len()
        ));
    }
    let mut bytes = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks(2) {
        let hex = std::str::from_utf8(pair).unwrap_or("??");
        let byte = u8::from_str_radix(hex, 16)
            .map_err(|_| format!("--key-hex: {hex:?} is not a hexadecimal byte"))?;
        bytes.push(byte);
    }
    String::from_utf8(bytes).map_err(|_| {
        "--key-hex: the bytes are not UTF-8; convoy's partition keys are UTF-8 text".to_owned()
    })
}

/// An optional `key`, decoded from hexadecimal when `hex`.
pub fn optional_key(key: Option<&str>, hex: bool) -> Result<Option<String>, String> {
    key.map(|k| key_value(k, hex)).transpose()
}

/// Arguments of `retry`: one partition's, or `--all-halted`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The category.
    pub category: String,
    /// The partition key, e.g. a client id (hexadecimal with --key-hex);
    /// not with --all-halted.
    #[arg(required_unless_present = "all_halted", conflicts_with = "all_halted")]
    pub key: Option<String>,
    /// KEY is hexadecimal: the key's UTF-8 bytes.
    #[arg(long, requires = "key")]
    pub key_hex: bool,
    /// The handler (consumer group); required with --all-halted.
    #[command(flatten)]
    pub handler: HandlerArg,
    /// Act on a partition that is not halted (on its head): its owner is
    /// fenced out first, and the next owner runs the head again.
    #[arg(long, conflicts_with = "all_halted")]
    pub force: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Every partition of the category halted for --handler, each on the
    /// head it is halted on (never forced), after one confirmation.
    #[arg(long, requires = "handler")]
    pub all_halted: bool,
}

impl RetryArgs {
    /// One partition's retry as a head action (`None` with --all-halted).
    pub fn one(&self) -> Option<HeadArgs> {
        Some(HeadArgs {
            partition: PartitionArg {
                category: self.category.clone(),
                key: KeyArg {
                    key: self.key.clone()?,
                    key_hex: self.key_hex,
                },
                handler: HandlerArg {
                    handler: self.handler.handler.clone(),
                },
            },
            force: self.force,
            yes: self.yes,
        })
    }
}

/// One partition: its category, its key, and the handler (consumer group)
/// reading it (optional when only one does).
#[derive(Debug, Args)]
pub struct PartitionArg {
    /// The category.
    pub category: String,
    /// The partition key, e.g. a client id.
    #[command(flatten)]
    pub key: KeyArg,
    /// The handler.
    #[command(flatten)]
    pub handler: HandlerArg,
}

/// Arguments of `skip`, `dead-letter` and `retry`.
#[derive(Debug, Args)]
pub struct HeadArgs {
    /// The partition.
    #[command(flatten)]
    pub partition: PartitionArg,
    /// Act on a partition that is not halted (on its head): its owner is
    /// fenced out first, and the event it has in flight may still take
    /// effect.
    #[arg(long)]
    pub force: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("convoy").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn partitions_with_json_and_global_options_anywhere() {
        let cli = parse(&[
            "--redis-url",
            "redis://h/0",
            "partitions",
            "order",
            "--json",
            "--operator",
            "alice",
        ])
        .expect("parses");
        assert_eq!(cli.conn.redis_url.as_deref(), Some("redis://h/0"));
        assert_eq!(cli.conn.operator.as_deref(), Some("alice"));
        assert_eq!(cli.conn.config, PathBuf::from("domain.toml"));
        match cli.command {
            Command::Partitions(PartitionsArgs {
                category,
                json,
                key_hex,
            }) => {
                assert_eq!(category, "order");
                assert!(json && !key_hex);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn skip_and_dead_letter_flags() {
        let cli = parse(&[
            "skip",
            "order",
            "acme",
            "--handler",
            "Ledger",
            "--force",
            "-y",
        ])
        .expect("parses");
        let Command::Skip(a) = cli.command else {
            panic!("not skip")
        };
        assert_eq!(
            (
                a.partition.category.as_str(),
                a.partition.key.value().as_deref()
            ),
            ("order", Ok("acme"))
        );
        assert_eq!(a.partition.handler.handler.as_deref(), Some("Ledger"));
        assert!(a.force && a.yes);

        let cli = parse(&["dead-letter", "order", "acme"]).expect("parses");
        let Command::DeadLetter(a) = cli.command else {
            panic!("not dead-letter")
        };
        assert!(!a.force && !a.yes);
        assert_eq!(a.partition.handler.handler, None);
    }

    #[test]
    fn dlq_key_is_optional_and_replay_needs_an_entry() {
        let cli = parse(&["dlq", "order"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Dlq(DlqArgs { key: None, .. })
        ));
        let cli = parse(&["dlq", "order", "acme", "--json"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Dlq(DlqArgs {
                key: Some(_),
                json: true,
                ..
            })
        ));
        let e = parse(&["replay", "order", "acme"]).expect_err("no entry id");
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let cli = parse(&["replay", "order", "acme", "1-0", "--yes"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Replay(ReplayArgs { yes: true, .. })
        ));
    }

    #[test]
    fn keys_in_hexadecimal() {
        let cli = parse(&["skip", "order", "61 00 0a", "--key-hex"]).expect("parses");
        let Command::Skip(a) = cli.command else {
            panic!("not skip")
        };
        assert_eq!(a.partition.key.value().as_deref(), Ok("a\0\n"));
        assert_eq!(key_value("e282ac", true).as_deref(), Ok("\u{20ac}"));
        assert_eq!(key_value("acme", false).as_deref(), Ok("acme"));
        for bad in ["abc", "zz", "ff"] {
            let e = key_value(bad, true).expect_err(bad);
            assert!(e.starts_with("--key-hex: "), "{e}");
        }
        let cli = parse(&["replay", "order", "6163", "1-0", "--key-hex"]).expect("parses");
        let Command::Replay(ReplayArgs { key, entry_id, .. }) = cli.command else {
            panic!("not replay")
        };
        assert_eq!(
            (key.value().as_deref(), entry_id.as_str()),
            (Ok("ac"), "1-0")
        );
        assert!(
            parse(&["dlq", "order", "--key-hex"]).is_err(),
            "needs a key"
        );
    }

    #[test]
    fn acl_takes_categories() {
        let cli = parse(&["acl", "order", "payment", "--user", "app"]).expect("parses");
        let Command::Acl(AclArgs { categories, user }) = cli.command else {
            panic!("not acl")
        };
        assert_eq!((categories.len(), user.as_str()), (2, "app"));
        assert!(parse(&["acl"]).is_err(), "needs a category");
    }

    #[test]
    fn outbox_shows_or_acts_on_one_row() {
        let cli =
            parse(&["outbox", "--json", "--postgres-url", "postgres://h/db"]).expect("parses");
        let Command::Outbox(a) = cli.command else {
            panic!("not outbox")
        };
        assert!(a.json && a.action.is_none());
        assert_eq!(a.limit, 50);
        assert_eq!(a.postgres_url.as_deref(), Some("postgres://h/db"));
        let cli = parse(&[
            "outbox",
            "retry",
            "17",
            "--postgres-url",
            "postgres://h/db",
            "-y",
        ])
        .expect("parses");
        let Command::Outbox(a) = cli.command else {
            panic!("not outbox")
        };
        assert_eq!(a.postgres_url.as_deref(), Some("postgres://h/db"));
        assert!(matches!(
            a.action,
            Some(OutboxAction::Retry(RowArgs { id: 17, yes: true }))
        ));
        let cli = parse(&["outbox", "discard", "3"]).expect("parses");
        let Command::Outbox(a) = cli.command else {
            panic!("not outbox")
        };
        assert!(matches!(
            a.action,
            Some(OutboxAction::Discard(RowArgs { id: 3, yes: false }))
        ));
        for args in [
            &["outbox", "retry"][..],
            &["outbox", "retry", "x"],
            &["outbox", "discard", "-1"],
            &["outbox", "frobnicate"],
        ] {
            let e = parse(args).expect_err("usage error");
            assert!(e.use_stderr(), "{args:?}");
        }
    }

    #[test]
    fn mistakes_are_usage_errors() {
        for args in [
            &["inspect", "order"][..],
            &["skip", "order", "acme", "--frce"],
            &["partitions"],
            &["frobnicate"],
        ] {
            let e = parse(args).expect_err("usage error");
            assert!(e.use_stderr(), "{args:?}");
        }
    }

    #[test]
    fn a_cluster_url_is_taken() {
        let url = "redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001/";
        let cli = parse(&["partitions", "order", "--redis-url", url]).expect("parses");
        assert_eq!(cli.conn.redis_url.as_deref(), Some(url));
    }

    #[test]
    fn help_names_the_environment_variable_and_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("redis+cluster://"), "{help}");
        assert!(help.contains("CONVOY_REDIS_URL"), "{help}");
        assert!(help.contains("CONVOY_POSTGRES_URL"), "{help}");
        assert!(help.contains("Exit codes"), "{help}");
    }
}
