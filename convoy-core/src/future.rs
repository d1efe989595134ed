//! The boxed future of every object-safe async method (handlers, stores,
//! brokers).

use std::future::Future;
use std::pin::Pin;

/// A boxed future, as returned by generated dispatch code and by the
/// methods of [`OutboxStore`](crate::outbox::OutboxStore),
/// [`StateStore`](crate::process_manager::StateStore) and
/// [`Broker`](crate::broker::Broker).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
