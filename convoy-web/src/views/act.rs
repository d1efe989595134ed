//! The actions: each shown on a confirmation page naming the exact head
//! entry and generation it will act on, then POSTed with them (and the
//! CSRF token). The head action is fenced exactly as the command line's:
//! the admin's script acts only if the head is still the confirmed entry,
//! and the page first refuses when the unit's durable generation moved.

use std::sync::Arc;

use axum::extract::{Extension, Form, Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use convoy_runtime::redis::admin::{
    AdminError, HeadOp, HeadReplay, HeadRequest, Inspection, Lane, PauseTarget,
};
use maud::{Markup, html};
use serde::Deserialize;

use super::read::RETRY_ALL_MAX;
use super::{
    Failure, Operator, View, check_csrf, csrf_field, enc, html_response, layout, pretty, short, utc,
};
use crate::state::{RowState, State};

fn parse_op(op: &str) -> Result<HeadOp, Failure> {
    match op {
        "skip" => Ok(HeadOp::Skip),
        "dead_letter" => Ok(HeadOp::DeadLetter),
        "retry" => Ok(HeadOp::Retry),
        _ => Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "the action must be skip, dead_letter or retry",
        )),
    }
}

fn op_words(op: HeadOp) -> (&'static str, &'static str) {
    match op {
        HeadOp::Skip => (
            "Skip",
            "The head is acknowledged without running it: the partition resumes with its next event, and this event is never handled by this handler.",
        ),
        HeadOp::DeadLetter => (
            "Dead-letter",
            "The head is copied to the key's dead letter stream, then acknowledged: the partition resumes with its next event; the dead letter can be replayed later.",
        ),
        HeadOp::Retry => (
            "Retry in place",
            "The halt and the head's failure count are cleared and nothing is acknowledged: the owner runs this same head again (attempt 1), then the events behind it, in order.",
        ),
    }
}

fn key_url(state: &State, category: &str, key: &str) -> String {
    state.url(&format!("/c/{category}/key?key={}", enc(key)))
}

/// `?op=&key=&handler=&force=`.
#[derive(Debug, Deserialize)]
pub(crate) struct ConfirmQuery {
    op: String,
    key: String,
    handler: Option<String>,
    force: Option<String>,
}

fn forced(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("1" | "on" | "true"))
}

/// Whether the unit is halted on its head (where an unforced action is
/// allowed).
fn on_halt(i: &Inspection) -> bool {
    let s = &i.status;
    i.head.as_ref().is_some_and(|h| {
        s.halted && h.pending && s.halt_entry.as_deref() == Some(h.entry_id.as_str())
    })
}

