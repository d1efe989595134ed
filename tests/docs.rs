//! The user documentation checked against the code, so that it cannot
//! drift: the README's size; no internal issue numbers, dated narratives or
//! one machine's notes; the configuration guide's key table against every
//! key `Config` accepts, and its `toml` blocks against the parser and the
//! defaults; the guides' links (the `.md` targets for readers of the
//! repository and the labels `convoy-runtime/src/lib.rs` resolves for
//! rustdoc); the test, example and package names and the environment
//! variables the commands name; and the handler override with a hyphen,
//! typed as the guide shows it. (The Rust snippets are doc tests of
//! `convoy-runtime`; the ACL rule is checked in `redis_acl.rs`.)

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use convoy_runtime::Config;

/// The README's size limit, in bytes.
const README_LIMIT: usize = 12 * 1024;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// `docs/*.md`, by path relative to the root, sorted.
fn guides() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| {
            let rel = format!("docs/{n}");
            let text = read(&rel);
            (rel, text)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 5, "the guides are missing: {out:?}");
    out
}

/// Everything written for users and contributors: the README, the
/// changelog, the contributing guide and the guides.
fn user_docs() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
        .into_iter()
        .map(|rel| (rel.to_owned(), read(rel)))
        .collect();
    out.extend(guides());
    out
}

/// The contents of the fenced code blocks of `text` whose info string
/// starts with `lang`.
fn code_blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(info)) => {
                if info.split(',').next() == Some(lang) {
                    current = Some(String::new());
                } else {
                    // Skip a block of another language to its closing fence.
                    current = Some("\u{0}skip".to_owned());
                }
            }
            (Some(block), Some(_)) => {
                if !block.starts_with('\u{0}') {
                    out.push(std::mem::take(block));
                }
                current = None;
            }
            (Some(block), None) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// `text` without its fenced code blocks and inline code spans: the prose,
/// where links are.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        // Drop `code spans` (one backtick each side is all the docs use).
        let mut in_span = false;
        for c in line.chars() {
            if c == '`' {
                in_span = !in_span;
            } else if !in_span {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

#[test]
fn the_readme_fits_on_a_screen() {
    let size = read("README.md").len();
    assert!(
        size <= README_LIMIT,
        "README.md is {size} bytes, more than {README_LIMIT}: move the detail to a guide in docs/ and link it"
    );
}

/// `#12`-style references (a `#` and a digit, not inside a word such as a
/// key `acme#2` or an origin `{producer}#{seq}`) and "issue 9" phrases.
fn issue_references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        let next_is_digit = chars.get(i + 1).is_some_and(char::is_ascii_digit);
        let after_word = i > 0 && (chars[i - 1].is_alphanumeric() || "}_".contains(chars[i - 1]));
        if *c == '#' && next_is_digit && !after_word {
            found.push(
                chars[i.saturating_sub(20)..(i + 6).min(chars.len())]
                    .iter()
                    .collect(),
            );
        }
    }
    let lower = text.to_lowercase();
    for word in ["issue ", "issues ", "issue #"] {
        for (at, _) in lower.match_indices(word) {
            if lower[at + word.len()..].starts_with(|c: char| c.is_ascii_digit() || c == '#') {
                found.push(text[at..(at + word.len() + 6).min(text.len())].to_owned());
            }
        }
    }
    for phrase in ["this session", "this machine", "on this 2-core"] {
        if lower.contains(phrase) {
            found.push(phrase.to_owned());
        }
    }
    found
}

#[test]
fn user_docs_cite_no_internal_issues_or_machine_notes() {
    assert!(!issue_references("see #18 and issue 9").is_empty());
    assert!(issue_references("key acme#2, origin {producer}#{seq}, # 1").is_empty());
    for (file, text) in user_docs() {
        let found = issue_references(&text);
        assert!(
            found.is_empty(),
            "{file} cites internal issues, dated narratives or one machine's notes: {found:?}"
        );
    }
}

/// A key `Config` accepts, as the configuration guide's table writes it:
/// `[server.partitioning] lease_ttl_ms`, `[broker.category_shards] <name>`,
/// `[handlers."name"] concurrency`.
fn config_keys() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    walk_struct(&[], &mut keys);
    keys
}

const PROBE: &str = "zz_docs_probe";

/// How the configuration parser takes a table at `path`.
enum Shape {
    /// A struct with these fields.
    Struct(Vec<String>),
    /// A map of user-named scalar values.
    ScalarMap,
    /// A map of user-named structs with these fields.
    StructMap(Vec<String>),
    /// Not a table.
    Scalar,
}

fn header(path: &[String]) -> String {
    path.join(".")
}

