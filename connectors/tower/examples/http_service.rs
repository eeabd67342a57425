//! An axum service behind triage's layer, sharing one capacity with a background worker
//! runtime: `--capacity` slots in all, a handler of fixed `--service-ms`, and background work
//! (Sheddable) published at `--background-rate` into the runtime.
//!
//! ```sh
//! cargo run --release -p triage-tower --example http_service -- --service-ms 10 --capacity 8
//! curl -i -H 'triage-criticality: critical' http://127.0.0.1:8080/work
//! curl -i http://127.0.0.1:8080/healthz        # and /readyz, /metrics: never shed
//! for i in $(seq 20); do curl -s -o /dev/null -w '%{http_code} ' \
//!     http://127.0.0.1:8080/recommendations; done  # 200s, then mostly 429s: the rate gate
//! ```
//!
//! Classification: the `triage-criticality` header is honoured from loopback peers only (the
//! trust predicate: an internal caller), else `/checkout` is Critical, `/search` High,
//! `/recommendations` Sheddable, and anything else Medium (counted as unclassified).
//!
//! Never shed: `/healthz` and `/readyz` (the probes) and `/metrics` (Prometheus' text format,
//! the layer's and the background runtime's metrics). A rate gate (the core's token buckets)
//! lets `--sheddable-rate` Sheddable requests a second through (burst: one second's worth)
//! and answers the rest `429` with a `Retry-After`.
//!
//! Every second it prints one line: per tier `served/refused` in that second, slots in use,
//! requests waiting, background messages completed. At exit (`--duration-s` or Ctrl-C) it
//! prints per tier the requests served, within deadline, refused by reason, the p50/p99 time
//! from entry to answer of served and of refused requests (measured in the process, around
//! the layer), the retry-reappearance ratio, and the background runtime's ledger.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clap::Parser;
use parking_lot::Mutex;
use triage::admission::{BorrowChain, BucketConfig, BucketsConfig, QueueAgeConfig};
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, MemoryBroker, Runtime, RuntimeConfig};
use triage::{wire, Criticality, PerTier};
use triage_tower::{Classifier, RateGate, Refusal, RefusalReason, TriageConfig, TriageLayer};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "An axum service admitting through triage, sharing capacity with a background runtime"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Fixed service time of the handler (and of a background job), in milliseconds.
    #[arg(long, default_value_t = 10)]
    service_ms: u64,
    /// Concurrency slots shared by HTTP requests and background jobs (the runtime's workers
    /// and its fixed limit). Capacity is about capacity x 1000 / service_ms requests/s.
    #[arg(long, default_value_t = 8, value_parser = at_least_one)]
    capacity: usize,
    /// Entry queue bound, in requests.
    #[arg(long, default_value_t = 1024, value_parser = at_least_one)]
    queue: usize,
    /// Background (Sheddable) messages published into the runtime per second; 0 for none.
    #[arg(long, default_value_t = 0)]
    background_rate: u64,
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    duration_s: u64,
    /// Disable queue-age admission (requests then wait until their deadline or eviction).
    #[arg(long)]
    no_queue_age: bool,
    /// Sheddable requests admitted per second by the rate gate (burst: one second's worth);
    /// beyond it they are answered 429 with a Retry-After. 0: no rate gate.
    #[arg(long, default_value_t = 2.0, value_parser = rate)]
    sheddable_rate: f64,
    /// Also serve `/metrics` and `/healthz` on this address, a listener of their own outside
    /// the service (the service's own `/metrics` route is never shed either).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// No live line.
    #[arg(long)]
    quiet: bool,
}

/// The flags; `--help` and `--version` print and exit, and a wrong flag is one line that
/// points at `--help` (not the whole help, which would scroll the error away).
fn parse_args<A: Parser>() -> A {
    A::try_parse().unwrap_or_else(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                eprintln!("{}; see --help", first.trim_end_matches('.'));
                std::process::exit(2);
            }
        }
    })
}

/// A count flag that must be at least 1 (`--capacity`, `--queue`).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("must be a whole number from 1 to {}", usize::MAX)),
    }
}

/// A rate flag (`--sheddable-rate`): a finite number of requests per second, 0 or more.
fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err("must be a finite number of requests per second, 0 or more".into()),
    }
}

/// Time from entry to answer, microseconds, per tier (as served, after demotion) and outcome:
/// served, or refused by reason (in `RefusalReason::ALL` order, read from `triage-reason`).
#[derive(Default)]
struct Timings {
    served: PerTier<Vec<u32>>,
    refused: PerTier<[Vec<u32>; 4]>,
}

