//! UI tests of convoy's macros: every `tests/ui/*/fail/*.rs` must fail to
//! compile with exactly the `.stderr` beside it, every `tests/ui/*/pass/*.rs`
//! must compile and run.
//!
//! After changing a message, regenerate with
//! `TRYBUILD=overwrite cargo test -p convoy-tests --test compiletest` and
//! review every changed `.stderr` like code.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*/fail/*.rs");
    t.pass("tests/ui/*/pass/*.rs");
}