/// The fields of the "unknown field `zz_docs_probe`, expected ..." error of
/// parsing `toml`, if it is that error.
fn expected_fields(toml: &str) -> Result<Option<Vec<String>>, ()> {
    let Err(e) = Config::from_toml(toml) else {
        return Err(());
    };
    let message = e.to_string();
    let marker = format!("unknown field `{PROBE}`, expected");
    let Some(at) = message.find(&marker) else {
        return Ok(None);
    };
    let rest = &message[at + marker.len()..];
    let line = rest.lines().next().unwrap_or("");
    let fields = line
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    Ok(Some(fields))
}

fn shape(path: &[String]) -> Shape {
    let table = if path.is_empty() {
        format!("{PROBE} = 1\n")
    } else {
        format!("[{}]\n{PROBE} = 1\n", header(path))
    };
    match expected_fields(&table) {
        Err(()) => return Shape::ScalarMap,
        Ok(Some(fields)) => return Shape::Struct(fields),
        Ok(None) => {}
    }
    let entry = format!("[{}.{PROBE}]\n{PROBE} = 1\n", header(path));
    match expected_fields(&entry) {
        Ok(Some(fields)) => Shape::StructMap(fields),
        _ => Shape::Scalar,
    }
}

fn walk_struct(path: &[String], keys: &mut BTreeSet<String>) {
    let Shape::Struct(fields) = shape(path) else {
        panic!("[{}] is not a section", header(path));
    };
    for field in fields {
        let mut child = path.to_vec();
        child.push(field.clone());
        match shape(&child) {
            Shape::Struct(_) => walk_struct(&child, keys),
            Shape::ScalarMap => {
                keys.insert(format!("[{}] <name>", header(&child)));
            }
            Shape::StructMap(inner) => {
                for f in inner {
                    keys.insert(format!("[{}.\"name\"] {f}", header(&child)));
                }
            }
            Shape::Scalar => {
                assert!(
                    !path.is_empty(),
                    "a top-level key `{field}`: give it a section"
                );
                keys.insert(format!("[{}] {field}", header(path)));
            }
        }
    }
}

/// The keys of the configuration guide's tables (their first column), with
/// a placeholder such as `<category>` written `<name>`.
fn documented_keys() -> BTreeSet<String> {
    read("docs/configuration.md")
        .lines()
        .filter_map(|l| l.strip_prefix("| `["))
        .map(|l| {
            let key = format!("[{}", l.split('`').next().unwrap_or(""));
            match key.find('<') {
                Some(at) => format!("{}<name>", &key[..at]),
                None => key,
            }
        })
        .collect()
}

#[test]
fn the_configuration_guide_lists_every_key() {
    let keys = config_keys();
    // The enumeration itself found the sections and keys that matter.
    for key in [
        "[broker] url",
        "[broker] wait_acks",
        "[broker.category_shards] <name>",
        "[outbox] notify",
        "[server.partitioning] lease_ttl_ms",
        "[handlers.\"name\"] concurrency",
    ] {
        assert!(keys.contains(key), "{key} not found in Config: {keys:?}");
    }
    let documented = documented_keys();
    let missing: Vec<_> = keys.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md's key table is out of date: missing {missing:?}, not keys of Config {unknown:?}"
    );
}

#[test]
fn the_guides_toml_blocks_are_valid_configuration() {
    let mut blocks = 0;
    for (file, text) in user_docs() {
        for block in code_blocks(&text, "toml") {
            blocks += 1;
            if let Err(e) = Config::from_toml(&block) {
                panic!("a toml block of {file} is not a valid domain.toml: {e}\n{block}");
            }
        }
    }
    assert!(blocks >= 3, "{blocks} toml blocks");
    // The first block of the configuration guide sets every key to its
    // default.
    let defaults = code_blocks(&read("docs/configuration.md"), "toml")
        .into_iter()
        .next()
        .expect("the defaults block");
    assert_eq!(
        Config::from_toml(&defaults).expect("parses"),
        Config::default(),
        "the defaults block of docs/configuration.md is not Config::default()"
    );
}

/// GitHub's and rustdoc's anchor of a heading: lower case, punctuation
/// dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// A link target relative to `file`: the file exists, and so does the
/// anchor when it names one in a markdown file.
fn check_target(file: &str, target: &str) -> Result<(), String> {
    if target.starts_with("http://") || target.starts_with("https://") {
        return Ok(());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let here = Path::new(file).parent().unwrap_or(Path::new(""));
    let rel: PathBuf = if path.is_empty() {
        PathBuf::from(file)
    } else {
        here.join(path)
    };
    let full = root().join(&rel);
    if !full.exists() {
        return Err(format!(
            "{file}: link to {target}: {} does not exist",
            rel.display()
        ));
    }
    if let Some(anchor) = anchor
        && rel.extension().is_some_and(|e| e == "md")
        && !anchors(&fs::read_to_string(&full).unwrap_or_default()).contains(anchor)
    {
        return Err(format!("{file}: link to {target}: no heading #{anchor}"));
    }
    Ok(())
}

/// The `[label]: target` definitions at the start of lines.
fn definitions(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix('[')?;
            let (label, target) = rest.split_once("]: ")?;
            Some((label.to_owned(), target.trim().to_owned()))
        })
        .collect()
}

