//! The registry: every message type and handler declared with convoy's
//! macros (collected with `inventory`), plus any registered by hand, and the
//! checks `Domain::init` runs over them.

use std::collections::BTreeMap;

use crate::error::{Error, Problem, Problems};
use crate::handler::{HandlerDescriptor, HandlerKind};
use crate::key::KeyPolicy;
use crate::message::{MessageDescriptor, MessageKind};
use crate::process_manager::{ProcessManagerDescriptor, ProcessManagerRegistration};

/// An `inventory` entry for one message type (submitted by the derives).
#[derive(Debug)]
pub struct MessageRegistration(pub &'static MessageDescriptor);

/// An `inventory` entry for one handler (submitted by the handler macros).
#[derive(Debug)]
pub struct HandlerRegistration(pub &'static HandlerDescriptor);

inventory::collect!(MessageRegistration);
inventory::collect!(HandlerRegistration);

/// Every message descriptor linked into this binary, sorted by wire name.
pub fn registered_messages() -> Vec<&'static MessageDescriptor> {
    let mut v: Vec<_> = inventory::iter::<MessageRegistration>
        .into_iter()
        .map(|r| r.0)
        .collect();
    v.sort_by(|a, b| (a.type_name, a.rust_path).cmp(&(b.type_name, b.rust_path)));
    v
}

/// Every handler descriptor linked into this binary, sorted by name.
pub fn registered_handlers() -> Vec<&'static HandlerDescriptor> {
    let mut v: Vec<_> = inventory::iter::<HandlerRegistration>
        .into_iter()
        .map(|r| r.0)
        .collect();
    v.sort_by_key(|h| h.name);
    v
}

/// Every process manager linked into this binary, sorted by name.
pub fn registered_process_managers() -> Vec<&'static ProcessManagerDescriptor> {
    let mut v: Vec<_> = inventory::iter::<ProcessManagerRegistration>
        .into_iter()
        .map(|r| r.0)
        .collect();
    v.sort_by_key(|p| p.name);
    v
}

/// Whether the target broker can partition streams.
#[derive(Debug, Clone, Copy)]
pub struct BrokerFacts<'a> {
    /// The broker's name, for messages.
    pub name: &'a str,
    /// Whether it advertises `STREAM_PARTITIONING`.
    pub stream_partitioning: bool,
    /// Whether it is the inline broker (where `sequential_by` is an accepted no-op).
    pub inline: bool,
}

/// The validated set of declarations of a domain.
#[derive(Debug, Clone)]
pub struct Registry {
    messages: BTreeMap<&'static str, &'static MessageDescriptor>,
    handlers: Vec<&'static HandlerDescriptor>,
    process_managers: Vec<&'static ProcessManagerDescriptor>,
    event_keys: BTreeMap<&'static str, &'static str>,
}

