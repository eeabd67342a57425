//! The endpoint's thread.

use crate::sync::{AtomicBool, Ordering};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::layers::FanoutBuilder;

use crate::runtime::metrics::histogram_buckets;

/// How often recorded histogram samples are folded into their buckets when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The running endpoint. Dropping it stops the thread (the recorder stays installed).
pub struct MetricsServer {
    addr: SocketAddr,
    handle: PrometheusHandle,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// The address it listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current metrics in Prometheus text format, as `/metrics` serves them.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The endpoint could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// Another global `metrics` recorder is already installed, or the exporter refused its
    /// configuration.
    Recorder(BuildError),
    /// The address could not be bound.
    Bind(String),
    /// [`serve_alongside`]: another global `metrics` recorder is already installed.
    AlreadyInstalled,
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Recorder(e) => write!(f, "cannot install the prometheus recorder: {e}"),
            ServeError::Bind(e) => write!(f, "cannot bind the metrics endpoint: {e}"),
            ServeError::AlreadyInstalled => {
                write!(f, "another global metrics recorder is already installed")
            }
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Recorder(e) => Some(e),
            ServeError::Bind(_) | ServeError::AlreadyInstalled => None,
        }
    }
}

/// Installs the Prometheus recorder globally and serves `/metrics` and `/healthz` on `addr`
/// from a dedicated thread. Call it before building the [`Runtime`](crate::runtime::Runtime),
/// whose metric handles are registered with the recorder installed at that moment.
///
/// # Errors
///
/// [`ServeError::Recorder`] if a global recorder is already installed; [`ServeError::Bind`]
/// if `addr` cannot be bound.
///
/// # Examples
///
/// ```no_run
/// let server = triage::observe::serve("127.0.0.1:9898".parse()?)?;
/// println!("scrape http://{}/metrics", server.local_addr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn serve(addr: SocketAddr) -> Result<MetricsServer, ServeError> {
    let http = bind(addr)?;
    let handle = builder()?
        .install_recorder()
        .map_err(ServeError::Recorder)?;
    start(http, handle)
}

/// Like [`serve`], and every metric also goes to `also`: both recorders see every
/// registration and every update (a `metrics-util` fan-out). For a process that keeps its
/// own in-process recorder (a stats file, a test's counters) and is scraped as well.
///
/// # Errors
///
/// [`ServeError::AlreadyInstalled`] if a global recorder is already installed;
/// [`ServeError::Recorder`] if the exporter refuses its configuration; [`ServeError::Bind`]
/// if `addr` cannot be bound.
///
/// # Examples
///
/// ```no_run
/// // `Mine` is a recorder of one's own (hidden here: every method a no-op).
/// # struct Mine;
/// # impl metrics::Recorder for Mine {
/// #     fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
/// #     fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
/// #     fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
/// #     fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter { metrics::Counter::noop() }
/// #     fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge { metrics::Gauge::noop() }
/// #     fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram { metrics::Histogram::noop() }
/// # }
/// let server = triage::observe::serve_alongside("127.0.0.1:9898".parse()?, Mine)?;
/// println!("scrape http://{}/metrics", server.local_addr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn serve_alongside<R>(addr: SocketAddr, also: R) -> Result<MetricsServer, ServeError>
where
    R: metrics::Recorder + Sync + Send + 'static,
{
    let http = bind(addr)?;
    let recorder = builder()?.build_recorder();
    let handle = recorder.handle();
    let fanout = FanoutBuilder::default()
        .add_recorder(recorder)
        .add_recorder(also)
        .build();
    metrics::set_global_recorder(fanout).map_err(|_| ServeError::AlreadyInstalled)?;
    start(http, handle)
}

fn bind(addr: SocketAddr) -> Result<tiny_http::Server, ServeError> {
    tiny_http::Server::http(addr).map_err(|e| ServeError::Bind(e.to_string()))
}

/// The exporter, with buckets per histogram (chosen for its unit, beside its name in
/// `runtime::metrics`): served as Prometheus histograms, so quantiles aggregate across workers.
fn builder() -> Result<PrometheusBuilder, ServeError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in histogram_buckets() {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .map_err(ServeError::Recorder)?;
    }
    Ok(builder)
}

fn start(http: tiny_http::Server, handle: PrometheusHandle) -> Result<MetricsServer, ServeError> {
    let local = http
        .server_addr()
        .to_ip()
        .ok_or_else(|| ServeError::Bind("not an IP listener".into()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let handle = handle.clone();
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("triage-metrics".into())
            .spawn(move || run(http, handle, stop))
            .map_err(|e| ServeError::Bind(e.to_string()))?
    };
    Ok(MetricsServer {
        addr: local,
        handle,
        stop,
        thread: Some(thread),
    })
}

fn run(http: tiny_http::Server, handle: PrometheusHandle, stop: Arc<AtomicBool>) {
    let mut last_upkeep = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if last_upkeep.elapsed() >= UPKEEP_EVERY {
            handle.run_upkeep();
            last_upkeep = std::time::Instant::now();
        }
        let request = match http.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(_) => continue,
        };
        let (status, body, content_type) = match (request.method(), request.url()) {
            (tiny_http::Method::Get, "/metrics") => {
                (200, handle.render(), "text/plain; version=0.0.4")
            }
            (tiny_http::Method::Get, "/healthz") => (200, "ok\n".to_owned(), "text/plain"),
            _ => (404, "not found\n".to_owned(), "text/plain"),
        };
        let mut response = tiny_http::Response::from_string(body).with_status_code(status);
        if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes())
        {
            response = response.with_header(h);
        }
        // A client that hung up is its own problem; the endpoint keeps serving.
        let _ = request.respond(response);
    }
}
