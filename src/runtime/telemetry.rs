//! Logging setup: structured `tracing` to stderr, text for people or JSON for pipelines.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber. `RUST_LOG`, when set, wins over the configured filter.
pub fn init(log: &LogSettings) {
    let mut filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // rdkafka logs at ERROR when it drops a consumer that a broker fenced (a static member
    // replaced while the broker restarted): the routine end of a stage's incarnation, which
    // the stage reports itself, at warn. Its consumer module says nothing else of use
    // (unless asked for by name).
    if !filter.to_string().contains("rdkafka::consumer") {
        filter = filter.add_directive("rdkafka::consumer::base_consumer=off".parse().unwrap());
    }
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
