//! The engine's own runtime (`[server] engine_threads`): where a domain's
//! engines run their consumers, beside the application's runtime.

use std::future::Future;
use std::sync::Arc;

use convoy_core::error::Error;

/// The engine's runtime of a domain, kept for the next engine of the same
/// domain: an application that starts its engine again (after a failed
/// start, say) reuses it rather than adding threads each time.
#[derive(Default)]
pub(crate) struct EngineRuntimeSlot(std::sync::Mutex<Option<EngineRuntime>>);

/// A running engine runtime: where to spawn, its size, and whether its
/// keeper shut it down (with the caller's runtime it was started from).
struct EngineRuntime {
    handle: tokio::runtime::Handle,
    threads: usize,
    closed: Arc<std::sync::atomic::AtomicBool>,
}

impl EngineRuntimeSlot {
    /// Starts the consumers: on a runtime of their own with `threads` worker
    /// threads (`[server] engine_threads`), or on the caller's runtime with 0
    /// (or when the engine's runtime cannot start).
    ///
    /// The engine's runtime lives as long as the caller's: it is shut down
    /// when the caller's runtime shuts down, dropping what it still runs, as
    /// the caller's runtime would have done with the consumers' tasks. It
    /// outlives the consumers, idle, so that what a handler started there
    /// (the reader task of a client it connected, a task it spawned) keeps
    /// running after the engine stopped, as it would have on the caller's
    /// runtime; the domain's next engine runs there again. Its threads log to
    /// a scoped subscriber in force where it was started (`set_default`), else
    /// to the global one.
    pub(crate) fn spawn(
        &self,
        threads: usize,
        consumers: impl Future<Output = Result<(), Error>> + Send + 'static,
    ) -> tokio::task::JoinHandle<Result<(), Error>> {
        if threads == 0 {
            return tokio::spawn(consumers);
        }
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = slot.as_ref()
            && r.threads == threads
            && !r.closed.load(std::sync::atomic::Ordering::SeqCst)
        {
            return r.handle.spawn(consumers);
        }
        match engine_runtime(threads) {
            Ok((runtime, end)) => {
                // Dropped with the caller's runtime, never before.
                let watch = Watch(end);
                tokio::spawn(async move {
                    let _watch = watch;
                    std::future::pending::<()>().await
                });
                let task = runtime.handle.spawn(consumers);
                *slot = Some(runtime);
                task
            }
            Err(e) => {
                tracing::warn!(error = %e, threads, "cannot start the engine's runtime; the consumers run on the application's");
                tokio::spawn(consumers)
            }
        }
    }
}

/// Tells the engine runtime's keeper to shut it down, when dropped.
struct Watch(std::sync::mpsc::Sender<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A runtime of `threads` worker threads named `convoy-engine`, owned by a
/// keeper thread that shuts it down on the first word (or the hang-up) of
/// the sender returned with it. Built on the keeper's thread: a runtime is
/// never dropped on the caller's, which may be a runtime's (where dropping
/// one panics).
fn engine_runtime(threads: usize) -> std::io::Result<(EngineRuntime, std::sync::mpsc::Sender<()>)> {
    // A scoped subscriber (`set_default`) is the caller thread's alone: the
    // engine's threads take it over. The global one (or none) they see by
    // themselves, including one installed later; setting it as their
    // default would only slow every thread's dispatch down.
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    let scoped = !format!("{dispatch:?}").starts_with("Dispatch::Global");
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (end, ended) = std::sync::mpsc::channel::<()>();
    let (started, handle) = std::sync::mpsc::channel();
    let shut = closed.clone();
    std::thread::Builder::new()
        .name("convoy-engine-keeper".to_owned())
        .spawn(move || {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads).thread_name("convoy-engine");
            if scoped {
                builder.on_thread_start(move || {
                    // For the thread's whole life.
                    std::mem::forget(tracing::dispatcher::set_default(&dispatch));
                });
            }
            match builder.enable_all().build() {
                Ok(runtime) => {
                    if started.send(Ok(runtime.handle().clone())).is_ok() {
                        let _ = ended.recv();
                    }
                    shut.store(true, std::sync::atomic::Ordering::SeqCst);
                    runtime.shutdown_background();
                }
                Err(e) => {
                    let _ = started.send(Err(e));
                }
            }
        })?;
    let handle = handle
        .recv()
        .map_err(|_| std::io::Error::other("the engine runtime's keeper thread ended at once"))??;
    Ok((
        EngineRuntime {
            handle,
            threads,
            closed,
        },
        end,
    ))
}
