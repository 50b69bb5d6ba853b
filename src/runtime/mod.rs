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

/// The exit of a command: 0, or its error in one line on stderr and 1.
pub fn exit(program: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: error: {}", error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error as one line. Causes are added unless the message already says them (ours carry
/// their cause in their message). Who acts (docs/troubleshooting.md, "Reading an error"): the
/// kind at the line's start names the user's and the dependencies' errors; ours say so.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1).map(|c| c.to_string()) {
        if !line.contains(&cause) {
            line = format!("{line}: {cause}");
        }
    }
    let ours = e.chain().any(|c| {
        c.downcast_ref::<crate::error::Error>()
            .is_some_and(|e| e.domain() == crate::error::Domain::Internal)
    });
    if ours {
        line.push_str(
            " (ours: see docs/troubleshooting.md; if it does not say, file an issue with this \
             line and the log)",
        );
    }
    line
}

/// Prints a command's result to stdout; a closed pipe (`likes config | head`) is not an error.
pub fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}

#[cfg(test)]
mod tests {
    use crate::error::Error;

    fn line(e: Error) -> String {
        super::error_line(&anyhow::Error::new(e).context("running the job"))
    }

    /// Only our own faults send the reader to an issue; the user's and the dependencies'
    /// errors say who acts by their kind alone.
    #[test]
    fn only_our_own_faults_ask_for_an_issue() {
        let state = line(Error::Stage {
            stage: "dedupe",
            source: Box::new(Error::State("a checkpoint without its marker".into())),
        });
        assert!(
            state.starts_with("running the job: dedupe failed: local state:"),
            "{state}"
        );
        assert!(state.contains("file an issue"), "{state}");
        for theirs in [
            Error::Input("--items-from x: no such file".into()),
            Error::Unavailable("the Pushgateway answered 500".into()),
            Error::Io {
                what: "binding api.listen 127.0.0.1:8080".into(),
                source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
            },
        ] {
            let l = line(theirs);
            assert!(!l.contains("file an issue"), "{l}");
        }
    }
}
