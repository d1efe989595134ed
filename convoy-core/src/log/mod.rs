//! Logging helpers: keeping the Redis client's reconnect noise from
//! burying convoy's own lines.
//!
//! While one node of a Redis Cluster is down, the Redis client (redis-rs)
//! logs the same warnings (`Failed to connect to node ...`, `async cluster
//! client recovery: ...`) dozens of times a second in every process, through
//! the `log` crate with targets starting with `redis`. [`quiet_redis`] wraps
//! the layer that writes your logs (a `tracing_subscriber::fmt::layer()`,
//! usually) so that each such line (each target, level and source line) is
//! written at most once per ten seconds, followed later by one line saying
//! how many were left out:
//!
//! ```text
//! WARN convoy_runtime::log: lines left out suppressed=312 source_target="redis::cluster_handling::async_connection" source="src/cluster_handling/async_connection/mod.rs:1871" last="Failed to connect to node: ..."
//! ```
//!
//! Events of every other target, convoy's own (`convoy_runtime::...`) and
//! your application's included, are passed through untouched.
//!
//! # Example
//!
//! ```
//! use tracing_subscriber::prelude::*;
//! use tracing_subscriber::{EnvFilter, fmt};
//!
//! tracing_subscriber::registry()
//!     .with(
//!         convoy_runtime::log::quiet_redis(fmt::layer())
//!             .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into())),
//!     )
//!     .init();
//! ```
//!
//! Put the level filter *outside* the wrapper, as above (or as a layer of
//! its own below it, `registry().with(filter).with(quiet_redis(..))`), so
//! only lines that would be written count against the limit. `init()`
//! also routes the `log` crate's records, the Redis client's among them,
//! into `tracing` (tracing-subscriber's default `tracing-log` feature); the
//! lines are recognised both ways.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::callsite::{Callsite, Identifier};
use tracing::field::{Field, FieldSet, Value, Visit};
use tracing::metadata::Kind;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber, span};
use tracing_subscriber::layer::{Context, Layer};

/// The default window of [`QuietRedis`]: ten seconds.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// The default number of lines of one source written per window: one.
pub const DEFAULT_PER_WINDOW: u32 = 1;
/// The target of the lines that tell how many were left out.
pub const NOTE_TARGET: &str = "convoy_runtime::log";

/// At most this many sources are tracked; lines of further sources share
/// one budget.
const MAX_SOURCES: usize = 1024;
/// How much of the last left-out line's text the note repeats.
const LAST_TEXT_CHARS: usize = 300;

/// Wraps `layer` (the layer that writes your logs) so that the Redis
/// client's repeated lines are rate-limited: [`DEFAULT_PER_WINDOW`] line of
/// each source per [`DEFAULT_WINDOW`], and a note of how many were left
/// out. See the [module documentation](self).
pub fn quiet_redis<L>(layer: L) -> QuietRedis<L> {
    QuietRedis {
        inner: layer,
        limits: Limits {
            per_window: DEFAULT_PER_WINDOW,
            window: DEFAULT_WINDOW,
        },
        state: Mutex::new(State::default()),
        pending: AtomicBool::new(false),
        clock: Instant::now,
    }
}

/// A [`Layer`] that passes every event to the layer it wraps, except the
/// lines of the Redis client (targets `redis` and `redis::...`) beyond
/// [`per_window`](Self::per_window) per [`window`](Self::window) and
/// source (target, level, file and line); made by [`quiet_redis`].
///
/// The number left out is written, once the window of their source is
/// over, as one event of target [`NOTE_TARGET`] at their level, with the
/// fields `suppressed` (how many), `source_target`, `source` (file:line)
/// and `last` (the text of the last one left out). It is written before
/// the next event that reaches the layer (of any target), so a source that
/// falls silent has its count written with the next line logged.
pub struct QuietRedis<L> {
    inner: L,
    limits: Limits,
    state: Mutex<State>,
    /// Some source has a count not yet written.
    pending: AtomicBool,
    clock: fn() -> Instant,
}

impl<L> fmt::Debug for QuietRedis<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuietRedis")
            .field("per_window", &self.limits.per_window)
            .field("window", &self.limits.window)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    per_window: u32,
    window: Duration,
}

