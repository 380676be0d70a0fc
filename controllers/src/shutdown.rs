//! The process-wide shutdown request: set once by the first SIGTERM or
//! SIGINT (or a lost Lease), observed by every wait of the process and by
//! every reconcile, so a reconcile that has not acted yet ends at once
//! rather than holding the process's exit behind a slow read.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// The process-wide shutdown request: set once, observed by every wait.
#[derive(Clone)]
pub struct Shutdown {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            tx: Arc::new(watch::channel(false).0),
        }
    }
}

impl Shutdown {
    pub fn request(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_requested(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once shutdown is requested (at once if it already was).
    pub fn wait(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            // The sender lives as long as any `Shutdown`; an error means it is
            // gone, which can only happen when the process is ending anyway.
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Runs `fut` unless shutdown comes first (`None`).
    pub async fn race<F: Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            out = fut => Some(out),
            () = self.wait() => None,
        }
    }
}

/// Runs one controller loop (`run`, a kube-runtime `Controller` set to
/// stop on `stop`) until it ends. Once `stop` resolves, a loop whose cache
/// (`store`) was filled is drained: its in-flight reconciles finish. One
/// whose cache never filled has nothing in flight (its runner waits for the
/// first list, which a stopped watcher never delivers, and would wait for
/// it until the shutdown grace ran out): it ends at once.
pub async fn drain_if_started<K>(
    run: impl Future<Output = ()>,
    store: kube::runtime::reflector::Store<K>,
    stop: impl Future<Output = ()>,
) where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    use futures::FutureExt;
    tokio::pin!(run);
    tokio::select! {
        () = &mut run => return,
        () = stop => {}
    }
    // Polled once: a filled cache answers at once; an unfilled one would
    // take over the waker its applier waits on, which no longer matters,
    // as the loop is dropped.
    if store.wait_until_ready().now_or_never().is_some() {
        run.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;

    #[tokio::test]
    async fn a_loop_whose_cache_never_filled_ends_at_once_on_shutdown() {
        let (reader, _writer) = store::<k8s_openapi::api::core::v1::ConfigMap>();
        let shutdown = Shutdown::default();
        let never = futures::future::pending::<()>();
        let stopping = shutdown.clone();
        let ending = tokio::spawn(drain_if_started(never, reader, stopping.wait()));
        shutdown.request();
        tokio::time::timeout(std::time::Duration::from_secs(2), ending)
            .await
            .expect("ended at once")
            .expect("no panic");
    }

    #[tokio::test]
    async fn a_started_loop_is_drained_on_shutdown() {
        use kube::runtime::watcher::Event;
        let (reader, mut writer) = store::<k8s_openapi::api::core::v1::ConfigMap>();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let shutdown = Shutdown::default();
        let drained = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let in_flight = {
            let drained = drained.clone();
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                drained.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        };
        let ending = tokio::spawn(drain_if_started(in_flight, reader, shutdown.wait()));
        shutdown.request();
        ending.await.expect("no panic");
        assert!(drained.load(std::sync::atomic::Ordering::SeqCst), "drained");
    }
}