/// The confirmation of a head action: the head entry, the generation,
/// the event; a form POSTing them back.
pub(crate) async fn confirm_head(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Query(q): Query<ConfirmQuery>,
) -> View {
    let op = parse_op(&q.op)?;
    let force = forced(&q.force);
    let key = q.key.as_str();
    let group = state
        .admin
        .resolve_group(&category, Some(key), q.handler.as_deref())
        .await?;
    let i = state.admin.inspect(&category, key, &group).await?;
    let s = &i.status;
    let (verb, what) = op_words(op);
    let not_a_stream = s.halt_reason.as_deref() == Some("not a stream");
    if i.head.is_none() && !not_a_stream {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!("{category}:{key} has no head for {group}: nothing to act on"),
        ));
    }
    if !on_halt(&i) && !force && !not_a_stream {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!(
                "{category}:{key} is not halted on its head for {group}: an action would fence its running owner out; use the forced action on the key's page to do it anyway"
            ),
        ));
    }
    let entry = i
        .head
        .as_ref()
        .map(|h| h.entry_id.clone())
        .unwrap_or_default();
    let hide = state.settings.hide_payloads;
    let body = html! {
        p { a href=(key_url(&state, &category, key)) { "← key " (key) } }
        h1 { "Confirm: " (verb) }
        div class=(if force { "box warn" } else { "box" }) {
            p { (what) }
            dl {
                dt { "partition" } dd class="mono" { (category) ":" (key) }
                dt { "handler" } dd class="mono" { (group) }
                @if not_a_stream {
                    dt { "halt" } dd { "halted because its key was not a stream: the halt is cleared, no event is skipped" }
                } @else {
                    dt { "head entry" } dd class="mono" id="confirm-entry" { (entry) }
                }
                dt { "generation" } dd class="mono" id="confirm-generation" { (s.durable_generation) }
                dt { "owner" } dd class="mono" { (s.owner.as_deref().unwrap_or("—")) " " @if let Some(g) = s.generation { "(lease generation " (g) ")" } }
                @if s.halted {
                    dt { "halted" } dd class="err" { (s.halt_reason.as_deref().unwrap_or("")) @if let Some(t) = s.halt_since_ms { " since " (utc(t)) } }
                }
                @if let Some(e) = s.halt_error.as_deref().or(s.last_error.as_deref()) { dt { "error" } dd class="err" { (e) } }
                @if let Some(env) = i.head.as_ref().and_then(|h| h.envelope.as_ref()) {
                    dt { "type" } dd { (env.type_name) }
                    dt { "message id" } dd class="mono" { (env.id) }
                    dt { "published" } dd { (utc(env.time_ms)) }
                }
            }
            @if let Some(env) = i.head.as_ref().and_then(|h| h.envelope.as_ref()) {
                @if hide { p class="muted" { "Payload hidden by the page's settings." } } @else { pre { (pretty(&env.payload)) } }
            }
            @if force {
                p class="err" {
                    strong { "FORCE: " }
                    "this partition is not halted on this head. Its owner is fenced out first (its lease is deleted and the generation bumped); the event it has in flight may still take effect."
                }
            }
            p class="muted" { "Acted on only if the head is still this entry and the generation has not moved; recorded in the audit stream as " (state.settings.operator.clone()) " or your login." }
        }
        form method="post" action=(state.url(&format!("/c/{category}/act"))) {
            (csrf_field(&state))
            input type="hidden" name="op" value=(q.op);
            input type="hidden" name="key" value=(key);
            input type="hidden" name="handler" value=(group);
            input type="hidden" name="entry" value=(entry);
            input type="hidden" name="generation" value=(s.durable_generation);
            @if force { input type="hidden" name="force" value="1"; }
            button type="submit" id="confirm" class=(if op == HeadOp::Retry && !force { "" } else { "danger" }) {
                (verb) @if !entry.is_empty() { " entry " (entry) } @if force { " (FORCED)" }
            }
            " "
            a class="button secondary" href=(key_url(&state, &category, key)) { "Cancel" }
        }
    };
    Ok(html_response(layout(
        &state,
        &format!("Confirm {verb}"),
        body,
    )))
}

/// The form of a head action.
#[derive(Debug, Deserialize)]
pub(crate) struct ActForm {
    #[serde(default)]
    csrf: String,
    op: String,
    key: String,
    handler: String,
    #[serde(default)]
    entry: String,
    generation: u64,
    force: Option<String>,
}

/// A confirmed head action: refused when the generation moved (the page
/// was stale), else the admin's fenced action on the confirmed entry.
pub(crate) async fn act_head(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(f): Form<ActForm>,
) -> View {
    check_csrf(&state, &headers, &f.csrf)?;
    let op = parse_op(&f.op)?;
    let force = forced(&f.force);
    let key = f.key.as_str();
    let again = state.url(&format!(
        "/c/{category}/confirm?op={}&key={}&handler={}{}",
        f.op,
        enc(key),
        enc(&f.handler),
        if force { "&force=1" } else { "" }
    ));
    if f.entry.is_empty() {
        // Only a unit halted because its key was not a stream has no head
        // to confirm.
        let i = state.admin.inspect(&category, key, &f.handler).await?;
        if i.status.halt_reason.as_deref() != Some("not a stream") {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "no head entry confirmed; nothing was done",
            ));
        }
    }
    // The script acts only on the confirmed head at the confirmed
    // generation, atomically with the action.
    let outcome = state
        .admin
        .act_on_head(
            op,
            &HeadRequest {
                category: &category,
                key,
                group: &f.handler,
                force,
                operator: &operator.0,
                expect_entry: (!f.entry.is_empty()).then_some(f.entry.as_str()),
                expect_generation: Some(f.generation),
            },
        )
        .await
        .map_err(|e| stale(e, &again))?;
    let (verb, _) = op_words(op);
    Ok(html_response(layout(
        &state,
        "Done",
        html! {
            h1 { (verb) ": done" }
            div class="box note" id="outcome" {
                dl {
                    dt { "partition" } dd class="mono" { (category) ":" (key) }
                    dt { "handler" } dd class="mono" { (f.handler) }
                    @if !outcome.entry_id.is_empty() { dt { "entry" } dd class="mono" { (outcome.entry_id) " (" (outcome.lane.as_str()) " lane)" } }
                    @if let Some(d) = &outcome.dlq_id { dt { "dead letter" } dd class="mono" { (d) } }
                    @if let Some(t) = &outcome.fenced { dt { "fenced out" } dd class="mono err" { (t) } }
                    dt { "audit record" } dd class="mono" { (outcome.audit_id) " by " (operator.0) }
                }
            }
            p { a class="button" href=(key_url(&state, &category, key)) { "Back to the key" } }
        },
    )))
}

