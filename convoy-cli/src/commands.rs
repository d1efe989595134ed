//! The commands: connect, ask, act, render.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use convoy_runtime::Config;
use convoy_runtime::config::{redact_url, url_secrets};
use convoy_runtime::key::Escaped;
use convoy_runtime::redis::admin::{Admin, AdminError, HeadOp, HeadRequest};

use crate::cli::{Cli, Command, Connection, HeadArgs, RetryArgs};
use crate::{outbox, render};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// From the admin API (Redis, refusals, handler resolution).
    #[error(transparent)]
    Admin(Box<AdminError>),
    /// The configuration file could not be used.
    #[error(transparent)]
    Config(convoy_runtime::Error),
    /// No Redis URL anywhere.
    #[error(
        "no Redis URL: pass --redis-url, set CONVOY_REDIS_URL, or set [broker] url in {config} (or point --config at the domain's file)"
    )]
    NoUrl {
        /// The configuration file looked at.
        config: String,
    },
    /// The configuration names the inline broker.
    #[error(
        "{config} uses the inline broker, which has no partitions to operate; pass --redis-url or set CONVOY_REDIS_URL"
    )]
    Inline {
        /// The configuration file.
        config: String,
    },
    /// No PostgreSQL URL for the outbox commands.
    #[error(
        "no PostgreSQL URL for the outbox: pass --postgres-url, set CONVOY_POSTGRES_URL, or set [outbox] postgres_url in {config} (or point --config at the domain's file)"
    )]
    NoPostgresUrl {
        /// The configuration file looked at.
        config: String,
    },
    /// An outbox retry or discard without a Redis to audit it in.
    #[error(
        "outbox retry and discard are recorded in the convoy:audit stream on Redis, and {config} names no Redis: pass --redis-url or set CONVOY_REDIS_URL; nothing was changed"
    )]
    AuditNeedsRedis {
        /// The configuration file looked at.
        config: String,
    },
    /// Reading the outbox failed.
    #[error(transparent)]
    Outbox(convoy_runtime::Error),
    /// Not confirmed, and no way to ask.
    #[error(
        "refusing to {action} without confirmation: standard input is not a terminal; pass --yes to confirm"
    )]
    NotConfirmed {
        /// What would have been done.
        action: &'static str,
    },
    /// The operator answered no.
    #[error("{action} declined; nothing was changed")]
    Declined {
        /// What would have been done.
        action: &'static str,
    },
    /// Reading the answer or writing output failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// JSON output failed.
    #[error("cannot render JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The operator page cannot start.
    #[error(transparent)]
    Web(#[from] convoy_web::WebError),
    /// An argument cannot be used (a `--key-hex` that is not hexadecimal
    /// UTF-8, a category that cannot exist).
    #[error("{0}")]
    Usage(String),
}

impl From<AdminError> for CliError {
    fn from(e: AdminError) -> Self {
        CliError::Admin(Box::new(e))
    }
}

impl CliError {
    /// 2 when Redis cannot be reached, 64 for an argument that cannot be
    /// used, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Admin(e) if e.is_unreachable() => 2,
            CliError::Outbox(e) if e.is_transient() => 2,
            CliError::Usage(_) => crate::USAGE,
            CliError::Web(convoy_web::WebError::Io { .. }) => 1,
            CliError::Web(_) => crate::USAGE,
            _ => 1,
        }
    }
}

/// Where to connect.
#[derive(Debug)]
pub struct Target {
    pub(crate) url: String,
    ca_file: Option<String>,
    backfill_suffix: String,
}

