//! The views: overview, a category's partitions, a key, dead letters,
//! the audit log. Each page's live part is also served alone
//! (`fragment=1`), which the script fetches on every tick.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use axum::extract::{Path, Query, State as AxState};
use axum::http::StatusCode;
use convoy_runtime::redis::admin::{
    AuditRecord, DeadLetter, Inspection, PartitionStatus, PauseTarget, ScanCursor,
};
use maud::{Markup, html};
use serde::Deserialize;

use super::{
    Failure, State, View, age, csrf_field, cut, enc, html_response, layout, pretty, short, utc,
};
use crate::chart::lag_chart;
use crate::state::{RowState, Series, now_ms};

/// `SSCAN COUNT` of a prefix search (most entries do not match).
const SEARCH_COUNT: usize = 1000;

/// `SSCAN` calls one page view makes at most.
const MAX_SCAN_CALLS: usize = 8;

/// Rows of the snapshot's halted units a retry-all confirmation shows.
pub(super) const RETRY_ALL_MAX: usize = 200;

/// `?fragment=1`.
#[derive(Debug, Deserialize)]
pub(crate) struct Fragment {
    fragment: Option<String>,
}

/// The page, or its live part alone.
fn whole_or_part(
    state: &State,
    title: &str,
    fragment: bool,
    live_url: &str,
    head: Markup,
    part: Markup,
) -> View {
    if fragment {
        return Ok(html_response(part));
    }
    let sep = if live_url.contains('?') { '&' } else { '?' };
    Ok(html_response(layout(
        state,
        title,
        html! {
            (head)
            div id="live" data-live=(format!("{live_url}{sep}fragment=1")) { (part) }
        },
    )))
}

fn state_badge(s: RowState) -> Markup {
    html! { span class=(format!("state state-{}", s.as_str())) { (s.as_str()) } }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| v.to_string())
}

