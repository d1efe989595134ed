//! TLS is an optional feature: without `tls`, none of rustls, ring or the
//! webpki roots is in the runtime's dependency graph; with it, they are
//! (`cargo tree` on the locked graph, offline).

use std::process::Command;

/// The runtime's normal dependencies, one `name vX.Y.Z` per line.
fn tree(features: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "tree",
        "-p",
        "convoy-runtime",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ])
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    let out = cmd.output().expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn tls_crates(tree: &str) -> Vec<&str> {
    let mut found: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| ["rustls", "ring", "webpki-roots", "tokio-rustls"].contains(name))
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

#[test]
fn tls_crates_are_compiled_only_with_the_tls_feature() {
    let without = tree(&[]);
    assert_eq!(tls_crates(&without), Vec::<&str>::new(), "{without}");
    // The test kit and the metrics endpoint do not bring TLS back either.
    let others = tree(&["testing", "prometheus"]);
    assert_eq!(tls_crates(&others), Vec::<&str>::new(), "{others}");
    let with = tree(&["tls"]);
    assert_eq!(
        tls_crates(&with),
        ["ring", "rustls", "tokio-rustls", "webpki-roots"],
        "{with}"
    );
}
