//! `convoy serve`: the operator page (`convoy-web`) over the same
//! connection, configuration and identity as every other command.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use convoy_runtime::config::url_secrets;
use convoy_runtime::outbox::OutboxStore;
use convoy_web::{Auth, OperatorPage, Settings};
use tokio_util::sync::CancellationToken;

use crate::cli::{Connection, OutboxArgs, ServeArgs};
use crate::connect::{connect, load_config, operator, target};
use crate::error::CliError;

/// Finds Redis, checks the address and credentials before connecting, then
/// serves until SIGINT or SIGTERM.
pub async fn run(conn: &Connection, args: &ServeArgs) -> Result<ExitCode, CliError> {
    let target = &target(conn)?;
    let auth = Auth::from_sources(args.token_file.as_deref(), args.basic_file.as_deref())?;
    convoy_web::check_listen(&args.listen, &auth)?;
    let admin = connect(target).await?;
    let config = load_config(&conn.config)?;
    let postgres_url = std::env::var("CONVOY_POSTGRES_URL").ok();
    let mut secrets = url_secrets(&target.url);
    let outbox = match postgres_url
        .as_ref()
        .or(config.outbox.postgres_url.as_ref())
    {
        Some(url) => {
            secrets.extend(url_secrets(url));
            let outbox_args = OutboxArgs {
                postgres_url: postgres_url.clone(),
                limit: 0,
                json: false,
                action: None,
            };
            let store = super::outbox::open(conn, &outbox_args, &config).await?;
            let name = store.qualified_table().to_owned();
            Some((name, Arc::new(store) as Arc<dyn OutboxStore>))
        }
        None => None,
    };
    let settings = Settings {
        read_only: args.read_only,
        hide_payloads: args.hide_payloads,
        auth,
        operator: operator(conn),
        allowed_hosts: args.allowed_host.clone(),
        live_interval: Duration::from_secs(args.live_seconds.max(1)),
        snapshot_interval: Duration::from_secs(args.snapshot_seconds.max(1)),
        snapshot_keys_per_second: args.snapshot_rate,
        outbox,
        secrets,
        ..Settings::default()
    };
    let page = OperatorPage::new(admin, settings);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        convoy_runtime::shutdown_signal().await;
        stop.cancel();
    });
    let read_only = args.read_only;
    page.serve(args.listen, shutdown, |addr| {
        eprintln!(
            "convoy: the operator page is at http://{addr}/{}",
            if read_only { " (read-only)" } else { "" }
        );
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
