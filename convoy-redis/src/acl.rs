//! The least-privilege Redis ACL rule for convoy: the key patterns of a
//! domain's categories and of convoy's own keys, no pub/sub channels, and
//! exactly the commands convoy runs (directly and inside its Lua scripts).
//!
//! ```
//! let rules = convoy_runtime::redis::acl::rules(&["order", "payment"]);
//! assert_eq!(&rules[..4], ["resetkeys", "~{*}order", "~{*}order:*", "~order:__wake__"]);
//! // ACL SETUSER app reset on >secret <the rules joined by spaces>
//! println!("{}", convoy_runtime::redis::acl::setuser("app", "secret", &["order"]));
//! ```
//!
//! Redis checks key patterns for every command a script runs too, so every
//! key convoy touches is passed to its scripts by name and matches one of
//! these patterns: `{*}{category}` and `{*}{category}:*` for each category
//! (streams, lanes, index, dead letters, in every shard `{s}`),
//! `{category}:__wake__` (its wake-ups), and `{*}convoy:*` and `convoy:*`
//! (leases, liveness, unit state, counters, the audit streams, shard counts,
//! process-manager state). Glob characters in a category's name are
//! escaped; `{` and `}` are not glob characters.

use convoy_core::names;

/// Every command convoy runs, as ACL command rules (subcommands named
/// where convoy uses only some). Connection set-up (`AUTH`, `HELLO`) is
/// always allowed by Redis; `SELECT` is here for URLs that name a
/// database. On Redis 7.2 and later the client library also names itself
/// with `CLIENT SETINFO` when it connects and ignores a refusal (Redis
/// 7.0 has no such command, so it is not in this list): add
/// `+client|setinfo` there to keep `ACL LOG` quiet.
pub const COMMANDS: &[&str] = &[
    // Scripts (redis-rs sends EVALSHA, loading the script when Redis does
    // not have it).
    "+evalsha",
    "+script|load",
    // Streams.
    "+xadd",
    "+xack",
    "+xautoclaim",
    "+xdel",
    "+xgroup|create",
    "+xgroup|setid",
    "+xgroup|delconsumer",
    "+xinfo|groups",
    "+xinfo|consumers",
    "+xlen",
    "+xpending",
    "+xrange",
    "+xrevrange",
    "+xread",
    "+xreadgroup",
    "+xtrim",
    // Strings, hashes, sets, sorted sets.
    "+get",
    "+mget",
    "+set",
    "+del",
    "+exists",
    "+incrby",
    "+pttl",
    "+type",
    "+hget",
    "+hgetall",
    "+hmget",
    "+hset",
    "+hdel",
    "+hincrby",
    "+sadd",
    "+srem",
    "+scard",
    "+smembers",
    "+sismember",
    "+sscan",
    "+pexpire",
    "+persist",
    "+zadd",
    "+zcard",
    "+zrange",
    "+zremrangebyscore",
    "+zscore",
    // Server and connection: `INFO` tells a single-node URL that names a
    // cluster node; the cluster client reads the topology and follows ASK
    // redirections.
    "+time",
    "+ping",
    "+select",
    "+info",
    // `[broker] wait_replicas`.
    "+wait",
    "+cluster|slots",
    "+cluster|shards",
    "+asking",
];

/// The glob patterns of every key of `category`: `{*}category` (its
/// events without a key, in its shard) and `{*}category:*` (in every
/// shard), and its wake stream `category:__wake__`. Glob metacharacters in
/// the name are escaped.
pub fn category_patterns(category: &str) -> [String; 3] {
    let c = glob_escape(category);
    [
        format!("~{{*}}{c}"),
        format!("~{{*}}{c}:*"),
        format!("~{}", glob_escape(&names::wake_stream(category))),
    ]
}

/// The patterns of convoy's own keys: `{*}convoy:*` in the shards and
/// `convoy:*` outside them.
pub fn own_patterns() -> [String; 2] {
    [
        format!("~{{*}}{}:*", names::OWN_PREFIX),
        format!("~{}:*", names::OWN_PREFIX),
    ]
}

/// The ACL rules of a user that runs convoy on `categories` (engines,
/// publishers and the `convoy` command line alike): `resetkeys`, the key
/// patterns, `resetchannels`, `-@all`, then [`COMMANDS`]. Give them to
/// `ACL SETUSER name on >password ...` (see [`setuser`]).
pub fn rules(categories: &[&str]) -> Vec<String> {
    let mut out = vec!["resetkeys".to_owned()];
    for c in categories {
        out.extend(category_patterns(c));
    }
    out.extend(own_patterns());
    out.push("resetchannels".to_owned());
    out.push("-@all".to_owned());
    out.extend(COMMANDS.iter().map(|c| (*c).to_owned()));
    out
}

/// The whole `ACL SETUSER` command for `user` with `password` on
/// `categories`, as one line for `redis-cli` (`reset` first, so running it
/// again replaces every earlier rule of the user).
pub fn setuser(user: &str, password: &str, categories: &[&str]) -> String {
    let mut out = format!("ACL SETUSER {user} reset on >{password}");
    for r in rules(categories) {
        out.push(' ');
        out.push_str(&r);
    }
    out
}

/// `s` with the glob metacharacters `* ? [ ] \` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_cover_categories_and_convoy() {
        let r = rules(&["order"]);
        assert_eq!(
            &r[..8],
            [
                "resetkeys",
                "~{*}order",
                "~{*}order:*",
                "~order:__wake__",
                "~{*}convoy:*",
                "~convoy:*",
                "resetchannels",
                "-@all"
            ]
        );
        assert!(r.contains(&"+evalsha".to_owned()));
        assert_eq!(category_patterns("a*b")[1], "~{*}a\\*b:*");
    }

    #[test]
    fn setuser_is_one_line() {
        let s = setuser("app", "pw", &["order", "payment"]);
        assert!(s.starts_with("ACL SETUSER app reset on >pw resetkeys ~{*}order ~{*}order:* ~order:__wake__ ~{*}payment ~{*}payment:* ~payment:__wake__ ~{*}convoy:* ~convoy:* resetchannels -@all +evalsha"), "{s}");
        assert!(!s.contains('\n'));
    }
}