/// A refusal because the page was stale (the head or the generation moved
/// since it was shown) says so and links to a fresh confirmation.
fn stale(e: AdminError, again: &str) -> Failure {
    let moved = matches!(
        e,
        AdminError::GenerationMoved { .. } | AdminError::HeadChanged { .. }
    );
    let mut f = Failure::from(e);
    if moved {
        f.message = format!("stale confirmation: {}. Look again: {again}", f.message);
    }
    f
}

/// `?handler=`.
#[derive(Debug, Deserialize)]
pub(crate) struct HandlerQuery {
    handler: String,
}

/// The confirmation of retrying every halted partition of a handler: the
/// snapshot's halted units, each re-read now, with the entry each is
/// halted on (at most [`RETRY_ALL_MAX`] at once).
pub(crate) async fn confirm_retry_all(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Query(q): Query<HandlerQuery>,
) -> View {
    let group = state
        .admin
        .resolve_group(&category, None, Some(&q.handler))
        .await?;
    let Some(snap) = state.snapshot(&category) else {
        return Err(Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the snapshot of this category is not taken yet; try again in a few seconds",
        ));
    };
    let keys: Vec<String> = snap
        .rows
        .iter()
        .filter(|r| r.group == group && r.state == RowState::Halted)
        .take(RETRY_ALL_MAX)
        .map(|r| r.key.clone())
        .collect();
    let halted: Vec<_> = state
        .admin
        .partition_statuses(&category, &keys)
        .await?
        .into_iter()
        .filter(|s| s.group == group && s.halted && s.halt_entry.is_some())
        .collect();
    let body = html! {
        p { a href=(state.url(&format!("/c/{category}"))) { "← partitions of " (category) } }
        h1 { "Confirm: retry every halted partition of " span class="mono" { (short(&group)) } }
        div class="box" {
            p { "Each partition below runs its halted head again, in place (never forced): acted on only if it is still halted on the entry shown. Each is audited." }
            @if keys.len() == RETRY_ALL_MAX { p class="err" { "Only the first " (RETRY_ALL_MAX) " halted partitions are shown; confirm, then come back for the rest." } }
        }
        @if halted.is_empty() { p class="muted" { "No partition of " (category) " is halted for " (group) " now." } } @else {
            form method="post" action=(state.url(&format!("/c/{category}/retry-all"))) {
                (csrf_field(&state))
                input type="hidden" name="handler" value=(group);
                table {
                    tr { th { "key" } th { "halted on entry" } th class="n" { "generation" } th { "error" } }
                    @for s in &halted {
                        @let entry = s.halt_entry.clone().unwrap_or_default();
                        tr {
                            td class="mono" { (s.key) }
                            td class="mono" { (entry) }
                            td class="n" { (s.durable_generation) }
                            td class="err" { (s.halt_error.as_deref().unwrap_or("")) }
                        }
                        input type="hidden" name="unit" value=(format!("{entry} {} {}", s.durable_generation, s.key));
                    }
                }
                p { button type="submit" id="confirm" { "Retry " (halted.len()) " halted partitions in place" } }
            }
        }
    };
    Ok(html_response(layout(&state, "Confirm retry all", body)))
}

