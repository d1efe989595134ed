//! A category's shard count, recorded in Redis (`convoy:shards:{category}`)
//! by the first engine, publisher or operator tool that uses the category,
//! and checked by every other one: a process configured with another count
//! would put a key's events in another stream, and order would be lost.

use redis::Value;

use super::connection::Conn;
use crate::error::Error;
use crate::names;

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