/// Labels used as `[text][label]` or `[label]` in the prose.
fn used_labels(text: &str) -> BTreeSet<String> {
    let prose = prose(text);
    let is_label = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let mut out = BTreeSet::new();
    for line in prose.lines() {
        if line.starts_with('[') && line.contains("]: ") {
            continue; // a definition
        }
        let mut rest = line;
        while let Some(open) = rest.find('[') {
            let after = &rest[open + 1..];
            let Some(close) = after.find(']') else { break };
            let inner = &after[..close];
            let tail = &after[close + 1..];
            if let Some(next) = tail.strip_prefix('[') {
                if let Some(end) = next.find(']') {
                    if is_label(&next[..end]) {
                        out.insert(next[..end].to_owned());
                    }
                    rest = &next[end + 1..];
                    continue;
                }
            } else if !tail.starts_with('(') && is_label(inner) {
                out.insert(inner.to_owned());
            }
            rest = tail;
        }
    }
    out
}

/// The labels `convoy-runtime/src/lib.rs` defines for rustdoc:
/// `[label]: crate::docs::module#anchor`.
fn rustdoc_labels() -> Vec<(String, String)> {
    read("convoy-runtime/src/lib.rs")
        .lines()
        .filter_map(|l| {
            let def = l.trim().strip_prefix("#[doc = \"")?.strip_suffix("\"]")?;
            let (label, target) = def.strip_prefix('[')?.split_once("]: ")?;
            let target = target.strip_prefix("crate::docs::")?;
            Some((label.to_owned(), target.to_owned()))
        })
        .collect()
}

#[test]
fn the_guides_links_resolve_in_the_repository_and_in_rustdoc() {
    let rustdoc = rustdoc_labels();
    assert!(rustdoc.len() >= 8, "lib.rs's labels: {rustdoc:?}");
    let mut problems = Vec::new();
    // rustdoc's labels point at a guide and one of its headings.
    for (label, target) in &rustdoc {
        let (module, anchor) = match target.split_once('#') {
            Some((m, a)) => (m, Some(a)),
            None => (target.as_str(), None),
        };
        let file = format!("{}.md", module.replace('_', "-"));
        let md = match anchor {
            Some(a) => format!("{file}#{a}"),
            None => file,
        };
        if let Err(e) = check_target("docs/lib.rs", &md) {
            problems.push(format!("lib.rs label [{label}]: {e}"));
        }
    }
    for (file, text) in user_docs().into_iter().chain([(
        "convoy-cli/README.md".to_owned(),
        read("convoy-cli/README.md"),
    )]) {
        let defined = definitions(&text);
        for (label, target) in &defined {
            if let Err(e) = check_target(&file, target) {
                problems.push(e);
            }
            // The same label means the same page (and heading) in rustdoc.
            if file.starts_with("docs/") {
                let (page, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, format!("#{a}")),
                    None => (target.as_str(), String::new()),
                };
                let module = format!("{}{anchor}", page.trim_end_matches(".md").replace('-', "_"));
                if !rustdoc.iter().any(|(l, t)| l == label && *t == module) {
                    problems.push(format!(
                        "{file}: [{label}]: {target} has no twin `#[doc = \"[{label}]: crate::docs::{module}\"]` in convoy-runtime/src/lib.rs"
                    ));
                }
            }
        }
        for label in used_labels(&text) {
            if !defined.iter().any(|(l, _)| *l == label) {
                problems.push(format!(
                    "{file}: [{label}] is used but not defined at the end of the page"
                ));
            }
        }
        // Inline links: `[text](target)`.
        let prose = prose(&text);
        for (at, _) in prose.match_indices("](") {
            let target = prose[at + 2..].split(')').next().unwrap_or("");
            if let Err(e) = check_target(&file, target) {
                problems.push(e);
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every file below `dir` whose name ends with `suffix`, leaving out build
/// output and git's own files.
fn files_below(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !["target", ".git", "node_modules"].contains(&name.as_str()) {
                files_below(&path, suffix, out);
            }
        } else if name.ends_with(suffix) {
            out.push(path);
        }
    }
}

/// The words following `flag ` in `text` (`--test fault_schedules`).
fn after_flag<'a>(text: &'a str, flag: &str) -> BTreeSet<&'a str> {
    text.match_indices(flag)
        .filter(|(at, _)| text[..*at].ends_with(' ') || *at == 0)
        .filter_map(|(at, _)| {
            text[at + flag.len()..]
                .split(|c: char| c.is_whitespace() || "`|),".contains(c))
                .next()
        })
        .filter(|w| !w.is_empty() && !w.starts_with('-'))
        .collect()
}

