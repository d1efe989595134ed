//! Why a command failed, its exit code, and the one line `main` prints.

use convoy_runtime::config::{redact_url, url_secrets};
use convoy_runtime::key::Escaped;
use convoy_runtime::redis::admin::AdminError;

/// Exit code of a usage error (`EX_USAGE`), kept apart from 2 (Redis
/// cannot be reached).
pub const USAGE: u8 = 64;

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
            CliError::Usage(_) => USAGE,
            CliError::Web(convoy_web::WebError::Io { .. }) => 1,
            CliError::Web(_) => USAGE,
            _ => 1,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn exit_codes() {
        let e = CliError::NotConfirmed { action: "skip" };
        assert_eq!(e.exit_code(), 1);
        let e = CliError::from(AdminError::NotHalted {
            category: "c".into(),
            key: "k".into(),
            group: "g".into(),
        });
        assert_eq!(e.exit_code(), 1);
        assert_eq!(CliError::Usage("x".into()).exit_code(), USAGE);
    }
}
