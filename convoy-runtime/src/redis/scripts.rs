//! The Lua scripts, kept as `.lua` files beside this one.

use std::sync::LazyLock;

use redis::Script;

/// Every script convoy runs.
pub(crate) struct Scripts {
    pub(crate) publish: Script,
    pub(crate) acquire: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) read: Script,
    pub(crate) ack: Script,
    pub(crate) fail: Script,
    pub(crate) claim: Script,
    pub(crate) reap: Script,
    pub(crate) plain_ack: Script,
    pub(crate) dead_letter: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    publish: Script::new(include_str!("lua/publish.lua")),
    acquire: Script::new(include_str!("lua/acquire.lua")),
    renew: Script::new(include_str!("lua/renew.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    read: Script::new(include_str!("lua/read.lua")),
    ack: Script::new(include_str!("lua/ack.lua")),
    fail: Script::new(include_str!("lua/fail.lua")),
    claim: Script::new(include_str!("lua/claim.lua")),
    reap: Script::new(include_str!("lua/reap.lua")),
    plain_ack: Script::new(include_str!("lua/plain_ack.lua")),
    dead_letter: Script::new(include_str!("lua/dead_letter.lua")),
});
