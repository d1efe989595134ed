//! The runtime's modules import each other without cycles, each imports
//! only from its own layer or lower ones, and the brokers never import the
//! assembly (domain, engine, unit of work): the layering the crate docs
//! describe, checked on every test run.
//!
//! An import is a `use crate::…` / `use super::…` / `use self::…` path, or
//! such a path written inline, resolved to the longest module prefix that
//! is a file of `src/`. A parent's `mod child;` and its relative
//! `pub use child::…` re-exports are containment, not imports. Comments
//! and a trailing `#[cfg(test)] mod tests { … }` block are left out. (The
//! same rules as `../shared/tools/modcycles.py`, so both agree.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `src`, by module path (`redis/mod.rs` is
/// `["redis"]`, `lib.rs` is `[]`).
fn files(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            out.insert(module, path);
        }
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The source without comments and without a trailing test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a readable source file");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = &rest[l..];
                rest = rest.find('\n').map_or("", |n| &rest[n..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                break;
            }
        }
    }
    // `#[cfg(test)] mod name {` to the end: the house style puts tests last.
    let mut from = 0;
    while let Some(i) = out[from..].find("#[cfg(test)]") {
        let at = from + i;
        let after = out[at + "#[cfg(test)]".len()..].trim_start();
        if let Some(m) = after.strip_prefix("mod")
            && m.starts_with(char::is_whitespace)
        {
            let m = m.trim_start();
            let name_len = m.find(|c: char| !is_word(c)).unwrap_or(m.len());
            if name_len > 0 && m[name_len..].trim_start().starts_with('{') {
                out.truncate(at);
                break;
            }
        }
        from = at + 1;
    }
    out
}

/// Each `use …;` statement of `text` (its path part), and the text with
/// them removed.
fn uses(text: &str) -> (Vec<String>, String) {
    let mut found = Vec::new();
    let mut rest_text = String::new();
    let mut i = 0;
    let bytes = text.as_bytes();
    while let Some(off) = text[i..].find("use") {
        let at = i + off;
        let before_ok = at == 0 || !is_word(text[..at].chars().next_back().unwrap_or(' '));
        let after = &text[at + 3..];
        let ws = after.len() - after.trim_start().len();
        if before_ok
            && ws > 0
            && bytes.get(at + 3 + ws).is_some_and(|b| *b != b';')
            && let Some(end) = after.find(';')
        {
            found.push(after[..end].trim_start().replace('\n', " "));
            rest_text.push_str(&text[i..at]);
            i = at + 3 + end + 1;
            continue;
        }
        rest_text.push_str(&text[i..at + 3]);
        i = at + 3;
    }
    rest_text.push_str(&text[i..]);
    (found, rest_text)
}

/// The paths a `use` body names, one level of `{…}` groups expanded.
fn use_paths(body: &str) -> Vec<String> {
    let body = body.trim_end();
    let Some(open) = body.find("::{") else {
        return vec![body.to_owned()];
    };
    let Some(inner) = body[open + 3..].strip_suffix('}') else {
        return vec![body.to_owned()];
    };
    let prefix = &body[..open];
    // Split at commas that are not inside a nested group.
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (j, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&inner[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .map(|item| format!("{prefix}::{}", item.trim()))
        .collect()
}

/// The longest prefix of `path` that is a module of the crate.
fn resolve(files: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (0..=path.len())
        .rev()
        .map(|i| path[..i].to_vec())
        .find(|m| files.contains_key(m))
}

/// Who imports whom.
fn imports(files: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, path) in files {
        let mut out = BTreeSet::new();
        let (statements, rest) = uses(&code(path));
        for body in statements {
            for q in use_paths(&body) {
                let segs: Vec<&str> = q
                    .split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                let target: Vec<String> = match segs.first() {
                    Some(&"crate") => segs[1..].iter().map(|s| (*s).to_owned()).collect(),
                    Some(&("super" | "self")) => {
                        let mut cur = module.clone();
                        let mut k = 0;
                        while k < segs.len() && matches!(segs[k], "super" | "self") {
                            if segs[k] == "super" {
                                cur.pop();
                            }
                            k += 1;
                        }
                        cur.extend(segs[k..].iter().map(|s| (*s).to_owned()));
                        cur
                    }
                    _ => continue,
                };
                let target: Vec<String> = target
                    .iter()
                    .map(|t| {
                        t.split(" as ")
                            .next()
                            .unwrap_or("")
                            .trim_matches(|c| c == '{' || c == '}' || c == ' ')
                            .to_owned()
                    })
                    .collect();
                if let Some(r) = resolve(files, &target) {
                    let ancestor = module.starts_with(&r) && target.len() <= r.len();
                    if &r != module && !ancestor {
                        out.insert(r);
                    }
                }
            }
        }
        for (kw, segs) in inline_paths(&rest) {
            let target: Vec<String> = match kw {
                "crate" => segs,
                "super" => {
                    let mut cur = module[..module.len().saturating_sub(1)].to_vec();
                    cur.extend(segs);
                    cur
                }
                _ => {
                    let mut cur = module.clone();
                    cur.extend(segs);
                    cur
                }
            };
            if let Some(r) = resolve(files, &target)
                && &r != module
            {
                out.insert(r);
            }
        }
        edges.insert(module.clone(), out);
    }
    edges
}

/// `crate::a::b`, `super::a`, `self::a` (or `…::{`) written in code.
fn inline_paths(text: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for kw in ["crate", "super", "self"] {
        let mut from = 0;
        while let Some(off) = text[from..].find(kw) {
            let at = from + off;
            from = at + kw.len();
            if at > 0 && text[..at].chars().next_back().is_some_and(is_word) {
                continue;
            }
            let mut rest = &text[at + kw.len()..];
            let mut segs = Vec::new();
            while let Some(r) = rest.strip_prefix("::") {
                let len = r.find(|c: char| !is_word(c)).unwrap_or(r.len());
                if len == 0 {
                    if r.starts_with('{') && segs.is_empty() {
                        segs.push("{".to_owned());
                    }
                    break;
                }
                segs.push(r[..len].to_owned());
                rest = &r[len..];
            }
            if !segs.is_empty() {
                out.push((kw, segs));
            }
        }
    }
    out
}

/// The strongly connected sets of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn strong<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in &s.edges[v] {
            let Some((w, _)) = s.edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                strong(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            strong(&mut s, v);
        }
    }
    s.out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn name(files: &BTreeMap<Module, PathBuf>, m: &Module) -> String {
    files[m]
        .strip_prefix(src())
        .expect("under src")
        .display()
        .to_string()
}