/// Retries each confirmed (entry, key) in place, fenced on that entry.
pub(crate) async fn retry_all(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(fields): Form<Vec<(String, String)>>,
) -> View {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    check_csrf(&state, &headers, field("csrf"))?;
    let group = field("handler").to_owned();
    let mut done = 0usize;
    let mut left = Vec::new();
    for (_, unit) in fields.iter().filter(|(k, _)| k == "unit") {
        // `{entry} {generation} {key}` (a key may hold spaces).
        let mut parts = unit.splitn(3, ' ');
        let (Some(entry), Some(generation), Some(key)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(generation) = generation.parse::<u64>() else {
            left.push((key.to_owned(), "no generation confirmed".to_owned()));
            continue;
        };
        let request = HeadRequest {
            category: &category,
            key,
            group: &group,
            force: false,
            operator: &operator.0,
            expect_entry: Some(entry),
            expect_generation: Some(generation),
        };
        match state.admin.act_on_head(HeadOp::Retry, &request).await {
            Ok(_) => done += 1,
            Err(e) => left.push((key.to_owned(), e.to_string())),
        }
    }
    Ok(html_response(layout(
        &state,
        "Done",
        html! {
            h1 { "Retry all halted: done" }
            div class="box note" id="outcome" {
                p { "Retried " (done) " halted partitions of " (category) " for " (group) " in place (each audited); their owners run the heads again, in order." }
                @if !left.is_empty() {
                    p { (left.len()) " left alone (their heads moved or they resumed meanwhile):" }
                    ul { @for (k, e) in &left { li { span class="mono" { (k) } ": " (e) } } }
                }
            }
            p { a class="button" href=(state.url(&format!("/c/{category}"))) { "Back to the partitions" } }
        },
    )))
}

/// `?key=&dlq_id=`.
#[derive(Debug, Deserialize)]
pub(crate) struct ReplayQuery {
    key: String,
    dlq_id: String,
}

/// Where a replay at the head would put a dead letter: the handler, the
/// unit's durable generation, and the first entry it has not finished in
/// the primary lane, which the letter goes before (`Some("")`: none;
/// `None`: not known from the inspection, when the head is pending in the
/// backfill lane).
struct AtHead {
    group: String,
    generation: u64,
    first: Option<String>,
    head: Option<convoy_runtime::redis::admin::Head>,
    halted: bool,
}

impl AtHead {
    fn of(group: String, i: Inspection) -> AtHead {
        let first = match &i.head {
            None => Some(String::new()),
            Some(h) if h.lane == Lane::Primary => Some(h.entry_id.clone()),
            // Nothing pending or new in the primary lane, else the head
            // would be there.
            Some(h) if !h.pending => Some(String::new()),
            Some(_) => None,
        };
        AtHead {
            group,
            generation: i.status.durable_generation,
            first,
            halted: i.status.halted,
            head: i.head,
        }
    }
}

/// The confirmation of a replay: the dead letter, and where it goes: at
/// the tail, or at the head before the exact entry (and generation) shown.
pub(crate) async fn confirm_replay(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Query(q): Query<ReplayQuery>,
) -> View {
    let letters = state.admin.dlq(&category, Some(&q.key)).await?;
    let Some(l) = letters.iter().find(|l| l.dlq_id == q.dlq_id) else {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no dead letter {} for {category}:{}", q.dlq_id, q.key),
        ));
    };
    let at_head = match &l.group {
        Some(g) => Some(AtHead::of(
            g.clone(),
            state.admin.inspect(&category, &q.key, g).await?,
        )),
        None => None,
    };
    let every = state.admin.groups(&category).await?;
    let hide = state.settings.hide_payloads;
    let body: Markup = html! {
        p { a href=(key_url(&state, &category, &q.key)) { "← key " (q.key) } }
        h1 { "Confirm: replay a dead letter" }
        div class="box" {
            dl {
                dt { "partition" } dd class="mono" { (category) ":" (q.key) }
                dt { "dead letter" } dd class="mono" { (l.dlq_id) }
                dt { "handler" } dd class="mono" { (l.group.as_deref().unwrap_or("—")) }
                dt { "from entry" } dd class="mono" { (l.entry.as_deref().unwrap_or("—")) }
                dt { "error" } dd class="err" { (l.error.as_deref().unwrap_or("")) }
                @if let Some(env) = &l.envelope {
                    dt { "type" } dd { (env.type_name) }
                    dt { "message id" } dd class="mono" { (env.id) }
                }
            }
            @if let Some(env) = &l.envelope {
                @if hide { p class="muted" { "Payload hidden by the page's settings." } } @else { pre { (pretty(&env.payload)) } }
            }
        }
        form method="post" action=(state.url(&format!("/c/{category}/replay"))) {
            (csrf_field(&state))
            input type="hidden" name="key" value=(q.key);
            input type="hidden" name="dlq_id" value=(l.dlq_id);
            @if let Some(g) = &l.group {
                p {
                    label { input type="radio" name="at" value="tail" checked; " at the tail, for " span class="mono" { (short(g)) } " only: after the events already there (out of its original order); the other handlers, which handled it, acknowledge it without running it" }
                }
            }
            @if let Some(h) = &at_head {
                input type="hidden" name="handler" value=(h.group);
                input type="hidden" name="generation" value=(h.generation);
                @if let Some(first) = &h.first { input type="hidden" name="head" value=(if first.is_empty() { "none" } else { first.as_str() }); }
                div class="box" {
                    p { label { input type="radio" name="at" value="head"; " at the head of " span class="mono" { (short(&h.group)) } ": before every event it has not finished, restoring the key's order" } }
                    dl {
                        dt { "goes before" } dd class="mono" id="replay-head-entry" {
                            @match (&h.first, &h.head) {
                                (Some(f), _) if f.is_empty() => { "nothing: the handler has finished every event of the key" }
                                (Some(f), _) => { (f) }
                                (None, Some(head)) => { "the primary lane's first unfinished event (the head, " (head.entry_id) ", is in the backfill lane)" }
                                (None, None) => { "—" }
                            }
                        }
                        @if let Some(env) = h.head.as_ref().and_then(|x| x.envelope.as_ref()) {
                            dt { "that event" } dd { (env.type_name) " " span class="mono" { (env.id) } ", published " (utc(env.time_ms)) }
                        }
                        dt { "generation" } dd class="mono" id="replay-head-generation" { (h.generation) }
                        dt { "state" } dd { @if h.halted { "halted on its head" } @else if h.head.as_ref().is_some_and(|x| x.pending) { span class="err" { "running, with an event in flight" } } @else { "idle" } }
                    }
                    p class="muted" { "Done only if that entry is still the first unfinished one and the generation has not moved." }
                    p { label class="err" { input type="checkbox" name="force" value="1"; " FORCE: fence a running owner out first (its event in flight may still take effect)" } }
                }
            } @else {
                p class="muted" { "This dead letter names no handler that dead-lettered it: it can only be replayed to every handler, below." }
            }
            @if l.group.is_some() {
                button type="submit" id="confirm" { "Replay dead letter " (l.dlq_id) }
                " "
                a class="button secondary" href=(key_url(&state, &category, &q.key)) { "Cancel" }
            }
        }
        @if !every.is_empty() {
            form method="post" class="box" id="every-form" action=(state.url(&format!("/c/{category}/replay"))) {
                (csrf_field(&state))
                input type="hidden" name="key" value=(q.key);
                input type="hidden" name="dlq_id" value=(l.dlq_id);
                input type="hidden" name="at" value="every";
                input type="hidden" name="handlers" value=(every.join("\n"));
                h2 { "Or: replay to every handler" }
                p { "At the tail, for each of the category's " (every.len()) " handlers:" }
                ul id="every-handlers" { @for g in &every { li class="mono" { (g) } } }
                p class="err" { "Each handler that handled this event already runs it again, unless its effects are exactly-once by the event's origin (AppliedEvents)." }
                p { label { input type="checkbox" name="every_confirmed" value="1" required; " I name these handlers: each one runs it" } }
                button type="submit" class="secondary" id="confirm-every" { "Replay to every handler" }
            }
        }
    };
    Ok(html_response(layout(&state, "Confirm replay", body)))
}

