//! `convoy replay`: a dead letter put back into its partition, at its
//! tail or (restoring the key's order) at its head.

use convoy_runtime::redis::admin::AdminError;

use crate::cli::ReplayArgs;
use crate::confirm::confirm;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// Finds the dead letter, confirms, replays it.
pub async fn run(s: &Session, args: &ReplayArgs) -> Result<String, CliError> {
    let (admin, category, entry_id) = (&s.admin, &args.category, &args.entry_id);
    let key = args.key.value().map_err(CliError::Usage)?;
    let letters = admin.dlq(category, Some(&key)).await?;
    let Some(letter) = letters.iter().find(|l| &l.dlq_id == entry_id) else {
        return Err(AdminError::NoSuchDeadLetter {
            stream: admin.dlq_stream(category, Some(&key)).await?,
            category: category.clone(),
            key,
            id: entry_id.clone(),
        }
        .into());
    };
    let handlers = admin.groups(category).await?.len();
    let head = args.at == "head";
    confirm(
        &render::replay_question(category, &key, letter, handlers, head),
        args.yes,
        "replay",
    )?;
    let o = if head {
        admin
            .replay_at_head(
                category,
                &key,
                entry_id,
                args.handler.handler.as_deref(),
                &s.who,
                args.force,
            )
            .await?
    } else {
        admin.replay(category, &key, entry_id, &s.who).await?
    };
    Ok(render::replay_outcome(&o, head))
}
