//! The engine: publishes the outbox and runs every event handler on the
//! domain's broker until told to stop.
//!
//! # Lifecycle
//!
//! 1. [`Engine::run_until`] starts the outbox processor and the broker's
//!    consumers (one per handler).
//! 2. When the signal fires, consumers stop taking new events, finish the
//!    ones in flight, acknowledge them and release their leases.
//! 3. Events raised by those last handlers are published, then the outbox
//!    processor stops.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::{ConsumerPlan, InlineBroker, Subscription};
use crate::domain::Domain;
use crate::error::Error;
use crate::outbox::OutboxProcessor;

impl Domain {
    /// The engine that publishes the outbox and runs the event handlers.
    pub fn engine(&self) -> Engine {
        Engine::new(self.clone())
    }
}

/// Runs a domain: outbox processor plus consumers.
#[derive(Debug)]
pub struct Engine {
    domain: Domain,
    shutdown_timeout: Duration,
}

impl Engine {
    pub(crate) fn new(domain: Domain) -> Self {
        Engine {
            domain,
            shutdown_timeout: Duration::from_secs(30),
        }
    }

    /// How long a graceful shutdown may take before in-flight work is
    /// abandoned (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    fn processor(&self) -> OutboxProcessor {
        let outbox = self.domain.outbox_handle();
        OutboxProcessor::new(
            outbox.store().clone(),
            self.domain.broker().clone(),
            self.domain.config().server.priority_lanes.clone(),
            self.domain.instance_id(),
            outbox.wake().clone(),
        )
    }

    /// What the broker consumes: the domain's handlers and process
    /// managers as subscriptions, with the parts a consumer needs.
    fn plan(&self) -> ConsumerPlan {
        let d = &self.domain;
        let registry = d.registry().clone();
        let mut subscriptions: Vec<Subscription> = d
            .event_handlers()
            .iter()
            .map(|(descriptor, handler)| {
                Subscription::for_handler(descriptor, handler.clone(), &registry)
            })
            .collect();
        for (descriptor, dispatch) in d.process_managers() {
            subscriptions.extend(Subscription::for_process_manager(
                descriptor, dispatch, &registry,
            ));
        }
        ConsumerPlan::new(
            subscriptions,
            registry,
            d.config().clone(),
            d.instance_id().to_owned(),
            d.key_policy().clone(),
            d.outbox_handle().clone(),
        )
    }

    /// Runs until `signal` completes, then shuts down gracefully.
    pub async fn run_until<F>(self, signal: F) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let token = CancellationToken::new();
        let handle = self.spawn_with(token.clone());
        signal.await;
        handle.shutdown().await
    }

    /// Starts the engine in the background.
    pub fn spawn(self) -> EngineHandle {
        self.spawn_with(CancellationToken::new())
    }

    fn spawn_with(self, token: CancellationToken) -> EngineHandle {
        let processor = Arc::new(self.processor());
        let outbox_token = CancellationToken::new();
        let relay = self.domain.outbox().relay(processor, outbox_token.clone());
        let outbox_task = tokio::spawn(relay);
        let plan = Arc::new(self.plan());
        let broker = self.domain.broker().clone();
        let consumer_task = tokio::spawn(broker.run(plan, token.clone()));
        EngineHandle {
            token,
            outbox_token,
            outbox_task,
            consumer_task,
            timeout: self.shutdown_timeout,
        }
    }

    /// Inline broker only: publishes and handles until nothing is left to
    /// do (events raised by handlers included).
    pub async fn run_until_idle(&self) -> Result<(), Error> {
        let broker: &dyn Any = &**self.domain.broker();
        let inline = broker
            .downcast_ref::<InlineBroker>()
            .ok_or_else(|| Error::Unsupported {
                operation: "Engine::run_until_idle",
                broker: self.domain.broker().name().to_owned(),
                hint: "it needs the inline broker; use run_until with other brokers",
            })?;
        let processor = self.processor();
        let plan = self.plan();
        loop {
            processor.drain().await?;
            if inline.drain(&plan).await == 0 {
                return Ok(());
            }
        }
    }
}

/// A running engine.
#[derive(Debug)]
pub struct EngineHandle {
    token: CancellationToken,
    outbox_token: CancellationToken,
    outbox_task: tokio::task::JoinHandle<()>,
    consumer_task: tokio::task::JoinHandle<Result<(), Error>>,
    timeout: Duration,
}

impl EngineHandle {
    /// A token that stops the engine when cancelled.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops gracefully: consumers finish and acknowledge the events in
    /// flight and release their leases, then pending outbox records are
    /// published.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.token.cancel();
        let consumers = tokio::time::timeout(self.timeout, self.consumer_task).await;
        // The relay publishes what is pending once more before it returns
        // (the events the last handlers raised).
        self.outbox_token.cancel();
        let _ = self.outbox_task.await;
        match consumers {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(Error::TaskFailed {
                task: "consumer task",
                reason: join.to_string(),
            }),
            Err(_) => {
                tracing::warn!(
                    "graceful shutdown timed out; in-flight events stay pending and are reclaimed by the next owner"
                );
                Ok(())
            }
        }
    }
}