/// The form of a replay.
#[derive(Debug, Deserialize)]
pub(crate) struct ReplayForm {
    #[serde(default)]
    csrf: String,
    key: String,
    dlq_id: String,
    at: Option<String>,
    force: Option<String>,
    /// At the head: the handler, the generation and the first unfinished
    /// entry (`none`) the confirmation showed.
    handler: Option<String>,
    generation: Option<u64>,
    head: Option<String>,
    /// To every handler (`at=every`): the handlers the confirmation named
    /// (one per line), and the box that names them ticked.
    handlers: Option<String>,
    every_confirmed: Option<String>,
}

/// A confirmed replay: the dead letter id fences it (a letter replayed
/// meanwhile is gone and refused); at the head, so do the entry it goes
/// before and the unit's generation, as the confirmation showed them.
pub(crate) async fn replay(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(f): Form<ReplayForm>,
) -> View {
    check_csrf(&state, &headers, &f.csrf)?;
    let head = f.at.as_deref() == Some("head");
    let o = if head {
        let (Some(group), Some(generation)) = (f.handler.as_deref(), f.generation) else {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "a replay at the head needs the handler and generation its confirmation showed; nothing was done",
            ));
        };
        let again = state.url(&format!(
            "/c/{category}/confirm-replay?key={}&dlq_id={}",
            enc(&f.key),
            enc(&f.dlq_id)
        ));
        state
            .admin
            .replay_head(&HeadReplay {
                category: &category,
                key: &f.key,
                dlq_id: &f.dlq_id,
                group: Some(group),
                operator: &operator.0,
                force: forced(&f.force),
                expect_head: f.head.as_deref().map(|h| if h == "none" { "" } else { h }),
                expect_generation: Some(generation),
            })
            .await
            .map_err(|e| stale(e, &again))?
    } else if f.at.as_deref() == Some("every") {
        let named: Vec<String> = f
            .handlers
            .as_deref()
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        if f.every_confirmed.as_deref() != Some("1") || named.is_empty() {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "a replay to every handler needs the handlers its confirmation named, each acknowledged; nothing was done",
            ));
        }
        let mut now = state.admin.groups(&category).await?;
        let mut sorted = named.clone();
        now.sort();
        sorted.sort();
        if now != sorted {
            return Err(Failure::new(
                StatusCode::CONFLICT,
                format!(
                    "stale confirmation: the category's handlers are now {}, not the ones confirmed; nothing was done. Look again: {}",
                    now.join(", "),
                    state.url(&format!(
                        "/c/{category}/confirm-replay?key={}&dlq_id={}",
                        enc(&f.key),
                        enc(&f.dlq_id)
                    ))
                ),
            ));
        }
        state
            .admin
            .replay_to(&category, &f.key, &f.dlq_id, &named, &operator.0)
            .await?
    } else {
        state
            .admin
            .replay(&category, &f.key, &f.dlq_id, &operator.0)
            .await?
    };
    Ok(html_response(layout(
        &state,
        "Done",
        html! {
            h1 { "Replay: done" }
            div class="box note" id="outcome" {
                dl {
                    dt { "dead letter" } dd class="mono" { (o.dlq_id) }
                    dt { "now entry" } dd class="mono" { (o.entry_id) " at the " (if head { "head" } else { "tail" }) " of " (o.stream) }
                    dt { "for" } dd class="mono" id="replayed-to" { (o.handlers.join(", ")) }
                    dt { "audit record" } dd class="mono" { (o.audit_id) " by " (operator.0) }
                }
            }
            p { a class="button" href=(key_url(&state, &category, &f.key)) { "Back to the key" } }
        },
    )))
}

