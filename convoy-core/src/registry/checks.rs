//! The checks of `Domain::init`, one function per rule, named for it.
//!
//! Each check adds every problem it finds to the list (so that init reports
//! all of them at once, not only the first); none stops the others.
//!
//! | rule | function |
//! | --- | --- |
//! | two message types never share a wire name | [`check_unique_type_names`] |
//! | handler and process-manager names are unique (they name consumer groups) | [`check_unique_handler_names`] |
//! | handled types are of the handler's kind (events, or commands for a command handler) | [`check_handled_kinds`] |
//! | handled types belong to the handler's category | [`check_handled_categories`] |
//! | the `sequential_by` field exists on every handled type | [`check_key_fields_exist`] |
//! | a process manager's `correlate` field exists on its event | [`check_correlate_fields_exist`] |
//! | a command has one command handler | [`check_one_command_handler_per_command`] |
//! | one key per category, handlers and process managers together | [`check_one_key_per_category`] |
//! | the broker advertises `STREAM_PARTITIONING` (or delivers serially, as the inline broker does) | [`check_broker_partitions`] |
//! | every declared event handler and process manager is run (a warning unless `require_all_handlers`) | [`check_every_declared_handler_runs`] |
//! | category names cannot reach another category's keys or convoy's own (`convoy` is reserved) | [`check_category_names`] |

use std::collections::BTreeMap;

use crate::error::Problem;
use crate::handler::{HandlerDescriptor, HandlerKind};
use crate::message::{MessageDescriptor, MessageKind};
use crate::process_manager::ProcessManagerDescriptor;

/// What the checks need to know of the broker.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct BrokerFacts<'a> {
    /// The broker's name, for messages.
    pub name: &'a str,
    /// Whether it advertises `STREAM_PARTITIONING`.
    pub stream_partitioning: bool,
    /// Whether it advertises `SERIAL_DELIVERY` (one event at a time, in
    /// submission order: `sequential_by` is an accepted no-op there).
    pub serial_delivery: bool,
}

/// Everything declared, in a fixed order: messages by (wire name, Rust
/// path), handlers and process managers by name, each descriptor once.
#[derive(Debug)]
pub(super) struct Declarations {
    pub(super) messages: Vec<&'static MessageDescriptor>,
    pub(super) handlers: Vec<&'static HandlerDescriptor>,
    pub(super) process_managers: Vec<&'static ProcessManagerDescriptor>,
}

impl Declarations {
    pub(super) fn new(
        messages: impl IntoIterator<Item = &'static MessageDescriptor>,
        handlers: impl IntoIterator<Item = &'static HandlerDescriptor>,
        process_managers: impl IntoIterator<Item = &'static ProcessManagerDescriptor>,
    ) -> Self {
        let mut handlers: Vec<&'static HandlerDescriptor> = handlers.into_iter().collect();
        handlers.sort_by_key(|h| h.name);
        handlers.dedup_by(|a, b| std::ptr::eq(*a, *b));
        let mut pms: Vec<&'static ProcessManagerDescriptor> =
            process_managers.into_iter().collect();
        pms.sort_by_key(|p| p.name);
        // A process manager's descriptor is an associated const, whose
        // address may differ between uses: one name is one type.
        pms.dedup_by(|a, b| a.name == b.name);
        let mut messages: Vec<&'static MessageDescriptor> = messages.into_iter().collect();
        // Handled types are known even when their registration was not linked.
        messages.extend(handlers.iter().flat_map(|h| h.handles.iter().copied()));
        messages.extend(pms.iter().flat_map(|p| p.handles.iter().map(|h| h.message)));
        messages.sort_by(|a, b| (a.type_name, a.rust_path).cmp(&(b.type_name, b.rust_path)));
        Declarations {
            messages,
            handlers,
            process_managers: pms,
        }
    }
}

/// Two message types never share a wire name. Returns the types by wire
/// name.
pub(super) fn check_unique_type_names(
    d: &Declarations,
    problems: &mut Vec<Problem>,
) -> BTreeMap<&'static str, &'static MessageDescriptor> {
    let mut by_name: BTreeMap<&'static str, &'static MessageDescriptor> = BTreeMap::new();
    for &m in &d.messages {
        match by_name.get(m.type_name) {
            Some(prev) if std::ptr::eq(*prev, m) || prev.rust_path == m.rust_path => {}
            Some(prev) => problems.push(Problem::DuplicateTypeName {
                type_name: m.type_name.to_owned(),
                paths: (prev.rust_path.to_owned(), m.rust_path.to_owned()),
            }),
            None => {
                by_name.insert(m.type_name, m);
            }
        }
    }
    by_name
}

