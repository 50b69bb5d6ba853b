//! The one home of a job's gauges (docs/operations.md, "Alerts: what to do"): a CronJob run
//! of `drift`, `reconcile --dead-letters` or `compare` leaves them for Prometheus, as a
//! textfile for node_exporter's collector or on a Pushgateway. One renderer, so every job's
//! gauges have the same exposition; one writer and one pusher, so the flags mean the same.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// One gauge of a run: `(name, help, value)`.
pub type Gauge = (&'static str, &'static str, i64);

/// The Prometheus text exposition (format 0.0.4) of `gauges`.
pub fn render(gauges: &[Gauge]) -> String {
    let mut s = String::new();
    for (name, help, v) in gauges {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    s
}

/// Where a job's gauges go: the flags `--metrics-file` and `--push`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Outputs {
    /// Write the gauges here (Prometheus text format, for a textfile collector).
    #[arg(long)]
    pub metrics_file: Option<PathBuf>,
    /// PUT the gauges to this Prometheus Pushgateway (http://host:port).
    #[arg(long, value_parser = gateway_arg)]
    pub push: Option<String>,
}

impl Outputs {
    /// Leaves `gauges` where the flags say, the Pushgateway's under `job`.
    pub async fn publish(&self, job: &str, gauges: &[Gauge]) -> Result<()> {
        let text = render(gauges);
        if let Some(path) = &self.metrics_file {
            write_file(path, &text)?;
        }
        if let Some(gateway) = &self.push {
            push(gateway, job, text).await?;
        }
        Ok(())
    }
}

/// Writes the gauges where a textfile collector reads them (atomically: write, then rename,
/// so the collector never reads half a file).
pub fn write_file(path: &std::path::Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(Error::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(Error::io(format!("renaming to {}", path.display())))
}

/// The `--push` flag's check, so a wrong gateway is refused before the job's work.
pub(crate) fn gateway_arg(gateway: &str) -> std::result::Result<String, String> {
    gateway_base(gateway)
        .map(|_| gateway.to_string())
        .map_err(|e| e.to_string())
}

/// The gateway without its trailing `/`. Plain HTTP only: the product's HTTP client carries
/// no trust roots (it talks TLS only to its peer regions, with their configured CA), so an
/// https:// gateway would fail every push at its certificate.
fn gateway_base(gateway: &str) -> Result<&str> {
    let base = gateway.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err(Error::Input(format!(
            "--push {gateway:?}: give the Pushgateway as http://host:port (plain HTTP: an \
             in-cluster gateway; or --metrics-file for a textfile collector)"
        )));
    }
    Ok(base)
}

/// PUTs the gauges to a Prometheus Pushgateway (`http://host:port`) as `job`: a PUT replaces
/// the job's whole group, so a gauge a run no longer sets does not linger.
pub async fn push(gateway: &str, job: &str, text: String) -> Result<()> {
    let base = gateway_base(gateway)?;
    let url = format!("{base}/metrics/job/{job}");
    let answer = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| Error::Unavailable(format!("an HTTP client for the Pushgateway: {e}")))?
        .put(&url)
        .header("Content-Type", "text/plain; version=0.0.4")
        .body(text)
        .send()
        .await
        .map_err(|e| Error::Unavailable(format!("pushing the gauges to {url}: {e}")))?;
    if !answer.status().is_success() {
        return Err(Error::Unavailable(format!(
            "the Pushgateway at {url} answered {}",
            answer.status()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_gauge_has_its_help_and_type_lines() {
        let text = super::render(&[("likes_x", "an x", 3), ("likes_y", "a y", -1)]);
        assert_eq!(
            text,
            "# HELP likes_x an x\n# TYPE likes_x gauge\nlikes_x 3\n\
             # HELP likes_y a y\n# TYPE likes_y gauge\nlikes_y -1\n"
        );
    }

    #[tokio::test]
    async fn a_gateway_without_a_scheme_or_over_https_is_bad_input() {
        for gateway in ["pushgateway:9091", "https://pushgateway:9091"] {
            let e = super::push(gateway, "likes_drift", String::new())
                .await
                .unwrap_err();
            assert!(matches!(e, crate::error::Error::Input(_)), "{e}");
            assert!(e.to_string().contains("http://host:port"), "{e}");
        }
    }

    /// The PUT a Pushgateway gets: the job's path, the exposition as the body; a refusal is
    /// an error that names the answer.
    #[tokio::test]
    async fn the_gauges_are_put_under_the_jobs_path() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gateway = tokio::spawn(async move {
            let mut seen = Vec::new();
            for status in ["200 OK", "400 Bad Request"] {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let mut got = String::new();
                while !got.contains("likes_x 3\n") {
                    let n = conn.read(&mut buf).await.unwrap();
                    got.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                conn.write_all(answer.as_bytes()).await.unwrap();
                seen.push(got);
            }
            seen
        });
        let text = super::render(&[("likes_x", "an x", 3)]);
        let url = format!("http://{addr}/");
        super::push(&url, "likes_drift", text.clone())
            .await
            .unwrap();
        let refused = super::push(&url, "likes_drift", text).await.unwrap_err();
        assert!(refused.to_string().contains("400"), "{refused}");
        let seen = gateway.await.unwrap();
        assert!(
            seen[0].starts_with("PUT /metrics/job/likes_drift HTTP/1.1"),
            "{}",
            seen[0]
        );
        assert!(seen[0].contains("# TYPE likes_x gauge"), "{}", seen[0]);
    }
}
