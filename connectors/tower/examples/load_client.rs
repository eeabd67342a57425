//! An open-loop HTTP load generator with a retry mode, for measuring the retry-reappearance
//! ratio of a service behind triage's layer (`http_service`): requests at a fixed `--rate`,
//! labelled by the mix 10/20/30/40 % in `triage-criticality`, each with its own
//! `x-request-id`, kept across its retries.
//!
//! `--retry immediate`: a naive client, resending a refused request at once (same id, same
//! tier), up to `--max-retries`. `--retry policy`: the tower retry policy of this crate
//! ([`RetryAfterPolicy`]: `Retry-After`, full jitter, a retry budget of 20 % of traffic,
//! demotion), one budget for the whole client. `--retry none`: no retries.
//!
//! ```sh
//! cargo run --release -p triage-tower --example load_client -- --rate 2400 --duration-s 20 --retry policy
//! ```
//!
//! Bounded: it stops sending after `--duration-s`, and waits at most `--drain-s` for answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use http::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use triage::{wire, Criticality};
use triage_tower::RetryAfterPolicy;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Retry {
    None,
    Immediate,
    Policy,
}

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Open-loop HTTP load with a retry mode, for the retry-reappearance ratio"
)]
struct Args {
    /// Target URL (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:8080/work")]
    url: String,
    /// First attempts per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Seconds of sending.
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Most seconds to wait for outstanding answers after sending stops.
    #[arg(long, default_value_t = 30)]
    drain_s: u64,
    /// Retry mode.
    #[arg(long, value_enum, default_value_t = Retry::Policy)]
    retry: Retry,
    /// Retries per request at most (both modes).
    #[arg(long, default_value_t = 3)]
    max_retries: u32,
    /// Percent of Critical, High, Medium, Sheddable.
    #[arg(long, default_value = "10,20,30,40")]
    mix: String,
    /// Prefix of the request ids (so runs do not share ids).
    #[arg(long, default_value = "run")]
    id_prefix: String,
}

#[derive(Default)]
struct Counts {
    first: [AtomicU64; 4],
    ok: [AtomicU64; 4],
    refused: [AtomicU64; 4],
    errors: [AtomicU64; 4],
    attempts: AtomicU64,
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Args = parse_args();
    let uri: http::Uri = args.url.parse()?;
    let host = uri.host().unwrap_or_default();
    if !(host == "127.0.0.1" || host == "localhost" || host == "[::1]") {
        return Err("only loopback targets".into());
    }
    let mix: Vec<u64> = args
        .mix
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    if mix.len() != 4 || mix.iter().sum::<u64>() == 0 {
        return Err("--mix takes four percentages".into());
    }
    let client: Client<_, String> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http();
    let counts = Arc::new(Counts::default());
    // Counts every attempt that reaches the wire, retries included.
    let counting = {
        let counts = Arc::clone(&counts);
        tower::service_fn(move |req: Request<String>| {
            counts.attempts.fetch_add(1, Ordering::Relaxed);
            let mut c = client.clone();
            async move { c.call(req).await }
        })
    };
    let with_policy = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryAfterPolicy::new(
            triage::runtime::RetryConfig {
                max_retries: args.max_retries,
            },
            triage::runtime::BackoffConfig::default(),
            Arc::new(tower::retry::budget::TpsBudget::new(
                Duration::from_secs(10),
                10,
                0.2,
            )),
        )))
        .service(counting.clone());

    let total: u64 = mix.iter().sum();
    let started = Instant::now();
    let end = started + Duration::from_secs(args.duration_s);
    let mut tasks = tokio::task::JoinSet::new();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while Instant::now() < end {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * args.rate as f64) as u64;
        while sent < due {
            let roll = fastrand::u64(0..total);
            let mut acc = 0;
            let rank = mix
                .iter()
                .position(|p| {
                    acc += p;
                    roll < acc
                })
                .unwrap_or(3);
            let tier = Criticality::ALL[rank];
            let id = format!("{}-{sent}", args.id_prefix);
            let build = {
                let uri = uri.clone();
                move || {
                    Request::get(uri.clone())
                        .header(wire::CRITICALITY, tier.as_str())
                        .header(wire::REQUEST_ID, id.clone())
                        .body(String::new())
                }
            };
            let counts = Arc::clone(&counts);
            let mode = args.retry;
            let max = args.max_retries;
            let (plain, policy) = (counting.clone(), with_policy.clone());
            counts.first[tier.rank()].fetch_add(1, Ordering::Relaxed);
            tasks.spawn(async move {
                let outcome = match mode {
                    Retry::Policy => policy.oneshot(build()?).await.map(|r| r.status()),
                    Retry::None | Retry::Immediate => {
                        let tries = if mode == Retry::None { 0 } else { max };
                        let mut status = Ok(StatusCode::OK);
                        for _ in 0..=tries {
                            status = plain.clone().oneshot(build()?).await.map(|r| r.status());
                            match status {
                                Ok(s) if s == 503 || s == 429 => continue,
                                _ => break,
                            }
                        }
                        status
                    }
                };
                let i = tier.rank();
                match outcome {
                    Ok(s) if s.is_success() => counts.ok[i].fetch_add(1, Ordering::Relaxed),
                    Ok(_) => counts.refused[i].fetch_add(1, Ordering::Relaxed),
                    Err(_) => counts.errors[i].fetch_add(1, Ordering::Relaxed),
                };
                Ok::<(), http::Error>(())
            });
            sent += 1;
        }
        while tasks.try_join_next().is_some() {}
    }
    let sending = started.elapsed().as_secs_f64();
    let _ = tokio::time::timeout(Duration::from_secs(args.drain_s), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    let attempts = counts.attempts.load(Ordering::Relaxed);
    println!(
        "sent {sent} first attempts in {sending:.1} s ({:.0}/s), {attempts} attempts on the wire ({:.2} per request), retry mode {:?}",
        sent as f64 / sending,
        attempts as f64 / sent.max(1) as f64,
        args.retry
    );
    for tier in Criticality::ALL {
        let i = tier.rank();
        let first = counts.first[i].load(Ordering::Relaxed);
        let ok = counts.ok[i].load(Ordering::Relaxed);
        println!(
            "{:<9} requests {first:>7}  served in the end {ok:>7} ({:.1}%)  refused in the end {:>7}  errors {}",
            tier.as_str(),
            100.0 * ok as f64 / first.max(1) as f64,
            counts.refused[i].load(Ordering::Relaxed),
            counts.errors[i].load(Ordering::Relaxed),
        );
    }
    Ok(())
}
