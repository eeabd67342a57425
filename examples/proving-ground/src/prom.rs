//! A real Prometheus for the scale-out run: Debian's `prometheus` binary (installed by
//! `tests/tools.sh`) started with a generated configuration, a storage directory of its own and
//! a free port, scraping the workers every second through file-based service discovery, with
//! deploy/'s rules loaded; and a small client of its HTTP query API (`/api/v1/query`,
//! `/api/v1/query_range`), blocking, over `ureq`, parsed with `serde_json`.
//!
//! Targets come and go as in a deployment: a worker's `/metrics` address is written to its
//! job's `file_sd` file when it starts and removed when it is killed or leaves, and every
//! process gets a port of its own, so each process is its own series (`instance`) and a
//! counter's last scraped value is that process's total.

// Shared by the binary (src/main.rs) and tests; each uses a part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Prometheus server started by the harness; stopped (and its storage removed) on drop.
#[derive(Debug)]
pub struct Prometheus {
    child: Option<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its configuration, targets files and storage.
    pub dir: PathBuf,
    agent: ureq::Agent,
}

/// One scrape target of a job's `file_sd` file: an address and its labels.
#[derive(Clone, Debug)]
pub struct Target {
    /// `host:port` of the worker's `/metrics`.
    pub addr: SocketAddr,
    /// Extra labels (`worker`, `process`).
    pub labels: BTreeMap<String, String>,
}

/// One series of an instant query: its labels and value.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// One series of a range query: its labels and `(unix seconds, value)` points.
#[derive(Clone, Debug)]
pub struct Series {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// Points, oldest first.
    pub points: Vec<(f64, f64)>,
}

/// A free TCP port on 127.0.0.1 (bound and released: another process could take it in
/// between, which on this machine does not happen in practice).
///
/// # Panics
///
/// When no port can be bound at all.
pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local address")
}

/// The Prometheus configuration: every job scraped each second through its `file_sd` file
/// `targets-<job>.json` in `dir`, rules evaluated each second.
pub fn config(dir: &Path, jobs: &[&str], rules: &[PathBuf]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s"
    );
    let _ = writeln!(s, "rule_files:");
    for r in rules {
        let _ = writeln!(s, "  - {}", r.display());
    }
    let _ = writeln!(s, "scrape_configs:");
    for job in jobs {
        let _ = writeln!(
            s,
            "  - job_name: {job}\n    file_sd_configs:\n      - files: [{}]\n        refresh_interval: 1s",
            targets_path(dir, job).display()
        );
    }
    s
}

fn targets_path(dir: &Path, job: &str) -> PathBuf {
    dir.join(format!("targets-{job}.json"))
}

