// What the derives record about a type.
use convoy_runtime::__private::MessageKind;
use convoy_runtime::registry::registered_messages;
use convoy_runtime::{Aggregate, Command, Event, Message};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct OrderLine;

#[derive(Aggregate)]
#[aggregate(category = "orders")]
pub enum Order {}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = OrderLine)]
pub struct LineAdded {
    pub line_id: u32,
    pub sku: String,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = crate::Order, name = "OrderPlaced")]
pub struct OrderPlacedV2 {
    pub order_id: String,
}

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order)]
pub struct PlaceOrder {}

fn main() {
    assert_eq!(<OrderLine as Aggregate>::CATEGORY, "order_line");
    assert_eq!(<Order as Aggregate>::CATEGORY, "orders");

    let d = LineAdded::DESCRIPTOR;
    assert_eq!(d.type_name, "LineAdded");
    assert_eq!(d.kind, MessageKind::Event);
    assert_eq!(d.category, "order_line");
    assert_eq!(d.fields, ["line_id", "sku"]);
    assert!(d.rust_path.ends_with("::LineAdded"), "{}", d.rust_path);

    let d = OrderPlacedV2::DESCRIPTOR;
    assert_eq!(d.type_name, "OrderPlaced");
    assert!(d.rust_path.ends_with("::OrderPlacedV2"), "{}", d.rust_path);
    assert_eq!(d.category, "orders");

    let d = PlaceOrder::DESCRIPTOR;
    assert_eq!((d.kind, d.category, d.fields.len()), (MessageKind::Command, "orders", 0));
    assert_eq!(PlaceOrder {}.partition_key("anything"), None);

    let names: Vec<&str> = registered_messages().iter().map(|m| m.type_name).collect();
    assert_eq!(names, ["LineAdded", "OrderPlaced", "PlaceOrder"]);
}
