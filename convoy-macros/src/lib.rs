//! Procedural macros of convoy: `#[derive(Aggregate)]`, `#[derive(Event)]`,
//! `#[derive(Command)]`, `#[event_handler]` and `#[command_handler]`.
//!
//! Depend on `convoy-runtime`, which re-exports every macro here
//! (`use convoy_runtime::{Aggregate, Event, event_handler};`); the code the
//! macros generate names `::convoy_runtime`.
//!
//! This file declares only the entry points and their documentation; the
//! derives live in `message/`, the handler attributes in `handler/`
//! (`attr.rs` parses, `check.rs` validates, `expand.rs` generates).
//! `#[process_manager]` lives in `process_manager/`, split the same way;
//! `impl_block.rs` holds what both attributes on an impl block share (the
//! expansion frame, the `#[handle]` markers, the impl block's checks, the
//! generated `dispatch`), and `tokens.rs` parsing and span helpers.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

mod ctxt;
mod handler;
mod impl_block;
mod message;
mod process_manager;
mod signature;
mod symbol;
mod tokens;

use message::Kind;

/// Makes a type an aggregate: the stream category of the events and
/// commands that are `part_of` it.
///
/// ```
/// use convoy_runtime::Aggregate;
///
/// #[derive(Aggregate)]
/// pub struct Order;
///
/// assert_eq!(<Order as Aggregate>::CATEGORY, "order");
/// ```
///
/// ## category
///
/// The category defaults to the type name in snake case (`OrderLine` is
/// `order_line`). Set it with `#[aggregate(category = "...")]`; it becomes
/// the first segment of stream names (`{category}:{key}`), so it must be
/// non-empty and contain no `:` or whitespace.
///
/// ```
/// use convoy_runtime::Aggregate;
///
/// #[derive(Aggregate)]
/// #[aggregate(category = "orders")]
/// pub struct OrderLine;
///
/// assert_eq!(<OrderLine as Aggregate>::CATEGORY, "orders");
/// ```
#[proc_macro_derive(Aggregate, attributes(aggregate))]
pub fn derive_aggregate(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    message::derive_aggregate(&input).into()
}

/// Makes a struct an event: a message that goes through the outbox to the
/// broker and is handled by `#[event_handler]`s.
///
/// The struct needs named fields and serde's `Serialize` and `Deserialize`;
/// it cannot be generic. The derive implements `convoy_runtime::Message`
/// and `convoy_runtime::Event`, and registers the type with the runtime.
///
/// ```
/// use convoy_runtime::{Aggregate, Event, Message};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Aggregate)]
/// pub struct Order;
///
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order)]
/// pub struct OrderPlaced {
///     pub order_id: String,
///     pub client_id: String,
///     pub total: u64,
/// }
///
/// let placed = OrderPlaced { order_id: "o-1".into(), client_id: "c-1".into(), total: 3 };
/// assert_eq!(placed.partition_key("client_id"), Some(Some("c-1".to_owned())));
/// assert_eq!(OrderPlaced::DESCRIPTOR.category, "order");
/// ```
///
/// ## part_of
///
/// Required: `part_of = Order` names the aggregate type (a path to a type
/// with `#[derive(Aggregate)]`) whose category the event belongs to.
///
/// ## name
///
/// The type name carried on the wire defaults to the struct's name; set it
/// with `name = "..."`, for example to rename the Rust type without
/// breaking stored events:
///
/// ```
/// # use convoy_runtime::{Aggregate, Event, Message};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order, name = "OrderPlaced")]
/// pub struct OrderPlacedV1 {
///     pub order_id: String,
/// }
///
/// assert_eq!(OrderPlacedV1::DESCRIPTOR.type_name, "OrderPlaced");
/// ```
#[proc_macro_derive(Event, attributes(event))]
pub fn derive_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    message::derive_message(&input, Kind::Event).into()
}

