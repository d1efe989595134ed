//! `convoy gaps`: the gaps `on_poison = "dead_letter"` recorded, and
//! `--ack` of one key's gap once reconciled.

use crate::cli::{GapsArgs, optional_key};
use crate::confirm::confirm;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// Lists the gaps (of the key, when given), or acknowledges the key's gap
/// with `--ack`.
pub async fn run(s: &Session, args: &GapsArgs) -> Result<String, CliError> {
    let key = optional_key(args.key.as_deref(), args.key_hex).map_err(CliError::Usage)?;
    match (args.ack, key) {
        (true, Some(key)) => ack(s, args, &key).await,
        (_, key) => {
            let gaps = s.admin.gaps(&args.category, key.as_deref()).await?;
            Ok(if args.json {
                render::json(&gaps)?
            } else {
                render::gaps(&args.category, &gaps)
            })
        }
    }
}

/// Acknowledges the gap of `key` for the handler, after confirmation (its
/// dead letter stays).
async fn ack(s: &Session, args: &GapsArgs, key: &str) -> Result<String, CliError> {
    let category = &args.category;
    let group = s
        .admin
        .resolve_group(category, Some(key), args.handler.handler.as_deref())
        .await?;
    confirm(
        &format!(
            "Acknowledge the gap of {}:{} for handler {} (its dead letter stays)?",
            render::text(category),
            render::key(key),
            render::text(&group)
        ),
        args.yes,
        "acknowledge the gap",
    )?;
    Ok(
        match s.admin.ack_gap(category, key, &group, &s.who).await? {
            Some(entry) => format!(
                "gap at entry {} of {}:{} acknowledged for handler {} (audited)\n",
                render::text(&entry),
                render::text(category),
                render::key(key),
                render::text(&group)
            ),
            None => format!(
                "no gap recorded for {}:{} and handler {}\n",
                render::text(category),
                render::key(key),
                render::text(&group)
            ),
        },
    )
}
