//! A category's shard count and partition key field, recorded in Redis
//! (`convoy:shards:{category}`, `convoy:key_field:{category}`) by the first
//! engine, publisher or operator tool that uses the category, and checked
//! by every other one: a process configured with another count, or
//! routing by another field (or by none), would put a key's events in
//! another stream, and order would be lost.

use redis::Value;

use super::connection::Conn;
use convoy_core::broker::KeyUse;
use convoy_core::error::Error;
use convoy_core::names;

/// Records `configured` as `category`'s shard count unless one is recorded,
/// and fails when the recorded count differs.
pub(crate) async fn check_shards(
    conn: &mut Conn,
    category: &str,
    configured: u32,
) -> Result<(), Error> {
    let key = names::shards(category);
    let (_, recorded): (Value, Option<u32>) = redis::pipe()
        .cmd("SET")
        .arg(&key)
        .arg(configured)
        .arg("NX")
        .cmd("GET")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(|e| Error::redis(format!("failed to check the shard count of {category}"), e))?;
    match recorded {
        Some(n) if n != configured => Err(Error::Config {
            file: "<config>".into(),
            message: format!(
                "category {category} has {n} shards in Redis ({key}), and this process is configured with {configured}; a category's shard count is fixed once it is used (its keys' streams would move): set [broker.category_shards] {category} = {n}"
            ),
        }),
        _ => Ok(()),
    }
}

/// `category`'s recorded shard count, or `None` when nothing recorded one
/// (no engine or publisher used the category yet).
pub(crate) async fn recorded_shards(conn: &mut Conn, category: &str) -> Result<Option<u32>, Error> {
    redis::cmd("GET")
        .arg(names::shards(category))
        .query_async(conn)
        .await
        .map_err(|e| Error::redis(format!("failed to read the shard count of {category}"), e))
}

/// Records the key field this process uses for `category` unless one is
/// recorded, and fails when the recorded one differs: a publication or a
/// consumer of the category by another field, or unkeyed while Redis
/// records a field, is refused with what to do. Nothing is recorded for a
/// category this process uses unkeyed.
pub(crate) async fn check_key_field(
    conn: &mut Conn,
    category: &str,
    used: KeyUse<'_>,
) -> Result<(), Error> {
    let key = names::key_field(category);
    let fail = |e| {
        Error::redis(
            format!("failed to check the partition key of {category}"),
            e,
        )
    };
    let recorded: Option<String> = match used {
        KeyUse::Field(field) => redis::cmd("SET")
            .arg(&key)
            .arg(field)
            .arg("NX")
            .arg("GET")
            .query_async(conn)
            .await
            .map_err(fail)?,
        KeyUse::Unkeyed(_) => redis::cmd("GET")
            .arg(&key)
            .query_async(conn)
            .await
            .map_err(fail)?,
    };
    match (used.mismatch(recorded.as_deref()), recorded) {
        (Some(this), Some(recorded)) => Err(Error::KeyFieldMismatch {
            category: category.to_owned(),
            recorded,
            this,
            record: key,
        }),
        _ => Ok(()),
    }
}

/// `category`'s recorded partition key field, or `None` when nothing
/// recorded one.
pub(crate) async fn recorded_key_field(
    conn: &mut Conn,
    category: &str,
) -> Result<Option<String>, Error> {
    redis::cmd("GET")
        .arg(names::key_field(category))
        .query_async(conn)
        .await
        .map_err(|e| Error::redis(format!("failed to read the partition key of {category}"), e))
}
