// Several handlers on one category, partitioned by the same key, in one file.
use convoy_runtime::registry::registered_handlers;
use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
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

pub struct ClientLedger;
pub struct Notifier;
pub struct Statistics;

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }

    #[handle]
    async fn shipped(&self, event: OrderShipped, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl Notifier {
    #[handle]
    async fn shipped(&self, event: OrderShipped, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

#[event_handler(part_of = Order)]
impl Statistics {
    #[handle]
    async fn placed(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

fn main() {
    let handlers = registered_handlers();
    let summary: Vec<(&str, &str, Option<&str>, Vec<&str>)> = handlers
        .iter()
        .map(|h| {
            let name = h.name.rsplit("::").next().unwrap();
            let handles = h.handles.iter().map(|m| m.type_name).collect();
            (name, h.category, h.sequential_by, handles)
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("ClientLedger", "order", Some("client_id"), vec!["OrderPlaced", "OrderShipped"]),
            ("Notifier", "order", Some("client_id"), vec!["OrderShipped"]),
            ("Statistics", "order", None, vec!["OrderPlaced"]),
        ]
    );
}
