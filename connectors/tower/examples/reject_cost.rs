//! The CPU cost of the layer's refuse path, in nanoseconds per request, on one thread and in
//! process (no network): the seeds' `r`, the cost of a rejection against a success.
//!
//! ```sh
//! cargo run --release -p triage-tower --example reject_cost
//! ```
//!
//! The figure is this thread's CPU time (`/proc/thread-self/schedstat`), not the wall time,
//! so that other work on a shared machine does not count. Each case calls the service `--iterations` times with a fresh request and polls the answer once (it is ready at once), and prints the mean. Building the request
//! (a `GET` with one header) is timed alone and subtracted. No metrics recorder is installed,
//! so metric updates cost an atomic check each; with a Prometheus recorder add its cost.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use clap::Parser;
use http::{Request, Response};
use tower::{Layer, Service};
use triage::admission::QueueAgeConfig;
use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
use triage::queue::WfqConfig;
use triage::{wire, Criticality};
use triage_tower::{Classifier, GateRefusal, TriageConfig, TriageLayer};

#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Calls per case.
    #[arg(long, default_value_t = 500_000)]
    iterations: u32,
}

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("not answered at once"),
    }
}

fn request(path: &str, id: Option<&str>) -> Request<String> {
    let mut b = Request::get(path).header(wire::CRITICALITY, "sheddable");
    if let Some(id) = id {
        b = b.header(wire::REQUEST_ID, id);
    }
    b.body(String::new()).expect("valid request")
}

/// This thread's CPU time so far, in ns (`/proc/thread-self/schedstat`, Linux), or `None`.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Mean CPU time per call in ns (wall time where the CPU time cannot be read): on a machine
/// shared with other work the wall time counts the time others ran too.
fn per_call(iterations: u32, mut f: impl FnMut(u32)) -> f64 {
    for i in 0..iterations / 10 {
        f(i);
    }
    let (cpu, wall) = (cpu_ns(), Instant::now());
    for i in 0..iterations {
        f(i);
    }
    let spent = match (cpu, cpu_ns()) {
        (Some(a), Some(b)) => (b - a) as f64,
        _ => wall.elapsed().as_nanos() as f64,
    };
    spent / f64::from(iterations)
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Args = parse_args();
    let n = args.iterations;
    let limit = ConcurrencyLimit::new(Fixed::new(1)?.into(), TierShares::default());
    let mut config = TriageConfig::default();
    config.queue = WfqConfig {
        capacity: std::num::NonZeroUsize::MIN,
        ..WfqConfig::default()
    };
    config.queue.admission = QueueAgeConfig::disabled();
    let layer = TriageLayer::builder(config, limit.clone())
        .classifier(Classifier::new().trust_header_when(|_| true))
        .gate(|_t: Criticality, head: &http::request::Parts| {
            if head.uri.path() == "/limited" {
                return Err(GateRefusal::rate(None));
            }
            Ok(())
        })
        .build()?;
    let mut svc = layer.layer(tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));

    let build = per_call(n, |_| {
        black_box(request("/work", None));
    });
    let served = per_call(n, |_| {
        let res = ready(svc.call(request("/work", None))).expect("infallible");
        assert_eq!(res.status(), 200);
        black_box(res);
    });

    // Fill the one slot and the one place in the queue with Critical work: a Sheddable
    // request then finds the queue full with nothing lower to evict.
    let _held = limit
        .try_acquire(Criticality::Critical)
        .expect("a free slot");
    let admission = layer.admission().clone();
    let waiter = tokio::spawn(async move { admission.admit(Criticality::Critical, None).await });
    while layer.admission().waiting().critical == 0 {
        tokio::task::yield_now().await;
    }
    let capacity = per_call(n, |_| {
        let res = ready(svc.call(request("/work", None))).expect("infallible");
        assert_eq!(res.status(), 503);
        black_box(res);
    });
    let rate = per_call(n, |_| {
        let res = ready(svc.call(request("/limited", None))).expect("infallible");
        assert_eq!(res.status(), 429);
        black_box(res);
    });
    // 10,000 ids in turn: each call finds its id shed before (a reappearance) and sheds it again.
    let ids: Vec<String> = (0..10_000).map(|i| format!("id-{i}")).collect();
    let tracked = per_call(n, |i| {
        let res = ready(svc.call(request("/work", Some(&ids[i as usize % ids.len()]))))
            .expect("infallible");
        assert_eq!(res.status(), 503);
        black_box(res);
    });
    waiter.abort();

    println!("CPU ns per request, one thread, in process ({n} calls each; building the request, {build:.0} ns, subtracted):");
    println!(
        "  served at once (slot free, inner service answers at once): {:>6.0}",
        served - build
    );
    println!(
        "  refused, capacity (503: queue full, nothing lower to evict): {:>6.0}",
        capacity - build
    );
    println!(
        "  refused, rate (429 by a gate, before the queue):            {:>6.0}",
        rate - build
    );
    println!(
        "  refused, capacity, an x-request-id seen again, re-tracked:{:>6.0}",
        tracked - build
    );
    Ok(())
}