/// Makes a struct a command: a message dispatched synchronously to its one
/// `#[command_handler]`, never published.
///
/// Same rules and options as `#[derive(Event)]`, in `#[command(..)]`.
///
/// ```
/// use convoy_runtime::{Aggregate, Command, Message};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Aggregate)]
/// pub struct Order;
///
/// #[derive(Command, Serialize, Deserialize)]
/// #[command(part_of = Order)]
/// pub struct PlaceOrder {
///     pub client_id: String,
/// }
///
/// assert_eq!(PlaceOrder::DESCRIPTOR.type_name, "PlaceOrder");
/// ```
///
/// ## part_of
///
/// Required: the aggregate type the command belongs to.
///
/// ## name
///
/// The wire type name; defaults to the struct's name.
///
/// ## reply
///
/// What the command handler answers to the caller of `Domain::process`:
/// with `reply = T`, the handler method returns `Result<T, E>` and
/// `domain.process(cmd).await?` is a `T`. Without it, the reply is `()`
/// (handler methods return `Result<(), E>`).
///
/// ```
/// # use convoy_runtime::{Aggregate, Command, HandlerError, command_handler};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// #[derive(Command, Serialize, Deserialize)]
/// #[command(part_of = Order, reply = u64)]
/// pub struct PlaceOrder { pub client_id: String }
///
/// pub struct Desk;
///
/// #[command_handler(part_of = Order)]
/// impl Desk {
///     #[handle]
///     async fn place(&self, command: PlaceOrder) -> Result<u64, HandlerError> {
///         Ok(42) // the new order's number
///     }
/// }
/// # fn main() {}
/// ```
#[proc_macro_derive(Command, attributes(command))]
pub fn derive_command(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    message::derive_message(&input, Kind::Command).into()
}

/// Declares an event handler: implements `convoy_runtime::EventHandler` for
/// the type and records its declaration, so that `Domain::init` validates
/// it. It *runs* only when a value is given to
/// `Domain::builder().handler(..)`; a declared handler that is not given is
/// a warning at `init` (an error with `.require_all_handlers()`).
///
/// The usual form goes on an inherent `impl` block. Each method marked
/// `#[handle]` handles the event type it takes:
/// `async fn name(&self, event: E) -> Result<(), Err>` or
/// `async fn name(&self, event: E, ctx: &Context) -> Result<(), Err>`, where
/// `Err` converts into `convoy_runtime::HandlerError` (any error type, a
/// `String` or a `&str` does). An `Err` is a processing failure: retried,
/// then halted for a partitioned handler, dead-lettered otherwise. The
/// futures must be `Send`, and handlers take `&self`: one handler value
/// serves many partitions at once, so keep mutable state behind a lock.
/// Other items of the block are left alone.
///
/// ```
/// use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Aggregate)]
/// pub struct Order;
///
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order)]
/// pub struct OrderPlaced { pub order_id: String, pub client_id: String, pub total: u64 }
///
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order)]
/// pub struct OrderShipped { pub order_id: String, pub client_id: String }
///
/// pub struct ClientLedger;
///
/// #[event_handler(part_of = Order, sequential_by = "client_id")]
/// impl ClientLedger {
///     #[handle]
///     async fn placed(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
///         assert_eq!(ctx.partition_key(), Some(event.client_id.as_str()));
///         Ok(())
///     }
///
///     #[handle]
///     async fn shipped(&self, event: OrderShipped) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// # fn main() {}
/// ```
///
/// The handler's name, also its consumer group, is the module path of the
/// declaration followed by the type name (`my_crate::ledger::ClientLedger`).
///
/// ## part_of
///
/// Required: `part_of = Order` names the aggregate (a type with
/// `#[derive(Aggregate)]`) whose category the handler consumes. Every
/// handled event must be an event (`#[derive(Event)]`); a type that is not
/// is a compile error at the type.
///
/// ## sequential_by
///
/// `sequential_by = "client_id"` partitions the category by that field:
/// two events with the same `client_id` are never handled at the same time,
/// and their effects land in publish order, while different keys run in
/// parallel across every engine process.
///
/// The field must be a direct field of every handled event, of a type that
/// can be a key: strings, integers, `Option`s of them (`None` is rejected
/// when the event is raised), or a type implementing
/// `convoy_runtime::PartitionKey`. Both are checked at compile time, with
/// the error on the `"client_id"` literal, and again by `Domain::init`,
/// which also requires one key per category across all handlers. The
/// field must be visible from the module of the handler.
///
/// On the inline broker, `sequential_by` is an accepted no-op: events are
/// handled one at a time, in order, anyway.
///
/// ## handles
///
/// Only for the second form, on a struct: `handles = [OrderPlaced, ..]`
/// lists the handled events, and the struct implements
/// `convoy_runtime::Handle<E>` once for each of them.
///
/// ```
/// # use convoy_runtime::{Aggregate, Event};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Order)]
/// # pub struct OrderPlaced { pub order_id: String, pub client_id: String, pub total: u64 }
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Order)]
/// # pub struct OrderShipped { pub order_id: String, pub client_id: String }
/// use convoy_runtime::{Context, Handle, HandlerError, event_handler};
///
/// #[event_handler(part_of = Order, sequential_by = "client_id", handles = [OrderPlaced, OrderShipped])]
/// pub struct ClientLedger;
///
/// impl Handle<OrderPlaced> for ClientLedger {
///     async fn handle(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
///
/// impl Handle<OrderShipped> for ClientLedger {
///     async fn handle(&self, event: OrderShipped, ctx: &Context) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// # fn main() {}
/// ```
///
/// ## name
///
/// The handler's stable name: `name = "ledger-projector"` (ASCII letters,
/// digits, `-`, `_` and `.`; checked at compile time). It names the
/// consumer group, the leases and unit state in Redis, and is what
/// `Context::handler()` and the logs show. Without it the name is the
/// handler's Rust path (`module_path!()::ClientLedger`), so moving the type
/// to another module renames it. A renamed handler is a new consumer group:
/// it has no leases and no progress, and reads every partition again from
/// its oldest retained entry (see the README, "The DSL").
///
/// ```
/// # use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Order)]
/// # pub struct OrderPlaced { pub order_id: String, pub client_id: String }
/// pub struct ClientLedger;
///
/// #[event_handler(part_of = Order, sequential_by = "client_id", name = "ledger-projector")]
/// impl ClientLedger {
///     #[handle]
///     async fn placed(&self, event: OrderPlaced) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// # fn main() {}
/// ```
#[proc_macro_attribute]
pub fn event_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::expand(Kind::Event, args.into(), item.into()).into()
}