/// The URL from the flag or `CONVOY_REDIS_URL` (clap reads both), else
/// from the configuration as the engine reads it (`[broker] url`, which
/// `CONVOY_BROKER_URL` or `CONVOY__BROKER__URL` override); the backfill
/// suffix and TLS CA from the configuration.
pub fn target(conn: &Connection) -> Result<Target, CliError> {
    let shown = conn.config.display().to_string();
    let config = load_config(&conn.config)?;
    let suffix = config.server.priority_lanes.backfill_suffix.clone();
    if let Some(url) = &conn.redis_url {
        return Ok(Target {
            url: url.clone(),
            ca_file: None,
            backfill_suffix: suffix,
        });
    }
    match config.broker.url.as_str() {
        "inline" if conn.config.exists() => Err(CliError::Inline { config: shown }),
        "inline" => Err(CliError::NoUrl { config: shown }),
        url => Ok(Target {
            url: url.to_owned(),
            ca_file: config.broker.tls_ca_file.clone(),
            backfill_suffix: suffix,
        }),
    }
}

/// The configuration as the engine reads it: the file with the same
/// environment overrides (`CONVOY__SECTION__KEY`, `CONVOY_BROKER_URL`;
/// [`Config::load`]), or the defaults with them when the file does not
/// exist. The CLI needs it only for what a flag does not give (the URL,
/// the TLS CA, the backfill suffix, the outbox), and says which file it
/// looked at when the URL is missing.
pub fn load_config(path: &Path) -> Result<Config, CliError> {
    if !path.exists() {
        return Config::from_env().map_err(CliError::Config);
    }
    Config::load(path).map_err(CliError::Config)
}

pub async fn connect(t: &Target) -> Result<Admin, CliError> {
    let admin = match &t.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                CliError::Config(convoy_runtime::Error::Config {
                    file: "[broker] tls_ca_file".into(),
                    message: format!("{path:?} cannot be read: {e}"),
                })
            })?;
            Admin::connect_with_ca(&t.url, pem).await?
        }
        None => Admin::connect(&t.url).await?,
    };
    Ok(admin.backfill_suffix(t.backfill_suffix.clone()))
}

