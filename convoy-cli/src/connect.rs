//! Where the commands connect and who acts: the Redis URL from the flag,
//! the environment or the configuration as the engine reads it, the
//! connection, the operator's name.

use std::path::Path;

use convoy_runtime::Config;
use convoy_runtime::redis::admin::Admin;

use crate::cli::{Cli, Command, Connection};
use crate::error::CliError;

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

/// The admin API on `t`, with its TLS CA and backfill suffix.
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

/// The operator's name: `--operator`, else `$USER`, else `$LOGNAME`, else
/// the process's uid and host.
pub fn operator(conn: &Connection) -> String {
    conn.operator
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(process_identity)
}

/// Who runs this process when no name was given (a container or a cron
/// job without `$USER`): `uid {uid}@{host}`, so the audit record still
/// says who acted.
fn process_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid().to_string())
        .unwrap_or_else(|_| "?".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("uid {uid}@{host}")
}

/// What a command on the partitions works with: the admin API and who
/// acts.
#[derive(Debug)]
pub struct Session {
    /// The admin API, connected.
    pub admin: Admin,
    /// The operator, recorded in the audit stream.
    pub who: String,
}

/// Connects as [`target`] and [`connect`] say, for [`operator`].
pub async fn session(conn: &Connection) -> Result<Session, CliError> {
    let target = target(conn)?;
    let admin = connect(&target).await?;
    Ok(Session {
        admin,
        who: operator(conn),
    })
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
    use super::*;

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
