//! Every metric the layer reports, named and described in one place, through the `metrics`
//! facade (a Prometheus exporter, or none). Handles are registered once, at construction, so
//! the refuse path records without a registry lookup.

use metrics::{Counter, Histogram};
use triage::Criticality;

use crate::RefusalReason;

/// Requests by `tier` and `outcome` (`served`, or the refusal reason: `capacity`,
/// `expired`, `rate`, `circuit`). Never-shed paths are not counted here.
pub const REQUESTS: &str = "triage_http_requests_total";
/// Requests served that finished within their deadline, by `tier` (goodput).
pub const GOODPUT: &str = "triage_http_goodput_total";
/// Requests that got the default tier because nothing classified them, or a trusted header
/// named an unknown tier.
pub const UNCLASSIFIED: &str = "triage_http_unclassified_total";
/// Requests whose `triage-deadline-ms` or `grpc-timeout` header did not parse: served under
/// the tier's window, and counted here so a misbehaving client shows.
pub const MALFORMED_DEADLINE: &str = "triage_http_malformed_deadline_total";
/// Requests on a never-shed path (health, readiness, metrics), served without a slot.
pub const NEVER_SHED: &str = "triage_http_never_shed_total";
/// From the layer's entry to the inner service's response, served requests, by `tier`, in
/// seconds.
pub const SERVED_SECONDS: &str = "triage_http_served_seconds";
/// From the layer's entry to the refusal, by `tier`, in seconds (immediate refusals and
/// those answered after waiting: evicted, expired).
pub const REFUSED_SECONDS: &str = "triage_http_refused_seconds";
/// Shed requests whose id the reappearance tracker remembered, by `tier`.
pub const SHED_TRACKED: &str = "triage_http_shed_tracked_total";
/// Of those, the ones that came back within the window, by `tier` of the shed request.
pub const REAPPEARED: &str = "triage_http_reappeared_total";
/// `reappeared / shed` over the last window (about one to one and a quarter windows), by
/// `tier`; across instances prefer `rate(reappeared) / rate(shed)`.
pub const REAPPEARANCE_RATIO: &str = "triage_http_reappearance_ratio";

pub(crate) fn describe() {
    metrics::describe_counter!(
        MALFORMED_DEADLINE,
        "Requests whose triage-deadline-ms or grpc-timeout header did not parse (served under the tier's window)."
    );
    metrics::describe_counter!(
        REQUESTS,
        "HTTP/gRPC requests admitted or refused by triage, by tier and outcome."
    );
    metrics::describe_counter!(
        GOODPUT,
        "HTTP/gRPC requests served within their deadline, by tier."
    );
    metrics::describe_counter!(
        UNCLASSIFIED,
        "HTTP/gRPC requests given the default tier because nothing classified them."
    );
    metrics::describe_counter!(
        NEVER_SHED,
        "HTTP/gRPC requests on a never-shed path (health, readiness, metrics)."
    );
    metrics::describe_histogram!(
        SERVED_SECONDS,
        metrics::Unit::Seconds,
        "Time from the triage layer's entry to the response of a served request, by tier."
    );
    metrics::describe_histogram!(
        REFUSED_SECONDS,
        metrics::Unit::Seconds,
        "Time from the triage layer's entry to a refusal, by tier."
    );
    metrics::describe_counter!(
        SHED_TRACKED,
        "Shed requests whose id the reappearance tracker remembered, by tier."
    );
    metrics::describe_counter!(
        REAPPEARED,
        "Shed requests that came back (same id) within the reappearance window, by tier."
    );
    metrics::describe_gauge!(REAPPEARANCE_RATIO, "Share of shed requests that came back within the reappearance window, over the last window, by tier.");
}

/// `[f(tier); 4]` indexed by rank.
pub(crate) fn per_rank<T>(mut f: impl FnMut(Criticality) -> T) -> [T; 4] {
    std::array::from_fn(|rank| f(Criticality::from_rank(rank).unwrap_or(Criticality::Sheddable)))
}

/// The layer's handles, one set per tier.
pub(crate) struct Handles {
    pub(crate) served: [Counter; 4],
    pub(crate) refused: [[Counter; 4]; 4],
    pub(crate) goodput: [Counter; 4],
    pub(crate) served_seconds: [Histogram; 4],
    pub(crate) refused_seconds: [Histogram; 4],
    pub(crate) unclassified: Counter,
    pub(crate) malformed_deadline: Counter,
    pub(crate) never_shed: Counter,
}

impl Handles {
    pub(crate) fn register() -> Self {
        describe();
        Handles {
            served: per_rank(
                |t| metrics::counter!(REQUESTS, "tier" => t.as_str(), "outcome" => "served"),
            ),
            refused: per_rank(|t| {
                let by_reason = |r: RefusalReason| metrics::counter!(REQUESTS, "tier" => t.as_str(), "outcome" => r.as_str());
                // Indexed by `RefusalReason::index`.
                [
                    by_reason(RefusalReason::Capacity),
                    by_reason(RefusalReason::Expired),
                    by_reason(RefusalReason::Rate),
                    by_reason(RefusalReason::Circuit),
                ]
            }),
            goodput: per_rank(|t| metrics::counter!(GOODPUT, "tier" => t.as_str())),
            served_seconds: per_rank(|t| metrics::histogram!(SERVED_SECONDS, "tier" => t.as_str())),
            refused_seconds: per_rank(
                |t| metrics::histogram!(REFUSED_SECONDS, "tier" => t.as_str()),
            ),
            unclassified: metrics::counter!(UNCLASSIFIED),
            malformed_deadline: metrics::counter!(MALFORMED_DEADLINE),
            never_shed: metrics::counter!(NEVER_SHED),
        }
    }
}