/// The operator's name: `--operator`, else `$USER`, else `$LOGNAME`.
pub fn operator(conn: &Connection) -> String {
    conn.operator
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Runs one command; the text for stdout is printed here.
pub async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    if let Command::Acl { categories, user } = &cli.command {
        return print(&acl(categories, user)?);
    }
    // The outbox listing needs no Redis; its actions connect for the
    // audit record.
    if let Command::Outbox(args) = &cli.command {
        return print(&outbox::run(&cli.conn, args).await?);
    }
    let target = target(&cli.conn)?;
    if let Command::Serve(args) = &cli.command {
        return crate::serve::run(&cli.conn, &target, args).await;
    }
    let admin = connect(&target).await?;
    let who = operator(&cli.conn);
    let out = match cli.command {
        Command::Acl { .. } | Command::Outbox(_) | Command::Serve(_) => String::new(),
        Command::Partitions {
            category,
            json,
            key_hex,
        } => {
            let report = admin.partitions(&category).await?;
            if json {
                render::json(&report)?
            } else {
                render::partitions(&report, key_hex)
            }
        }
        Command::Inspect {
            category,
            key,
            handler,
            json,
        } => {
            let key = key.value().map_err(CliError::Usage)?;
            let group = admin
                .resolve_group(&category, Some(&key), handler.handler.as_deref())
                .await?;
            let i = admin.inspect(&category, &key, &group).await?;
            if json {
                render::json(&i)?
            } else {
                render::inspection(&category, &i)
            }
        }
        Command::Skip(args) => head_action(&admin, HeadOp::Skip, &args, &who).await?,
        Command::DeadLetter(args) => head_action(&admin, HeadOp::DeadLetter, &args, &who).await?,
        Command::Gaps {
            category,
            key,
            key_hex,
            handler,
            ack,
            yes,
            json,
        } => {
            let key = key
                .map(|k| crate::cli::key_value(&k, key_hex))
                .transpose()
                .map_err(CliError::Usage)?;
            match (ack, key) {
                (true, Some(key)) => {
                    let group = admin
                        .resolve_group(&category, Some(&key), handler.handler.as_deref())
                        .await?;
                    confirm(
                        &format!(
                            "Acknowledge the gap of {}:{} for handler {} (its dead letter stays)?",
                            render::text(&category),
                            render::key(&key),
                            render::text(&group)
                        ),
                        yes,
                        "acknowledge the gap",
                    )?;
                    match admin.ack_gap(&category, &key, &group, &who).await? {
                        Some(entry) => format!(
                            "gap at entry {} of {}:{} acknowledged for handler {} (audited)\n",
                            render::text(&entry),
                            render::text(&category),
                            render::key(&key),
                            render::text(&group)
                        ),
                        None => format!(
                            "no gap recorded for {}:{} and handler {}\n",
                            render::text(&category),
                            render::key(&key),
                            render::text(&group)
                        ),
                    }
                }
                (_, key) => {
                    let gaps = admin.gaps(&category, key.as_deref()).await?;
                    if json {
                        render::json(&gaps)?
                    } else {
                        render::gaps(&category, &gaps)
                    }
                }
            }
        }
        Command::Retry(args) => match args.one() {
            Some(one) => head_action(&admin, HeadOp::Retry, &one, &who).await?,
            None => retry_all_halted(&admin, &args, &who).await?,
        },
        Command::Dlq {
            category,
            key,
            key_hex,
            json,
        } => {
            let key = key
                .map(|k| crate::cli::key_value(&k, key_hex))
                .transpose()
                .map_err(CliError::Usage)?;
            let letters = admin.dlq(&category, key.as_deref()).await?;
            if json {
                render::json(&letters)?
            } else {
                let stream = match letters.first() {
                    Some(l) => l.stream.clone(),
                    None => admin.dlq_stream(&category, key.as_deref()).await?,
                };
                render::dead_letters(&render::stream(&stream), &letters)
            }
        }
        Command::Replay {
            category,
            key,
            entry_id,
            at,
            handler,
            force,
            yes,
        } => {
            let key = key.value().map_err(CliError::Usage)?;
            let letters = admin.dlq(&category, Some(&key)).await?;
            let Some(letter) = letters.iter().find(|l| l.dlq_id == entry_id) else {
                return Err(AdminError::NoSuchDeadLetter {
                    stream: admin.dlq_stream(&category, Some(&key)).await?,
                    category,
                    key,
                    id: entry_id,
                }
                .into());
            };
            let handlers = admin.groups(&category).await?.len();
            let head = at == "head";
            confirm(
                &render::replay_question(&category, &key, letter, handlers, head),
                yes,
                "replay",
            )?;
            let o = if head {
                admin
                    .replay_at_head(
                        &category,
                        &key,
                        &entry_id,
                        handler.handler.as_deref(),
                        &who,
                        force,
                    )
                    .await?
            } else {
                admin.replay(&category, &key, &entry_id, &who).await?
            };
            render::replay_outcome(&o, head)
        }
        Command::Audit { limit, json } => {
            let records = admin.audit(limit).await?;
            if json {
                render::json(&records)?
            } else {
                render::audit(&records)
            }
        }
    };
    print(&out)
}

/// Writes `out` to stdout, with any control or bidirectional character
/// that escaped rendering escaped (newlines end lines).
fn print(out: &str) -> Result<ExitCode, CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(render::terminal_safe(out).as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `convoy acl`: the `ACL SETUSER` line for `categories`, after checking
/// each is a category convoy can have.
fn acl(categories: &[String], user: &str) -> Result<String, CliError> {
    for c in categories {
        convoy_runtime::key::check_category(c).map_err(|rule| {
            CliError::Usage(format!("{:?} is not a category: {rule}", Escaped(c)))
        })?;
    }
    if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CliError::Usage(format!(
            "--user {:?}: a Redis user name is one word",
            Escaped(user)
        )));
    }
    let names: Vec<&str> = categories.iter().map(String::as_str).collect();
    Ok(render::acl(user, &names))
}