impl Registry {
    /// Validates the declarations, reporting every problem found.
    pub fn build(
        messages: impl IntoIterator<Item = &'static MessageDescriptor>,
        handlers: impl IntoIterator<Item = &'static HandlerDescriptor>,
        process_managers: impl IntoIterator<Item = &'static ProcessManagerDescriptor>,
        broker: BrokerFacts<'_>,
    ) -> Result<Registry, Error> {
        let mut problems = Vec::new();

        let mut by_name: BTreeMap<&'static str, &'static MessageDescriptor> = BTreeMap::new();
        let mut all_messages: Vec<&'static MessageDescriptor> = messages.into_iter().collect();
        let mut hs: Vec<&'static HandlerDescriptor> = handlers.into_iter().collect();
        let mut pms: Vec<&'static ProcessManagerDescriptor> =
            process_managers.into_iter().collect();
        pms.sort_by_key(|p| p.name);
        // A process manager's descriptor is an associated const, whose
        // address may differ between uses: one name is one type.
        pms.dedup_by(|a, b| a.name == b.name);
        // Handled types are known even when their registration was not linked.
        all_messages.extend(hs.iter().flat_map(|h| h.handles.iter().copied()));
        all_messages.extend(pms.iter().flat_map(|p| p.handles.iter().map(|h| h.message)));
        all_messages.sort_by(|a, b| (a.type_name, a.rust_path).cmp(&(b.type_name, b.rust_path)));
        for m in all_messages {
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

        hs.sort_by_key(|h| h.name);
        hs.dedup_by(|a, b| std::ptr::eq(*a, *b));
        for w in hs.windows(2) {
            if w[0].name == w[1].name {
                problems.push(Problem::DuplicateHandler(w[0].name.to_owned()));
            }
        }

        let mut keys: BTreeMap<(HandlerKind, &'static str), (&'static str, &'static str)> =
            BTreeMap::new();
        let mut command_owner: BTreeMap<&'static str, &'static str> = BTreeMap::new();
        for h in &hs {
            let want = match h.kind {
                HandlerKind::Event => MessageKind::Event,
                HandlerKind::Command => MessageKind::Command,
            };
            for m in h.handles {
                if m.kind != want {
                    problems.push(Problem::KindMismatch {
                        handler: h.name.to_owned(),
                        type_name: m.type_name.to_owned(),
                    });
                }
                if m.category != h.category {
                    problems.push(Problem::CategoryMismatch {
                        handler: h.name.to_owned(),
                        category: h.category.to_owned(),
                        type_name: m.type_name.to_owned(),
                        type_category: m.category.to_owned(),
                    });
                }
                if let Some(field) = h.sequential_by
                    && !m.has_field(field)
                {
                    problems.push(Problem::MissingKeyField {
                        handler: h.name.to_owned(),
                        type_name: m.type_name.to_owned(),
                        field: field.to_owned(),
                        available: m.fields.iter().map(|f| (*f).to_owned()).collect(),
                    });
                }
                if h.kind == HandlerKind::Command
                    && let Some(prev) = command_owner.insert(m.type_name, h.name)
                    && prev != h.name
                {
                    problems.push(Problem::DuplicateCommandHandler {
                        type_name: m.type_name.to_owned(),
                        handlers: (prev.to_owned(), h.name.to_owned()),
                    });
                }
            }
            if let Some(field) = h.sequential_by {
                match keys.get(&(h.kind, h.category)) {
                    Some(&(other, other_field)) if other_field != field => {
                        problems.push(Problem::KeyConflict {
                            category: h.category.to_owned(),
                            first: (other.to_owned(), other_field.to_owned()),
                            second: (h.name.to_owned(), field.to_owned()),
                        });
                    }
                    Some(_) => {}
                    None => {
                        keys.insert((h.kind, h.category), (h.name, field));
                    }
                }
                if h.kind == HandlerKind::Event && !broker.stream_partitioning && !broker.inline {
                    problems.push(Problem::BrokerCapability {
                        handler: h.name.to_owned(),
                        broker: broker.name.to_owned(),
                    });
                }
            }
        }

        for p in &pms {
            if hs.iter().any(|h| h.name == p.name) {
                problems.push(Problem::DuplicateHandler(p.name.to_owned()));
            }
            for h in p.handles {
                let m = h.message;
                if m.kind != MessageKind::Event {
                    problems.push(Problem::KindMismatch {
                        handler: p.name.to_owned(),
                        type_name: m.type_name.to_owned(),
                    });
                }
                if !m.has_field(h.correlate) {
                    problems.push(Problem::MissingCorrelateField {
                        process_manager: p.name.to_owned(),
                        type_name: m.type_name.to_owned(),
                        field: h.correlate.to_owned(),
                        available: m.fields.iter().map(|f| (*f).to_owned()).collect(),
                    });
                }
                if !p.sequential {
                    continue;
                }
                // A sequential process manager partitions each category it
                // subscribes to by the field its correlate maps there.
                match keys.get(&(HandlerKind::Event, m.category)) {
                    Some(&(other, other_field)) if other_field != h.correlate => {
                        problems.push(Problem::KeyConflict {
                            category: m.category.to_owned(),
                            first: (other.to_owned(), other_field.to_owned()),
                            second: (p.name.to_owned(), h.correlate.to_owned()),
                        });
                    }
                    Some(_) => {}
                    None => {
                        keys.insert((HandlerKind::Event, m.category), (p.name, h.correlate));
                    }
                }
            }
            if p.sequential && !broker.stream_partitioning && !broker.inline {
                problems.push(Problem::BrokerCapability {
                    handler: p.name.to_owned(),
                    broker: broker.name.to_owned(),
                });
            }
        }

        if !problems.is_empty() {
            return Err(Error::IncorrectUsage(Problems(problems)));
        }
        let event_keys = keys
            .into_iter()
            .filter(|((kind, _), _)| *kind == HandlerKind::Event)
            .map(|((_, category), (_, field))| (category, field))
            .collect();
        Ok(Registry {
            messages: by_name,
            handlers: hs,
            process_managers: pms,
            event_keys,
        })
    }

    /// The message type with this wire name.
    pub fn message(&self, type_name: &str) -> Option<&'static MessageDescriptor> {
        self.messages.get(type_name).copied()
    }

    /// Every validated handler, sorted by name.
    pub fn handlers(&self) -> &[&'static HandlerDescriptor] {
        &self.handlers
    }

    /// Every validated process manager, sorted by name.
    pub fn process_managers(&self) -> &[&'static ProcessManagerDescriptor] {
        &self.process_managers
    }

    /// The partition key field of an event category, when partitioned.
    pub fn key_field(&self, category: &str) -> Option<&'static str> {
        self.event_keys.get(category).copied()
    }