/// Handler and process-manager names are unique: each names a consumer
/// group.
pub(super) fn check_unique_handler_names(d: &Declarations, problems: &mut Vec<Problem>) {
    for w in d.handlers.windows(2) {
        if w[0].name == w[1].name {
            problems.push(Problem::DuplicateHandler(w[0].name.to_owned()));
        }
    }
    for p in &d.process_managers {
        if d.handlers.iter().any(|h| h.name == p.name) {
            problems.push(Problem::DuplicateHandler(p.name.to_owned()));
        }
    }
}

/// Handled types are of the handler's kind: events for event handlers and
/// process managers, commands for command handlers.
pub(super) fn check_handled_kinds(d: &Declarations, problems: &mut Vec<Problem>) {
    for h in &d.handlers {
        let want = match h.kind {
            HandlerKind::Event => MessageKind::Event,
            HandlerKind::Command => MessageKind::Command,
        };
        for m in h.handles.iter().filter(|m| m.kind != want) {
            problems.push(Problem::KindMismatch {
                handler: h.name.to_owned(),
                type_name: m.type_name.to_owned(),
            });
        }
    }
    for p in &d.process_managers {
        for h in p
            .handles
            .iter()
            .filter(|h| h.message.kind != MessageKind::Event)
        {
            problems.push(Problem::KindMismatch {
                handler: p.name.to_owned(),
                type_name: h.message.type_name.to_owned(),
            });
        }
    }
}

/// Handled types belong to the handler's category (a process manager
/// spans categories, so this is about handlers). The handler macros assert
/// it at compile time; this is the defence in depth for descriptors
/// registered by hand.
pub(super) fn check_handled_categories(d: &Declarations, problems: &mut Vec<Problem>) {
    for h in &d.handlers {
        for m in h.handles.iter().filter(|m| m.category != h.category) {
            problems.push(Problem::CategoryMismatch {
                handler: h.name.to_owned(),
                category: h.category.to_owned(),
                type_name: m.type_name.to_owned(),
                type_category: m.category.to_owned(),
            });
        }
    }
}

/// The `sequential_by` field exists on every handled type (the macro
/// checks it at compile time; this is the defence in depth for
/// descriptors registered by hand).
pub(super) fn check_key_fields_exist(d: &Declarations, problems: &mut Vec<Problem>) {
    for h in &d.handlers {
        let Some(field) = h.sequential_by else {
            continue;
        };
        for m in h.handles.iter().filter(|m| !m.has_field(field)) {
            problems.push(Problem::MissingKeyField {
                handler: h.name.to_owned(),
                type_name: m.type_name.to_owned(),
                field: field.to_owned(),
                available: fields_of(m),
            });
        }
    }
}

/// A process manager's `correlate` field exists on each of its events.
pub(super) fn check_correlate_fields_exist(d: &Declarations, problems: &mut Vec<Problem>) {
    for p in &d.process_managers {
        for h in p
            .handles
            .iter()
            .filter(|h| !h.message.has_field(h.correlate))
        {
            problems.push(Problem::MissingCorrelateField {
                process_manager: p.name.to_owned(),
                type_name: h.message.type_name.to_owned(),
                field: h.correlate.to_owned(),
                available: fields_of(h.message),
            });
        }
    }
}

/// A command has one command handler.
pub(super) fn check_one_command_handler_per_command(d: &Declarations, problems: &mut Vec<Problem>) {
    let mut owner: BTreeMap<&'static str, &'static str> = BTreeMap::new();
    for h in d.handlers.iter().filter(|h| h.kind == HandlerKind::Command) {
        for m in h.handles {
            if let Some(prev) = owner.insert(m.type_name, h.name)
                && prev != h.name
            {
                problems.push(Problem::DuplicateCommandHandler {
                    type_name: m.type_name.to_owned(),
                    handlers: (prev.to_owned(), h.name.to_owned()),
                });
            }
        }
    }
}