#[test]
fn the_runtime_modules_import_each_other_without_cycles() {
    let files = files(&src());
    let edges = imports(&files);
    let found: Vec<String> = cycles(&edges)
        .iter()
        .map(|c| {
            let names: Vec<String> = c.iter().map(|m| name(&files, m)).collect();
            format!("cycle of {} files: {}", c.len(), names.join(", "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "the runtime's modules import each other in a circle (import only from lower layers; see the crate docs):\n{}",
        found.join("\n")
    );
}

/// The layer of a module, as the crate docs list them: 1 vocabulary, 2
/// handler contracts, 3 delivery contracts, 4 brokers, 5 assembly, 6 what
/// serves tests and generated code.
fn layer(m: &Module) -> Option<u8> {
    let path: Vec<&str> = m.iter().map(String::as_str).collect();
    Some(match path.as_slice() {
        [] => return None,
        // Test modules kept in their own file serve tests only (the test
        // kit they use is a crate of its own, `convoy-testkit`).
        [.., "tests"] => 6,
        ["error" | "key" | "message" | "envelope" | "metrics" | "log" | "future" | "backoff"]
        | ["config", ..] => 1,
        ["raise" | "handler" | "process_manager"] | ["registry", ..] => 2,
        ["names" | "routing"] | ["outbox", ..] | ["broker"] | ["broker", "plan" | "outage"] => 3,
        ["broker", "inline"] | ["redis", ..] | ["postgres", ..] => 4,
        ["domain" | "uow" | "engine" | "signal"] => 5,
        ["private"] => 6,
        _ => return None,
    })
}

#[test]
fn every_module_has_a_layer_and_imports_only_from_its_own_or_lower_ones() {
    let files = files(&src());
    let edges = imports(&files);
    let mut wrong = Vec::new();
    for (module, targets) in &edges {
        let Some(from) = layer(module) else {
            if !module.is_empty() {
                wrong.push(format!(
                    "{} has no layer: add it to `layer` here and to the crate docs' table",
                    name(&files, module)
                ));
            }
            continue;
        };
        for t in targets {
            if let Some(to) = layer(t).filter(|to| *to > from) {
                wrong.push(format!(
                    "{} (layer {from}) imports {} (layer {to})",
                    name(&files, module),
                    name(&files, t)
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn brokers_never_import_the_domain_the_engine_or_the_unit_of_work() {
    let files = files(&src());
    let edges = imports(&files);
    let assembly: Vec<Module> = ["domain", "engine", "uow"]
        .iter()
        .map(|m| vec![(*m).to_owned()])
        .collect();
    let mut wrong = Vec::new();
    for (module, targets) in &edges {
        let broker = matches!(module.first().map(String::as_str), Some("redis" | "broker"));
        for t in targets.iter().filter(|t| broker && assembly.contains(t)) {
            wrong.push(format!(
                "{} imports {}",
                name(&files, module),
                name(&files, t)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_a_cycle() {
    // The checker itself: two files that import each other are one cycle,
    // and containment (`mod`, a relative re-export) is not an import.
    let dir = std::env::temp_dir().join(format!("convoy-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).expect("dir");
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\npub use a::X;\n").expect("lib");
    std::fs::write(
        dir.join("a/mod.rs"),
        "mod c;\npub use c::Y;\nuse crate::b::Z; // b\npub struct X;\n",
    )
    .expect("a");
    std::fs::write(dir.join("a/c.rs"), "use super::X;\npub struct Y;\n").expect("c");
    std::fs::write(
        dir.join("b.rs"),
        "pub struct Z;\nfn f() { let _ = crate::a::X; }\n/* crate::a::c::Y */\n",
    )
    .expect("b");
    let files = files(&dir);
    let edges = imports(&files);
    let found = cycles(&edges);
    std::fs::remove_dir_all(&dir).ok();
    let names: Vec<Vec<String>> = found
        .iter()
        .map(|c| c.iter().map(|m| m.join("/")).collect())
        .collect();
    assert_eq!(names, vec![vec!["a".to_owned(), "b".to_owned()]]);
}