/// Declares a command handler: implements `convoy_runtime::CommandHandler`
/// for the type and records its declaration for `Domain::init` to
/// validate; it handles commands once given to
/// `Domain::builder().command_handler(..)`.
///
/// Same forms and method signatures as `#[event_handler]`, for commands
/// (`#[derive(Command)]`). Commands are dispatched synchronously to their one
/// handler and never reach the outbox.
///
/// ```
/// use convoy_runtime::{Aggregate, Command, Context, HandlerError, command_handler};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Aggregate)]
/// pub struct Order;
///
/// #[derive(Command, Serialize, Deserialize)]
/// #[command(part_of = Order)]
/// pub struct PlaceOrder { pub order_id: String, pub client_id: String }
///
/// pub struct Orders;
///
/// #[command_handler(part_of = Order)]
/// impl Orders {
///     #[handle]
///     async fn place(&self, command: PlaceOrder, ctx: &Context) -> Result<(), HandlerError> {
///         if command.order_id.is_empty() {
///             return Err("an order needs an id".into());
///         }
///         Ok(())
///     }
/// }
/// # fn main() {}
/// ```
///
/// ## part_of
///
/// Required: the aggregate (a type with `#[derive(Aggregate)]`) the handled
/// commands belong to. Every handled type must be a command.
///
/// ## sequential_by
///
/// Accepted and checked like on an event handler: the field must exist on
/// every handled command and be of a key type (compile time), and
/// `Domain::init` checks it again, with one key per category. It is inert at
/// run time: commands are dispatched synchronously and never reach the
/// outbox, so there is no stream to partition. On the inline broker it is an
/// accepted no-op as well.
///
/// ```
/// # use convoy_runtime::{Aggregate, Command, HandlerError, command_handler};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// # #[derive(Command, Serialize, Deserialize)]
/// # #[command(part_of = Order)]
/// # pub struct PlaceOrder { pub order_id: String, pub client_id: String }
/// pub struct Orders;
///
/// #[command_handler(part_of = Order, sequential_by = "client_id")]
/// impl Orders {
///     #[handle]
///     async fn place(&self, command: PlaceOrder) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// # fn main() {}
/// ```
///
/// ## handles
///
/// Only on a struct: `handles = [PlaceOrder, ..]` lists the handled
/// commands, and the struct implements `convoy_runtime::Handle<C>` for each
/// (`Handle` answers `()`: a command with a `reply` needs the `impl` form).
///
/// ## name
///
/// The handler's stable name, as for `#[event_handler]`.
#[proc_macro_attribute]
pub fn command_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::expand(Kind::Command, args.into(), item.into()).into()
}

