//! The faults of a chaos run, drawn from its seed, and the processes they hit, restarted the
//! way Kubernetes restarts a container (on exit, after a backoff that doubles).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::super::demo::{spawn, Proc};
use crate::error::{Error, Result};

/// One fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// kill -9 of a `likes` process (api with its relay, dedupe, count).
    Kill { process: &'static str },
    /// kill -9 of dedupe and the loss of its local state (a new disk).
    WipeDedupeState,
    /// kill -9 of the Kafka broker, started again after `down_s`.
    Broker { down_s: u64 },
    /// kill -9 of Cassandra, started again after `down_s`.
    Cassandra { down_s: u64 },
}

/// A fault and when it strikes, seconds into the load.
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    pub at_s: f64,
    #[serde(flatten)]
    pub fault: Fault,
}

/// The schedule of a seed: one broker and one Cassandra kill always, then `extra` more of any
/// kind, at times spread over the middle of the load (10%..80%), in time order.
pub fn schedule(seed: u64, seconds: f64, extra: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = vec![
        Fault::Broker {
            down_s: rng.random_range(5..=25),
        },
        Fault::Cassandra {
            down_s: rng.random_range(3..=12),
        },
    ];
    for _ in 0..extra {
        faults.push(match rng.random_range(0..8) {
            0 | 1 => Fault::Kill { process: "dedupe" },
            2 | 3 => Fault::Kill { process: "count" },
            4 => Fault::Kill { process: "api" },
            5 => Fault::WipeDedupeState,
            6 => Fault::Broker {
                down_s: rng.random_range(5..=25),
            },
            _ => Fault::Cassandra {
                down_s: rng.random_range(3..=12),
            },
        });
    }
    let mut planned: Vec<Planned> = faults
        .into_iter()
        .map(|fault| Planned {
            at_s: (seconds * rng.random_range(0.1..0.8) * 10.0).round() / 10.0,
            fault,
        })
        .collect();
    planned.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    planned
}

/// A `likes` process under supervision.
struct Supervised {
    name: &'static str,
    proc: Option<Proc>,
    started: Instant,
    /// When a stopped process starts again.
    restart_at: Option<Instant>,
    backoff: Duration,
    /// Starts after the first.
    restarts: u32,
    /// Exits nobody asked for (the process died on its own).
    exits: Vec<String>,
}

/// The run's `likes` processes, restarted on exit with Kubernetes' policy in small: 1 s
/// doubling to 10 s, reset after 30 s up.
pub struct Fleet {
    dir: PathBuf,
    env: Vec<(String, String)>,
    procs: Vec<Supervised>,
}

impl Fleet {
    pub fn start(dir: &Path, env: Vec<(String, String)>) -> Result<Self> {
        let mut procs = Vec::new();
        for name in ["api", "dedupe", "count"] {
            procs.push(Supervised {
                name,
                proc: Some(spawn(name, dir, &env)?),
                started: Instant::now(),
                restart_at: None,
                backoff: Duration::from_secs(1),
                restarts: 0,
                exits: Vec::new(),
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            env,
            procs,
        })
    }

    /// Notices exits and restarts what is due.
    pub fn tick(&mut self) -> Result<()> {
        let now = Instant::now();
        for s in &mut self.procs {
            if let Some(p) = &mut s.proc {
                if let Ok(Some(status)) = p.child.try_wait() {
                    tracing::warn!(process = s.name, %status, "exited on its own; restarting after a backoff");
                    s.exits.push(status.to_string());
                    s.proc = None;
                    schedule_restart(s, now);
                }
            }
            if s.proc.is_none() && s.restart_at.is_some_and(|t| now >= t) {
                s.proc = Some(spawn(s.name, &self.dir, &self.env)?);
                s.started = now;
                s.restart_at = None;
                s.restarts += 1;
            }
        }
        Ok(())
    }

    /// kill -9 of `name`; the supervisor starts it again after its backoff.
    pub fn kill9(&mut self, name: &str) {
        let now = Instant::now();
        if let Some(s) = self.procs.iter_mut().find(|s| s.name == name) {
            if let Some(mut p) = s.proc.take() {
                let _ = p.child.kill();
                let _ = p.child.wait();
                schedule_restart(s, now);
            }
        }
    }

    /// (process, restarts, exits on its own) for the report.
    pub fn tally(&self) -> Vec<(&'static str, u32, Vec<String>)> {
        self.procs
            .iter()
            .map(|s| (s.name, s.restarts, s.exits.clone()))
            .collect()
    }

    /// SIGTERM to every process, and a wait for its exit (SIGKILL after 30 s).
    pub fn stop(&mut self) {
        for s in &mut self.procs {
            if let Some(mut p) = s.proc.take() {
                let pid = p.child.id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid])
                    .status();
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = p.child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.procs {
            if let Some(mut p) = s.proc.take() {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

fn schedule_restart(s: &mut Supervised, now: Instant) {
    if s.started.elapsed() > Duration::from_secs(30) {
        s.backoff = Duration::from_secs(1);
    }
    s.restart_at = Some(now + s.backoff);
    s.backoff = (s.backoff * 2).min(Duration::from_secs(10));
}

/// kill -9 of the stack's `kafka` or `cassandra` (by `stack/stack.sh`'s pid file).
pub fn kill9_dependency(stack_dir: &Path, name: &str) -> Result<()> {
    let pidfile = stack_dir.join(format!("{name}.pid"));
    let pid = std::fs::read_to_string(&pidfile)
        .map_err(|e| Error::State(format!("{}: {e} (is the stack up?)", pidfile.display())))?;
    let pid = pid.trim().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `stack/stack.sh up`: starts what is down and waits until it serves.
pub fn stack_up(script: &Path) -> Result<()> {
    let out = std::process::Command::new(script)
        .arg("up")
        .output()
        .map_err(|e| Error::Config(format!("{}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Error::State(format!(
            "{} up failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_draws_the_same_schedule_with_a_broker_and_a_cassandra_kill() {
        let a = schedule(42, 60.0, 4);
        let b = schedule(42, 60.0, 4);
        assert_eq!(
            a.iter()
                .map(|p| (p.at_s, p.fault.clone()))
                .collect::<Vec<_>>(),
            b.iter()
                .map(|p| (p.at_s, p.fault.clone()))
                .collect::<Vec<_>>()
        );
        assert_eq!(a.len(), 6);
        assert!(a.iter().any(|p| matches!(p.fault, Fault::Broker { .. })));
        assert!(a.iter().any(|p| matches!(p.fault, Fault::Cassandra { .. })));
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert!(a.iter().all(|p| (6.0..=48.0).contains(&p.at_s)));
    }
}
