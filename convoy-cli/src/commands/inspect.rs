//! `convoy inspect`: a partition's head event, its delivery count, the
//! unit's attempts and last error.

use crate::cli::InspectArgs;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// The partition of the key, for the handler named or the only one.
pub async fn run(s: &Session, args: &InspectArgs) -> Result<String, CliError> {
    let category = &args.partition.category;
    let key = args.partition.key.value().map_err(CliError::Usage)?;
    let group = s
        .admin
        .resolve_group(
            category,
            Some(&key),
            args.partition.handler.handler.as_deref(),
        )
        .await?;
    let i = s.admin.inspect(category, &key, &group).await?;
    Ok(if args.json {
        render::json(&i)?
    } else {
        render::inspection(category, &i)
    })
}