/// Skip or dead-letter: resolve the handler, look at the head, check it
/// is halted there (or `--force`), confirm, then act only if the head is
/// still the entry confirmed.
async fn head_action(
    admin: &Admin,
    op: HeadOp,
    args: &HeadArgs,
    who: &str,
) -> Result<String, CliError> {
    let key = args.key.value().map_err(CliError::Usage)?;
    let (category, key) = (args.category.as_str(), key.as_str());
    let group = admin
        .resolve_group(category, Some(key), args.handler.handler.as_deref())
        .await?;
    let i = admin.inspect(category, key, &group).await?;
    let action = match op {
        HeadOp::Skip => "skip",
        HeadOp::DeadLetter => "dead-letter",
        HeadOp::Retry => "retry",
    };
    if i.status.halt_reason.as_deref() == Some("not a stream") {
        // Halted because its key held another type: once the operator fixed
        // the key, the script clears the halt (no event is skipped); while
        // the key is still wrong it refuses, naming the key.
        confirm(
            &format!(
                "{category}:{} halted because its key was not a stream; clear the halt for {}?",
                render::key(key),
                render::text(&group)
            ),
            args.yes,
            action,
        )?;
        let request = HeadRequest {
            category,
            key,
            group: &group,
            force: args.force,
            operator: who,
            expect_entry: None,
            expect_generation: Some(i.status.durable_generation),
        };
        admin.act_on_head(op, &request).await?;
        return Ok(format!(
            "halt of {category}:{} cleared for {}; no event was skipped, its owner resumes\n",
            render::key(key),
            render::text(&group)
        ));
    }
    let Some(head) = &i.head else {
        return Err(AdminError::NothingToDo {
            category: category.to_owned(),
            key: key.to_owned(),
            group,
        }
        .into());
    };
    let s = &i.status;
    let on_halt = s.halted && head.pending && s.halt_entry.as_deref() == Some(&head.entry_id);
    if !on_halt && !args.force {
        // The script checks this again, atomically; refusing here spares
        // the question.
        return Err(if s.halted {
            AdminError::HeadMoved {
                category: category.to_owned(),
                key: key.to_owned(),
                group,
                halt_entry: s.halt_entry.clone().unwrap_or_default(),
                head: head.entry_id.clone(),
            }
        } else {
            AdminError::NotHalted {
                category: category.to_owned(),
                key: key.to_owned(),
                group,
            }
        }
        .into());
    }
    let mut err = std::io::stderr().lock();
    err.write_all(render::head_summary(category, &i, head).as_bytes())?;
    if !on_halt {
        err.write_all(render::force_warning(&i).as_bytes())?;
    }
    drop(err);
    confirm(
        &render::head_question(op, category, &i, head),
        args.yes,
        action,
    )?;
    let outcome = admin
        .act_on_head(
            op,
            &HeadRequest {
                category,
                key,
                group: &group,
                force: args.force,
                operator: who,
                expect_entry: Some(&head.entry_id),
                expect_generation: Some(i.status.durable_generation),
            },
        )
        .await?;
    Ok(render::head_outcome(category, &i.status, &outcome))
}

/// `convoy retry CATEGORY --all-halted --handler NAME`: every partition of
/// the category halted for the handler, each retried in place on the head
/// it is halted on (a partition whose head moved meanwhile is left alone
/// and counted), after one confirmation naming how many.
async fn retry_all_halted(admin: &Admin, args: &RetryArgs, who: &str) -> Result<String, CliError> {
    let category = args.category.as_str();
    let Some(handler) = args.handler.handler.as_deref() else {
        return Err(CliError::Usage(
            "--all-halted needs --handler NAME: the handler whose halted partitions to retry"
                .to_owned(),
        ));
    };
    let group = admin.resolve_group(category, None, Some(handler)).await?;
    let report = admin.partitions(category).await?;
    let halted: Vec<_> = report
        .partitions
        .iter()
        .filter(|p| p.group == group && p.halted)
        .collect();
    if halted.is_empty() {
        return Ok(format!(
            "no partition of {} is halted for handler {}\n",
            render::text(category),
            render::text(&group)
        ));
    }
    confirm(
        &format!(
            "Run the halted head again, in place, in {} partitions of {} for handler {}?",
            halted.len(),
            render::text(category),
            render::text(&group)
        ),
        args.yes,
        "retry",
    )?;
    let (mut done, mut left) = (0, Vec::new());
    for p in halted {
        let request = HeadRequest {
            category,
            key: &p.key,
            group: &group,
            force: false,
            operator: who,
            expect_entry: p.halt_entry.as_deref(),
            expect_generation: Some(p.durable_generation),
        };
        match admin.act_on_head(HeadOp::Retry, &request).await {
            Ok(_) => done += 1,
            Err(e) => left.push(format!("{}: {e}", render::key(&p.key))),
        }
    }
    let mut out = format!(
        "retried {done} halted partitions of {} for handler {} in place (each audited); their owners run the heads again, in order\n",
        render::text(category),
        render::text(&group)
    );
    if !left.is_empty() {
        out.push_str(&format!(
            "{} left alone (their heads moved or they resumed meanwhile):\n",
            left.len()
        ));
        for l in left {
            out.push_str(&format!("  {l}\n"));
        }
    }
    Ok(out)
}

