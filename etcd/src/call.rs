//! How every call to etcd is made: one deadline and one trace span per
//! RPC ([`with_deadline`]), attempts again with backoff under one deadline
//! for all of them ([`retry_until`]), which errors are worth another
//! attempt ([`Retry`], the policies as data), and how an answer lost on the
//! way is noticed ([`LostAnswer`]). The clients build their calls from
//! these; nothing here knows a client.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::error::EtcdError;
use super::transport::Deadlines;

type Result<T, E = EtcdError> = std::result::Result<T, E>;

/// `fut`, one RPC, within `after`: its error classified (`member_id` names
/// the member the call is about), a timeout named after `op`.
pub(super) async fn with_deadline<T>(
    op: &'static str,
    after: Duration,
    member_id: Option<u64>,
    fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    // Every etcd call goes through here: one trace span per call.
    let span = tracing::info_span!(
        "etcd",
        otel.name = op,
        otel.kind = "client",
        etcd.op = op,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty
    );
    let result = match tokio::time::timeout(after, fut)
        .instrument(span.clone())
        .await
    {
        Err(_) => Err(EtcdError::Timeout { op, after }),
        Ok(Err(e)) => Err(EtcdError::from_client(e, member_id)),
        Ok(Ok(v)) => Ok(v),
    };
    match &result {
        Ok(_) => span.record("outcome", "ok"),
        Err(e) => span
            .record("outcome", e.reason())
            .record("otel.status_code", "ERROR"),
    };
    result
}

/// Runs `attempt` until it succeeds, fails with an error `retry` rejects, or
/// `total` has passed (then the last error is returned). The backoff grows
/// by half from 100 ms up to 500 ms.
async fn retry_until<T, F, Fut>(
    total: Duration,
    retry: impl Fn(&EtcdError) -> bool,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if retry(&e) && started.elapsed() + backoff < total => {
                tracing::debug!(error = %e, ?backoff, "etcd call refused, retrying");
                tokio::time::sleep(backoff).await;
                // etcd's refusals here last a known few seconds (a member
                // started less than 5 s ago does not count as connected):
                // asking again every half second ends the wait within 0.5 s
                // of it, at the cost of a refused call.
                backoff = backoff.mul_f64(1.5).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// How a call is asked again, as data: the deadline all its attempts
/// share, and the errors (by [`EtcdError::reason`]) worth another attempt.
/// A cluster-wide call asks each attempt of the member calls go to then, so
/// "again" is of the next member once the client moved on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Retry {
    within: fn(&Deadlines) -> Duration,
    on: &'static [&'static str],
}

impl Retry {
    /// One attempt.
    pub const ONCE: Retry = Retry {
        within: |_| Duration::ZERO,
        on: &[],
    };
    /// A read: an endpoint that timed out is asked again on the next one.
    pub const READ: Retry = Retry {
        within: |d| d.request * 2,
        on: &["Unreachable", "NoLeader", "Timeout"],
    };
    /// The alarm list: asked again of the next endpoint when one is cut off.
    pub const ALARMS: Retry = Retry {
        within: |d| d.request * 2,
        on: &["Unreachable"],
    };
    /// A membership change: etcd's strict reconfiguration check (a member
    /// that started less than ~5 s ago does not count as active yet),
    /// elections, and timeouts (raft silently drops a conf change proposed
    /// while another is pending, which looks like a hang).
    pub const MEMBERSHIP: Retry = Retry {
        within: |d| d.reconfigure,
        on: &["UnhealthyCluster", "NoLeader", "Unreachable", "Timeout"],
    };
    /// A promotion: as a membership change, and a learner not in sync with
    /// the leader yet, up to the promote deadline.
    pub const PROMOTE: Retry = Retry {
        within: |d| d.promote,
        on: &[
            "LearnerNotInSync",
            "UnhealthyCluster",
            "NoLeader",
            "Unreachable",
            "Timeout",
        ],
    };
    /// A call only the leader answers: through elections and cut-off members.
    pub const LEADER: Retry = Retry {
        within: |d| d.reconfigure,
        on: &["NoLeader", "Unreachable"],
    };

    /// `attempt` until it succeeds, or as this policy says (under `deadlines`).
    pub async fn run<T, Fut>(self, deadlines: &Deadlines, attempt: impl FnMut() -> Fut) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        let retries = |e: &EtcdError| self.on.contains(&e.reason());
        retry_until((self.within)(deadlines), retries, attempt).await
    }
}

/// Whether an attempt's answer was lost on the way (it timed out, or its
/// connection broke): etcd may have done what it asked all the same.
#[derive(Default)]
pub(super) struct LostAnswer(AtomicBool);

impl LostAnswer {
    /// Notes `e`, an attempt's error. A lost answer, not only a slow one: a
    /// member being removed may cut the connection that carried its own
    /// removal after committing it.
    pub fn note(&self, e: &EtcdError) {
        if matches!(e, EtcdError::Timeout { .. } | EtcdError::Unreachable(_)) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    pub fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn retry_gives_up_at_the_deadline_with_the_last_error() {
        let mut attempts = 0;
        let started = Instant::now();
        let result: Result<()> = retry_until(
            Duration::from_millis(450),
            |e| e.is_transient(),
            || {
                attempts += 1;
                async { Err(EtcdError::UnhealthyCluster("strict reconfig".into())) }
            },
        )
        .await;
        assert_eq!(result.unwrap_err().reason(), "UnhealthyCluster");
        assert!(attempts >= 2, "retried {attempts} times");
        assert!(started.elapsed() < Duration::from_millis(900));

        let mut attempts = 0;
        let result: Result<()> = retry_until(
            Duration::from_secs(5),
            |e| e.is_transient(),
            || {
                attempts += 1;
                async { Err(EtcdError::TooManyLearners) }
            },
        )
        .await;
        assert_eq!(result.unwrap_err().reason(), "TooManyLearners");
        assert_eq!(attempts, 1, "non-retryable errors are returned at once");
    }
    #[test]
    fn every_error_a_policy_retries_is_a_reason_etcd_errors_give() {
        let reasons = [
            EtcdError::Unreachable(String::new()),
            EtcdError::Timeout {
                op: "op",
                after: Duration::ZERO,
            },
            EtcdError::NotInSync { member_id: 1 },
            EtcdError::UnhealthyCluster(String::new()),
            EtcdError::NoLeader(String::new()),
        ]
        .map(|e| e.reason());
        let policies = [
            Retry::ONCE,
            Retry::READ,
            Retry::ALARMS,
            Retry::MEMBERSHIP,
            Retry::PROMOTE,
            Retry::LEADER,
        ];
        for policy in policies {
            for label in policy.on {
                assert!(reasons.contains(label), "{label} is no reason");
            }
        }
    }
}
