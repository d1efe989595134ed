//! The Redis key names the tests read and write, for categories with the
//! default shard count ([`DEFAULT_SHARDS`]): the shard computation in one
//! place, over `convoy_runtime::redis::keys` (the names the engine uses).
//!
//! Used from `support/mod.rs` and, by `#[path]`, from test files that do
//! not use the shared domain.
#![allow(dead_code, unreachable_pub)]

use convoy_runtime::redis::keys::{self, DEFAULT_SHARDS};

/// The shard of a partition key (or correlation value) among the default
/// shard count.
pub fn shard(key: &str) -> u32 {
    keys::shard_of(key, DEFAULT_SHARDS)
}

/// Every shard of a category with the default shard count.
pub fn shards() -> std::ops::Range<u32> {
    0..DEFAULT_SHARDS
}

/// `{s}category:key`: the partition stream of `key`.
pub fn stream(category: &str, key: &str) -> String {
    keys::partition_stream(shard(key), category, key)
}

/// `{s}category:key:suffix`: a backfill lane of `key`.
pub fn backfill(category: &str, key: &str, suffix: &str) -> String {
    keys::backfill_stream(shard(key), category, key, suffix)
}

/// `{s}category:key:dlq`: the partition's dead letters.
pub fn partition_dlq(category: &str, key: &str) -> String {
    keys::partition_dlq(shard(key), category, key)
}

/// `{s}category:__partitions__`: the discovery index of `key`'s own shard.
pub fn partition_index(category: &str, key: &str) -> String {
    keys::partition_index(shard(key), category)
}

/// `{s}category`: the category's events without a partition key.
pub fn base_stream(category: &str) -> String {
    keys::base_stream(category, DEFAULT_SHARDS)
}

/// `{s}category:dlq`: dead letters of the category's ordinary handlers.
pub fn category_dlq(category: &str) -> String {
    keys::category_dlq(category, DEFAULT_SHARDS)
}

/// `{s}convoy:groups:category`: the groups set of `key`'s shard.
pub fn groups(category: &str, key: &str) -> String {
    keys::groups(shard(key), category)
}

/// `{s}convoy:lease:group:scope:key` (`scope`: the category, or `*` for a
/// sequential process manager).
pub fn lease(group: &str, scope: &str, key: &str) -> String {
    keys::lease(shard(key), group, scope, key)
}

/// `{s}convoy:unit:group:scope:key`.
pub fn unit(group: &str, scope: &str, key: &str) -> String {
    keys::unit(shard(key), group, scope, key)
}

/// The `SCAN MATCH` pattern of every lease of `key` in `scope`, whatever
/// its group: `{s}convoy:lease:*:scope:key`.
pub fn lease_pattern(scope: &str, key: &str) -> String {
    format!("{}convoy:lease:*:{scope}:{key}", keys::tag(shard(key)))
}

/// Every partition key of `category` in the discovery indexes of all its
/// shards (their union), sorted.
pub async fn all_partitions(
    c: &mut redis::aio::MultiplexedConnection,
    category: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut pipe = redis::pipe();
    for s in shards() {
        pipe.cmd("SMEMBERS").arg(keys::partition_index(s, category));
    }
    let per_shard: Vec<Vec<String>> = pipe.query_async(c).await?;
    let mut all: Vec<String> = per_shard.into_iter().flatten().collect();
    all.sort();
    Ok(all)
}