/// Declares a process manager: implements `convoy_runtime::ProcessManager`
/// for a state struct and records its declaration for `Domain::init` to
/// validate; it runs once given to
/// `Domain::builder().process_manager::<P>()`.
///
/// A process manager follows one business process, such as an order from
/// placement to shipping, across the events of several categories. Its
/// state is a struct with `Default` and serde's `Serialize` and
/// `Deserialize`; each instance is keyed by a correlation value (the order
/// id), and the runtime loads the instance's state before each event and
/// saves it after.
///
/// The attribute goes on the state struct's inherent `impl` block. Each
/// method marked `#[handle(..)]` handles the event type it takes:
/// `async fn name(&mut self, event: E) -> Result<(), Err>` or
/// `async fn name(&mut self, event: E, ctx: &Context) -> Result<(), Err>`,
/// where `Err` converts into `convoy_runtime::HandlerError` (any error type,
/// a `String` or a `&str` does). Every handled type must be an event
/// (`#[derive(Event)]`), handled by one method; the events may belong to
/// any number of aggregates. Other items of the block are left alone.
///
/// ```
/// use convoy_runtime::{Aggregate, Context, Event, HandlerError, process_manager};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Aggregate)]
/// pub struct Order;
///
/// #[derive(Aggregate)]
/// pub struct Payment;
///
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order)]
/// pub struct OrderPlaced { pub order_id: String, pub total: u64 }
///
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Payment)]
/// pub struct PaymentCaptured { pub payment_id: String, pub order_ref: String }
///
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order)]
/// pub struct OrderShipped { pub order_id: String }
///
/// #[derive(Default, Serialize, Deserialize)]
/// pub struct Fulfilment { order_id: String, paid: bool, shipped: bool }
///
/// #[process_manager(sequential_by = true)]
/// impl Fulfilment {
///     #[handle(start, correlate = "order_id")]
///     async fn placed(&mut self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
///         self.order_id = event.order_id;
///         Ok(())
///     }
///
///     #[handle(correlate = "order_ref")]
///     async fn paid(&mut self, event: PaymentCaptured) -> Result<(), HandlerError> {
///         self.paid = true;
///         Ok(())
///     }
///
///     #[handle(end, correlate = "order_id")]
///     async fn shipped(&mut self, event: OrderShipped) -> Result<(), HandlerError> {
///         if !self.paid {
///             return Err("shipped before payment".into());
///         }
///         self.shipped = true;
///         Ok(())
///     }
/// }
/// # fn main() {}
/// ```
///
/// The process manager's name, also its consumer group, is the module path
/// of the declaration followed by the type name
/// (`my_crate::orders::Fulfilment`).
///
/// ## sequential_by
///
/// `sequential_by = true` serializes each instance: every category the
/// process manager subscribes to is partitioned by the field its `correlate`
/// names there (`order` by `order_id`, `payment` by `order_ref` above), and
/// one engine process at a time owns a correlation value across all of
/// them, so no two events of one instance are ever handled at the same
/// time. Different instances run in parallel. Events of one category arrive
/// in publish order; the order between categories is not promised.
///
/// It takes `true` or `false`, not a field name: the fields are the
/// `correlate`s. Without it (or with `false`) the categories are not
/// partitioned for the process manager, and the instance's version alone
/// guards its state against concurrent updates.
///
/// ```
/// # use convoy_runtime::{Aggregate, Event, HandlerError, ProcessManager, process_manager};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Order)]
/// # pub struct OrderPlaced { pub order_id: String, pub total: u64 }
/// #[derive(Default, Serialize, Deserialize)]
/// pub struct Revenue { total: u64 }
///
/// #[process_manager(sequential_by = false)]
/// impl Revenue {
///     #[handle(start, correlate = "order_id")]
///     async fn placed(&mut self, event: OrderPlaced) -> Result<(), HandlerError> {
///         self.total += event.total;
///         Ok(())
///     }
/// }
///
/// fn main() {
///     assert!(!Revenue::DESCRIPTOR.sequential);
/// }
/// ```
///
/// ## correlate
///
/// Required on every `#[handle]`: `correlate = "order_ref"` names the field
/// of that event that carries the correlation value. It may differ from one
/// event type to the next. The field must be a direct field of the event,
/// of a type that can be a key: strings, integers, `Option`s of them (an
/// event whose field is `None` belongs to no instance), or a type
/// implementing `convoy_runtime::PartitionKey`. Both are checked at compile
/// time, with the error on the `"order_ref"` literal. The field must be
/// visible from the module of the process manager.
///
/// ```
/// # use convoy_runtime::{Aggregate, Event, HandlerError, process_manager};
/// # use serde::{Deserialize, Serialize};
/// use convoy_runtime::{Envelope, Priority, ProcessManager};
///
/// # #[derive(Aggregate)]
/// # pub struct Payment;
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Payment)]
/// pub struct PaymentCaptured { pub payment_id: String, pub order_ref: String }
///
/// #[derive(Default, Serialize, Deserialize)]
/// pub struct Receipt { paid: bool }
///
/// #[process_manager]
/// impl Receipt {
///     #[handle(start, end, correlate = "order_ref")]
///     async fn paid(&mut self, event: PaymentCaptured) -> Result<(), HandlerError> {
///         self.paid = true;
///         Ok(())
///     }
/// }
///
/// fn main() {
///     let event = PaymentCaptured { payment_id: "p-1".into(), order_ref: "o-1".into() };
///     let envelope = Envelope::wrap(&event, None, Priority::Normal, None).unwrap();
///     assert_eq!(Receipt::correlation(&envelope).unwrap().as_deref(), Some("o-1"));
///     assert_eq!(Receipt::DESCRIPTOR.handles[0].correlate, "order_ref");
/// }
/// ```
///
/// ## start and end
///
/// `start` marks an event that creates an instance; an event for a
/// correlation value with no instance yet is skipped (with a log line)
/// unless it is a `start` event. `end` marks an event that completes the
/// instance: events for it after that are ignored. Both are optional, and
/// one event may be both (the instance lives for one event).
///
/// ```
/// # use convoy_runtime::{Aggregate, Context, Event, HandlerError, process_manager};
/// # use serde::{Deserialize, Serialize};
/// use convoy_runtime::ProcessManager;
///
/// # #[derive(Aggregate)]
/// # pub struct Order;
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Order)]
/// # pub struct OrderPlaced { pub order_id: String, pub total: u64 }
/// # #[derive(Event, Serialize, Deserialize)]
/// # #[event(part_of = Order)]
/// # pub struct OrderShipped { pub order_id: String }
/// #[derive(Event, Serialize, Deserialize)]
/// #[event(part_of = Order)]
/// pub struct OrderAmended { pub order_id: String, pub total: u64 }
///
/// #[derive(Default, Serialize, Deserialize)]
/// pub struct Tracking { total: u64 }
///
/// #[process_manager(sequential_by = true)]
/// impl Tracking {
///     #[handle(start, correlate = "order_id")]
///     async fn placed(&mut self, event: OrderPlaced) -> Result<(), HandlerError> {
///         self.total = event.total;
///         Ok(())
///     }
///
///     #[handle(correlate = "order_id")]
///     async fn amended(&mut self, event: OrderAmended) -> Result<(), HandlerError> {
///         self.total = event.total;
///         Ok(())
///     }
///
///     #[handle(end, correlate = "order_id")]
///     async fn shipped(&mut self, event: OrderShipped, ctx: &Context) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
///
/// fn main() {
///     let flags: Vec<_> = Tracking::DESCRIPTOR.handles.iter().map(|h| (h.start, h.end)).collect();
///     assert_eq!(flags, [(true, false), (false, false), (false, true)]);
/// }
/// ```
#[proc_macro_attribute]
pub fn process_manager(args: TokenStream, item: TokenStream) -> TokenStream {
    process_manager::expand(args.into(), item.into()).into()
}
