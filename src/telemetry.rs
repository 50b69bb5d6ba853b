//! Logging setup: structured `tracing` to stderr, text for people or JSON for pipelines.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber. `RUST_LOG`, when set, wins over the configured filter.
pub fn init(log: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = match log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
