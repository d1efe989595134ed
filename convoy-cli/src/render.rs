//! Output: aligned tables and key/value blocks for people, JSON for
//! scripts. Every function returns the text; the caller prints it.

use convoy_runtime::key::{Escaped, needs_escape};
use convoy_runtime::redis::admin::{
    AuditRecord, CategoryReport, DeadLetter, Head, HeadOp, HeadOutcome, Inspection, KeyPause,
    PartitionStatus, ReplayOutcome,
};
use convoy_runtime::redis::keys;
use serde::Serialize;

/// Longest halt reason or error shown in a table cell.
const CELL: usize = 60;

/// Longest key shown in a table cell (a key is user data: it may be
/// kilobytes long).
const KEY_CELL: usize = 40;

/// Longest key shown in a message or a key/value block.
const KEY_TEXT: usize = 120;

/// Text from Redis (user data: keys, errors, entry fields) for the
/// terminal: control and bidirectional characters escaped (see
/// [`Escaped`]), on one line.
pub fn text(s: &str) -> String {
    Escaped(s).to_string()
}

/// A partition key for a message: escaped, and cut to [`KEY_TEXT`]
/// characters with `…` (the whole key is in `--json`, and in hexadecimal
/// with `partitions --key-hex`).
pub fn key(k: &str) -> String {
    cut(&text(k), KEY_TEXT)
}

/// A Redis key's name (a stream, which holds a partition key) for a
/// message: escaped, and cut like a key.
pub fn stream(name: &str) -> String {
    cut(&text(name), KEY_TEXT)
}

