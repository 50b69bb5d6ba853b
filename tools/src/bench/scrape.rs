//! Figures read from the stages themselves: their Prometheus /metrics (counters and histogram
//! buckets, quantiles between two scrapes) and /proc (CPU time, peak RSS).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

/// GET /metrics from a stage.
pub(crate) fn scrape(port: u16) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return out;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some((k, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                out.insert(k.to_string(), v);
            }
        }
    }
    out
}

/// Cumulative bucket counts of histogram `name`, by upper bound.
pub(crate) fn buckets(metrics: &HashMap<String, f64>, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut v: Vec<(f64, f64)> = metrics
        .iter()
        .filter_map(|(k, &c)| {
            let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, c))
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// A quantile from cumulative buckets (linear within the bucket).
pub(crate) fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total == 0.0 {
        return f64::NAN;
    }
    let target = q * total;
    let (mut prev_le, mut prev_c) = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= target {
            if le.is_infinite() {
                return prev_le;
            }
            let frac = if c > prev_c {
                (target - prev_c) / (c - prev_c)
            } else {
                0.0
            };
            return prev_le + frac * (le - prev_le);
        }
        (prev_le, prev_c) = (le, c);
    }
    prev_le
}

pub(crate) fn diff(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|&(le, c)| {
            let b = before
                .iter()
                .find(|x| x.0 == le)
                .map(|x| x.1)
                .unwrap_or(0.0);
            (le, c - b)
        })
        .collect()
}

/// CPU seconds (user + system) a process has used so far; NaN when it is gone.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the parenthesised command name; utime and stime are 14th and 15th.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            // USER_HZ is 100 on every Linux this runs on.
            Some(ticks / 100.0)
        })
        .unwrap_or(f64::NAN)
}

pub(crate) fn peak_rss_mb(pid: u32) -> f64 {
    status_mb(pid, "VmHWM:")
}

/// A memory line of /proc/<pid>/status (`VmHWM:` peak, `VmRSS:` now), in MB.
pub(crate) fn status_mb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_from_buckets() {
        let b = vec![
            (0.1, 50.0),
            (0.5, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ];
        assert!((quantile(&b, 0.5) - 0.1).abs() < 1e-9);
        assert!((quantile(&b, 0.99) - 0.95).abs() < 1e-9);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
