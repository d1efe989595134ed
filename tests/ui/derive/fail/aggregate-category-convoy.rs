// The category `convoy` would make its partitions (`convoy:{key}`) convoy's
// own keys, such as the `convoy:audit` stream.
use convoy_runtime::Aggregate;

#[derive(Aggregate)]
#[aggregate(category = "convoy")]
pub struct Audit;

fn main() {}
