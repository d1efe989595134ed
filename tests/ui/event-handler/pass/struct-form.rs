// The struct form: `handles = [..]` plus one `Handle<T>` impl per type.
use std::sync::Arc;

use convoy_runtime::envelope::Priority;
use convoy_runtime::key::KeyPolicy;
use convoy_runtime::{Aggregate, Context, Envelope, Event, EventHandler, Handle, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderShipped {
    pub order_id: String,
    pub client_id: String,
}

#[event_handler(part_of = Order, sequential_by = "client_id", handles = [OrderPlaced, OrderShipped])]
pub struct ClientLedger;

impl Handle<OrderPlaced> for ClientLedger {
    async fn handle(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
        assert_eq!(ctx.partition_key(), Some(event.client_id.as_str()));
        Ok(())
    }
}

impl Handle<OrderShipped> for ClientLedger {
    async fn handle(&self, event: OrderShipped, _ctx: &Context) -> Result<(), HandlerError> {
        Err(format!("{} was not placed", event.order_id).into())
    }
}

fn main() {
    let handler = ClientLedger;
    let d = handler.descriptor();
    assert!(d.name.ends_with("::ClientLedger"), "{}", d.name);
    assert_eq!(d.sequential_by, Some("client_id"));
    assert!(d.handles_type("OrderPlaced") && d.handles_type("OrderShipped"));

    let placed = OrderPlaced { order_id: "o-1".into(), client_id: "c-1".into() };
    let envelope = Envelope::wrap(&placed, Some("c-1".into()), Priority::Normal, None).unwrap();
    let ctx = Context::new(d.name, &envelope, 1, Arc::new(KeyPolicy::default()));
    futures::executor::block_on(handler.dispatch(&envelope, &ctx)).unwrap();

    let shipped = OrderShipped { order_id: "o-2".into(), client_id: "c-1".into() };
    let envelope = Envelope::wrap(&shipped, Some("c-1".into()), Priority::Normal, None).unwrap();
    let ctx = Context::new(d.name, &envelope, 1, Arc::new(KeyPolicy::default()));
    let error = futures::executor::block_on(handler.dispatch(&envelope, &ctx)).unwrap_err();
    assert_eq!(error.to_string(), "o-2 was not placed");
}