/// The form of a pause or resume: the key page's button.
#[derive(Debug, Deserialize)]
pub(crate) struct PauseForm {
    #[serde(default)]
    csrf: String,
    key: String,
    /// The handler (empty: every handler).
    #[serde(default)]
    handler: String,
    /// A prefix pause's prefix (resume only): held instead of the key.
    prefix: Option<String>,
    #[serde(default)]
    reason: String,
}

/// Pauses a key for a handler (`/c/{category}/pause`) or resumes a paused
/// key or prefix (`/c/{category}/resume`), then redirects to the key's
/// live status, so a reload never sends it again.
pub(crate) async fn pause(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    uri: axum::http::Uri,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(f): Form<PauseForm>,
) -> Result<axum::response::Response, Failure> {
    let pause = uri.path().ends_with("/pause");
    pause_or_resume(&state, &category, &operator, &headers, &f, pause).await
}

async fn pause_or_resume(
    state: &State,
    category: &str,
    operator: &Operator,
    headers: &HeaderMap,
    f: &PauseForm,
    pause: bool,
) -> Result<axum::response::Response, Failure> {
    check_csrf(state, headers, &f.csrf)?;
    let target = match &f.prefix {
        Some(p) if !pause => PauseTarget::Prefix(p.clone()),
        _ => PauseTarget::Key(f.key.clone()),
    };
    let handler = (!f.handler.is_empty()).then_some(f.handler.as_str());
    if pause {
        state
            .admin
            .pause(category, &target, handler, &f.reason, &operator.0)
            .await?;
    } else {
        state
            .admin
            .resume(category, &target, handler, &operator.0)
            .await?;
    }
    Ok(axum::response::Redirect::to(&key_url(state, category, &f.key)).into_response())
}