/// A key's UTF-8 bytes in hexadecimal, as `--key-hex` takes them.
pub fn hex(k: &str) -> String {
    k.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `out` with every control or bidirectional character other than the
/// newlines that end its lines escaped: the last guard before the
/// terminal, for anything rendering did not escape itself.
pub fn terminal_safe(out: &str) -> String {
    if !out.chars().any(|c| c != '\n' && needs_escape(c)) {
        return out.to_owned();
    }
    let mut safe = String::with_capacity(out.len());
    for c in out.chars() {
        if c != '\n' && needs_escape(c) {
            safe.push_str(&Escaped(c.encode_utf8(&mut [0; 4])).to_string());
        } else {
            safe.push(c);
        }
    }
    safe
}

/// `convoy acl`: the `ACL SETUSER` line and what it allows.
pub fn acl(user: &str, categories: &[&str]) -> String {
    let line = convoy_runtime::redis::acl::setuser(user, "PASSWORD", categories);
    format!(
        "# The least-privilege Redis user for convoy on {} (engines, publishers and the\n\
         # convoy command line): the categories' keys in every shard ({{s}}...), their\n\
         # wake streams and convoy's own ({{s}}convoy:*, convoy:*), no channels, only\n\
         # the commands convoy runs. Replace PASSWORD, then run it with redis-cli as\n\
         # an administrator (on a Redis Cluster: on every node), and put the user in\n\
         # the URL: redis://{user}:PASSWORD@host:6379/, or\n\
         # redis+cluster://{user}:PASSWORD@host1:port1,host2:port2/ (on Redis 7.2 and\n\
         # later, add +client|setinfo to keep ACL LOG quiet). A category added to the\n\
         # domain needs the rule again.\n\
         {line}\n",
        categories.join(", ")
    )
}
/// How a column is aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table with a header row, columns separated by two spaces.
#[derive(Debug)]
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra ones dropped).
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// The table, one line per row, without trailing spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.columns.iter().map(|(h, _)| width(h)).collect();
        for r in &self.rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.columns.iter().map(|(h, _)| (*h).to_owned()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(cell));
                match self.columns[i].1 {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` escaped (see [`text`]) and cut to `max` characters, with `…`
/// when cut.
pub fn truncate(s: &str, max: usize) -> String {
    cut(&text(s), max)
}

/// `s` cut to `max` characters, with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_owned();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

pub use convoy_runtime::redis::admin::utc;

/// A duration in milliseconds, short: `850ms`, `1.9s`, `2m05s`, `1h02m`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// Pretty JSON, with every control or bidirectional character in its
/// strings written as a `\uXXXX` escape (the same data for a JSON reader,
/// and nothing a terminal acts on).
pub fn json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    let mut s = json_safe(&serde_json::to_string_pretty(value)?);
    s.push('\n');
    Ok(s)
}

/// JSON text with the characters serde leaves as they are (DEL, C1
/// controls, bidirectional and invisible format characters) escaped as
/// `\uXXXX`. serde escapes C0 controls inside strings itself, so a raw
/// newline or tab is the layout's and stays.
fn json_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if needs_escape(c) && !matches!(c, '\n' | '\t' | '\r') {
            // Every such character is in the Basic Multilingual Plane.
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn owner_cell(p: &PartitionStatus) -> String {
    match (&p.owner, p.owner_alive) {
        (None, _) => "-".to_owned(),
        (Some(o), true) => text(o),
        (Some(o), false) => format!("{} (gone)", text(o)),
    }
}

/// The halt's reason and error, unescaped (callers escape or truncate).
fn halt_text(p: &PartitionStatus) -> String {
    let mut s = p.halt_reason.clone().unwrap_or_else(|| "halted".to_owned());
    if let Some(e) = &p.halt_error {
        s.push_str(": ");
        s.push_str(e);
    }
    s
}

/// An operator's pause, unescaped (callers escape or truncate): who, since
/// when, why.
pub fn pause_text(k: &KeyPause) -> String {
    let mut s = format!("paused by {} since {}", k.operator, utc(k.since_ms));
    if !k.reason.is_empty() {
        s.push_str(": ");
        s.push_str(&k.reason);
    }
    s
}

/// `convoy partitions`: one row per key and handler, then the totals.
/// Keys are escaped and cut to fit, or whole in hexadecimal with
/// `key_hex`.
pub fn partitions(r: &CategoryReport, key_hex: bool) -> String {
    let layout = format!(
        "category {}: {}, {} shards\n",
        text(&r.category),
        match &r.key_field {
            Some(f) => format!("partitioned by `{}`", text(f)),
            None => "no partition key recorded".to_owned(),
        },
        r.shards
    );
    if r.partitions.is_empty() {
        let groups = if r.groups.is_empty() {
            "no handler registered".to_owned()
        } else {
            format!("handlers: {}", text(&r.groups.join(", ")))
        };
        return format!(
            "{layout}category {}: no live partitions ({groups})\n",
            r.category
        );
    }
    let mut altered = false;
    let mut t = Table::new(&[
        ("KEY", Align::Left),
        ("HANDLER", Align::Left),
        ("OWNER", Align::Left),
        ("GEN", Align::Right),
        ("LEASE", Align::Right),
        ("LEN", Align::Right),
        ("PENDING", Align::Right),
        ("LAG", Align::Right),
        ("HALTED", Align::Left),
        ("REASON", Align::Left),
    ]);
    for p in &r.partitions {
        let len = if p.backfill_length > 0 {
            format!("{}+{}", p.length, p.backfill_length)
        } else {
            p.length.to_string()
        };
        let key_cell = if key_hex {
            hex(&p.key)
        } else {
            let cell = truncate(&p.key, KEY_CELL);
            altered |= cell != p.key;
            cell
        };
        t.row(vec![
            key_cell,
            text(&p.group),
            owner_cell(p),
            dash(p.generation),
            dash(p.lease_ms_left.map(duration)),
            len,
            p.pending.to_string(),
            p.lag.map_or_else(|| "?".to_owned(), |l| l.to_string()),
            match (p.halted, p.behind_halt, &p.gap, &p.key_pause) {
                (true, Some(n), _, _) => format!("yes, {n} behind"),
                (true, None, _, _) => "yes".to_owned(),
                (false, _, _, Some(_)) => "paused".to_owned(),
                (false, _, Some(_), None) => "no (gap)".to_owned(),
                (false, _, None, None) => "no".to_owned(),
            },
            match (&p.key_pause, p.halted) {
                (_, true) => truncate(&halt_text(p), CELL),
                (Some(k), false) => truncate(&pause_text(k), CELL),
                (None, false) => String::new(),
            },
        ]);
    }
    let s = &r.totals;
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let lag = if s.lag_unknown > 0 {
        format!("{} (+{} unknown)", s.lag, s.lag_unknown)
    } else {
        s.lag.to_string()
    };
    let backfill = if s.backfill_length > 0 {
        format!(" (+{} backfill)", s.backfill_length)
    } else {
        String::new()
    };
    let hint = if altered {
        "\nsome keys are shown escaped or cut; `--key-hex` lists them whole in hexadecimal, for `--key-hex` of the other commands\n"
    } else {
        ""
    };
    let behind = if s.behind_halts > 0 {
        format!(" ({} behind halted heads)", s.behind_halts)
    } else {
        String::new()
    };
    format!(
        "{layout}{}\ncategory {}: {}, {}, {} owned, {} halted; length {}{backfill}, pending {}, lag {lag}{behind}\n{hint}",
        t.render(),
        text(&r.category),
        plural(s.partitions, "partition", "partitions"),
        plural(r.groups.len(), "handler", "handlers"),
        s.owned,
        s.halted,
        s.length,
        s.pending,
    )
}

/// A key/value block with aligned values; multi-line values are indented.
fn block(rows: &[(&str, String)]) -> String {
    let w = rows.iter().map(|(k, _)| width(k)).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        if k.is_empty() && v.is_empty() {
            out.push('\n');
            continue;
        }
        let mut lines = v.lines();
        let first = lines.next().unwrap_or("");
        out.push_str(format!("{k:w$}  {first}").trim_end());
        out.push('\n');
        for l in lines {
            out.push_str(&format!("{:w$}  {l}", ""));
            out.push('\n');
        }
    }
    out
}

fn owner_line(p: &PartitionStatus) -> String {
    match (&p.owner, p.owner_alive) {
        (None, _) => format!(
            "none (durable generation {}; the next owner takes it at a newer one)",
            p.durable_generation
        ),
        (Some(o), alive) => {
            let gen_ = dash(p.generation);
            let lease = match (alive, p.lease_ms_left) {
                (true, Some(ms)) => format!(", lease {} left", duration(ms)),
                (true, None) => String::new(),
                (false, _) => ", not alive: its lease is free for the taking".to_owned(),
            };
            format!("{}, generation {gen_}{lease}", text(o))
        }
    }
}

/// The head, as words: `1-0 (primary lane, pending, delivered 2 times to e0:3)`.
fn head_line(h: &Head) -> String {
    let state = if h.pending {
        let times = if h.delivery_count == 1 {
            "time"
        } else {
            "times"
        };
        match &h.consumer {
            Some(c) => format!(
                "pending, delivered {} {times} to {}",
                h.delivery_count,
                text(c)
            ),
            None => format!("pending, delivered {} {times}", h.delivery_count),
        }
    } else {
        "not delivered yet".to_owned()
    };
    format!("{} ({} lane, {state})", text(&h.entry_id), h.lane.as_str())
}

/// A payload pretty-printed when it is JSON (with its strings' control and
/// bidirectional characters escaped), else escaped on one line.
fn payload(p: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(p) {
        Ok(v) => json_safe(&serde_json::to_string_pretty(&v).unwrap_or_else(|_| text(p))),
        Err(_) => text(p),
    }
}

/// `{category}:{key}`, the key escaped and cut.
fn partition(category: &str, k: &str) -> String {
    format!("{}:{}", text(category), key(k))
}

/// The unit's key's dead letter stream, `{s}{category}:{key}:dlq`, for a
/// message.
fn dlq(category: &str, s: &PartitionStatus) -> String {
    stream(&keys::partition_dlq(s.shard, category, &s.key))
}

/// The dashes of an optional escaped value.
fn dash_text(v: Option<&String>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| text(v))
}

/// `convoy inspect`: the unit's state, then its head.
pub fn inspection(category: &str, i: &Inspection) -> String {
    let s = &i.status;
    let mut rows: Vec<(&str, String)> = vec![("partition", partition(category, &s.key))];
    if s.key.chars().any(needs_escape) || key(&s.key) != s.key {
        rows.push(("key hex", cut(&hex(&s.key), 2 * KEY_TEXT)));
    }
    rows.push(("shard", s.shard.to_string()));
    rows.push(("handler", text(&s.group)));
    rows.push(("owner", owner_line(s)));
    if s.halted {
        let since = s.halt_since_ms.map(utc).unwrap_or_default();
        let reason = text(s.halt_reason.as_deref().unwrap_or_default());
        rows.push(("state", format!("HALTED since {since}: {reason}")));
        rows.push(("halted on", dash_text(s.halt_entry.as_ref())));
        rows.push(("halt error", dash_text(s.halt_error.as_ref())));
    } else if let Some(since) = s.paused_since_ms {
        rows.push((
            "state",
            format!(
                "PAUSED since {}: the owner's handler sees its dependency down and runs one probe at a time",
                utc(since)
            ),
        ));
    } else {
        rows.push(("state", "running".to_owned()));
    }
    rows.push(("attempts", s.attempts.to_string()));
    rows.push(("last error", dash_text(s.last_error.as_ref())));
    let len = if s.backfill_length > 0 {
        format!("{} (+{} backfill)", s.length, s.backfill_length)
    } else {
        s.length.to_string()
    };
    let behind = match s.behind_halt {
        Some(n) => format!(" ({n} behind the halted head)"),
        None => String::new(),
    };
    rows.push((
        "length",
        format!(
            "{len}, pending {}, lag {}{behind}",
            s.pending,
            s.lag
                .map_or_else(|| "unknown".to_owned(), |l| l.to_string())
        ),
    ));
    rows.push(("", String::new()));
    match &i.head {
        None => rows.push((
            "head",
            "none: nothing pending or waiting for this handler".into(),
        )),
        Some(h) => {
            rows.push(("head", head_line(h)));
            match (&h.envelope, &h.decode_error) {
                (Some(e), _) => {
                    rows.push(("type", text(&e.type_name)));
                    rows.push(("message id", text(&e.id)));
                    rows.push(("published", utc(e.time_ms)));
                    rows.push(("priority", e.priority.as_str().to_owned()));
                    rows.push(("correlation", dash_text(e.correlation_id.as_ref())));
                    rows.push(("payload", payload(&e.payload)));
                }
                (None, err) => {
                    rows.push(("undecodable", dash_text(err.as_ref())));
                }
            }
        }
    }
    block(&rows)
}

/// One line about the head an action is about to change (for the
/// confirmation dialog).
pub fn head_summary(category: &str, i: &Inspection, h: &Head) -> String {
    let s = &i.status;
    let what = match &h.envelope {
        Some(e) => format!(
            "{} (message {}, published {})",
            text(&e.type_name),
            text(&e.id),
            utc(e.time_ms)
        ),
        None => format!("undecodable ({})", dash_text(h.decode_error.as_ref())),
    };
    let state = match (&s.key_pause, s.halted) {
        (_, true) => format!("halted ({})", truncate(&halt_text(s), CELL)),
        (Some(k), false) => truncate(&pause_text(k), CELL),
        (None, false) => "running".to_owned(),
    };
    format!(
        "partition {} for handler {} is {state}\nhead {}: {what}\n",
        partition(category, &s.key),
        text(&s.group),
        head_line(h)
    )
}

/// The question asked before a skip, dead-letter or retry.
pub fn head_question(op: HeadOp, category: &str, i: &Inspection, h: &Head) -> String {
    let p = partition(category, &i.status.key);
    let (entry, group) = (text(&h.entry_id), text(&i.status.group));
    match op {
        HeadOp::Skip => format!(
            "Skip entry {entry} of {p} for handler {group}? It is acknowledged without being handled."
        ),
        HeadOp::DeadLetter => format!(
            "Move entry {entry} of {p} to {} for handler {group}?",
            dlq(category, &i.status)
        ),
        HeadOp::Retry => format!(
            "Run entry {entry} of {p} again for handler {group}, in place (the key's order is kept)?"
        ),
    }
}

/// The warning shown before forcing an action on a partition that is not
/// halted on its head.
pub fn force_warning(i: &Inspection) -> String {
    let s = &i.status;
    let owner = match (&s.owner, s.owner_alive) {
        (Some(o), true) => format!(
            "its owner {} (generation {}) is fenced out first (the generation is bumped and the lease deleted); the event it has in flight may still take effect, and the next owner takes the unit at a newer generation",
            text(o),
            dash(s.generation)
        ),
        _ => "it has no live owner to fence out".to_owned(),
    };
    format!("WARNING: --force on a partition that is not halted on this head: {owner}.\n")
}

/// What a skip, dead-letter or retry of the unit `s` did.
pub fn head_outcome(category: &str, s: &PartitionStatus, o: &HeadOutcome) -> String {
    let p = partition(category, &s.key);
    let (entry, group) = (text(&o.entry_id), text(&s.group));
    if o.op == HeadOp::Retry {
        let mut out = format!(
            "cleared the halt of {p} for handler {group}: its owner runs entry {entry} again (attempt 1), then the events behind it, in order\n"
        );
        if let Some(token) = &o.fenced {
            out.push_str(&format!(
                "fenced out the owner's lease {}: the next owner takes the unit at a newer generation and runs the head again\n",
                text(token)
            ));
        }
        out.push_str(&format!("audit record {}\n", text(&o.audit_id)));
        return out;
    }
    let mut out = match (&o.op, &o.dlq_id) {
        (HeadOp::DeadLetter, Some(id)) => format!(
            "moved entry {entry} of {p} to {} as {} for handler {group}",
            dlq(category, s),
            text(id)
        ),
        _ => format!("skipped entry {entry} of {p} for handler {group}"),
    };
    out.push_str(if o.deleted {
        " and deleted it from the stream"
    } else {
        " (kept in the stream for the category's other handlers)"
    });
    out.push_str("; the partition resumes with its next event\n");
    if let Some(token) = &o.fenced {
        out.push_str(&format!(
            "fenced out the owner's lease {}: the next owner takes the unit at a newer generation and reclaims what is pending\n",
            text(token)
        ));
    }
    out.push_str(&format!("audit record {}\n", text(&o.audit_id)));
    out
}

/// `convoy gaps`.
pub fn gaps(category: &str, rows: &[PartitionStatus]) -> String {
    if rows.is_empty() {
        return format!("no gaps recorded in category {}\n", text(category));
    }
    let mut t = Table::new(&[
        ("KEY", Align::Left),
        ("HANDLER", Align::Left),
        ("ENTRY", Align::Left),
        ("MESSAGE ID", Align::Left),
        ("DLQ ID", Align::Left),
        ("GAPS", Align::Right),
        ("REASON", Align::Left),
    ]);
    for p in rows {
        let Some(g) = &p.gap else { continue };
        t.row(vec![
            truncate(&p.key, KEY_CELL),
            text(&p.group),
            text(&g.entry_id),
            text(&g.message_id),
            text(&g.dead_letter_id),
            p.gaps.to_string(),
            truncate(&g.reason, CELL),
        ]);
    }
    format!(
        "{}\n{} gaps recorded in category {}; acknowledge one once reconciled: convoy gaps {} <key> --ack\n",
        t.render(),
        rows.len(),
        text(category),
        text(category)
    )
}

/// `convoy dlq`; `stream` is already escaped for the terminal.
pub fn dead_letters(stream: &str, letters: &[DeadLetter]) -> String {
    if letters.is_empty() {
        return format!("no dead letters in {stream}\n");
    }
    let mut t = Table::new(&[
        ("DLQ ID", Align::Left),
        ("TYPE", Align::Left),
        ("MESSAGE ID", Align::Left),
        ("HANDLER", Align::Left),
        ("ENTRY", Align::Left),
        ("WHEN", Align::Left),
        ("BY", Align::Left),
        ("ERROR", Align::Left),
    ]);
    for l in letters {
        let (ty, id) = match &l.envelope {
            Some(e) => (truncate(&e.type_name, CELL), truncate(&e.id, CELL)),
            None => ("?".to_owned(), "?".to_owned()),
        };
        t.row(vec![
            text(&l.dlq_id),
            ty,
            id,
            dash_text(l.group.as_ref()),
            dash_text(l.entry.as_ref()),
            dash(l.time_ms.map(utc)),
            l.operator
                .as_deref()
                .map_or_else(|| "-".to_owned(), |o| truncate(o, CELL)),
            truncate(l.error.as_deref().unwrap_or("-"), CELL),
        ]);
    }
    let n = letters.len();
    format!(
        "{}\n{n} dead letter{} in {stream}\n",
        t.render(),
        if n == 1 { "" } else { "s" }
    )
}

/// The question asked before a replay.
pub fn replay_question(
    category: &str,
    k: &str,
    l: &DeadLetter,
    to: &[String],
    every: bool,
    head: bool,
) -> String {
    let what = match &l.envelope {
        Some(e) => format!("{} (message {})", text(&e.type_name), text(&e.id)),
        None => "an undecodable entry".to_owned(),
    };
    let category = text(category);
    let names = |groups: &[String]| {
        groups
            .iter()
            .map(|g| text(g))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let failed = l.group.as_deref().map(text);
    let who = match (to, &failed) {
        ([], Some(g)) => format!("only handler {g}, which dead-lettered it, runs it"),
        ([], None) => "it names no handler that dead-lettered it".to_owned(),
        (groups, _) if every => format!(
            "EVERY handler of category {category} runs it: {}. Each one that handled the event already runs it again, unless its effects are exactly-once by the event's origin (AppliedEvents)",
            names(groups)
        ),
        (groups, _) => format!(
            "only {} {} {}",
            if groups.len() == 1 {
                "handler"
            } else {
                "handlers"
            },
            names(groups),
            if groups.len() == 1 {
                "runs it"
            } else {
                "run it"
            }
        ),
    };
    let p = format!("{category}:{}", key(k));
    if head {
        return format!(
            "Replay dead letter {} of {}, {what}, to the head of {p}? It runs before every event its handler has not finished (those are moved behind it), restoring the key's order; {who}.",
            text(&l.dlq_id),
            stream(&l.stream)
        );
    }
    format!(
        "Replay dead letter {} of {}, {what}, to the tail of {p}? It runs after the events already in the partition; {who}.",
        text(&l.dlq_id),
        stream(&l.stream)
    )
}

/// What a replay did.
pub fn replay_outcome(o: &ReplayOutcome, head: bool) -> String {
    format!(
        "replayed dead letter {} to the {} of {} as entry {}, for {}, and woke the partition's owners\naudit record {}\n",
        text(&o.dlq_id),
        if head {
            "head (the events not yet handled moved behind it)"
        } else {
            "tail"
        },
        stream(&o.stream),
        text(&o.entry_id),
        o.handlers
            .iter()
            .map(|g| text(g))
            .collect::<Vec<_>>()
            .join(", "),
        text(&o.audit_id)
    )
}

/// `convoy audit`.
pub fn audit(records: &[AuditRecord]) -> String {
    if records.is_empty() {
        return "no operator actions recorded in the audit streams\n".to_owned();
    }
    let mut t = Table::new(&[
        ("TIME", Align::Left),
        ("OP", Align::Left),
        ("PARTITION", Align::Left),
        ("HANDLER", Align::Left),
        ("ENTRY", Align::Left),
        ("OPERATOR", Align::Left),
        ("FORCED", Align::Left),
    ]);
    for r in records {
        let f = |k: &str| r.fields.get(k).cloned().unwrap_or_default();
        let time = f("time").parse().map(utc).unwrap_or_default();
        let op = f("op");
        // An outbox action's entry is the row's id, not a stream entry.
        let entry = if op.starts_with("outbox_") {
            format!("outbox row {}", f("entry"))
        } else {
            f("entry")
        };
        let group = f("group");
        t.row(vec![
            time,
            truncate(&op, CELL),
            format!(
                "{}:{}",
                truncate(&f("category"), CELL),
                truncate(&f("key"), KEY_CELL)
            ),
            if group.is_empty() {
                "-".to_owned()
            } else {
                truncate(&group, CELL)
            },
            truncate(&entry, CELL),
            truncate(&f("operator"), CELL),
            if f("forced") == "1" { "yes" } else { "no" }.to_owned(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use convoy_runtime::Envelope;
    use convoy_runtime::redis::admin::{Lane, Totals};

    use super::*;

    fn status(key: &str, halted: bool) -> PartitionStatus {
        PartitionStatus {
            key: key.to_owned(),
            shard: 3,
            group: "app::Ledger".to_owned(),
            owner: Some("e0".to_owned()),
            owner_alive: true,
            generation: Some(12),
            durable_generation: 12,
            lease_ms_left: Some(1_900),
            paused_since_ms: None,
            length: if halted { 7 } else { 0 },
            backfill_length: 0,
            pending: if halted { 7 } else { 0 },
            undelivered: Some(0),
            lag: Some(if halted { 7 } else { 0 }),
            behind_halt: halted.then_some(6),
            halted,
            halt_reason: halted.then(|| "max_retries exceeded".to_owned()),
            halt_error: halted.then(|| "poison event c1#3".to_owned()),
            halt_since_ms: halted.then_some(1_764_424_287_123),
            halt_entry: halted.then(|| "1764424280000-0".to_owned()),
            attempts: if halted { 3 } else { 0 },
            last_error: halted.then(|| "poison event c1#3".to_owned()),
            gap: None,
            gaps: 0,
            key_pause: None,
        }
    }

    #[test]
    fn tables_align_columns_and_trim() {
        let mut t = Table::new(&[
            ("NAME", Align::Left),
            ("N", Align::Right),
            ("X", Align::Left),
        ]);
        t.row(vec!["a".into(), "1".into(), String::new()]);
        t.row(vec!["long name".into(), "1234".into(), "x".into()]);
        t.row(vec!["short".into()]);
        assert_eq!(
            t.render(),
            "NAME          N  X\n\
             a             1\n\
             long name  1234  x\n\
             short\n"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(1_949), "1.9s");
        assert_eq!(duration(125_000), "2m05s");
        assert_eq!(duration(3_720_000), "1h02m");
        assert_eq!(truncate("abc\ndef", 10), "abc\\ndef");
        assert_eq!(truncate("abcdefghijkl", 5), "abcd…");
    }

    #[test]
    fn partitions_table_and_totals() {
        let report = CategoryReport {
            category: "ledger".into(),
            shards: 16,
            key_field: Some("client_id".into()),
            groups: vec!["app::Ledger".into()],
            partitions: vec![status("c0", false), status("c1", true)],
            totals: Totals {
                partitions: 2,
                units: 2,
                owned: 2,
                halted: 1,
                length: 7,
                backfill_length: 0,
                pending: 7,
                lag: 7,
                lag_unknown: 0,
                behind_halts: 6,
            },
        };
        let text = partitions(&report, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "category ledger: partitioned by `client_id`, 16 shards"
        );
        assert_eq!(
            lines[1],
            "KEY  HANDLER      OWNER  GEN  LEASE  LEN  PENDING  LAG  HALTED         REASON"
        );
        assert_eq!(
            lines[2],
            "c0   app::Ledger  e0      12   1.9s    0        0    0  no"
        );
        assert_eq!(
            lines[3],
            "c1   app::Ledger  e0      12   1.9s    7        7    7  yes, 6 behind  max_retries exceeded: poison event c1#3"
        );
        assert_eq!(
            lines[5],
            "category ledger: 2 partitions, 1 handler, 2 owned, 1 halted; length 7, pending 7, lag 7 (6 behind halted heads)"
        );
        let empty = CategoryReport {
            partitions: Vec::new(),
            ..report
        };
        assert_eq!(
            partitions(&empty, false),
            "category ledger: partitioned by `client_id`, 16 shards\ncategory ledger: no live partitions (handlers: app::Ledger)\n"
        );
        let unrecorded = CategoryReport {
            key_field: None,
            ..empty
        };
        assert!(
            partitions(&unrecorded, false)
                .starts_with("category ledger: no partition key recorded, 16 shards\n")
        );
    }

    #[test]
    fn keys_are_escaped_and_cut_in_tables() {
        let hostile = "a\u{1b}[2J\r\nb\u{202e}gpj.exe";
        let long = "k".repeat(64 * 1024);
        let report = CategoryReport {
            category: "ledger".into(),
            shards: 16,
            key_field: None,
            groups: vec!["app::Ledger".into()],
            partitions: vec![
                status(hostile, false),
                status(&long, false),
                status("c0", false),
            ],
            totals: Totals::default(),
        };
        let out = partitions(&report, false);
        assert!(
            !out.chars().any(|c| c != '\n' && needs_escape(c)),
            "{out:?}"
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[2].starts_with("a\\u{1b}[2J\\r\\nb\\u{202e}gpj.exe  "),
            "{:?}",
            lines[2]
        );
        assert!(lines.iter().all(|l| l.chars().count() < 200), "{out}");
        assert!(lines[3].starts_with(&format!("{}…  app::Ledger", "k".repeat(KEY_CELL - 1))));
        assert!(out.contains("`--key-hex` lists them whole"), "{out}");
        // Whole, in hexadecimal, for --key-hex.
        let out = partitions(&report, true);
        assert!(
            out.contains("611b5b324a0d0a62e280ae67706a2e657865  "),
            "{out}"
        );
        assert!(out.contains(&"6b".repeat(64 * 1024)));
        // Plain keys need no hint.
        let plain = CategoryReport {
            partitions: vec![status("c0", false)],
            ..report
        };
        assert!(!partitions(&plain, false).contains("--key-hex"));
    }

    #[test]
    fn json_and_output_have_no_raw_controls() {
        let s = status("a\u{202e}b\u{85}\u{7f}\n", true);
        let out = json(&s).expect("json");
        assert!(
            out.contains("\"key\": \"a\\u202eb\\u0085\\u007f\\n\""),
            "{out}"
        );
        let back: serde_json::Value = serde_json::from_str(&out).expect("same data");
        assert_eq!(back["key"], s.key.as_str());
        assert_eq!(terminal_safe("ok\n\u{1b}[31m\n"), "ok\n\\u{1b}[31m\n");
        let i = Inspection {
            status: s,
            head: None,
        };
        let block = inspection("ledger", &i);
        assert!(
            block.contains("partition   ledger:a\\u{202e}b\\u{85}\\u{7f}\\n\n"),
            "{block}"
        );
        assert!(
            block.contains("key hex     61e280ae62c2857f0a\n"),
            "{block}"
        );
    }

    #[test]
    fn inspection_block_with_pretty_payload() {
        let i = Inspection {
            status: status("c1", true),
            head: Some(Head {
                entry_id: "1764424280000-0".into(),
                lane: Lane::Primary,
                stream: "ledger:c1".into(),
                pending: true,
                consumer: Some("e0:12".into()),
                delivery_count: 1,
                idle_ms: Some(10),
                envelope: Some(Envelope {
                    id: "m1".into(),
                    type_name: "Posted".into(),
                    category: "ledger".into(),
                    partition_key: Some("c1".into()),
                    time_ms: 1_764_424_280_000,
                    priority: convoy_runtime::Priority::Normal,
                    correlation_id: None,
                    payload: "{\"seq\":3,\"poison\":true}".into(),
                    origin: None,
                    replay: None,
                }),
                decode_error: None,
            }),
        };
        let text = inspection("ledger", &i);
        for want in [
            "partition    ledger:c1\n",
            "shard        3\n",
            "owner        e0, generation 12, lease 1.9s left\n",
            "state        HALTED since 2025-11-29 13:51:27.123 UTC: max_retries exceeded\n",
            "attempts     3\n",
            "head         1764424280000-0 (primary lane, pending, delivered 1 time to e0:12)\n",
            "type         Posted\n",
            "payload      {\n               \"poison\": true,\n               \"seq\": 3\n             }\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let summary = head_summary("ledger", &i, i.head.as_ref().expect("head"));
        assert!(summary.starts_with(
            "partition ledger:c1 for handler app::Ledger is halted (max_retries exceeded: poison event c1#3)\n"
        ));
        let question = head_question(
            HeadOp::DeadLetter,
            "ledger",
            &i,
            i.head.as_ref().expect("head"),
        );
        assert!(
            question.contains("of ledger:c1 to {3}ledger:c1:dlq for handler app::Ledger?"),
            "{question}"
        );
        let warning = force_warning(&i);
        assert!(
            warning.contains("e0 (generation 12) is fenced out"),
            "{warning}"
        );
        assert!(warning.contains("may still take effect"), "{warning}");
    }
}
