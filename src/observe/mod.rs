//! Serving the metrics: a Prometheus scrape endpoint and a liveness endpoint on their own
//! listener and thread (feature `prometheus`).
//!
//! The runtime records through the [`metrics`] facade (see the table in the `runtime::metrics`
//! docs); this module installs `metrics-exporter-prometheus` as the global recorder and serves
//!
//! - `GET /metrics`: the Prometheus text format;
//! - `GET /healthz`: `200 ok` while the process runs.
//!
//! Both are served by a dedicated OS thread with its own listener (`tiny_http`), outside the
//! tokio runtime and outside any shedding: an overloaded worker still answers its probes and
//! its scrapes, so the operator sees the overload instead of a missing target.

mod server;

pub use server::{serve, serve_alongside, MetricsServer, ServeError};