/// The `p` quantile of `v` in milliseconds, formatted with `decimals`; `-` when `v` is empty.
fn percentile(v: &mut [u32], p: f64, decimals: usize) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    format!("{:.decimals$}", f64::from(v[i]) / 1_000.0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Args = parse_args();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();
    let service = Duration::from_millis(args.service_ms);
    // The Prometheus recorder, installed before the runtime and the layer register their
    // metrics; its listener is `--metrics` or a port of the system's choosing, and the
    // service's own `/metrics` route renders the same registry.
    let metrics = triage::observe::serve(
        args.metrics
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
    )?;
    if args.metrics.is_some() {
        println!(
            "metrics: http://{}/metrics (liveness: /healthz)",
            metrics.local_addr()
        );
    }
    let metrics = Arc::new(metrics);

    // The background runtime: its workers and the HTTP requests take slots from one limit.
    let rt_config = RuntimeConfig {
        workers: args.capacity.try_into()?,
        ..RuntimeConfig::default()
    };
    let mut runtime = Runtime::builder(rt_config).start(move |_job: Job<u64>| async move {
        tokio::time::sleep(service).await;
        Ok::<(), HandlerError>(())
    })?;
    let broker = MemoryBroker::new();
    runtime.attach(broker.source());
    if args.background_rate > 0 {
        let broker = broker.clone();
        let every = Duration::from_secs_f64(1.0 / args.background_rate as f64);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            for i in 0u64.. {
                tick.tick().await;
                broker.publish(i, Criticality::Sheddable, None);
            }
        });
    }

    let mut config = TriageConfig::default();
    config.queue = WfqConfig {
        capacity: args
            .queue
            .try_into()
            .map_err(|_| "--queue must be at least 1")?,
        ..WfqConfig::default()
    };
    if args.no_queue_age {
        config.queue.admission = QueueAgeConfig::disabled();
    }
    let classifier = Classifier::new()
        .trust_header_when(|head| {
            head.extensions
                .get::<ConnectInfo<SocketAddr>>()
                .is_some_and(|c| c.0.ip().is_loopback())
        })
        .route("/checkout", Criticality::Critical)
        .route("/search", Criticality::High)
        .route("/recommendations", Criticality::Sheddable);
    let mut layer =
        TriageLayer::builder(config, runtime.concurrency_limit()).classifier(classifier);
    if args.sheddable_rate > 0.0 {
        // The core's token buckets as a gate, before the queue: Sheddable alone is
        // rate-limited, and borrows from nobody.
        let buckets = BucketsConfig {
            sheddable: Some(BucketConfig {
                rate: Some(args.sheddable_rate),
                ..BucketConfig::default()
            }),
            borrow: BorrowChain::none(),
            ..BucketsConfig::default()
        };
        layer = layer.gate(RateGate::new(&buckets)?);
    }
    let layer = layer.build()?;

    let timings = Arc::new(Mutex::new(Timings::default()));
    let handler = move |req: Request| async move {
        tokio::time::sleep(service).await;
        // The layer put the request's tier in its extensions: echo it for load generators.
        let tier = req
            .extensions()
            .get::<Criticality>()
            .copied()
            .unwrap_or(Criticality::Medium);
        ([(wire::CRITICALITY, tier.as_str())], "done\n").into_response()
    };
    let app = Router::new()
        .route("/work", get(handler))
        .route("/checkout", get(handler))
        .route("/search", get(handler))
        .route("/recommendations", get(handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ready\n" }))
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    (
                        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        metrics.render(),
                    )
                }
            }),
        )
        .layer(layer.clone())
        .layer(middleware::from_fn({
            let timings = Arc::clone(&timings);
            move |req: Request, next: Next| {
                let timings = Arc::clone(&timings);
                async move { timed(timings, req, next).await }
            }
        }));
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    println!(
        "listening on {} (capacity {} slots, {} ms service: about {:.0} req/s)",
        args.addr,
        args.capacity,
        args.service_ms,
        args.capacity as f64 * 1_000.0 / args.service_ms.max(1) as f64
    );
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    let started = Instant::now();
    let mut last = layer.stats();
    let mut last_bg = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let now = layer.stats();
        let bg = runtime.stats().ledger.total().completed;
        if !args.quiet {
            let mut line = format!("{:>4}s", started.elapsed().as_secs());
            for tier in Criticality::ALL {
                let served = now.served[tier] - last.served[tier];
                let refused: u64 = (0..4)
                    .map(|i| now.refused[tier][i] - last.refused[tier][i])
                    .sum();
                line += &format!(" {}={served}/{refused}", &tier.as_str()[..4]);
            }
            let w = layer.admission().waiting();
            line += &format!(
                " slots={} waiting={} bg={}",
                layer.admission().limit().in_flight(),
                w.critical + w.high + w.medium + w.sheddable,
                bg - last_bg
            );
            println!("{line}");
        }
        last = now;
        last_bg = bg;
        if args.duration_s > 0 && started.elapsed() >= Duration::from_secs(args.duration_s) {
            break;
        }
    }
    server.abort();
    let elapsed = started.elapsed().as_secs_f64();
    let stats = layer.stats();
    let mut t = std::mem::take(&mut *timings.lock());
    println!("\nafter {elapsed:.1} s, per tier (served within deadline / served / refused by reason; time from entry to answer, ms):");
    for tier in Criticality::ALL {
        let refused: Vec<String> = RefusalReason::ALL
            .iter()
            .map(|r| format!("{} {}", r.as_str(), stats.refused(tier, *r)))
            .collect();
        let total: u64 = stats.served[tier] + stats.refused[tier].iter().sum::<u64>();
        let ok = if total > 0 {
            format!("{:.2}%", 100.0 * stats.goodput[tier] as f64 / total as f64)
        } else {
            "-".into()
        };
        println!(
            "{:<9} {:>7} requests, {:>7} within deadline ({ok}), served {:>7}, refused: {}",
            tier.as_str(),
            total,
            stats.goodput[tier],
            stats.served[tier],
            refused.join(", ")
        );
        let mut line = format!(
            "          ms from entry to answer: served p50 {} p99 {} (n {})",
            percentile(&mut t.served[tier], 0.5, 2),
            percentile(&mut t.served[tier], 0.99, 2),
            t.served[tier].len(),
        );
        for (i, reason) in RefusalReason::ALL.iter().enumerate() {
            let v = &mut t.refused[tier][i];
            if !v.is_empty() {
                line += &format!(
                    "; refused {} p50 {} p99 {} (n {})",
                    reason.as_str(),
                    percentile(v, 0.5, 3),
                    percentile(v, 0.99, 3),
                    v.len()
                );
            }
        }
        println!("{line}");
    }
    println!(
        "unclassified {}, malformed deadline header {}, never shed {}",
        stats.unclassified, stats.malformed_deadline, stats.never_shed
    );
    let r = layer.reappearance().stats();
    println!("retry reappearance (shed ids seen again within the window), per tier:");
    for tier in Criticality::ALL {
        println!(
            "{:<9} shed {:>7} reappeared {:>7} ratio {}",
            tier.as_str(),
            r.shed[tier],
            r.reappeared[tier],
            r.ratio(tier).map_or("-".into(), |x| format!("{x:.3}"))
        );
    }
    println!(
        "all tiers: ratio {} (untracked {})",
        r.total_ratio().map_or("-".into(), |x| format!("{x:.3}")),
        r.untracked
    );
    broker.close();
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    let total = report.stats.ledger.total();
    println!(
        "background runtime: consumed {}, completed {}, shed {}, expired {}; ledger balances: {}",
        total.consumed,
        total.completed,
        total.shed,
        total.expired,
        if report.stats.balances() { "yes" } else { "NO" }
    );
    Ok(())
}

