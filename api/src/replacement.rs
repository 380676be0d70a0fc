//! Replacing a failed member, bounded (`status.replacements`): a member
//! whose replacement did not cure it is not replaced again without new
//! evidence. Each replacement of a member (its removal from etcd as
//! failed, after which its volume is deleted and it joins again empty) is
//! counted per member name; the next one waits a back-off that doubles with
//! each, and after [`MAX_REPLACEMENTS`] the cluster holds instead. The
//! count starts afresh once a replaced member has been healthy for
//! [`HEALTHY_RESETS`] failure graces: a failure after that is a new one.
//! Cluster API's control plane bounds its remediation the same way
//! (`maxRetry`, `retryPeriod`, `minHealthyPeriod`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Replacements of one member without a healthy period in between before
/// the cluster holds.
pub const MAX_REPLACEMENTS: u32 = 3;

/// Failure graces a replaced member must stay healthy for its count to
/// start afresh.
pub const HEALTHY_RESETS: u32 = 10;

/// The replacements of one member.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementStatus {
    /// The member (pod) name.
    #[schemars(length(max = 253))]
    pub member: String,
    /// Replacements since it was last healthy for a while.
    pub count: i32,
    /// When the last one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time: Option<Time>,
    /// How the member's etcd container last ended before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub last_exit: Option<String>,
}

/// Whether a failed member may be replaced now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replacement {
    /// Yes; it is replacement number `nth` of this run of failures.
    Allowed { nth: u32 },
    /// Not before `not_before`: the back-off since the last one.
    BackOff { made: u32, not_before: Timestamp },
    /// No: `made` replacements did not cure it.
    Exhausted { made: u32 },
}

/// The precision of a recorded `lastTime`: a Kubernetes `Time` is written
/// in whole seconds (RFC 3339 without a fraction), so the time read back
/// may be up to this much before the replacement it records.
pub const RECORDED_IN: Duration = Duration::from_secs(1);

/// The back-off after `made` replacements: 2^made failure graces.
pub fn back_off(made: u32, grace: Duration) -> Duration {
    grace.saturating_mul(1 << made.min(16))
}

/// Whether the member may be replaced at `now`, from its record and since
/// when it has been unhealthy this time (`unhealthy_since`).
pub fn judge(
    record: Option<&ReplacementStatus>,
    unhealthy_since: Option<Timestamp>,
    grace: Duration,
    now: Timestamp,
) -> Replacement {
    let Some((made, last)) = counted(record, unhealthy_since, grace) else {
        return Replacement::Allowed { nth: 1 };
    };
    if made >= MAX_REPLACEMENTS {
        return Replacement::Exhausted { made };
    }
    // `lastTime` is written in whole seconds (a Kubernetes `Time`): the
    // replacement was made up to a second after it, so the back-off counts
    // from the end of that second and is never cut short.
    let wait = k8s_openapi::jiff::SignedDuration::try_from(
        back_off(made, grace).saturating_add(RECORDED_IN),
    )
    .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    match last.checked_add(wait) {
        Ok(not_before) if not_before > now => Replacement::BackOff { made, not_before },
        _ => Replacement::Allowed { nth: made + 1 },
    }
}

/// The replacements that count (none once the member was healthy for
/// [`HEALTHY_RESETS`] graces after the last), with the last one's time.
fn counted(
    record: Option<&ReplacementStatus>,
    unhealthy_since: Option<Timestamp>,
    grace: Duration,
) -> Option<(u32, Timestamp)> {
    let record = record?;
    let last = record.last_time.as_ref()?.0;
    let healthy_for = unhealthy_since
        .and_then(|since| Duration::try_from(since.duration_since(last)).ok())
        .unwrap_or_default();
    (healthy_for < grace.saturating_mul(HEALTHY_RESETS))
        .then_some((record.count.max(0) as u32, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    const GRACE: Duration = Duration::from_secs(120);

    fn at(secs: i64) -> Timestamp {
        Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1_000_000 + secs)
    }

    fn made(count: i32, last: i64) -> ReplacementStatus {
        ReplacementStatus {
            member: "c-etcd-1".into(),
            count,
            last_time: Some(Time(at(last))),
            last_exit: Some("exited with code 2 (Error)".into()),
        }
    }

    #[test]
    fn a_first_failure_is_replaced_at_once() {
        assert_eq!(
            judge(None, Some(at(0)), GRACE, at(120)),
            Replacement::Allowed { nth: 1 }
        );
    }

    #[test]
    fn each_further_replacement_waits_twice_as_long_and_the_fourth_is_never_made() {
        // Replaced at 0, failing again at once: the second waits 2 graces.
        let one = made(1, 0);
        assert_eq!(
            judge(Some(&one), Some(at(10)), GRACE, at(130)),
            Replacement::BackOff {
                made: 1,
                not_before: at(241)
            }
        );
        assert_eq!(
            judge(Some(&one), Some(at(10)), GRACE, at(240)),
            Replacement::BackOff {
                made: 1,
                not_before: at(241)
            }
        );
        assert_eq!(
            judge(Some(&one), Some(at(10)), GRACE, at(241)),
            Replacement::Allowed { nth: 2 }
        );
        let two = made(2, 240);
        assert_eq!(
            judge(Some(&two), Some(at(250)), GRACE, at(240 + 480)),
            Replacement::BackOff {
                made: 2,
                not_before: at(240 + 481)
            }
        );
        let three = made(3, 720);
        assert_eq!(
            judge(Some(&three), Some(at(730)), GRACE, at(100_000)),
            Replacement::Exhausted { made: 3 }
        );
    }

    /// A replacement made at 0.9 s is recorded at 0 s: the next one still
    /// waits its whole back-off after the real one.
    #[test]
    fn a_back_off_is_never_cut_short_by_the_recorded_whole_second() {
        let one = made(1, 0);
        let real = at(0) + SignedDuration::from_millis(900);
        let just_before_its_end =
            real + SignedDuration::from_secs(240) - SignedDuration::from_millis(1);
        assert!(matches!(
            judge(Some(&one), Some(at(10)), GRACE, just_before_its_end),
            Replacement::BackOff { made: 1, .. }
        ));
        let status = serde_json::to_value(made(1, 0)).expect("serializes");
        assert_eq!(status["lastTime"], "1970-01-12T13:46:40Z", "whole seconds");
    }

    #[test]
    fn a_member_healthy_for_ten_graces_after_its_replacement_counts_afresh() {
        let three = made(3, 0);
        let failed_again = at(10 * 120);
        assert_eq!(
            judge(Some(&three), Some(failed_again), GRACE, at(10 * 120 + 120)),
            Replacement::Allowed { nth: 1 }
        );
        // Failing again a little sooner counts on.
        let soon = at(10 * 120 - 1);
        assert_eq!(
            judge(Some(&three), Some(soon), GRACE, at(5000)),
            Replacement::Exhausted { made: 3 }
        );
        assert_eq!(
            judge(Some(&made(1, 0)), Some(soon), GRACE, at(5000)),
            Replacement::Allowed { nth: 2 }
        );
    }
}
