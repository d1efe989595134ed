// `on_poison` takes "halt" or "dead_letter".
use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "tab")]
pub struct Tab;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Tab)]
pub struct Noted {
    pub key: String,
}

pub struct Lenient;

#[event_handler(part_of = Tab, sequential_by = "key", on_poison = "skip")]
impl Lenient {
    #[handle]
    async fn noted(&self, _e: Noted) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
