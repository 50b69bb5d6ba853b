//! What every process shares, whatever it runs: how it starts (config, topology, logs), how
//! it stops, the clock, metrics and health, and supervision of stages.

pub mod clock;
pub mod health;
pub mod hold;
pub mod metrics;
pub mod shutdown;
pub mod supervise;
pub mod telemetry;

use std::path::PathBuf;

use crate::config::Settings;
use crate::error::Result;
use crate::topology::Topology;

/// The flags every binary of the project takes (`likes`, `likes-tools`).
#[derive(clap::Args, Debug, Clone)]
pub struct Boot {
    /// A TOML config file layered over the embedded defaults.
    #[arg(long, env = "LIKES_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// A topology spec to use instead of the embedded `topology/topology.toml`.
    #[arg(long, global = true)]
    pub topology: Option<PathBuf>,
}

impl Boot {
    /// Loads the settings, starts logging as they say, then loads the topology.
    pub fn load(&self) -> Result<(Settings, Topology)> {
        let settings = Settings::load(self.config.as_deref())?;
        telemetry::init(&settings.log);
        if settings.api.claim_takeover.is_some() {
            tracing::warn!(
                "api.claim_takeover is no longer used (request keys live on the edge row: \
                 nothing is ever taken over); remove it from the configuration"
            );
        }
        let path = self.topology.clone().or_else(|| settings.topology_path());
        let topology = Topology::load(path.as_deref())?;
        Ok((settings, topology))
    }

    /// The multi-threaded tokio runtime a command runs on.
    pub fn tokio() -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
}

/// The exit of a command: 0, or its error in one line on stderr and 1. Causes are added
/// unless the message already says them (ours carry their cause in their message).
pub fn exit(program: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut line = e.to_string();
            for cause in e.chain().skip(1).map(|c| c.to_string()) {
                if !line.contains(&cause) {
                    line = format!("{line}: {cause}");
                }
            }
            eprintln!("{program}: error: {line}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints a command's result to stdout; a closed pipe (`likes config | head`) is not an error.
pub fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}
