//! The header names this crate reads and writes, as `http` types made at compile time from the
//! core's wire contract (`triage::wire`), so a lookup hashes a ready name instead of parsing a
//! string on every request.

use http::HeaderName;
use triage::wire;

pub(crate) const CRITICALITY: HeaderName = HeaderName::from_static(wire::CRITICALITY);
pub(crate) const ATTEMPT: HeaderName = HeaderName::from_static(wire::ATTEMPT);
pub(crate) const DEADLINE_MS: HeaderName = HeaderName::from_static(wire::DEADLINE_MS);
pub(crate) const REASON: HeaderName = HeaderName::from_static(wire::REASON);
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static(wire::REQUEST_ID);
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(wire::GRPC_TIMEOUT);
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static(wire::GRPC_STATUS);
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static(wire::GRPC_MESSAGE);
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static(wire::GRPC_RETRY_PUSHBACK_MS);
pub(crate) const RETRY_AFTER: HeaderName = HeaderName::from_static(wire::RETRY_AFTER);
