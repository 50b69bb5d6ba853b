//! The faults of a chaos run as they strike, on its seed's schedule, and what heals them: a
//! dependency started again, a partition healed, a paused process resumed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::faults::{self, Fault, Fleet, Planned};
use super::{check, cluster, say};
use crate::loadgen::Live;
use likes::config::Settings;
use likes::runtime::shutdown::CancellationToken;
use likes::topology::Topology;

/// A node of the replicated stack killed by a fault.
pub(super) struct NodeDown {
    node: String,
    back_at: Instant,
    /// Its start, once under way.
    start: Option<tokio::task::JoinHandle<Result<()>>>,
    /// Its entry in [`Strikes::outages`].
    outage: usize,
    /// Starts that failed so far: one is tried again, as an operator would after a fault of
    /// the run itself (a partition, a paused peer) stood in its way.
    failed_starts: u32,
}

/// What ends a partition or a pause.
pub(super) enum Heal {
    /// A process's or a node's link.
    Partition(String),
    Resume(&'static str),
}

/// A replay under way: the stage it holds stopped, and the reset's outcome.
pub(super) type Replaying = (
    &'static str,
    tokio::task::JoinHandle<likes::Result<likes::ops::replay::ReplayReport>>,
);

/// The faults of a run as they strike, one at a time: a fault waits until the dependency
/// killed before it is back and a replay before it is done.
pub(super) struct Strikes<'a> {
    pub settings: &'a Settings,
    /// The topology the run's processes start with (a window change changes it).
    pub topology: Topology,
    pub session: &'a Arc<scylla::client::session::Session>,
    pub dir: &'a std::path::Path,
    pub stack_dir: &'a std::path::Path,
    pub stack_script: &'a PathBuf,
    pub fleet: &'a mut Fleet,
    /// Ctrl-C or SIGTERM: no further fault strikes (a dependency down is brought back first).
    pub interrupted: &'a CancellationToken,
    pub struck: Vec<Planned>,
    /// Most items behind their edges when a dependency came back.
    pub max_drift: usize,
    /// A killed dependency comes back at this time.
    pub down_until: Option<Instant>,
    /// Replicated stack: the nodes down (one broker and one Cassandra node at most), each
    /// started again in the background once its time is up.
    pub nodes_down: Vec<NodeDown>,
    /// Partitions healed and paused processes resumed at these times.
    pub healing: Vec<(Instant, Heal)>,
    /// On the replicated stack.
    pub cluster: bool,
    pub max_skew_s: i64,
    pub replaying: Option<Replaying>,
    /// The processes' environment (for the operations jobs a fault starts; a window change
    /// changes it).
    pub env: Vec<(String, String)>,
    /// Operations jobs started by faults, with the time they struck: waited for after the load.
    pub jobs: Vec<(f64, likes_testkit::procs::Proc)>,
    /// What the load's client knows of each edge (an erasure picks its user from it).
    pub live: Arc<Live>,
    /// Users erased by a fault: their acknowledged likes were taken back on purpose.
    pub erased: Vec<String>,
    /// Dependencies killed: which, and from when to when (seconds after the load's
    /// [`Live::t0`]; the end is set when the stack is up again).
    pub outages: Vec<(&'static str, f64, Option<f64>)>,
}

impl Strikes<'_> {
    /// Strikes `plan` while the load runs; returns once the load and every fault are done,
    /// or, after an interrupt, once no dependency is down and no replay is under way.
    pub async fn run(
        &mut self,
        plan: &[Planned],
        load: &tokio::task::JoinHandle<()>,
        started: Instant,
    ) -> Result<()> {
        let mut next = 0;
        loop {
            self.fleet.tick()?;
            let t = started.elapsed().as_secs_f64();
            if self.interrupted.is_cancelled() {
                // Heal at once: nothing is left cut off or frozen.
                for h in &mut self.healing {
                    h.0 = Instant::now();
                }
                for d in &mut self.nodes_down {
                    d.back_at = Instant::now();
                }
            }
            self.heal_due(t)?;
            if self.cluster {
                self.restart_due(started).await?;
            }
            let pending = self.down_until.is_some()
                || !self.healing.is_empty()
                || !self.nodes_down.is_empty();
            if self
                .replaying
                .as_ref()
                .is_some_and(|(_, task)| task.is_finished())
            {
                self.replay_done(t).await;
            } else if self.replaying.is_some() {
                // The next fault waits for the replay.
            } else if !self.cluster && self.down_until.is_some() {
                if self.down_until.is_some_and(|at| Instant::now() >= at) {
                    self.stack_back(started).await?;
                }
            } else if self.interrupted.is_cancelled() {
                if !pending {
                    return Ok(());
                }
            } else if next < plan.len() && t >= plan[next].at_s && !self.blocked(&plan[next].fault)
            {
                let f = &plan[next].fault;
                say(&format!("  t={t:>5.1}s {f:?}"));
                self.struck.push(Planned {
                    at_s: (t * 10.0).round() / 10.0,
                    fault: f.clone(),
                    outcome: None,
                });
                self.strike(f)?;
                next += 1;
            } else if load.is_finished() && next >= plan.len() && !pending {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether `f` must wait. On one node a fault waits for the dependency killed before it
    /// (the loop holds it); on the replicated stack faults overlap, as Jepsen's nemeses do,
    /// but one node is down at a time (two of three Cassandra nodes down is no quorum, by
    /// design unavailable), one partition and one pause at a time, and a replay or a window
    /// change (which hold stages) waits for everything else.
    fn blocked(&self, f: &Fault) -> bool {
        let partitioned = self
            .healing
            .iter()
            .any(|h| matches!(h.1, Heal::Partition(_)));
        let paused = self.healing.iter().any(|h| matches!(h.1, Heal::Resume(_)));
        match f {
            Fault::Broker { .. } | Fault::Cassandra { .. } => self.down_until.is_some(),
            Fault::LeaderBounce { .. } => self.is_down("cluster-kafka-"),
            Fault::CassandraNode { .. } => self.is_down("cluster-cassandra-"),
            Fault::Partition { .. } | Fault::Isolate { .. } => partitioned,
            Fault::Pause { .. } => paused,
            Fault::Replay { .. } | Fault::WindowChange { .. } | Fault::WipeDedupeState => {
                self.down_until.is_some() || !self.healing.is_empty() || !self.nodes_down.is_empty()
            }
            Fault::Kill { .. } | Fault::Skew { .. } | Fault::ReconcileTwice | Fault::Erase => false,
        }
    }

    /// Heals the partitions and resumes the paused processes whose time has come.
    fn heal_due(&mut self, t: f64) -> Result<()> {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.healing)
            .into_iter()
            .partition(|h| now >= h.0);
        self.healing = later;
        for (_, heal) in due {
            let outcome = match heal {
                Heal::Partition(p) => cluster::heal().map(|_| format!("{p}'s link healed"))?,
                Heal::Resume(p) => {
                    if self.fleet.signal(p, "CONT") {
                        format!("{p} resumed")
                    } else {
                        format!("{p} had been restarted meanwhile")
                    }
                }
            };
            say(&format!("  t={t:>5.1}s {outcome}"));
        }
        Ok(())
    }

    fn is_down(&self, prefix: &str) -> bool {
        self.nodes_down.iter().any(|d| d.node.starts_with(prefix))
    }

    /// Replicated stack: starts each killed node once its time is up, in the background (the
    /// other faults go on meanwhile), and ends its outage when it serves again.
    async fn restart_due(&mut self, started: Instant) -> Result<()> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.nodes_down.len() {
            let d = &mut self.nodes_down[i];
            if d.start.as_ref().is_some_and(|t| t.is_finished()) {
                let outcome = d
                    .start
                    .take()
                    .expect("checked")
                    .await
                    .map_err(|e| anyhow!("starting {}: {e}", d.node))?;
                if let Err(e) = outcome {
                    d.failed_starts += 1;
                    if d.failed_starts > 1 {
                        return Err(e.context(format!("{} did not start twice", d.node)));
                    }
                    say(&format!(
                        "  t={:>5.1}s {} did not start ({e:#}); starting it again",
                        started.elapsed().as_secs_f64(),
                        d.node
                    ));
                    i += 1;
                    continue;
                }
                let d = self.nodes_down.swap_remove(i);
                self.outages[d.outage].2 = Some(self.live.t0.elapsed().as_secs_f64());
                say(&format!(
                    "  t={:>5.1}s {} is up again",
                    started.elapsed().as_secs_f64(),
                    d.node
                ));
                continue;
            }
            if d.start.is_none() && now >= d.back_at {
                let (script, node) = (self.stack_script.clone(), d.node.clone());
                d.start = Some(tokio::task::spawn_blocking(move || {
                    likes_testkit::stack::start_node(&script, &node).map_err(|e| anyhow!(e))
                }));
            }
            i += 1;
        }
        Ok(())
    }

    /// kill -9 of a node of the replicated stack, started again after `down_s`.
    fn kill_node(&mut self, node: String, dependency: &'static str, down_s: u64) -> Result<()> {
        faults::kill9_dependency(self.stack_dir, &node)?;
        self.outages
            .push((dependency, self.live.t0.elapsed().as_secs_f64(), None));
        self.nodes_down.push(NodeDown {
            node,
            back_at: Instant::now() + Duration::from_secs(down_s),
            start: None,
            outage: self.outages.len() - 1,
            failed_starts: 0,
        });
        Ok(())
    }

    fn strike(&mut self, f: &Fault) -> Result<()> {
        match f {
            Fault::Kill { process } => self.fleet.kill9(process),
            Fault::WipeDedupeState => {
                // The first instance's disk only; dedupe-2 keeps its own.
                self.fleet.kill9("dedupe");
                let group = self.settings.group(&self.topology.groups.dedupe);
                let _ = std::fs::remove_dir_all(
                    self.dir.join("dedupe-state").join(group).join("chaos-0"),
                );
            }
            Fault::Broker { down_s } => {
                faults::kill9_dependency(self.stack_dir, "kafka")?;
                self.outages
                    .push(("kafka", self.live.t0.elapsed().as_secs_f64(), None));
                self.down_until = Some(Instant::now() + Duration::from_secs(*down_s));
            }
            Fault::Cassandra { down_s } => {
                faults::kill9_dependency(self.stack_dir, "cassandra")?;
                self.outages
                    .push(("cassandra", self.live.t0.elapsed().as_secs_f64(), None));
                self.down_until = Some(Instant::now() + Duration::from_secs(*down_s));
            }
            Fault::ReconcileTwice => {
                // The nightly CronJob and an operator by hand, at once, while faults strike.
                let at = self.struck.last().map_or(0.0, |p| p.at_s);
                let mut env = self.env.clone();
                env.push(("LIKES__OPS__WAIT_TIMEOUT".into(), "120s".into()));
                for (name, reason) in [("reconcile-a", "chaos-a"), ("reconcile-b", "chaos-b")] {
                    let mut env = env.clone();
                    if self.cluster && name == "reconcile-b" {
                        // An ops job on a host whose clock is off, within the bound.
                        let by = -(self.max_skew_s / 2).max(1);
                        env.extend(
                            cluster::skew_env(by)
                                .into_iter()
                                .map(|(k, v)| (k.to_string(), v)),
                        );
                        self.note(format!("reconcile-b's clock {by:+} s"));
                    }
                    let job = likes_testkit::procs::spawn_job(
                        &["reconcile", "--sample", "40", "--reason", reason],
                        name,
                        self.dir,
                        &env,
                    )?;
                    self.jobs.push((at, job));
                }
            }
            Fault::WindowChange { to_ms } => {
                self.fleet.kill9("count");
                self.fleet.hold("count");
                let outcome = self.change_window(*to_ms);
                say(&format!("  window change: {outcome}"));
                if let Some(last) = self.struck.last_mut() {
                    last.outcome = Some(outcome);
                }
                self.fleet.release("count");
            }
            Fault::Erase => {
                let at = self.struck.last().map_or(0.0, |p| p.at_s);
                let Some(user) = self.most_liked_user() else {
                    if let Some(last) = self.struck.last_mut() {
                        last.outcome = Some("no acknowledged like yet: nobody to erase".into());
                    }
                    return Ok(());
                };
                say(&format!("  erasing {user}"));
                let job = likes_testkit::procs::spawn_job(
                    &["erase", "--user", &user],
                    "erase",
                    self.dir,
                    &self.env,
                )?;
                self.jobs.push((at, job));
                if let Some(last) = self.struck.last_mut() {
                    last.outcome = Some(format!("user {user}"));
                }
                self.erased.push(user);
            }
            Fault::LeaderBounce { down_s } => {
                let leader = cluster::busiest_leader(self.settings, &self.topology)?;
                self.kill_node(format!("cluster-kafka-{leader}"), "kafka leader", *down_s)?;
                self.note(format!(
                    "broker {leader} (leading most of the run's partitions)"
                ));
            }
            Fault::CassandraNode { node, down_s } => {
                self.kill_node(
                    format!("cluster-cassandra-{node}"),
                    "cassandra node",
                    *down_s,
                )?;
            }
            Fault::Partition { process, heal_s } => {
                cluster::partition(process)?;
                self.healing.push((
                    Instant::now() + Duration::from_secs(*heal_s),
                    Heal::Partition(process.to_string()),
                ));
            }
            Fault::Isolate { node, heal_s } => {
                cluster::isolate(node)?;
                self.healing.push((
                    Instant::now() + Duration::from_secs(*heal_s),
                    Heal::Partition(node.clone()),
                ));
            }
            Fault::Pause { process, for_s } => {
                if self.fleet.signal(process, "STOP") {
                    self.healing.push((
                        Instant::now() + Duration::from_secs(*for_s),
                        Heal::Resume(process),
                    ));
                } else {
                    self.note(format!("{process} was down: nothing to pause"));
                }
            }
            Fault::Skew { process, by_s } => {
                for (k, v) in cluster::skew_env(*by_s) {
                    self.fleet.set_proc_env(process, k, &v);
                }
                self.fleet.kill9(process);
            }
            Fault::Replay { stage, back_s } => {
                self.fleet.hold(stage);
                let group = self.settings.group(if *stage == "count" {
                    &self.topology.groups.count
                } else {
                    &self.topology.groups.dedupe
                });
                let to = likes::runtime::clock::now_ms() - *back_s as i64 * 1000;
                let (s, t) = (self.settings.clone(), self.topology.clone());
                let task = tokio::spawn(async move {
                    likes::ops::replay::run_checked(
                        &s,
                        &t,
                        &group,
                        likes::ops::replay::Target::Time(to),
                    )
                    .await
                });
                self.replaying = Some((stage, task));
            }
        }
        Ok(())
    }

    /// Adds to what came of the fault that struck last.
    fn note(&mut self, what: String) {
        if let Some(last) = self.struck.last_mut() {
            let o = last.outcome.get_or_insert_with(String::new);
            if !o.is_empty() {
                o.push_str("; ");
            }
            o.push_str(&what);
        }
    }

    /// The user with the most acknowledged likes so far (the first in name order of a tie).
    fn most_liked_user(&self) -> Option<String> {
        let edges = self.live.edges.as_ref()?.lock().unwrap();
        let mut per_user: std::collections::BTreeMap<String, usize> = Default::default();
        for ((_, user), s) in edges.iter() {
            if s.like_acked && !self.erased.contains(user) {
                *per_user.entry(user.clone()).or_default() += 1;
            }
        }
        let most = per_user.values().copied().max()?;
        per_user
            .into_iter()
            .find(|(_, n)| *n == most)
            .map(|(u, _)| u)
    }

    /// Records a new window length and points every process started from now on at it
    /// (the running ones checked the old length at their start and go on with it); says
    /// what came of it. A refused migrate leaves the old length everywhere.
    fn change_window(&mut self, to_ms: u64) -> String {
        let from_ms = self.topology.window.as_millis();
        let t = match self
            .topology
            .clone()
            .with_window(Duration::from_millis(to_ms))
        {
            Ok(t) => t,
            Err(e) => return format!("refused: {e}"),
        };
        let path = self.dir.join(format!("topology-{to_ms}.toml"));
        let written = toml::to_string(&t)
            .map_err(|e| e.to_string())
            .and_then(|text| std::fs::write(&path, text).map_err(|e| e.to_string()));
        if let Err(e) = written {
            return format!("failed: {}: {e}", path.display());
        }
        let mut env = self.env.clone();
        faults::set_var(
            &mut env,
            "LIKES__TOPOLOGY__PATH",
            &path.display().to_string(),
        );
        let migrated = likes_testkit::procs::likes_bin().and_then(|bin| {
            std::process::Command::new(bin)
                .args(["migrate", "--accept-window-change"])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .map_err(|e| anyhow!(format!("likes migrate: {e}")))
        });
        match migrated {
            Ok(out) if out.status.success() => {
                self.topology = t;
                self.fleet
                    .set_env("LIKES__TOPOLOGY__PATH", &path.display().to_string());
                self.env = env;
                format!("{from_ms} ms → {to_ms} ms")
            }
            Ok(out) => format!(
                "migrate failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => format!("migrate failed: {e}"),
        }
    }

    /// A replay finished: its outcome noted, its stage released.
    async fn replay_done(&mut self, t: f64) {
        let (stage, task) = self.replaying.take().expect("a replay runs");
        let outcome = match task.await {
            Ok(Ok(r)) => format!("reset: {}", r.to_string().lines().next().unwrap_or("")),
            Ok(Err(e)) => format!("refused: {e}"),
            Err(e) => format!("failed: {e}"),
        };
        say(&format!("  t={t:>5.1}s replay of {stage}: {outcome}"));
        if let Some(last) = self.struck.last_mut() {
            last.outcome = Some(outcome);
        }
        self.fleet.release(stage);
    }

    /// The killed dependency's time is up: the stack is brought back.
    async fn stack_back(&mut self, started: Instant) -> Result<()> {
        let script = self.stack_script.clone();
        tokio::task::spawn_blocking(move || faults::stack_up(&script))
            .await
            .map_err(|e| anyhow!("stack up: {e}"))??;
        self.back_up(started).await;
        Ok(())
    }

    /// The killed dependency serves again: its outage ends.
    async fn back_up(&mut self, started: Instant) {
        self.down_until = None;
        if let Some(o) = self.outages.last_mut().filter(|o| o.2.is_none()) {
            o.2 = Some(self.live.t0.elapsed().as_secs_f64());
        }
        say(&format!(
            "  t={:>5.1}s the stack is up again",
            started.elapsed().as_secs_f64()
        ));
        if let Ok((_, behind)) = check::drift(self.session, &self.settings.cql.keyspace).await {
            self.max_drift = self.max_drift.max(behind);
        }
    }
}