/// Asks on the terminal unless `yes`; refuses without a terminal.
pub fn confirm(question: &str, yes: bool, action: &'static str) -> Result<(), CliError> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(CliError::NotConfirmed { action });
    }
    ask(question, &mut stdin.lock(), &mut std::io::stderr(), action)
}

/// Writes the question, reads one line: `y` or `yes` proceeds, anything
/// else declines, end of input refuses.
fn ask(
    question: &str,
    input: &mut impl BufRead,
    output: &mut impl Write,
    action: &'static str,
) -> Result<(), CliError> {
    write!(output, "{question} [y/N] ")?;
    output.flush()?;
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        writeln!(output)?;
        return Err(CliError::NotConfirmed { action });
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(CliError::Declined { action }),
    }
}

/// An error as one line: its chain of causes joined with `: `, control
/// and bidirectional characters escaped, and the URL's secrets (its
/// password, a `pass` / `password` query value) hidden even when a cause
/// quotes them.
pub fn one_line(error: &(dyn std::error::Error + 'static), urls: &[String]) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    for url in urls {
        text = text.replace(url.as_str(), &redact_url(url));
        for secret in url_secrets(url) {
            text = text.replace(&secret, "***");
        }
    }
    Escaped(&text).to_string()
}

/// The URLs a command would use (Redis, and PostgreSQL for the outbox
/// commands), for hiding their secrets in errors.
pub fn urls_for_errors(cli: &Cli) -> Vec<String> {
    let config = load_config(&cli.conn.config).ok();
    let redis = cli.conn.redis_url.clone().or_else(|| {
        config
            .as_ref()
            .map(|c| c.broker.url.clone())
            .filter(|u| u != "inline")
    });
    let postgres = match &cli.command {
        Command::Outbox(args) => args
            .postgres_url
            .clone()
            .or_else(|| config.as_ref().and_then(|c| c.outbox.postgres_url.clone())),
        _ => None,
    };
    redis.into_iter().chain(postgres).collect()
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn answer(text: &str) -> (Result<(), CliError>, String) {
        let mut out = Vec::new();
        let r = ask("Skip?", &mut Cursor::new(text.as_bytes()), &mut out, "skip");
        (r, String::from_utf8(out).expect("utf-8"))
    }

    #[test]
    fn only_yes_proceeds() {
        let (r, shown) = answer("y\n");
        assert!(r.is_ok());
        assert_eq!(shown, "Skip? [y/N] ");
        assert!(answer("YES\n").0.is_ok());
        for no in ["\n", "n\n", "yess\n", "sure\n"] {
            let (r, _) = answer(no);
            assert!(matches!(r, Err(CliError::Declined { .. })), "{no:?}");
        }
        let (r, _) = answer("");
        let e = r.expect_err("closed stdin");
        assert!(e.to_string().contains("pass --yes"), "{e}");
    }

    #[test]
    fn errors_are_one_line_without_the_password() {
        let io =
            std::io::Error::other("connect to redis://u:hunter2@h:1/ failed\nretry u:hunter2@h:1");
        let e = CliError::Io(io);
        let line = one_line(
            &e,
            &[
                "postgres://p:s3cret@db/x".into(),
                "redis://u:hunter2@h:1/".into(),
            ],
        );
        assert!(!line.contains("hunter2"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("redis://u:***@h:1/"), "{line}");
        let io = std::io::Error::other("no socket at unix:///run/r.sock?pass=hunter2&db=1");
        let line = one_line(
            &CliError::Io(io),
            &["unix:///run/r.sock?pass=hunter2&db=1".into()],
        );
        assert!(!line.contains("hunter2"), "{line}");
        assert!(line.contains("pass=***"), "{line}");
        let cluster = "redis+cluster://u:hunter2@h1:1,h2:2/?password=hunter3";
        let io = std::io::Error::other(format!(
            "{cluster}: node redis://u:hunter2@h2:2/?password=hunter3 refused"
        ));
        let line = one_line(&CliError::Io(io), &[cluster.into()]);
        assert!(
            !line.contains("hunter2") && !line.contains("hunter3"),
            "{line}"
        );
        assert!(line.contains("redis+cluster://u:***@h1:1,"), "{line}");
        let io = std::io::Error::other("cannot reach postgres://p:s3cret@db/x");
        let line = one_line(&CliError::Io(io), &["postgres://p:s3cret@db/x".into()]);
        assert!(!line.contains("s3cret"), "{line}");
        let io = std::io::Error::other("key \"a\u{1b}[2J\u{202e}b\" failed");
        let line = one_line(&CliError::Io(io), &[]);
        assert!(line.contains("a\\u{1b}[2J\\u{202e}b"), "{line}");
    }

    #[test]
    fn acl_checks_categories_and_user() {
        let line = acl(&["order".into()], "app").expect("acl");
        assert!(line.contains("ACL SETUSER app reset on >"), "{line}");
        let patterns = convoy_runtime::redis::acl::category_patterns("order").join(" ");
        assert!(line.contains(&format!(" {patterns} ")), "{line}");
        let own = convoy_runtime::redis::acl::own_patterns().join(" ");
        assert!(line.contains(&format!(" {own} ")), "{line}");
        let e = acl(&["convoy".into()], "app").expect_err("reserved");
        assert_eq!(e.exit_code(), 64);
        assert!(e.to_string().contains("`convoy` is reserved"), "{e}");
        assert!(acl(&["order".into()], "a b").is_err());
    }

    #[test]
    fn exit_codes() {
        let e = CliError::NotConfirmed { action: "skip" };
        assert_eq!(e.exit_code(), 1);
        let e = CliError::from(AdminError::NotHalted {
            category: "c".into(),
            key: "k".into(),
            group: "g".into(),
        });
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn url_from_flag_else_config() {
        let dir = std::env::temp_dir().join(format!("convoy-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("domain.toml");
        std::fs::write(
            &file,
            "[broker]\nurl = \"redis://:pw@h:7/0\"\n[server.priority_lanes]\nbackfill_suffix = \"slow\"\n",
        )
        .expect("write");
        let conn = |url: Option<&str>, config: &Path| Connection {
            redis_url: url.map(str::to_owned),
            config: config.to_owned(),
            operator: None,
        };
        let t = target(&conn(None, &file)).expect("from config");
        assert_eq!(t.url, "redis://:pw@h:7/0");
        assert_eq!(t.backfill_suffix, "slow");
        let t = target(&conn(Some("redis://x/"), &file)).expect("flag wins");
        assert_eq!(t.url, "redis://x/");
        let missing = dir.join("missing.toml");
        let e = target(&conn(None, &missing)).expect_err("no url");
        assert!(matches!(e, CliError::NoUrl { .. }), "{e}");
        std::fs::write(&file, "[broker]\nurl = \"inline\"\n").expect("write");
        let e = target(&conn(None, &file)).expect_err("inline");
        assert!(e.to_string().contains("inline broker"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