/// One key per category: a partition key belongs to the category, so every
/// event handler on it, and every sequential process manager subscribed to
/// it (through the field its `correlate` names there), uses one key or
/// none. (Command handlers are checked among themselves: their
/// `sequential_by` is inert.) Returns the key field of each partitioned
/// event category.
pub(super) fn check_one_key_per_category(
    d: &Declarations,
    problems: &mut Vec<Problem>,
) -> BTreeMap<&'static str, &'static str> {
    let mut keys: BTreeMap<(HandlerKind, &'static str), (String, &'static str)> = BTreeMap::new();
    let mut claim = |kind, category: &'static str, who: String, field: &'static str| match keys
        .get(&(kind, category))
    {
        Some((other, other_field)) if *other_field != field => {
            problems.push(Problem::KeyConflict {
                category: category.to_owned(),
                first: (other.clone(), (*other_field).to_owned()),
                second: (who, field.to_owned()),
            });
        }
        Some(_) => {}
        None => {
            keys.insert((kind, category), (who, field));
        }
    };
    // The key a category's aggregate declares comes first: a writer that
    // links no handler of the category routes by it too.
    for m in &d.messages {
        if let (MessageKind::Event, Some(field)) = (m.kind, m.partition_key) {
            claim(
                HandlerKind::Event,
                m.category,
                format!("the aggregate of `{}`", m.rust_path),
                field,
            );
        }
    }
    for h in &d.handlers {
        if let Some(field) = h.sequential_by {
            claim(h.kind, h.category, h.name.to_owned(), field);
        }
    }
    for p in d.process_managers.iter().filter(|p| p.sequential) {
        for h in p.handles {
            claim(
                HandlerKind::Event,
                h.message.category,
                p.name.to_owned(),
                h.correlate,
            );
        }
    }
    keys.into_iter()
        .filter(|((kind, _), _)| *kind == HandlerKind::Event)
        .map(|((_, category), (_, field))| (category, field))
        .collect()
}

/// Every event handler declaring `sequential_by`, and every sequential
/// process manager, needs a broker that advertises `STREAM_PARTITIONING`,
/// or one that delivers every event serially (the inline broker, where
/// `sequential_by` is an accepted no-op).
pub(super) fn check_broker_partitions(
    d: &Declarations,
    broker: BrokerFacts<'_>,
    problems: &mut Vec<Problem>,
) {
    if broker.stream_partitioning || broker.serial_delivery {
        return;
    }
    let handlers = d
        .handlers
        .iter()
        .filter(|h| h.kind == HandlerKind::Event && h.sequential_by.is_some())
        .map(|h| h.name);
    let pms = d
        .process_managers
        .iter()
        .filter(|p| p.sequential)
        .map(|p| p.name);
    for name in handlers.chain(pms) {
        problems.push(Problem::BrokerCapability {
            handler: name.to_owned(),
            broker: broker.name.to_owned(),
        });
    }
}

/// Every event handler and process manager declared in the binary is run
/// by the domain: one declared with `#[event_handler]` but never passed to
/// `Domain::builder().handler(..)` would never handle anything, silently.
/// `run` names what the domain runs. `Domain::init` logs these problems as
/// warnings, or fails with them under `require_all_handlers`.
#[doc(hidden)]
pub fn check_every_declared_handler_runs(
    handlers: &[&'static HandlerDescriptor],
    process_managers: &[&'static ProcessManagerDescriptor],
    run: &[&str],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let declared = handlers
        .iter()
        .filter(|h| h.kind == HandlerKind::Event)
        .map(|h| (h.name, "event handler"))
        .chain(process_managers.iter().map(|p| (p.name, "process manager")));
    for (name, kind) in declared {
        if !run.contains(&name)
            && !problems
                .iter()
                .any(|p| matches!(p, Problem::HandlerNotRun { handler, .. } if handler == name))
        {
            problems.push(Problem::HandlerNotRun {
                handler: name.to_owned(),
                kind,
            });
        }
    }
    problems
}

/// Every category a message or handler names can be one: the `Aggregate`
/// derive checks it at compile time; this is the defence in depth for
/// aggregates implemented by hand (a category `convoy` would put domain
/// events in `convoy:audit` and let a skip delete audit records).
pub(super) fn check_category_names(d: &Declarations, problems: &mut Vec<Problem>) {
    let mut seen = std::collections::BTreeSet::new();
    let categories = d
        .messages
        .iter()
        .map(|m| (m.category, m.type_name))
        .chain(d.handlers.iter().map(|h| (h.category, h.name)));
    for (category, declared_by) in categories {
        if let Err(rule) = crate::key::check_category(category)
            && seen.insert(category)
        {
            problems.push(Problem::BadCategory {
                category: category.to_owned(),
                declared_by: declared_by.to_owned(),
                rule,
            });
        }
    }
}

fn fields_of(m: &MessageDescriptor) -> Vec<String> {
    m.fields.iter().map(|f| (*f).to_owned()).collect()
}
