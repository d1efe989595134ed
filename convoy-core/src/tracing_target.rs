//! Log targets as they were before the runtime was split into crates.
//!
//! Filters such as `RUST_LOG=convoy_runtime=info` or
//! `convoy_runtime::redis::loss=error` select convoy's own log lines by
//! target, and a `tracing` event's target is by default the module path it
//! is logged from. The code that logs now lives in `convoy-core`,
//! `convoy-redis` and `convoy-postgres`, so each of them routes its
//! `tracing::warn!` (and the other event and span macros) through a module
//! made by [`tracing_shim!`](crate::tracing_shim) that sets the target back
//! to the old module path: `convoy_redis::partitioned::worker` logs as
//! `convoy_runtime::redis::partitioned::worker`. A file opts in with
//! `use crate::tracing;`.

pub use ::tracing;

/// The length of `path` with its prefix `from` replaced by `to`.
pub const fn len(path: &str, from: &str, to: &str) -> usize {
    assert!(starts_with(path.as_bytes(), from.as_bytes()));
    path.len() - from.len() + to.len()
}

/// The bytes of `path` with its prefix `from` replaced by `to`; `N` is
/// [`len`].
pub const fn bytes<const N: usize>(path: &str, from: &str, to: &str) -> [u8; N] {
    let (path, from, to) = (path.as_bytes(), from.as_bytes(), to.as_bytes());
    let mut out = [0u8; N];
    let mut i = 0;
    while i < to.len() {
        out[i] = to[i];
        i += 1;
    }
    let mut j = from.len();
    while j < path.len() {
        out[i] = path[j];
        i += 1;
        j += 1;
    }
    out
}

/// `bytes` as text (they are the UTF-8 of two module paths).
pub const fn as_str(bytes: &'static [u8]) -> &'static str {
    match core::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => panic!("a module path is UTF-8"),
    }
}

const fn starts_with(s: &[u8], prefix: &[u8]) -> bool {
    if s.len() < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if s[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The old target of the module it is expanded in: its module path with
/// the prefix `$from` (a crate name) replaced by `$to`.
#[doc(hidden)]
#[macro_export]
macro_rules! old_target {
    ($from:literal => $to:literal) => {{
        const PATH: &str = ::core::module_path!();
        const N: usize = $crate::tracing_target::len(PATH, $from, $to);
        const BYTES: [u8; N] = $crate::tracing_target::bytes::<N>(PATH, $from, $to);
        const TARGET: &str = $crate::tracing_target::as_str(&BYTES);
        TARGET
    }};
}

/// Defines, in the module it is expanded in, `tracing`'s event and span
/// macros with the target of [`old_target!`](crate::old_target), and
/// re-exports the few other items of `tracing` convoy uses (`Instrument`,
/// `Level`, `Span`). Call it as
/// `tracing_shim!($ "convoy_redis" => "convoy_runtime::redis")`: the `$`
/// lets it define macros that take arguments.
#[doc(hidden)]
#[macro_export]
macro_rules! tracing_shim {
    ($d:tt $from:literal => $to:literal) => {
        #[allow(unused_imports)]
        pub(crate) use $crate::tracing_target::tracing::{Instrument, Level, Span};

        #[allow(unused_macros)]
        macro_rules! shim_trace {
            ($d($d arg:tt)*) => {
                $crate::tracing_target::tracing::trace!(target: $crate::old_target!($from => $to), $d($d arg)*)
            };
        }
        #[allow(unused_macros)]
        macro_rules! shim_debug {
            ($d($d arg:tt)*) => {
                $crate::tracing_target::tracing::debug!(target: $crate::old_target!($from => $to), $d($d arg)*)
            };
        }
        #[allow(unused_macros)]
        macro_rules! shim_info {
            ($d($d arg:tt)*) => {
                $crate::tracing_target::tracing::info!(target: $crate::old_target!($from => $to), $d($d arg)*)
            };
        }
        #[allow(unused_macros)]
        macro_rules! shim_warn {
            ($d($d arg:tt)*) => {
                $crate::tracing_target::tracing::warn!(target: $crate::old_target!($from => $to), $d($d arg)*)
            };
        }
        #[allow(unused_macros)]
        macro_rules! shim_error {
            ($d($d arg:tt)*) => {
                $crate::tracing_target::tracing::error!(target: $crate::old_target!($from => $to), $d($d arg)*)
            };
        }
        #[allow(unused_macros)]
        macro_rules! shim_span {
            ($d($d arg:tt)*) => {
                $crate::tracing_target::tracing::span!(target: $crate::old_target!($from => $to), $d($d arg)*)
            };
        }
        #[allow(unused_imports)]
        // Renamed on the way out: `warn` alone would be ambiguous with the
        // built-in attribute of that name.
        pub(crate) use {
            shim_debug as debug, shim_error as error, shim_info as info, shim_span as span,
            shim_trace as trace, shim_warn as warn,
        };
    };
}

#[cfg(test)]
mod tests {
    mod redis {
        // What convoy-redis's lib.rs expands, with this test module standing
        // in for convoy-redis's root (the calls below are made from it).
        crate::tracing_shim!($ "convoy_core::tracing_target::tests" => "convoy_runtime::redis");
    }

    #[test]
    fn the_shim_s_events_and_spans_carry_the_old_target() {
        use redis as tracing;
        let log = convoy_testkit::CapturedLog::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("convoy_runtime::redis=info")
            .with_writer(log.clone())
            .with_ansi(false)
            .finish();
        ::tracing::subscriber::with_default(subscriber, || {
            let span = tracing::span!(tracing::Level::INFO, "unit", key = "k");
            span.in_scope(|| tracing::warn!(shard = 3, "lost a lease"));
            tracing::info!("kept");
            tracing::debug!("filtered out");
        });
        let text = log.text();
        assert!(
            text.contains("convoy_runtime::redis: lost a lease shard=3"),
            "{text}"
        );
        assert!(text.contains("unit{key=\"k\"}"), "{text}");
        assert!(text.contains("convoy_runtime::redis: kept"), "{text}");
        assert!(!text.contains("filtered out"), "{text}");
    }

    #[test]
    fn the_prefix_is_replaced() {
        const T: &str = crate::old_target!("convoy_core" => "convoy_runtime");
        assert_eq!(T, "convoy_runtime::tracing_target::tests");
        let (from, to) = ("convoy_redis", "convoy_runtime::redis");
        for (path, old) in [
            ("convoy_redis", "convoy_runtime::redis"),
            ("convoy_redis::loss", "convoy_runtime::redis::loss"),
        ] {
            const MAX: usize = 64;
            let n = super::len(path, from, to);
            let bytes = super::bytes::<MAX>(path, from, to);
            assert_eq!(std::str::from_utf8(&bytes[..n]).unwrap(), old);
        }
    }
}
