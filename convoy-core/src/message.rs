//! Messages: aggregates (stream categories), events, commands and their
//! partition keys.
//!
//! User types implement these traits through `#[derive(Aggregate)]`,
//! `#[derive(Event)]` and `#[derive(Command)]`; nothing here is meant to be
//! implemented by hand, although it can be.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A stream category: the aggregate an event or command is `part_of`.
///
/// Derive it with `#[derive(convoy_runtime::Aggregate)]`; the category
/// defaults to the type name in snake case and can be set with
/// `#[aggregate(category = "order")]`.
///
/// A category's partition key belongs to the category:
/// `#[aggregate(partition_key = "client_id")]` declares it where every
/// process that raises the category's events sees it, whether or not it
/// links a handler of the category (a writer service routes its events by
/// it). Every event of the aggregate must then carry the field, and every
/// `sequential_by` on the category must name it (both compile errors).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a convoy aggregate",
    label = "`part_of` must name an aggregate",
    note = "add `#[derive(convoy_runtime::Aggregate)]` to `{Self}`"
)]
pub trait Aggregate: 'static {
    /// The stream category of every message that is `part_of` this aggregate.
    const CATEGORY: &'static str;
    /// The partition key field of the category's events, when declared on
    /// the aggregate (`#[aggregate(partition_key = "..")]`).
    const PARTITION_KEY: Option<&'static str> = None;
}

/// Whether a message is an event or a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageKind {
    /// Something that happened; goes through the outbox to the broker.
    Event,
    /// A request to do something; dispatched synchronously, never published.
    Command,
}

impl std::fmt::Display for MessageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MessageKind::Event => "event",
            MessageKind::Command => "command",
        })
    }
}

/// What the runtime knows about a message type, built at compile time.
#[derive(Debug)]
pub struct MessageDescriptor {
    /// The type name carried on the wire (`OrderPlaced` unless renamed with
    /// `#[event(name = "...")]`).
    pub type_name: &'static str,
    /// The Rust path of the type, for messages (`orders::OrderPlaced`).
    pub rust_path: &'static str,
    /// Event or command.
    pub kind: MessageKind,
    /// The stream category (the aggregate's).
    pub category: &'static str,
    /// The names of the type's fields, in declaration order.
    pub fields: &'static [&'static str],
    /// For an event: the partition key its aggregate declares
    /// ([`Aggregate::PARTITION_KEY`]); `None` for commands.
    pub partition_key: Option<&'static str>,
}

impl MessageDescriptor {
    /// Whether the type declares a direct field with this name.
    pub fn has_field(&self, name: &str) -> bool {
        self.fields.contains(&name)
    }
}

/// A message type (event or command) known to convoy.
///
/// Messages travel as JSON: the derives require `serde::Serialize` and
/// `serde::Deserialize` on the type, and say so in one error when either
/// is missing (they are not supertraits, which would report every missing
/// derive several times over, at convoy's traits).
pub trait Message: Send + Sync + 'static {
    /// The aggregate the message is `part_of`.
    type Aggregate: Aggregate;
    /// Compile-time description of the type.
    const DESCRIPTOR: &'static MessageDescriptor;

    /// The partition key carried by the direct field `field`.
    ///
    /// Returns `None` when the type has no such field or the field's type is
    /// not a [`PartitionKey`]; `Some(None)` when the field holds no value
    /// (`Option::None`), which is the null key.
    fn partition_key(&self, field: &str) -> Option<Option<String>>;

    /// The message as JSON (generated: `serde_json::to_string`).
    #[doc(hidden)]
    fn to_json(&self) -> Result<String, serde_json::Error>;

    /// The message read from JSON (generated: `serde_json::from_str`).
    #[doc(hidden)]
    fn from_json(json: &str) -> Result<Self, serde_json::Error>
    where
        Self: Sized;
}

/// An event: published through the outbox and handled by event handlers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a convoy event",
    label = "handled types must be events",
    note = "add `#[derive(convoy_runtime::Event)]` to `{Self}`; commands belong to `#[command_handler]`"
)]
pub trait Event: Message {}

