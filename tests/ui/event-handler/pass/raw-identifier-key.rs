// A key field whose name is a keyword (`r#type`) is named `"type"`.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, Message, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "device")]
pub struct DeviceAggregate;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = DeviceAggregate)]
pub struct Reading {
    pub r#type: String,
    pub value: i64,
}

pub struct Sensors;

#[event_handler(part_of = DeviceAggregate, sequential_by = "type")]
impl Sensors {
    #[handle]
    async fn reading(&self, event: Reading, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

fn main() {
    let reading = Reading { r#type: "thermo".into(), value: 3 };
    assert_eq!(Reading::DESCRIPTOR.fields, ["type", "value"]);
    assert_eq!(reading.partition_key("type"), Some(Some("thermo".to_owned())));
}