/// A `file_sd` file's content.
pub fn targets_json(targets: &[Target]) -> String {
    let list: Vec<serde_json::Value> = targets
        .iter()
        .map(|t| {
            serde_json::json!({
                "targets": [t.addr.to_string()],
                "labels": t.labels,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

impl Prometheus {
    /// Starts `prometheus` with its files in `dir` (created), scraping `jobs` and evaluating
    /// `rules`; waits until it is ready (at most 60 s).
    ///
    /// # Errors
    ///
    /// When the binary cannot be started (not installed: `tests/tools.sh` installs it) or does
    /// not become ready.
    pub fn start(dir: &Path, jobs: &[&str], rules: &[PathBuf]) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        for job in jobs {
            write_atomic(&targets_path(&dir, job), "[]")?;
        }
        let cfg = dir.join("prometheus.yml");
        write_atomic(&cfg, &config(&dir, jobs, rules))?;
        let addr = free_addr();
        let out = std::fs::File::create(dir.join("prometheus.out")).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start prometheus (tests/tools.sh installs it): {e}"))?;
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .build();
        let p = Prometheus {
            child: Some(child),
            addr,
            dir,
            agent,
        };
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if p.agent
                .get(&format!("http://{addr}/-/ready"))
                .call()
                .is_ok()
            {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!(
            "prometheus not ready within 60 s; see {}",
            p.dir.join("prometheus.out").display()
        ))
    }

    /// Replaces `job`'s targets (Prometheus watches the file and picks the change up within
    /// about a second).
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn set_targets(&self, job: &str, targets: &[Target]) -> Result<(), String> {
        write_atomic(&targets_path(&self.dir, job), &targets_json(targets))
    }

    fn get(&self, path: &str, params: &[(&str, String)]) -> Result<serde_json::Value, String> {
        let mut req = self.agent.get(&format!("http://{}{path}", self.addr));
        for (k, v) in params {
            req = req.query(k, v);
        }
        let body = match req.call() {
            Ok(r) => r.into_string().map_err(|e| e.to_string())?,
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                return Err(format!("{path}: HTTP {code}: {text}"));
            }
            Err(e) => return Err(format!("{path}: {e}")),
        };
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(format!("{path}: {body}"));
        }
        Ok(v)
    }

    /// An instant query (at `at`, Unix seconds, or now).
    ///
    /// # Errors
    ///
    /// HTTP or query errors, with Prometheus' message.
    pub fn query(&self, q: &str, at: Option<f64>) -> Result<Vec<Sample>, String> {
        let mut params = vec![("query", q.to_owned())];
        if let Some(t) = at {
            params.push(("time", format!("{t:.3}")));
        }
        let v = self.get("/api/v1/query", &params)?;
        Ok(parse_vector(&v["data"]))
    }

    /// A range query from `start` to `end` (Unix seconds) every `step` seconds.
    ///
    /// # Errors
    ///
    /// HTTP or query errors, with Prometheus' message.
    pub fn query_range(
        &self,
        q: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, String> {
        let params = [
            ("query", q.to_owned()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", format!("{step}")),
        ];
        let v = self.get("/api/v1/query_range", &params)?;
        Ok(parse_matrix(&v["data"]))
    }

    /// Waits until `job` has `n` targets up (at most `limit`); returns whether it did.
    pub fn wait_up(&self, job: &str, n: usize, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let q = format!("sum(up{{job=\"{job}\"}})");
        while Instant::now() < until {
            if let Ok(s) = self.query(&q, None) {
                if s.first().is_some_and(|s| s.value as usize == n) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        false
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn labels(v: &serde_json::Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn point(v: &serde_json::Value) -> Option<(f64, f64)> {
    let t = v.get(0)?.as_f64()?;
    let x = v.get(1)?.as_str()?.parse().ok()?;
    Some((t, x))
}

/// The samples of an instant query's `data` (`resultType` `vector`).
pub fn parse_vector(data: &serde_json::Value) -> Vec<Sample> {
    data["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|s| {
                    Some(Sample {
                        labels: labels(&s["metric"]),
                        value: point(&s["value"])?.1,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The series of a range query's `data` (`resultType` `matrix`).
pub fn parse_matrix(data: &serde_json::Value) -> Vec<Series> {
    data["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| Series {
                    labels: labels(&s["metric"]),
                    points: s["values"]
                        .as_array()
                        .map(|p| p.iter().filter_map(point).collect())
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query_apis_vector_and_matrix() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"resultType":"vector","result":[
                {"metric":{"tier":"critical","instance":"127.0.0.1:1"},"value":[1700000000.5,"1234"]},
                {"metric":{"tier":"high"},"value":[1700000000.5,"NaN"]}]}"#,
        )
        .unwrap();
        let s = parse_vector(&v);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["tier"], "critical");
        assert_eq!(s[0].value, 1234.0);
        assert!(s[1].value.is_nan());
        let m: serde_json::Value = serde_json::from_str(
            r#"{"resultType":"matrix","result":[
                {"metric":{"alertname":"TriageSheddableShed","alertstate":"firing"},
                 "values":[[10,"1"],[11,"1"]]}]}"#,
        )
        .unwrap();
        let m = parse_matrix(&m);
        assert_eq!(m[0].labels["alertstate"], "firing");
        assert_eq!(m[0].points, vec![(10.0, 1.0), (11.0, 1.0)]);
    }

    #[test]
    fn the_configuration_scrapes_every_job_each_second_from_its_targets_file() {
        let c = config(
            Path::new("/tmp/x"),
            &["a", "b"],
            &[PathBuf::from("/r/triage.rules.yml")],
        );
        assert!(c.contains("scrape_interval: 1s"));
        assert!(c.contains("evaluation_interval: 1s"));
        assert!(c.contains("  - /r/triage.rules.yml"));
        assert!(c.contains("job_name: a"));
        assert!(c.contains("files: [/tmp/x/targets-b.json]"));
        let t = targets_json(&[Target {
            addr: "127.0.0.1:9000".parse().unwrap(),
            labels: BTreeMap::from([("worker".to_owned(), "w0".to_owned())]),
        }]);
        assert_eq!(
            t,
            r#"[{"labels":{"worker":"w0"},"targets":["127.0.0.1:9000"]}]"#
        );
    }
}