/// A command: dispatched synchronously to its command handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a convoy command",
    label = "handled types must be commands",
    note = "add `#[derive(convoy_runtime::Command)]` to `{Self}`; events belong to `#[event_handler]`"
)]
pub trait Command: Message {
    /// What the command handler returns to the caller of
    /// `Domain::process`: `()` unless declared with
    /// `#[command(part_of = .., reply = OrderId)]`, in which case the
    /// handler method returns `Result<OrderId, E>`.
    type Reply: Send + 'static;
}

/// A field type that can serve as a partition key: string-like,
/// integer-like or a [`uuid::Uuid`] (rendered hyphenated, lowercase), or an
/// `Option` of one (where `None` is the null key, rejected when the message
/// is raised).
///
/// Implement it for your own identifier types; wrap a type from another
/// crate in a newtype of yours and implement it for the newtype.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a partition key",
    label = "this field's type is not string-like or integer-like",
    note = "partition keys are strings, integers, `uuid::Uuid`s or `Option`s of them; implement `convoy_runtime::PartitionKey` for your own identifier types, and wrap a type from another crate in a newtype that implements `PartitionKey`"
)]
pub trait PartitionKey {
    /// The key as it appears in the stream name, or `None` for the null key.
    fn to_partition_key(&self) -> Option<String>;
}

impl PartitionKey for str {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.to_owned())
    }
}

impl PartitionKey for String {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.clone())
    }
}

impl PartitionKey for Box<str> {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl PartitionKey for std::sync::Arc<str> {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl PartitionKey for std::borrow::Cow<'_, str> {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.to_string())
    }
}

/// The hyphenated lowercase form, `67e55044-10b1-426f-9247-bb680e5fe0c8`.
impl PartitionKey for uuid::Uuid {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.hyphenated().to_string())
    }
}

impl<T: PartitionKey + ?Sized> PartitionKey for &T {
    fn to_partition_key(&self) -> Option<String> {
        (**self).to_partition_key()
    }
}

impl<T: PartitionKey> PartitionKey for Option<T> {
    fn to_partition_key(&self) -> Option<String> {
        self.as_ref().and_then(PartitionKey::to_partition_key)
    }
}

macro_rules! integer_keys {
    ($($t:ty),*) => {$(
        impl PartitionKey for $t {
            fn to_partition_key(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
integer_keys!(
    i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize
);

/// Autoref probe used by `#[derive(Event)]` to read any field as a key when
/// its type is a [`PartitionKey`], and to answer `None` otherwise.
#[doc(hidden)]
#[derive(Debug)]
pub struct KeyProbe<'a, T: ?Sized>(pub &'a T);

/// Probe arm taken when the field type is a [`PartitionKey`].
#[doc(hidden)]
pub trait ViaPartitionKey {
    fn probe_key(&self) -> Option<Option<String>>;
}

impl<T: PartitionKey + ?Sized> ViaPartitionKey for KeyProbe<'_, T> {
    fn probe_key(&self) -> Option<Option<String>> {
        Some(self.0.to_partition_key())
    }
}

/// Probe arm taken when the field type is not a [`PartitionKey`].
#[doc(hidden)]
pub trait ViaFallback {
    fn probe_key(&self) -> Option<Option<String>>;
}

impl<T: ?Sized> ViaFallback for &KeyProbe<'_, T> {
    fn probe_key(&self) -> Option<Option<String>> {
        None
    }
}

/// Autoref probe of whether a message type is serde-serializable both
/// ways, used by the generated `Message` impl (so that a type without the
/// serde derives still gets its impl, and the one error about them is
/// [`require_serde`]'s). Not a public API.
#[doc(hidden)]
pub struct SerdeProbe<T>(std::marker::PhantomData<fn() -> T>);

impl<T> SerdeProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        SerdeProbe(std::marker::PhantomData)
    }
}

