//! `convoy partitions`: a category's live partitions for every handler.

use crate::cli::PartitionsArgs;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// The category's partitions, as a table or JSON.
pub async fn run(s: &Session, args: &PartitionsArgs) -> Result<String, CliError> {
    let report = s.admin.partitions(&args.category).await?;
    Ok(if args.json {
        render::json(&report)?
    } else {
        render::partitions(&report, args.key_hex)
    })
}
