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