/// Times a request from entry to answer, by the tier it was admitted at (after demotion, so
/// a retry counts where it was queued): a served answer carries it in `triage-criticality`
/// (the handler echoes it), a refusal in its JSON body. Answers with neither (the never-shed
/// routes, 404s) are not timed.
async fn timed(timings: Arc<Mutex<Timings>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let response = next.run(req).await;
    let micros = u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX);
    let reason = response
        .headers()
        .get(wire::REASON)
        .and_then(|v| RefusalReason::from_name(v.to_str().ok()?));
    let Some(reason) = reason else {
        let tier = response
            .headers()
            .get(wire::CRITICALITY)
            .and_then(|v| wire::parse_criticality(v.as_bytes()).ok());
        if let Some(tier) = tier {
            timings.lock().served[tier].push(micros);
        }
        return response;
    };
    // A refusal's body is one short line of JSON: read it for the tier and put it back.
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    if let Some(refusal) = Refusal::parse_body(&bytes) {
        if let Some(i) = RefusalReason::ALL.iter().position(|x| *x == reason) {
            timings.lock().refused[refusal.tier][i].push(micros);
        }
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(flags: &[&str]) -> String {
        let argv = std::iter::once("http_service").chain(flags.iter().copied());
        match Args::try_parse_from(argv) {
            Ok(args) => panic!("{flags:?} accepted: {args:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn out_of_range_flags_are_one_error_naming_the_flag_and_range() {
        let e = refused(&["--queue", "0"]);
        assert!(e.contains("--queue") && e.contains("from 1 to"), "{e}");
        let e = refused(&["--capacity", "0"]);
        assert!(e.contains("--capacity") && e.contains("from 1 to"), "{e}");
        for bad in ["NaN", "inf", "-1.5", "fast"] {
            let e = refused(&[&format!("--sheddable-rate={bad}")]);
            assert!(
                e.contains("--sheddable-rate") && e.contains("0 or more"),
                "{e}"
            );
        }
        let ok = Args::try_parse_from(["http_service", "--sheddable-rate", "0", "--queue", "1"]);
        assert!(ok.is_ok_and(|a| a.sheddable_rate == 0.0 && a.queue == 1));
    }

    #[test]
    fn a_tier_with_no_requests_prints_a_dash() {
        assert_eq!(percentile(&mut [], 0.99, 2), "-");
        assert_eq!(percentile(&mut [1_500, 2_500], 0.5, 2), "1.50");
    }
}
