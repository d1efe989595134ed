//! The registry: every message type and handler declared with convoy's
//! macros (collected with `inventory`), plus any registered by hand,
//! validated by the checks `Domain::init` runs over them (one function per
//! rule, in `registry/checks.rs`).

mod checks;

use std::collections::BTreeMap;

use crate::error::{Error, Problems};
use crate::handler::HandlerDescriptor;
use crate::key::KeyPolicy;
use crate::message::MessageDescriptor;
use crate::process_manager::{ProcessManagerDescriptor, ProcessManagerRegistration};
use checks::Declarations;
#[doc(hidden)]
pub use checks::{BrokerFacts, check_every_declared_handler_runs};

/// An `inventory` entry for one message type (submitted by the derives).
#[doc(hidden)]
#[derive(Debug)]
pub struct MessageRegistration(pub &'static MessageDescriptor);

/// An `inventory` entry for one handler (submitted by the handler macros).
#[doc(hidden)]
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

/// The validated set of declarations of a domain.
#[derive(Debug, Clone)]
pub struct Registry {
    messages: BTreeMap<&'static str, &'static MessageDescriptor>,
    handlers: Vec<&'static HandlerDescriptor>,
    process_managers: Vec<&'static ProcessManagerDescriptor>,
    event_keys: BTreeMap<&'static str, &'static str>,
}

impl Registry {
    /// Validates the declarations with every check of `checks.rs`,
    /// reporting every problem found.
    #[doc(hidden)]
    pub fn build(
        messages: impl IntoIterator<Item = &'static MessageDescriptor>,
        handlers: impl IntoIterator<Item = &'static HandlerDescriptor>,
        process_managers: impl IntoIterator<Item = &'static ProcessManagerDescriptor>,
        broker: BrokerFacts<'_>,
    ) -> Result<Registry, Error> {
        let d = Declarations::new(messages, handlers, process_managers);
        let mut problems = Vec::new();
        let messages = checks::check_unique_type_names(&d, &mut problems);
        checks::check_unique_handler_names(&d, &mut problems);
        checks::check_handled_kinds(&d, &mut problems);
        checks::check_handled_categories(&d, &mut problems);
        checks::check_key_fields_exist(&d, &mut problems);
        checks::check_correlate_fields_exist(&d, &mut problems);
        checks::check_one_command_handler_per_command(&d, &mut problems);
        let event_keys = checks::check_one_key_per_category(&d, &mut problems);
        checks::check_broker_partitions(&d, broker, &mut problems);
        checks::check_category_names(&d, &mut problems);
        if !problems.is_empty() {
            return Err(Error::IncorrectUsage(Problems(problems)));
        }
        Ok(Registry {
            messages,
            handlers: d.handlers,
            process_managers: d.process_managers,
            event_keys,
        })
    }

    /// The message type with this wire name.
    pub fn message(&self, type_name: &str) -> Option<&'static MessageDescriptor> {
        self.messages.get(type_name).copied()
    }

    /// Every message type, by wire name.
    pub fn messages(&self) -> impl Iterator<Item = &'static MessageDescriptor> + '_ {
        self.messages.values().copied()
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
    #[doc(hidden)]
    pub fn key_policy(&self, backfill_suffix: &str) -> KeyPolicy {
        KeyPolicy::new(self.event_keys.clone(), backfill_suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::HandlerKind;
    use crate::message::MessageKind;

    const PLACED: MessageDescriptor = MessageDescriptor {
        type_name: "Placed",
        rust_path: "t::Placed",
        kind: MessageKind::Event,
        category: "order",
        fields: &["order_id", "client_id"],
        partition_key: None,
    };
    const SHIPPED: MessageDescriptor = MessageDescriptor {
        type_name: "Shipped",
        rust_path: "t::Shipped",
        kind: MessageKind::Event,
        category: "order",
        fields: &["order_id"],
        partition_key: None,
    };
    static A: HandlerDescriptor = HandlerDescriptor {
        name: "t::A",
        kind: HandlerKind::Event,
        category: "order",
        sequential_by: Some("client_id"),
        handles: &[&PLACED, &SHIPPED],
        dead_letter_poison: false,
    };
    static B: HandlerDescriptor = HandlerDescriptor {
        name: "t::B",
        kind: HandlerKind::Event,
        category: "order",
        sequential_by: Some("order_id"),
        handles: &[&PLACED],
        dead_letter_poison: false,
    };
    static C: HandlerDescriptor = HandlerDescriptor {
        name: "t::C",
        kind: HandlerKind::Event,
        category: "order",
        sequential_by: Some("order_id"),
        handles: &[&PLACED, &SHIPPED],
        dead_letter_poison: false,
    };

    const REDIS: BrokerFacts<'static> = BrokerFacts {
        name: "redis",
        stream_partitioning: true,
        serial_delivery: false,
    };

    #[test]
    fn reports_every_problem() {
        let plain = BrokerFacts {
            name: "plain",
            stream_partitioning: false,
            serial_delivery: false,
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
            serial_delivery: true,
        };
        let r = Registry::build([], [&B, &C], [], inline).expect("inline accepts");
        assert_eq!(r.key_field("order"), Some("order_id"));
        Registry::build([], [&C], [], REDIS).expect("redis accepts");
    }
}
