//! The faults of a chaos run, drawn from its seed, and the processes they hit, restarted the
//! way Kubernetes restarts a container (on exit, after a backoff that doubles).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use anyhow::{anyhow, Result};
use likes_testkit::procs::{spawn, Proc};

/// One fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// kill -9 of a `likes` process (api with its relay, dedupe, dedupe-2, count).
    Kill { process: &'static str },
    /// A stage's group reset to `back_s` seconds ago with `likes replay` (its processes
    /// stopped meanwhile, as the runbook says): the counts must not move.
    Replay { stage: &'static str, back_s: u64 },
    /// kill -9 of dedupe and the loss of its local state (a new disk).
    WipeDedupeState,
    /// kill -9 of the Kafka broker, started again after `down_s`.
    Broker { down_s: u64 },
    /// kill -9 of Cassandra, started again after `down_s`.
    Cassandra { down_s: u64 },
    /// Two `likes reconcile` runs at once (the nightly CronJob and an operator by hand):
    /// their corrections must never add up to a double correction.
    ReconcileTwice,
    /// kill -9 of count, then every process's window length changed to `to_ms` (`likes
    /// migrate --accept-window-change`): windows the killed process applied but never
    /// committed are read again on another grid, and must not count twice.
    WindowChange { to_ms: u64 },
    /// `likes erase --user` of the user with the most acknowledged likes, while the load
    /// goes on: every like of theirs is taken back through the pipeline, their later writes
    /// are refused, and no like of theirs is left.
    Erase,
    /// Replicated stack: kill -9 of the broker leading most of the run's partitions, in the
    /// middle of both stages' transactions, started again after `down_s`.
    LeaderBounce { down_s: u64 },
    /// Replicated stack: kill -9 of one Cassandra node (1-3) under the LWTs, started again
    /// after `down_s`; the other two keep a quorum.
    CassandraNode { node: u8, down_s: u64 },
    /// Replicated stack: every packet from `process` to the brokers and the Cassandra nodes
    /// dropped (it keeps running, its connections stall: not a clean kill) for `heal_s`.
    Partition { process: &'static str, heal_s: u64 },
    /// Replicated stack: a node (`cluster-kafka-N` or `cluster-cassandra-N`) cut off from
    /// everything (every packet to or from its address dropped) for `heal_s`; it keeps running
    /// with its own view, as a node behind a failed switch.
    Isolate { node: String, heal_s: u64 },
    /// SIGSTOP of `process` for `for_s` (past its group session or lease), then SIGCONT: a
    /// GC or VM pause.
    Pause { process: &'static str, for_s: u64 },
    /// `process` restarted with its clock `by_s` off (the product's clock, in-process: see
    /// chaos/cluster.rs), within the run's `cql.max_clock_skew`; it stays so until the run ends.
    Skew { process: &'static str, by_s: i64 },
}

/// The processes a partition, a pause or a skew may strike.
const STRUCK: [&str; 5] = ["api", "api-2", "dedupe", "dedupe-2", "count"];

/// A fault and when it strikes, seconds into the load.
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    pub at_s: f64,
    #[serde(flatten)]
    pub fault: Fault,
    /// What came of it, when not plain (a replay refused, say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// The schedule of a seed: one broker and one Cassandra kill, two reconcile runs at once, a
/// window change (1 s to 1.5 s, which straddles the old grid) and an erasure always, then `extra` more
/// of any kind, at times spread over the middle of the load (10%..80%), in time order.
pub fn schedule(seed: u64, seconds: f64, extra: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = vec![
        Fault::Broker {
            down_s: rng.random_range(5..=25),
        },
        Fault::Cassandra {
            down_s: rng.random_range(3..=12),
        },
        Fault::ReconcileTwice,
        Fault::WindowChange { to_ms: 1500 },
        Fault::Erase,
    ];
    for _ in 0..extra {
        faults.push(match rng.random_range(0..11) {
            0 => Fault::Kill { process: "dedupe" },
            1 => Fault::Kill {
                process: "dedupe-2",
            },
            2 | 3 => Fault::Kill { process: "count" },
            4 => Fault::Kill { process: "api" },
            5 => Fault::WipeDedupeState,
            6 => Fault::Broker {
                down_s: rng.random_range(5..=25),
            },
            7 => Fault::Cassandra {
                down_s: rng.random_range(3..=12),
            },
            8 => Fault::Replay {
                stage: "count",
                back_s: rng.random_range(5..=60),
            },
            9 => Fault::Replay {
                stage: "dedupe",
                back_s: rng.random_range(5..=60),
            },
            _ => Fault::Kill { process: "count" },
        });
    }
    spread(faults, seconds, &mut rng)
}

/// The schedule of a seed on the replicated stack: a leader bounce, a Cassandra node killed, a
/// process partitioned, a pause, a skew, a node isolated and a late write always (the kinds a
/// kill cannot make), then `extra` more of any kind, the single-node faults that still apply
/// included; the skew never exceeds `max_skew_s`.
///
/// The late write (issue 56): `api-2` (an API without the relay) partitioned from every node
/// for longer than `relay_min_age_s`, the relay's margin in force. The compare-and-sets it had
/// sent when the partition began stall in TCP's retransmits; their requests answer 503 at
/// their deadline; the relay of `api` takes their outbox entries once they are old enough,
/// finds no flip and fences the rows; on heal the stalled statements land, a whole margin
/// late, and must change nothing (docs/exactness.md, "The row fence").
pub fn schedule_cluster(
    seed: u64,
    seconds: f64,
    extra: usize,
    max_skew_s: i64,
    relay_min_age_s: u64,
) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let any = |rng: &mut StdRng, k: u32| match k {
        0 => Fault::LeaderBounce {
            down_s: rng.random_range(5..=20),
        },
        1 => Fault::CassandraNode {
            node: rng.random_range(1..=3),
            down_s: rng.random_range(5..=15),
        },
        2 => Fault::Partition {
            process: STRUCK[rng.random_range(0..STRUCK.len())],
            heal_s: rng.random_range(5..=20),
        },
        3 => Fault::Pause {
            process: STRUCK[rng.random_range(0..STRUCK.len())],
            for_s: rng.random_range(12..=25),
        },
        4 => Fault::Skew {
            process: STRUCK[rng.random_range(0..STRUCK.len())],
            by_s: rng.random_range(max_skew_s / 2..max_skew_s.max(2))
                * if rng.random_bool(0.5) { 1 } else { -1 },
        },
        5 => Fault::Isolate {
            node: format!(
                "cluster-{}-{}",
                if rng.random_bool(0.5) {
                    "kafka"
                } else {
                    "cassandra"
                },
                rng.random_range(1..=3)
            ),
            heal_s: rng.random_range(5..=20),
        },
        6 => Fault::Kill {
            process: STRUCK[rng.random_range(0..STRUCK.len())],
        },
        7 => Fault::ReconcileTwice,
        _ => Fault::Erase,
    };
    let mut faults: Vec<Fault> = (0..6).map(|k| any(&mut rng, k)).collect();
    for _ in 0..extra {
        let k = rng.random_range(0..9);
        faults.push(any(&mut rng, k));
    }
    faults.push(Fault::Partition {
        process: "api-2",
        heal_s: relay_min_age_s + rng.random_range(5..=10),
    });
    spread(faults, seconds, &mut rng)
}

/// Each fault at a time drawn over the middle of the load (10 %..80 %), in time order.
fn spread(faults: Vec<Fault>, seconds: f64, rng: &mut StdRng) -> Vec<Planned> {
    let mut planned: Vec<Planned> = faults
        .into_iter()
        .map(|fault| Planned {
            at_s: (seconds * rng.random_range(0.1..0.8) * 10.0).round() / 10.0,
            fault,
            outcome: None,
        })
        .collect();
    planned.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    planned
}

/// A `likes` process under supervision.
struct Supervised {
    /// Its name in the report and its log file (`<name>.log`).
    name: &'static str,
    /// The subcommand.
    command: &'static str,
    /// Environment of this process only (a second dedupe's instance id).
    env: Vec<(String, String)>,
    /// Stopped on purpose: not restarted until released.
    held: bool,
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
    /// Starts the APIs (`api` first, with the relay), dedupe, a second dedupe instance (`dedupe-2`: partitions move between the
    /// two whenever either dies) and count.
    pub fn start(
        dir: &Path,
        env: Vec<(String, String)>,
        apis: Vec<(&'static str, Vec<(String, String)>)>,
        own: impl Fn(&'static str) -> Vec<(String, String)>,
    ) -> Result<Self> {
        let mut fleet = Self {
            dir: dir.to_path_buf(),
            env,
            procs: Vec::new(),
        };
        let second = vec![(
            "LIKES__DEDUPE__INSTANCE_ID".to_string(),
            "chaos-1".to_string(),
        )];
        let mut procs: Vec<_> = apis
            .into_iter()
            .map(|(name, env)| (name, "api", env))
            .collect();
        procs.extend([
            ("dedupe", "dedupe", vec![]),
            ("dedupe-2", "dedupe", second),
            ("count", "count", vec![]),
        ]);
        for (name, command, mut env) in procs {
            env.extend(own(name));
            let mut s = Supervised {
                name,
                command,
                env,
                held: false,
                proc: None,
                started: Instant::now(),
                restart_at: None,
                backoff: Duration::from_secs(1),
                restarts: 0,
                exits: Vec::new(),
            };
            s.proc = Some(fleet.spawn(&s)?);
            fleet.procs.push(s);
        }
        Ok(fleet)
    }

    fn spawn(&self, s: &Supervised) -> Result<Proc> {
        let env: Vec<(String, String)> = self.env.iter().chain(&s.env).cloned().collect();
        spawn(s.command, s.name, &self.dir, &env)
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
            if s.proc.is_none() && !s.held && s.restart_at.is_some_and(|t| now >= t) {
                let env: Vec<(String, String)> = self.env.iter().chain(&s.env).cloned().collect();
                s.proc = Some(spawn(s.command, s.name, &self.dir, &env)?);
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

    /// Stops every process of `command` (SIGTERM, a clean exit) and keeps them stopped.
    pub fn hold(&mut self, command: &str) {
        for s in self.procs.iter_mut().filter(|s| s.command == command) {
            s.held = true;
            if let Some(p) = s.proc.take() {
                terminate(p);
            }
        }
    }

    /// Sets a variable of `name`'s environment alone from its next start on.
    pub fn set_proc_env(&mut self, name: &str, key: &str, value: &str) {
        if let Some(s) = self.procs.iter_mut().find(|s| s.name == name) {
            set_var(&mut s.env, key, value);
        }
    }

    /// Sends `signal` (STOP, CONT) to `name`, when it runs; false when it does not.
    pub fn signal(&mut self, name: &str, signal: &str) -> bool {
        let Some(p) = self
            .procs
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.proc.as_ref())
        else {
            return false;
        };
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &p.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Sets a variable of every process's environment from its next start on.
    pub fn set_env(&mut self, key: &str, value: &str) {
        set_var(&mut self.env, key, value);
    }

    /// Lets the held processes of `command` start again (at the next tick).
    pub fn release(&mut self, command: &str) {
        for s in self.procs.iter_mut().filter(|s| s.command == command) {
            s.held = false;
            s.restart_at = Some(Instant::now());
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
            if let Some(p) = s.proc.take() {
                terminate(p);
            }
        }
    }
}

/// SIGTERM, and a wait for the exit (SIGKILL after 30 s).
fn terminate(mut p: Proc) {
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

/// Sets `key` in `env`, replacing an earlier value.
pub fn set_var(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value.to_string()));
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
    likes_testkit::stack::kill9(stack_dir, name).map_err(|e| anyhow!(e))
}

/// `stack/stack.sh up`: starts what is down and waits until it serves.
pub fn stack_up(script: &Path) -> Result<()> {
    likes_testkit::stack::up(script).map_err(|e| anyhow!(e))
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
        assert_eq!(a.len(), 9);
        assert!(a.iter().any(|p| matches!(p.fault, Fault::Erase)));
        assert!(a
            .iter()
            .any(|p| matches!(p.fault, Fault::WindowChange { .. })));
        assert!(a.iter().any(|p| matches!(p.fault, Fault::ReconcileTwice)));
        assert!(a.iter().any(|p| matches!(p.fault, Fault::Broker { .. })));
        assert!(a.iter().any(|p| matches!(p.fault, Fault::Cassandra { .. })));
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert!(a.iter().all(|p| (6.0..=48.0).contains(&p.at_s)));
    }

    #[test]
    fn a_cluster_seed_always_has_each_kind_a_kill_cannot_make_and_skews_within_the_bound() {
        for seed in 1..50 {
            let a = schedule_cluster(seed, 90.0, 2, 10, 36);
            let b = schedule_cluster(seed, 90.0, 2, 10, 36);
            assert_eq!(
                a.iter()
                    .map(|p| (p.at_s, p.fault.clone()))
                    .collect::<Vec<_>>(),
                b.iter()
                    .map(|p| (p.at_s, p.fault.clone()))
                    .collect::<Vec<_>>()
            );
            assert_eq!(a.len(), 9);
            assert!(
                a.iter().any(|p| matches!(p.fault, Fault::Partition { process: "api-2", heal_s } if heal_s > 36)),
                "a late write: an API partitioned past the relay's margin"
            );
            assert!(a.iter().any(|p| matches!(p.fault, Fault::Isolate { .. })));
            assert!(a
                .iter()
                .any(|p| matches!(p.fault, Fault::LeaderBounce { .. })));
            assert!(a
                .iter()
                .any(|p| matches!(p.fault, Fault::CassandraNode { .. })));
            assert!(a.iter().any(|p| matches!(p.fault, Fault::Partition { .. })));
            assert!(a.iter().any(|p| matches!(p.fault, Fault::Pause { .. })));
            assert!(a.iter().any(|p| matches!(p.fault, Fault::Skew { .. })));
            assert!(a.iter().all(|p| match p.fault {
                Fault::Skew { by_s, .. } => (5..10).contains(&by_s.abs()),
                Fault::CassandraNode { node, .. } => (1..=3).contains(&node),
                _ => true,
            }));
        }
    }
}
