// A category cannot contain `:` (it is the first segment of stream names).
use convoy_runtime::Aggregate;

#[derive(Aggregate)]
#[aggregate(category = "order:v2")]
pub struct Order;

fn main() {}
