//! Requests that held the store up (see [`SlowRequest`]).

use std::time::Duration;

/// Says on stderr when a request waited for the store or held it long (the
/// store serves one request at a time): a test whose clients time out
/// (Lease renewals with a 2 s deadline) shows which requests held them up.
pub(super) struct SlowRequest {
    what: String,
    asked: std::time::Instant,
    locked: std::time::Instant,
}

impl SlowRequest {
    const SLOW: Duration = Duration::from_millis(250);

    pub(super) fn new(parts: &http::request::Parts, asked: std::time::Instant) -> Self {
        SlowRequest {
            what: format!("{} {}", parts.method, parts.uri.path()),
            asked,
            locked: std::time::Instant::now(),
        }
    }
}

impl Drop for SlowRequest {
    fn drop(&mut self) {
        let (waited, held) = (self.locked - self.asked, self.locked.elapsed());
        if waited > Self::SLOW || held > Self::SLOW {
            eprintln!(
                "[{} test API server] {} waited {:?} for the store and held it {:?}",
                k8s_openapi::jiff::Timestamp::now(),
                self.what,
                waited,
                held
            );
        }
    }
}