    /// The key policy of the domain.
    pub fn key_policy(&self, backfill_suffix: &str) -> KeyPolicy {
        KeyPolicy::new(self.event_keys.clone(), backfill_suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLACED: MessageDescriptor = MessageDescriptor {
        type_name: "Placed",
        rust_path: "t::Placed",
        kind: MessageKind::Event,
        category: "order",
        fields: &["order_id", "client_id"],
    };
    const SHIPPED: MessageDescriptor = MessageDescriptor {
        type_name: "Shipped",
        rust_path: "t::Shipped",
        kind: MessageKind::Event,
        category: "order",
        fields: &["order_id"],
    };
    static A: HandlerDescriptor = HandlerDescriptor {
        name: "t::A",
        kind: HandlerKind::Event,
        category: "order",
        sequential_by: Some("client_id"),
        handles: &[&PLACED, &SHIPPED],
    };
    static B: HandlerDescriptor = HandlerDescriptor {
        name: "t::B",
        kind: HandlerKind::Event,
        category: "order",
        sequential_by: Some("order_id"),
        handles: &[&PLACED],
    };
    static C: HandlerDescriptor = HandlerDescriptor {
        name: "t::C",
        kind: HandlerKind::Event,
        category: "order",
        sequential_by: Some("order_id"),
        handles: &[&PLACED, &SHIPPED],
    };

    const REDIS: BrokerFacts<'static> = BrokerFacts {
        name: "redis",
        stream_partitioning: true,
        inline: false,
    };

    #[test]
    fn reports_every_problem() {
        let plain = BrokerFacts {
            name: "plain",
            stream_partitioning: false,
            inline: false,
        };
        let err = Registry::build([], [&A, &B], [], plain).expect_err("must fail");
        let text = err.to_string();
        assert_eq!(err.problems().len(), 4, "{text}");
        assert!(
            text.contains("`Shipped` has no field `client_id` (available fields: order_id)"),
            "{text}"
        );
        assert!(
            text.contains("partitioned by `client_id` in `t::A` but by `order_id` in `t::B`"),
            "{text}"
        );
        assert!(
            text.contains("`t::A` declares sequential_by but the broker `plain`"),
            "{text}"
        );
        assert!(
            text.contains("`t::B` declares sequential_by but the broker `plain`"),
            "{text}"
        );
    }

    #[test]
    fn inline_and_capable_brokers_accept() {
        let inline = BrokerFacts {
            name: "inline",
            stream_partitioning: false,
            inline: true,
        };
        let r = Registry::build([], [&B, &C], [], inline).expect("inline accepts");
        assert_eq!(r.key_field("order"), Some("order_id"));
        Registry::build([], [&C], [], REDIS).expect("redis accepts");
    }
}