/// The overview: categories with their handlers' lag and halts,
/// instances, the outbox, and the lag chart.
pub(crate) async fn overview(
    AxState(state): AxState<Arc<State>>,
    Query(q): Query<Fragment>,
) -> View {
    let categories = state.admin.categories().await?;
    let mut summaries = Vec::new();
    for c in &categories {
        summaries.push(state.admin.category_summary(c).await?);
    }
    // Instances per handler, over the largest shard count of its
    // categories.
    let mut groups: BTreeMap<String, u32> = BTreeMap::new();
    for s in &summaries {
        for (g, _) in &s.lag {
            let e = groups.entry(g.clone()).or_insert(0);
            *e = (*e).max(s.shards);
        }
    }
    let mut instances = Vec::new();
    for (g, shards) in &groups {
        instances.extend(state.admin.instances(g, *shards).await?);
    }
    let snaps: HashMap<String, _> = categories
        .iter()
        .filter_map(|c| Some((c.clone(), state.snapshot(c)?)))
        .collect();
    let outbox = match &state.settings.outbox {
        Some((name, store)) => Some((name.clone(), store.stats().await)),
        None => None,
    };
    let now = now_ms();
    let lines: Vec<(String, Series)> = {
        let samples = state.samples.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = samples
            .handlers
            .iter()
            .map(|((c, g), s)| (format!("{c} / {}", short(g)), s.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let part = html! {
        h2 { "Categories" }
        @if summaries.is_empty() {
            p class="muted" { "No category registered yet: no engine ran against this Redis." }
        } @else {
            table {
                tr { th { "category" } th { "partition key" } th class="n" { "shards" } th class="n" { "partitions" }
                     th { "handler" } th class="n" { "lag" } th class="n" { "halted" } th {} }
                @for s in &summaries {
                    @let snap = snaps.get(&s.category);
                    @if s.lag.is_empty() {
                        tr {
                            td { a href=(state.url(&format!("/c/{}", s.category))) { (s.category) } }
                            td { (opt(s.key_field.as_deref())) } td class="n" { (s.shards) } td class="n" { (s.partitions) }
                            td class="muted" { "no handler registered" } td {} td {} td {}
                        }
                    }
                    @for (g, lag) in &s.lag {
                        @let halted = snap.map(|sn| sn.rows.iter().filter(|r| &r.group == g && r.state == RowState::Halted).count());
                        tr {
                            td { a href=(state.url(&format!("/c/{}", s.category))) { (s.category) } }
                            td { (opt(s.key_field.as_deref())) }
                            td class="n" { (s.shards) }
                            td class="n" { (s.partitions) }
                            td title=(g) { (short(g)) }
                            td class="n" { (lag) }
                            td class="n" {
                                @match halted {
                                    Some(0) => { "0" }
                                    Some(n) => {
                                        a href=(state.url(&format!("/c/{}?state=halted&handler={}", s.category, enc(g)))) {
                                            span class="state state-halted" { (n) " halted" }
                                        }
                                    }
                                    None => { span class="muted" title="no snapshot yet" { "…" } }
                                }
                            }
                            td class="actions" {
                                @if !state.settings.read_only && halted.is_some_and(|n| n > 0) {
                                    a href=(state.url(&format!("/c/{}/confirm-retry-all?handler={}", s.category, enc(g)))) { "retry all halted…" }
                                }
                                a href=(state.url(&format!("/c/{}/dlq", s.category))) { "dead letters" }
                            }
                        }
                    }
                }
            }
            p class="muted" {
                @for s in &summaries {
                    @if let Some(sn) = snaps.get(&s.category) {
                        (s.category) ": snapshot of " (sn.rows.len()) " units taken " (age(now.saturating_sub(sn.taken_ms))) " ago in " (age(sn.took.as_millis() as u64)) ". "
                    }
                }
            }
        }
        h2 { "Lag over the last minutes" }
        (lag_chart("lag per handler", &lines, now))
        h2 { "Instances" }
        @if instances.is_empty() {
            p class="muted" { "No instance registered." }
        } @else {
            table {
                tr { th { "instance" } th { "handler" } th { "alive" } th { "incarnation" } th class="n" { "owned units" } th { "registration runs out" } }
                @for i in &instances {
                    @let owned = snaps.values().map(|sn| sn.rows.iter().filter(|r| r.group == i.group && r.owner_alive && r.owner.as_deref() == Some(i.id.as_str())).count()).sum::<usize>();
                    tr {
                        td class="mono" { (i.id) }
                        td title=(i.group) { (short(&i.group)) }
                        td { @if i.alive { span class="state state-running" { "alive" } } @else { span class="state state-halted" { "gone" } } }
                        td class="mono" { (opt(i.incarnation.as_deref())) }
                        td class="n" { (owned) }
                        td { @if i.expires_ms > now { "in " (age(i.expires_ms - now)) } @else { (age(now - i.expires_ms)) " ago" } }
                    }
                }
            }
        }
        @if let Some((name, stats)) = &outbox {
            h2 { "Outbox " span class="mono" { (name) } }
            @match stats {
                Ok(s) => {
                    dl class="box" {
                        dt { "pending" } dd { (s.pending) }
                        dt { "oldest pending" } dd { (s.oldest_pending_ms.map_or_else(|| "—".to_owned(), |ms| format!("raised {} ago", age(now.saturating_sub(ms))))) }
                        dt { "abandoned" } dd { @if s.abandoned > 0 { span class="err" { (s.abandoned) } " (" code { "convoy outbox" } " lists and retries them)" } @else { "0" } }
                    }
                }
                Err(e) => { p class="err" { (state.scrub(&e.to_string())) } }
            }
        }
    };
    whole_or_part(
        &state,
        "Overview",
        q.fragment.is_some(),
        &state.url("/"),
        html! { h1 { "Overview" } },
        part,
    )
}

/// The query of a partitions listing.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    prefix: Option<String>,
    state: Option<String>,
    sort: Option<String>,
    handler: Option<String>,
    cursor: Option<String>,
    /// `1`: search the index live even when a snapshot exists.
    live: Option<String>,
    fragment: Option<String>,
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// A category's partitions: live from the index (by cursor, optionally by
/// key prefix), or from the background snapshot when sorted by lag or
/// filtered by state (the page's rows then re-read live).
pub(crate) async fn partitions(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Query(q): Query<ListQuery>,
) -> View {
    let groups = state.admin.groups(&category).await?;
    let prefix = non_empty(&q.prefix).unwrap_or("");
    let handler = non_empty(&q.handler);
    let filter = non_empty(&q.state).and_then(RowState::parse);
    let by_lag = non_empty(&q.sort) == Some("lag");
    let page_size = state.settings.page_size;
    let now = now_ms();
    let mut note;
    let mut next = None;
    let order: Vec<(String, String)>;
    // A prefix search reads the snapshot (sorted: no Redis command to
    // find the keys) unless asked to search the index live.
    let search_snapshot =
        !prefix.is_empty() && non_empty(&q.live).is_none() && state.snapshot(&category).is_some();
    if by_lag || filter.is_some() || search_snapshot {
        let Some(snap) = state.snapshot(&category) else {
            return list_page(
                &state, &category, &q, &groups, Vec::new(), None,
                html! { div class="box note" { "The snapshot of this category's partitions is being taken: sorting by lag and filtering by state use it. Reload in a few seconds, or list in index order." } },
            )
            .await;
        };
        // The rows are sorted by key: those with the prefix are together.
        let from = snap.rows.partition_point(|r| r.key.as_str() < prefix);
        let mut matching: Vec<_> = snap.rows[from..]
            .iter()
            .take_while(|r| r.key.starts_with(prefix))
            .filter(|r| handler.is_none_or(|h| r.group == h))
            .filter(|r| filter.is_none_or(|f| r.state == f))
            .collect();
        if by_lag {
            matching.sort_by_key(|r| std::cmp::Reverse(r.lag));
        }
        let offset: usize = non_empty(&q.cursor)
            .and_then(|c| c.strip_prefix('o'))
            .and_then(|o| o.parse().ok())
            .unwrap_or(0);
        let total = matching.len();
        order = matching
            .into_iter()
            .skip(offset)
            .take(page_size)
            .map(|r| (r.key.clone(), r.group.clone()))
            .collect();
        if offset + order.len() < total {
            next = Some(format!("o{}", offset + order.len()));
        }
        note = format!(
            "{total} matching units in the snapshot taken {} ago ({} units, read in {}); rows {}–{} shown, re-read live now.",
            age(now.saturating_sub(snap.taken_ms)),
            snap.rows.len(),
            age(snap.took.as_millis() as u64),
            if order.is_empty() { 0 } else { offset + 1 },
            offset + order.len()
        );
        if !prefix.is_empty() {
            note.push_str(
                " Keys created since are found by searching the index live (link below).",
            );
        }
    } else {
        let from = match non_empty(&q.cursor) {
            Some(c) => c
                .parse::<ScanCursor>()
                .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, e))?,
            None => ScanCursor::default(),
        };
        let count = if prefix.is_empty() {
            page_size
        } else {
            SEARCH_COUNT
        };
        let page = state
            .admin
            .partition_keys_page(&category, from, prefix, page_size, count, MAX_SCAN_CALLS)
            .await?;
        next = page.next.map(|c| c.to_string());
        note = format!(
            "In index order, live: {} keys from {} SSCAN call{} of the partition index.",
            page.keys.len(),
            page.calls,
            if page.calls == 1 { "" } else { "s" }
        );
        if page.keys.is_empty() && next.is_some() {
            note.push_str(
                " No key matched in this stretch of the index: go on with the next page.",
            );
        }
        order = page
            .keys
            .iter()
            .flat_map(|k| groups.iter().map(move |g| (k.clone(), g.clone())))
            .filter(|(_, g)| handler.is_none_or(|h| g == h))
            .collect();
    }
    let keys: Vec<String> = order
        .iter()
        .map(|(k, _)| k.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let statuses = state.admin.partition_statuses(&category, &keys).await?;
    let mut by_unit: HashMap<(String, String), PartitionStatus> = statuses
        .into_iter()
        .map(|s| ((s.key.clone(), s.group.clone()), s))
        .collect();
    let rows: Vec<PartitionStatus> = order
        .iter()
        .filter_map(|u| by_unit.remove(u))
        .filter(|s| filter.is_none_or(|f| RowState::of(s) == f))
        .collect();
    list_page(
        &state,
        &category,
        &q,
        &groups,
        rows,
        next,
        html! { p class="muted" { (note) } },
    )
    .await
}

/// The listing page: the filter form, then (live) the rows and the pager.
async fn list_page(
    state: &State,
    category: &str,
    q: &ListQuery,
    groups: &[String],
    rows: Vec<PartitionStatus>,
    next: Option<String>,
    note: Markup,
) -> View {
    let pending: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.pending > 0)
        .map(|r| (r.key.clone(), r.group.clone()))
        .collect();
    let oldest: HashMap<(String, String), u64> = pending
        .iter()
        .cloned()
        .zip(state.admin.oldest_pending(category, &pending).await?)
        .filter_map(|(u, ms)| Some((u, ms?)))
        .collect();
    let now = now_ms();
    let base = state.url(&format!("/c/{category}"));
    let mut query = Vec::new();
    for (k, v) in [
        ("prefix", &q.prefix),
        ("state", &q.state),
        ("sort", &q.sort),
        ("handler", &q.handler),
        ("live", &q.live),
    ] {
        if let Some(v) = non_empty(v) {
            query.push(format!("{k}={}", enc(v)));
        }
    }
    let with = |extra: Option<String>| {
        let mut parts = query.clone();
        parts.extend(extra);
        if parts.is_empty() {
            base.clone()
        } else {
            format!("{base}?{}", parts.join("&"))
        }
    };
    let here = with(non_empty(&q.cursor).map(|c| format!("cursor={}", enc(c))));
    let read_only = state.settings.read_only;
    let head = html! {
        h1 { "Partitions of " span class="mono" { (category) } }
        form class="filters" method="get" action=(base) {
            label { "key prefix" input type="search" name="prefix" value=(q.prefix.as_deref().unwrap_or("")); }
            label { "state"
                select name="state" {
                    option value="" { "any" }
                    @for s in RowState::ALL {
                        option value=(s.as_str()) selected[non_empty(&q.state) == Some(s.as_str())] { (s.as_str()) }
                    }
                }
            }
            label { "handler"
                select name="handler" {
                    option value="" { "every handler" }
                    @for g in groups {
                        option value=(g) selected[non_empty(&q.handler) == Some(g.as_str())] { (short(g)) }
                    }
                }
            }
            label { "order"
                select name="sort" {
                    option value="" { "index order (live)" }
                    option value="lag" selected[non_empty(&q.sort) == Some("lag")] { "lag, highest first" }
                }
            }
            button type="submit" { "Search" }
            a class="button secondary" href=(base) { "Reset" }
            a href=(state.url(&format!("/c/{category}/dlq"))) { "category dead letters" }
        }
    };
    let part = html! {
        (note)
        table {
            tr {
                th { "key" } th { "handler" } th { "owner" } th class="n" { "gen" } th class="n" { "length" }
                th class="n" { "pending" } th class="n" { "lag" } th { "oldest pending" } th { "state" }
                th class="n" { "attempts" } th { "last error" } th {}
            }
            @for r in &rows {
                @let st = RowState::of(r);
                @let key_url = state.url(&format!("/c/{category}/key?key={}", enc(&r.key)));
                tr {
                    td class="mono" { a href=(key_url) { (cut(&r.key, 60)) } }
                    td title=(r.group) { (short(&r.group)) }
                    td class="mono" {
                        @if let Some(o) = &r.owner {
                            (o) " " @if r.owner_alive { span class="muted" { "(alive)" } } @else { span class="err" { "(gone)" } }
                        } @else { span class="muted" { "—" } }
                    }
                    td class="n" { (opt(r.generation)) }
                    td class="n" { (r.length) @if r.backfill_length > 0 { " +" (r.backfill_length) } }
                    td class="n" { (r.pending) }
                    td class="n" { (opt(r.lag)) }
                    td { (oldest.get(&(r.key.clone(), r.group.clone())).map_or_else(|| "—".to_owned(), |ms| age(now.saturating_sub(*ms)))) }
                    td { (state_badge(st)) @if let Some(b) = r.behind_halt { " " span class="muted" { (b) " behind" } } }
                    td class="n" { (r.attempts) }
                    td class="err" title=(r.last_error.as_deref().unwrap_or("")) { (cut(r.halt_error.as_deref().or(r.last_error.as_deref()).unwrap_or(""), 90)) }
                    td class="actions" {
                        @if r.halted && !read_only {
                            @for (op, label) in [("retry", "retry"), ("skip", "skip"), ("dead_letter", "dead-letter")] {
                                a href=(state.url(&format!("/c/{category}/confirm?op={op}&key={}&handler={}", enc(&r.key), enc(&r.group)))) { (label) "…" }
                            }
                        }
                    }
                }
            }
        }
        @if rows.is_empty() { p class="muted" { "No partition on this page." } }
        div class="pager" {
            @if non_empty(&q.cursor).is_some() { a href=(with(None)) { "⇤ first page" } }
            @if let Some(n) = &next { a href=(with(Some(format!("cursor={}", enc(n))))) { "next page →" } }
            @if non_empty(&q.prefix).is_some() && non_empty(&q.live).is_none() && non_empty(&q.state).is_none() && non_empty(&q.sort).is_none() {
                a href=(format!("{}&live=1", with(None))) { "search the index live" }
            }
        }
    };
    whole_or_part(state, category, q.fragment.is_some(), &here, head, part)
}

/// `?key=...`.
#[derive(Debug, Deserialize)]
pub(crate) struct KeyQuery {
    key: String,
    fragment: Option<String>,
}

/// A key: each handler's unit and head (decoded), the lag chart, recent
/// entries, dead letters and audit records.
pub(crate) async fn key(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Query(q): Query<KeyQuery>,
) -> View {
    let key = q.key.as_str();
    let groups = state.admin.groups(&category).await?;
    let mut units = Vec::new();
    for g in &groups {
        units.push((g.clone(), state.admin.inspect(&category, key, g).await?));
    }
    let recent = state.admin.recent_entries(&category, key, 20).await?;
    let letters = state
        .admin
        .latest_dead_letters(&category, Some(key), 50)
        .await?;
    let audit = state
        .admin
        .key_audit(&category, key, KEY_AUDIT_SHOWN, KEY_AUDIT_SEARCHED)
        .await?;
    let now = now_ms();
    let lines: Vec<(String, Series)> = {
        let kept = state.settings.samples_kept;
        let mut samples = state.samples.lock().unwrap_or_else(|p| p.into_inner());
        units
            .iter()
            .map(|(g, i)| {
                let id = (category.clone(), key.to_owned(), g.clone());
                if let Some(lag) = i.status.lag {
                    samples.key(id.clone(), now, lag as i64, kept);
                }
                (
                    short(g).to_owned(),
                    samples.keys.get(&id).cloned().unwrap_or_default(),
                )
            })
            .collect()
    };
    let hide = state.settings.hide_payloads;
    let here = state.url(&format!("/c/{category}/key?key={}", enc(key)));
    let head = html! {
        p { a href=(state.url(&format!("/c/{category}"))) { "← partitions of " (category) } }
        h1 { "Key " span class="mono" { (key) } " of " span class="mono" { (category) } }
    };
    let part = html! {
        @if units.is_empty() { p class="muted" { "No handler is registered for this category." } }
        @for (g, i) in &units { (unit(&state, &category, key, g, i)) }
        h2 { "Lag of this key" }
        (lag_chart("lag of this key per handler", &lines, now))
        h2 { "Recent entries" }
        @if recent.is_empty() { p class="muted" { "The partition holds no entry." } } @else {
            table {
                tr { th { "entry" } th { "lane" } th { "type" } th { "message id" } th { "published" } th { "payload" } }
                @for e in &recent {
                    tr {
                        td class="mono" { (e.entry_id) }
                        td { (e.lane.as_str()) }
                        @if let Some(env) = &e.envelope {
                            td { (env.type_name) } td class="mono" { (env.id) } td { (utc(env.time_ms)) }
                            td class="mono" { @if hide { span class="muted" { "(hidden)" } } @else { (cut(&env.payload, 160)) } }
                        } @else {
                            td colspan="4" class="err" { (e.decode_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
        h2 { "Dead letters of this key" }
        (letters_table(&state, &category, Some(key), &letters))
        h2 { "Audit records of this key" }
        (audit_table(&audit.records))
        @if !audit.complete && audit.records.len() < KEY_AUDIT_SHOWN {
            p class="muted" { "Searched the newest " (audit.searched) " records of the key's shard audit stream; older ones are on the " a href=(state.url("/audit")) { "audit log" } " and in " span class="mono" { "convoy audit" } "." }
        }
    };
    whole_or_part(&state, key, q.fragment.is_some(), &here, head, part)
}

/// Audit records a key's page shows, at most.
const KEY_AUDIT_SHOWN: usize = 50;

/// Records of the key's shard audit stream a key's page reads, at most.
const KEY_AUDIT_SEARCHED: usize = 5_000;

/// One handler's unit of a key: its status, its head, the actions.
fn unit(state: &State, category: &str, key: &str, group: &str, i: &Inspection) -> Markup {
    let s = &i.status;
    let st = RowState::of(s);
    let hide = state.settings.hide_payloads;
    let on_halt = i.head.as_ref().is_some_and(|h| {
        s.halted && h.pending && s.halt_entry.as_deref() == Some(h.entry_id.as_str())
    });
    let confirm = |op: &str, force: bool| {
        state.url(&format!(
            "/c/{category}/confirm?op={op}&key={}&handler={}{}",
            enc(key),
            enc(group),
            if force { "&force=1" } else { "" }
        ))
    };
    html! {
        div class="box" {
            h2 { "Handler " span class="mono" { (group) } " " (state_badge(st)) }
            dl {
                dt { "owner" } dd class="mono" { (opt(s.owner.as_deref())) @if s.owner.is_some() { @if s.owner_alive { " (alive" @if let Some(ms) = s.lease_ms_left { ", " (age(ms)) " left" } ")" } @else { span class="err" { " (gone)" } } } }
                dt { "generation" } dd { "lease " (opt(s.generation)) ", durable " (s.durable_generation) }
                dt { "length" } dd { (s.length) " primary, " (s.backfill_length) " backfill" }
                dt { "pending / lag" } dd { (s.pending) " / " (opt(s.lag)) }
                dt { "attempts" } dd { (s.attempts) }
                @if let Some(e) = &s.last_error { dt { "last error" } dd class="err" { (e) } }
                @if s.halted {
                    dt { "halted" } dd class="err" {
                        (s.halt_reason.as_deref().unwrap_or("")) " on entry " span class="mono" { (opt(s.halt_entry.as_deref())) }
                        @if let Some(t) = s.halt_since_ms { " since " (utc(t)) }
                        @if let Some(b) = s.behind_halt { "; " (b) " events wait behind it" }
                    }
                }
                @if let Some(t) = s.paused_since_ms {
                    dt { "paused" } dd class="err" { "since " (utc(t)) ": the owner's handler sees its dependency down (many keys failing with transient errors); it starts no event but one probe at a time and resumes by itself when a probe succeeds" }
                }
                @if let Some(g) = &s.gap {
                    dt { "gap" } dd { "entry " span class="mono" { (g.entry_id) } " (message " (g.message_id) ") dead-lettered as " span class="mono" { (g.dead_letter_id) } ": " (g.reason) }
                }
                @if let Some(p) = &s.key_pause {
                    dt { "paused by an operator" } dd class="err" id=(format!("paused-{}", short(group))) {
                        (p.operator) " since " (utc(p.since_ms))
                        @if !p.reason.is_empty() { ": " (p.reason) }
                        @if p.handler.is_none() { " (every handler)" } @else if !matches!(p.target, PauseTarget::Key(_)) { " (" (p.target) ")" }
                    }
                }
            }
            @if !state.settings.read_only {
                @match &s.key_pause {
                    Some(p) => {
                        form method="post" action=(state.url(&format!("/c/{category}/resume"))) {
                            (csrf_field(state))
                            input type="hidden" name="key" value=(key);
                            input type="hidden" name="handler" value=(p.handler.as_deref().unwrap_or(""));
                            @if let PauseTarget::Prefix(prefix) = &p.target { input type="hidden" name="prefix" value=(prefix); }
                            button type="submit" class="resume" { "Resume " (p.target) }
                        }
                    }
                    None => {
                        form method="post" action=(state.url(&format!("/c/{category}/pause"))) {
                            (csrf_field(state))
                            input type="hidden" name="key" value=(key);
                            input type="hidden" name="handler" value=(group);
                            label { "reason " input type="text" name="reason" maxlength="200" required; }
                            " "
                            button type="submit" class="pause" { "Pause this key for " (short(group)) }
                        }
                    }
                }
            }
            @if let Some(h) = &i.head {
                h2 { "Head" }
                dl {
                    dt { "entry" } dd class="mono" { (h.entry_id) " (" (h.lane.as_str()) " lane)" }
                    dt { "delivery" } dd { @if h.pending { "pending for " span class="mono" { (opt(h.consumer.as_deref())) } ", delivered " (h.delivery_count) " times" @if let Some(ms) = h.idle_ms { ", idle " (age(ms)) } } @else { "not delivered yet" } }
                    @if let Some(env) = &h.envelope {
                        dt { "type" } dd { (env.type_name) }
                        dt { "message id" } dd class="mono" { (env.id) }
                        dt { "published" } dd { (utc(env.time_ms)) }
                        @if let Some(c) = &env.correlation_id { dt { "correlation id" } dd class="mono" { (c) } }
                    }
                    @if let Some(e) = &h.decode_error { dt { "undecodable" } dd class="err" { (e) } }
                }
                @if let Some(env) = &h.envelope {
                    @if hide { p class="muted" { "Payload hidden by the page's settings." } } @else { pre class="payload" { (pretty(&env.payload)) } }
                }
                @if !state.settings.read_only {
                    p class="actions" {
                        @if on_halt {
                            a class="button" href=(confirm("retry", false)) { "Retry in place…" }
                            a class="button danger" href=(confirm("dead_letter", false)) { "Dead-letter…" }
                            a class="button danger" href=(confirm("skip", false)) { "Skip…" }
                        } @else {
                            span class="muted" { "Not halted on this head. Forced actions fence the owner out: " }
                            a href=(confirm("retry", true)) { "force retry…" }
                            a href=(confirm("dead_letter", true)) { "force dead-letter…" }
                            a href=(confirm("skip", true)) { "force skip…" }
                        }
                    }
                }
            } @else {
                @if s.halt_reason.as_deref() == Some("not a stream") && !state.settings.read_only {
                    p { a class="button" href=(confirm("retry", false)) { "Clear the halt…" } }
                } @else {
                    p class="muted" { "No head: nothing waits for this handler." }
                }
            }
        }
    }
}

/// Dead letters, with the command line's fields.
fn letters_table(
    state: &State,
    category: &str,
    key: Option<&str>,
    letters: &[DeadLetter],
) -> Markup {
    let hide = state.settings.hide_payloads;
    html! {
        @if letters.is_empty() { p class="muted" { "No dead letter." } } @else {
            table {
                tr { th { "dead letter" } th { "handler" } th { "from entry" } th { "time" } th { "operator" } th { "type" } th { "message id" } th { "error" } th { "payload" } th {} }
                @for l in letters {
                    tr {
                        td class="mono" { (l.dlq_id) }
                        td title=(l.group.as_deref().unwrap_or("")) { (l.group.as_deref().map(short).unwrap_or("—")) }
                        td class="mono" { (opt(l.entry.as_deref())) }
                        td { (l.time_ms.map(utc).unwrap_or_default()) }
                        td { (l.operator.as_deref().unwrap_or("(automatic)")) }
                        @if let Some(env) = &l.envelope {
                            td { (env.type_name) } td class="mono" { (env.id) }
                        } @else { td colspan="2" class="err" { (l.decode_error.as_deref().unwrap_or("")) } }
                        td class="err" { (cut(l.error.as_deref().unwrap_or(""), 120)) }
                        td class="mono" { @if hide { span class="muted" { "(hidden)" } } @else { (l.envelope.as_ref().map(|e| cut(&e.payload, 120)).unwrap_or_default()) } }
                        td class="actions" {
                            @if let (Some(k), false) = (key, state.settings.read_only) {
                                a href=(state.url(&format!("/c/{category}/confirm-replay?key={}&dlq_id={}", enc(k), enc(&l.dlq_id)))) { "replay…" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Audit records, newest first, with the command line's fields.
fn audit_table(records: &[AuditRecord]) -> Markup {
    const SHOWN: [&str; 8] = [
        "time", "op", "category", "key", "group", "entry", "operator", "forced",
    ];
    html! {
        @if records.is_empty() { p class="muted" { "No operator action recorded." } } @else {
            table {
                tr { th { "time" } th { "op" } th { "partition" } th { "handler" } th { "entry" } th { "operator" } th { "forced" } th { "more" } }
                @for r in records {
                    @let f = |k: &str| r.fields.get(k).cloned().unwrap_or_default();
                    tr {
                        td { (f("time").parse().map(utc).unwrap_or_default()) }
                        td { (f("op")) }
                        td class="mono" { (f("category")) ":" (cut(&f("key"), 60)) }
                        td title=(f("group")) { (short(&f("group"))) }
                        td class="mono" { @if f("op").starts_with("outbox_") { "outbox row " } (f("entry")) }
                        td { (f("operator")) }
                        td { @if f("forced") == "1" { span class="err" { "yes" } } @else { "no" } }
                        td class="mono muted" {
                            @for (k, v) in r.fields.iter().filter(|(k, v)| !SHOWN.contains(&k.as_str()) && !v.is_empty()) {
                                (k) "=" (cut(v, 80)) " "
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `?key=...` of the dead letters view.
#[derive(Debug, Deserialize)]
pub(crate) struct LettersQuery {
    key: Option<String>,
}

/// Dead letters of a key, or of the category's ordinary handlers.
pub(crate) async fn dead_letters(
    AxState(state): AxState<Arc<State>>,
    Path(category): Path<String>,
    Query(q): Query<LettersQuery>,
) -> View {
    let key = non_empty(&q.key);
    let stream = state.admin.dlq_stream(&category, key).await?;
    let letters = state.admin.latest_dead_letters(&category, key, 200).await?;
    Ok(html_response(layout(
        &state,
        "Dead letters",
        html! {
            p { a href=(state.url(&format!("/c/{category}"))) { "← partitions of " (category) } }
            h1 { "Dead letters in " span class="mono" { (stream) } }
            form class="filters" method="get" action=(state.url(&format!("/c/{category}/dlq"))) {
                label { "key (empty: the category's ordinary handlers)" input type="search" name="key" value=(key.unwrap_or("")); }
                button type="submit" { "Show" }
            }
            p class="muted" { "The latest 200, newest first." }
            (letters_table(&state, &category, key, &letters))
        },
    )))
}

/// `?limit=N`.
#[derive(Debug, Deserialize)]
pub(crate) struct AuditQuery {
    limit: Option<usize>,
    fragment: Option<String>,
}

/// The latest operator actions of every audit stream, newest first.
pub(crate) async fn audit(
    AxState(state): AxState<Arc<State>>,
    Query(q): Query<AuditQuery>,
) -> View {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let mut records = state.admin.audit(limit).await?;
    records.reverse();
    whole_or_part(
        &state,
        "Audit log",
        q.fragment.is_some(),
        &state.url(&format!("/audit?limit={limit}")),
        html! { h1 { "Audit log" } p class="muted" { "The latest " (limit) " operator actions of every shard's audit stream and convoy:audit, newest first." } },
        audit_table(&records),
    )
}