impl<L> QuietRedis<L> {
    /// How many lines of one source are written per window (default
    /// [`DEFAULT_PER_WINDOW`]; 0 writes none, only the counts).
    pub fn per_window(mut self, lines: u32) -> Self {
        self.limits.per_window = lines;
        self
    }

    /// The length of the window (default [`DEFAULT_WINDOW`]).
    pub fn window(mut self, window: Duration) -> Self {
        self.limits.window = window;
        self
    }

    /// The wrapped layer.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    #[cfg(test)]
    fn clock(mut self, clock: fn() -> Instant) -> Self {
        self.clock = clock;
        self
    }
}

/// Where a line comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Source {
    level: Level,
    target: String,
    file: Option<String>,
    line: Option<u32>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    written: u32,
    /// Left out and not yet reported.
    suppressed: u64,
    last: String,
}

#[derive(Debug, Default)]
struct State {
    sources: HashMap<Source, Window>,
}

/// A count to write.
struct Note {
    source: Source,
    suppressed: u64,
    last: String,
}

/// What to do with one event of the Redis client.
enum Verdict {
    Write,
    Drop,
}

impl State {
    fn judge(&mut self, source: Source, text: String, now: Instant, limits: Limits) -> Verdict {
        let key = if self.sources.len() >= MAX_SOURCES && !self.sources.contains_key(&source) {
            Source {
                level: source.level,
                target: "redis".to_owned(),
                file: None,
                line: None,
            }
        } else {
            source
        };
        let w = self.sources.entry(key).or_insert_with(|| Window {
            started: now,
            written: 0,
            suppressed: 0,
            last: String::new(),
        });
        if now.saturating_duration_since(w.started) >= limits.window {
            w.started = now;
            w.written = 0;
        }
        if w.written < limits.per_window {
            w.written += 1;
            Verdict::Write
        } else {
            w.suppressed += 1;
            w.last = text;
            Verdict::Drop
        }
    }

    /// The counts whose window is over; `more` tells whether some count
    /// is still waiting for its window to end.
    fn due(&mut self, now: Instant, limits: Limits) -> (Vec<Note>, bool) {
        let mut notes = Vec::new();
        let mut more = false;
        for (source, w) in &mut self.sources {
            if w.suppressed == 0 {
                continue;
            }
            if now.saturating_duration_since(w.started) >= limits.window {
                notes.push(Note {
                    source: source.clone(),
                    suppressed: w.suppressed,
                    last: std::mem::take(&mut w.last),
                });
                w.suppressed = 0;
            } else {
                more = true;
            }
        }
        notes.sort_by(|a, b| {
            (&a.source.target, &a.source.file, a.source.line).cmp(&(
                &b.source.target,
                &b.source.file,
                b.source.line,
            ))
        });
        (notes, more)
    }
}

/// Whether `target` is the Redis client's (`redis` or `redis::...`).
fn is_redis(target: &str) -> bool {
    target
        .strip_prefix("redis")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

/// The fields of an event that say where it comes from and what it says;
/// for a record of the `log` crate, its `log.*` fields.
#[derive(Default)]
struct Fields {
    log_target: Option<String>,
    log_file: Option<String>,
    log_line: Option<u32>,
    message: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "log.target" => self.log_target = Some(value.to_owned()),
            "log.file" => self.log_file = Some(value.to_owned()),
            "message" => self.message = Some(truncated(value)),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "log.line" {
            self.log_line = u32::try_from(value).ok();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = Some(truncated(&format!("{value:?}")));
        }
    }
}

fn truncated(text: &str) -> String {
    match text.char_indices().nth(LAST_TEXT_CHARS) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

/// The source and text of `event` if it is one of the Redis client's.
fn redis_source(event: &Event<'_>) -> Option<(Source, String)> {
    let meta = event.metadata();
    let from_log = meta.fields().field("log.target").is_some();
    if !from_log && !is_redis(meta.target()) {
        return None;
    }
    let mut fields = Fields::default();
    event.record(&mut fields);
    let source = if from_log {
        let target = fields.log_target.take()?;
        if !is_redis(&target) {
            return None;
        }
        Source {
            level: *meta.level(),
            target,
            file: fields.log_file.take(),
            line: fields.log_line,
        }
    } else {
        Source {
            level: *meta.level(),
            target: meta.target().to_owned(),
            file: meta.file().map(str::to_owned),
            line: meta.line(),
        }
    };
    Some((source, fields.message.unwrap_or_default()))
}

impl<L> QuietRedis<L> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counts due now (cheap when none is pending).
    fn due_notes(&self, now: Instant) -> Vec<Note> {
        if !self.pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let (notes, more) = self.lock().due(now, self.limits);
        self.pending.store(more, Ordering::Release);
        notes
    }
}