impl<T> Default for SerdeProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for SerdeProbe<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SerdeProbe")
    }
}

/// Probe arm taken when the type is `Serialize + DeserializeOwned`.
#[doc(hidden)]
pub trait ViaSerde<T> {
    fn encode_json(&self, value: &T) -> Result<String, serde_json::Error>;
    fn decode_json(&self, json: &str) -> Result<T, serde_json::Error>;
    fn serde_check(&self) -> SerdeDerived;
}

impl<T: Serialize + DeserializeOwned> ViaSerde<T> for SerdeProbe<T> {
    fn encode_json(&self, value: &T) -> Result<String, serde_json::Error> {
        serde_json::to_string(value)
    }

    fn decode_json(&self, json: &str) -> Result<T, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn serde_check(&self) -> SerdeDerived {
        SerdeDerived
    }
}

/// Probe arm taken otherwise: never runs, because [`require_serde`]
/// rejects the program.
#[doc(hidden)]
pub trait ViaNoSerde<T> {
    fn encode_json(&self, value: &T) -> Result<String, serde_json::Error>;
    fn decode_json(&self, json: &str) -> Result<T, serde_json::Error>;
    fn serde_check(&self) -> SerdeMissing<T>;
}

impl<T> ViaNoSerde<T> for &SerdeProbe<T> {
    fn encode_json(&self, _: &T) -> Result<String, serde_json::Error> {
        Err(serde::ser::Error::custom(
            "the message type is not Serialize",
        ))
    }

    fn decode_json(&self, _: &str) -> Result<T, serde_json::Error> {
        Err(serde::de::Error::custom(
            "the message type is not Deserialize",
        ))
    }

    fn serde_check(&self) -> SerdeMissing<T> {
        SerdeMissing(std::marker::PhantomData)
    }
}

/// What the probe answers for a serde type.
#[doc(hidden)]
#[derive(Debug)]
pub struct SerdeDerived;

/// What the probe answers for a type lacking a serde derive.
#[doc(hidden)]
pub struct SerdeMissing<T>(std::marker::PhantomData<fn() -> T>);

impl<T> std::fmt::Debug for SerdeMissing<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SerdeMissing")
    }
}

/// Implemented only by the probe's answer for a serde type: the bound
/// whose failure is the one diagnostic of a message without the derives.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{M}` must derive `Serialize` and `Deserialize`: add `#[derive(serde::Serialize, serde::Deserialize)]` to it",
    label = "convoy messages travel as JSON",
    note = "`{M}` lacks `serde::Serialize`, `serde::Deserialize`, or both"
)]
pub trait IsSerde<M> {}

impl<M> IsSerde<M> for SerdeDerived {}

/// Compiles only when `answer` is the probe's answer for a serde type.
#[doc(hidden)]
pub fn require_serde<M, A: IsSerde<M>>(answer: A) {
    let _ = answer;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // The borrow selects the fallback arm for non-key types (autoref
    // specialization); for key types it is redundant, as clippy says.
    #[allow(clippy::needless_borrow)]
    fn probe_reads_key_types_and_ignores_others() {
        let s = String::from("c-1");
        let n = 42u64;
        let o: Option<String> = None;
        let f = 1.5f64;
        assert_eq!((&KeyProbe(&s)).probe_key(), Some(Some("c-1".into())));
        assert_eq!((&KeyProbe(&n)).probe_key(), Some(Some("42".into())));
        assert_eq!((&KeyProbe(&o)).probe_key(), Some(None));
        assert_eq!((&KeyProbe(&f)).probe_key(), None);
    }

    #[test]
    fn uuid_keys_are_hyphenated_lowercase() {
        let id = uuid::Uuid::from_u128(0x67E5_5044_10B1_426F_9247_BB68_0E5F_E0C8);
        assert_eq!(
            id.to_partition_key().as_deref(),
            Some("67e55044-10b1-426f-9247-bb680e5fe0c8")
        );
        assert_eq!(Some(id).to_partition_key(), id.to_partition_key());
    }
}