#[test]
fn the_commands_name_tests_examples_packages_and_variables_that_exist() {
    let mut sources = Vec::new();
    files_below(root(), ".rs", &mut sources);
    let stems: BTreeSet<String> = sources
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("tests")))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    let examples: BTreeSet<String> = fs::read_dir(root().join("examples"))
        .expect("examples/")
        .filter_map(|e| {
            e.ok()?
                .path()
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .collect();
    let mut packages: BTreeSet<String> = BTreeSet::from(["convoy-tests".to_owned()]);
    for dir in fs::read_dir(root()).expect("root").flatten() {
        if dir.path().join("Cargo.toml").exists() {
            packages.insert(dir.file_name().to_string_lossy().into_owned());
        }
    }
    let mut code = String::new();
    // Not this file: a name is checked against the code that reads it.
    let this = root().join("tests").join("docs.rs");
    for path in sources.iter().filter(|p| **p != this) {
        code.push_str(&fs::read_to_string(path).unwrap_or_default());
    }
    for script in ["run", "test", "valkey.sh", "redis8.sh"] {
        code.push_str(&read(&format!(".ci/{script}")));
    }

    let mut problems = Vec::new();
    for (file, text) in user_docs() {
        for name in after_flag(&text, "--test ") {
            if !stems.contains(name) {
                problems.push(format!("{file}: `--test {name}`: no tests/{name}.rs"));
            }
        }
        for name in after_flag(&text, "--example ") {
            if !examples.contains(name) {
                problems.push(format!("{file}: `--example {name}`: no examples/{name}.rs"));
            }
        }
        for name in after_flag(&text, "-p ") {
            if !packages.contains(name) {
                problems.push(format!("{file}: `-p {name}`: no such package"));
            }
        }
        // Environment variables: a test knob or setting the code reads, or
        // a configuration override naming a key.
        for (at, _) in text.match_indices("CONVOY_") {
            if text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                .collect();
            let name = name.trim_end_matches('_');
            if let Some(path) = name.strip_prefix("CONVOY__") {
                if path.starts_with("SECTION") {
                    continue; // the general form itself
                }
                let e = Config::from_toml_with_env("", "docs", [(name, "1")]).err();
                let wrong = e
                    .map(|e| e.to_string())
                    .filter(|m| m.contains("unknown field") || m.contains("does not name a key"));
                if let Some(m) = wrong {
                    problems.push(format!("{file}: {name} names no configuration key: {m}"));
                }
            } else if !code.contains(name) {
                problems.push(format!("{file}: {name} is read nowhere in the code"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Run by [`a_hyphenated_handler_override_can_be_typed`] in a child: prints
/// what the environment sets for the handler `ledger-projector`.
#[test]
fn config_child() {
    if std::env::var_os("CONVOY_DOCS_CHILD").is_none() {
        return;
    }
    let config = Config::from_env().expect("the environment's configuration");
    println!(
        "ledger-projector concurrency={}",
        config.concurrency("ledger-projector")
    );
}

#[test]
fn a_hyphenated_handler_override_can_be_typed() {
    // The guide's command, up to the program it starts.
    let guide = read("docs/configuration.md");
    let line = code_blocks(&guide, "sh")
        .iter()
        .flat_map(|b| b.lines().map(str::to_owned).collect::<Vec<_>>())
        .find(|l| l.starts_with("env 'CONVOY__HANDLERS__ledger-projector__"))
        .expect("docs/configuration.md shows the env command for a hyphenated handler name");
    let prefix = line.split(" cargo ").next().expect("the env part");
    let script = format!("{prefix} CONVOY_DOCS_CHILD=1 \"$0\" --exact config_child --nocapture");
    let exe = std::env::current_exe().expect("this test binary");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .arg(&exe)
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ledger-projector concurrency=8"),
        "`{script}` did not set the handler's concurrency:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The form the guide warns about is refused by bash.
    let refused = Command::new("bash")
        .arg("-c")
        .arg("export CONVOY__HANDLERS__ledger-projector__CONCURRENCY=8")
        .output()
        .expect("run bash");
    assert!(!refused.status.success());
}