impl<S, L> Layer<S> for QuietRedis<L>
where
    S: Subscriber,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.enabled(metadata, ctx)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_new_span(attrs, id, ctx);
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.inner.max_level_hint()
    }

    fn on_record(&self, span: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        self.inner.on_record(span, values, ctx);
    }

    fn on_follows_from(&self, span: &span::Id, follows: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_follows_from(span, follows, ctx);
    }

    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.event_enabled(event, ctx)
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let now = (self.clock)();
        for note in self.due_notes(now) {
            write_note(&self.inner, &note, ctx.clone());
        }
        let Some((source, text)) = redis_source(event) else {
            self.inner.on_event(event, ctx);
            return;
        };
        let verdict = self.lock().judge(source, text, now, self.limits);
        match verdict {
            Verdict::Write => self.inner.on_event(event, ctx),
            Verdict::Drop => self.pending.store(true, Ordering::Release),
        }
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_exit(id, ctx);
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        self.inner.on_close(id, ctx);
    }

    fn on_id_change(&self, old: &span::Id, new: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }
}

/// The callsite of the notes of one level (a note is written straight to
/// the wrapped layer, never dispatched, so the callsite is never
/// registered).
struct NoteCallsite(&'static Metadata<'static>);

impl Callsite for NoteCallsite {
    fn set_interest(&self, _: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        self.0
    }
}

const NOTE_FIELDS: &[&str] = &["message", "suppressed", "source_target", "source", "last"];

macro_rules! note_callsite {
    ($cs:ident, $meta:ident, $level:expr) => {
        static $cs: NoteCallsite = NoteCallsite(&$meta);
        static $meta: Metadata<'static> = Metadata::new(
            "convoy_runtime::log note",
            NOTE_TARGET,
            $level,
            Some(file!()),
            Some(line!()),
            Some(module_path!()),
            FieldSet::new(NOTE_FIELDS, Identifier(&$cs)),
            Kind::EVENT,
        );
    };
}

note_callsite!(TRACE_CS, TRACE_META, Level::TRACE);
note_callsite!(DEBUG_CS, DEBUG_META, Level::DEBUG);
note_callsite!(INFO_CS, INFO_META, Level::INFO);
note_callsite!(WARN_CS, WARN_META, Level::WARN);
note_callsite!(ERROR_CS, ERROR_META, Level::ERROR);

fn note_metadata(level: Level) -> &'static Metadata<'static> {
    match level {
        Level::TRACE => &TRACE_META,
        Level::DEBUG => &DEBUG_META,
        Level::INFO => &INFO_META,
        Level::WARN => &WARN_META,
        _ => &ERROR_META,
    }
}

fn write_note<S, L>(inner: &L, note: &Note, ctx: Context<'_, S>)
where
    S: Subscriber,
    L: Layer<S>,
{
    let meta = note_metadata(note.source.level);
    let fields = meta.fields();
    let (Some(message), Some(suppressed), Some(target), Some(source), Some(last)) = (
        fields.field("message"),
        fields.field("suppressed"),
        fields.field("source_target"),
        fields.field("source"),
        fields.field("last"),
    ) else {
        return;
    };
    let text = format_args!("lines left out");
    let at = match (&note.source.file, note.source.line) {
        (Some(file), Some(line)) => format!("{file}:{line}"),
        (Some(file), None) => file.clone(),
        _ => String::new(),
    };
    let values: [(&Field, Option<&dyn Value>); 5] = [
        (&message, Some(&text)),
        (&suppressed, Some(&note.suppressed)),
        (&target, Some(&note.source.target.as_str())),
        (&source, Some(&at.as_str())),
        (&last, Some(&note.last.as_str())),
    ];
    let values = fields.value_set(&values);
    inner.on_event(&Event::new(meta, &values), ctx);
}

#[cfg(test)]
mod tests;
