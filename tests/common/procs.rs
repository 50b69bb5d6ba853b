//! The stages as real child processes of the `likes` binary, for fault tests: SIGKILL them
//! at random moments, restart them, read their logs when something goes wrong.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use likes::config::Settings;

/// One stage process (`likes dedupe` or `likes count`), restartable.
pub struct Stage {
    pub name: &'static str,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    started_at: std::time::Instant,
    pub starts: u32,
}

/// The environment that points a child at `settings`' names and state.
pub fn stage_env(settings: &Settings, audit: &std::path::Path) -> Vec<(String, String)> {
    vec![
        ("LIKES__CQL__KEYSPACE".into(), settings.cql.keyspace.clone()),
        (
            "LIKES__CQL__MAX_CLOCK_SKEW".into(),
            format!("{}ms", settings.cql.max_clock_skew.as_millis()),
        ),
        (
            "LIKES__DEDUPE__ALLOW_SHORT_HORIZON".into(),
            settings.dedupe.allow_short_horizon.to_string(),
        ),
        (
            "LIKES__API__MAX_WRITES_PER_USER_PER_S".into(),
            settings.api.max_writes_per_user_per_s.to_string(),
        ),
        (
            "LIKES__KAFKA__TOPIC_PREFIX".into(),
            settings.kafka.topic_prefix.clone(),
        ),
        (
            "LIKES__DEDUPE__STATE_DIR".into(),
            settings.dedupe.state_dir.display().to_string(),
        ),
        (
            "LIKES__DEDUPE__INSTANCE_ID".into(),
            settings.dedupe.instance_id.clone(),
        ),
        (
            "LIKES__COUNT__AUDIT_LOG".into(),
            audit.display().to_string(),
        ),
        ("LIKES__KAFKA__SESSION_TIMEOUT".into(), "6s".into()),
        ("RUST_LOG".into(), "info".into()),
    ]
}

impl Stage {
    pub fn new(name: &'static str, env: Vec<(String, String)>, dir: &std::path::Path) -> Self {
        Self::named(name, name, env, dir)
    }

    /// A stage whose log is `<label>.log` (for two instances of one stage).
    pub fn named(
        name: &'static str,
        label: &str,
        env: Vec<(String, String)>,
        dir: &std::path::Path,
    ) -> Self {
        Self {
            name,
            env,
            log: dir.join(format!("{label}.log")),
            child: None,
            started_at: std::time::Instant::now(),
            starts: 0,
        }
    }

    /// Starts the process; `extra` adds variables for this start only (fail points).
    pub fn start_with(&mut self, extra: &[(&str, &str)]) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let env: Vec<(String, String)> = self
            .env
            .iter()
            .cloned()
            .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        let exe = std::path::Path::new(env!("CARGO_BIN_EXE_likes"));
        let child =
            likes_testkit::procs::start_logged(exe, &[self.name], &env, &self.log, false).unwrap();
        self.child = Some(child);
        self.started_at = std::time::Instant::now();
        self.starts += 1;
    }

    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    /// SIGKILL, as a crashed node would die.
    pub fn kill9(&mut self) {
        let mut c = self.child.take().expect("not running");
        c.kill().unwrap(); // SIGKILL on Unix
        c.wait().unwrap();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A process signalled before it installed its handler just dies of SIGTERM; give
            // it time to start, since a clean exit is what this checks.
            let young = Duration::from_secs(3).saturating_sub(self.started_at.elapsed());
            std::thread::sleep(young);
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let status = c.wait().unwrap();
            assert!(
                status.success(),
                "{} exited with {status} on SIGTERM; log:\n{}",
                self.name,
                self.tail()
            );
        }
    }

    /// Waits up to `timeout` for the process to exit on its own; returns whether it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(c) = &mut self.child {
                if c.try_wait().unwrap().is_some() {
                    self.child = None;
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Panics with the log if the process died on its own.
    pub fn assert_alive(&mut self) {
        if let Some(c) = &mut self.child {
            if let Some(status) = c.try_wait().unwrap() {
                panic!(
                    "{} died by itself ({status}); log:\n{}",
                    self.name,
                    self.tail()
                );
            }
        }
    }

    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The audit trail of applied counter writes: per item, every window applied, and the sum.
pub struct Audit {
    pub applied_pairs: usize,
    pub distinct_pairs: usize,
    pub sums: BTreeMap<String, i64>,
}

pub fn read_audit(path: &std::path::Path) -> Audit {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // batch -> its planned rows (item, windows, delta); and the batches' outcomes.
    let mut planned: BTreeMap<String, Vec<(String, Vec<i64>, i64)>> = BTreeMap::new();
    let mut applied = HashSet::new();
    let mut failed = HashSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f[0] {
            "P" => {
                let windows = f[3].split(',').map(|w| w.parse().unwrap()).collect();
                planned.entry(f[1].to_string()).or_default().push((
                    f[2].to_string(),
                    windows,
                    f[4].parse().unwrap(),
                ));
            }
            "A" => {
                applied.insert(f[1].to_string());
            }
            "F" => {
                failed.insert(f[1].to_string());
            }
            other => panic!("unknown audit record {other:?}"),
        }
    }
    let rows_of = |ids: &HashSet<String>| -> Vec<(String, Vec<i64>, i64)> {
        ids.iter()
            .flat_map(|b| planned.get(b).cloned().unwrap_or_default())
            .collect()
    };
    let mut rows = rows_of(&applied);
    // A batch cut off by a kill applied exactly when none of its (item, window) pairs was
    // applied again later (a batch that did not apply is re-planned with the same windows).
    let certain: HashSet<(String, i64)> = rows
        .iter()
        .flat_map(|(i, ws, _)| ws.iter().map(move |w| (i.clone(), *w)))
        .collect();
    for (b, batch_rows) in &planned {
        if applied.contains(b) || failed.contains(b) {
            continue;
        }
        let again = batch_rows
            .iter()
            .any(|(i, ws, _)| ws.iter().any(|w| certain.contains(&(i.clone(), *w))));
        if !again {
            rows.extend(batch_rows.iter().cloned());
        }
    }
    let mut seen = HashSet::new();
    let mut applied_pairs = 0;
    let mut sums = BTreeMap::new();
    for (item, windows, n) in rows {
        for w in windows {
            applied_pairs += 1;
            seen.insert((item.clone(), w));
        }
        *sums.entry(item).or_insert(0) += n;
    }
    Audit {
        applied_pairs,
        distinct_pairs: seen.len(),
        sums,
    }
}

/// Waits (up to 120 s) until the counts equal `want` while both stages stay alive, then stops
/// both cleanly; returns the last counts seen (nonzero entries).
pub async fn drain(
    dedupe: &mut Stage,
    count: &mut Stage,
    settings: &Settings,
    want: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    let have = settle(dedupe, count, settings, want, Duration::from_secs(120)).await;
    dedupe.stop();
    count.stop();
    have
}

/// Waits (up to `timeout`) until the counts equal `want` while both stages stay alive;
/// returns the last counts seen (nonzero entries). The stages go on running.
pub async fn settle(
    dedupe: &mut Stage,
    count: &mut Stage,
    settings: &Settings,
    want: &BTreeMap<String, i64>,
    timeout: Duration,
) -> BTreeMap<String, i64> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        dedupe.assert_alive();
        count.assert_alive();
        let have = super::topology::nonzero(&super::topology::counts(settings).await);
        if have == *want || tokio::time::Instant::now() > deadline {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A fault test's world: its own names, schema and topics, a run dir with the stage logs and
/// the audit trail, and the two stages (not started).
pub struct Harness {
    pub settings: Settings,
    pub topology: likes::topology::Topology,
    pub dir: PathBuf,
    pub audit: PathBuf,
    pub dedupe: Stage,
    pub count: Stage,
    /// The environment the stages run with (to derive more instances from).
    pub env: Vec<(String, String)>,
}

pub async fn harness(base: &str) -> Harness {
    let settings = super::topology::settings(base);
    let topology = likes::topology::Topology::load(None).unwrap();
    super::topology::setup(&settings, &topology).await;
    let dir = settings.dedupe.state_dir.with_extension("run");
    std::fs::create_dir_all(&dir).unwrap();
    let audit = dir.join("audit.tsv");
    let env = stage_env(&settings, &audit);
    let dedupe = Stage::new("dedupe", env.clone(), &dir);
    let count = Stage::new("count", env.clone(), &dir);
    Harness {
        settings,
        topology,
        dir,
        audit,
        dedupe,
        count,
        env,
    }
}

/// The audit trail's verdict: no (item, window) applied twice, and the applied deltas sum to
/// the ground truth item by item.
pub fn assert_audit(path: &std::path::Path, want: &BTreeMap<String, i64>) -> Audit {
    let a = read_audit(path);
    assert_eq!(
        a.applied_pairs, a.distinct_pairs,
        "an (item, window) was applied twice"
    );
    assert_eq!(
        &super::topology::nonzero(&a.sums),
        want,
        "the audit trail must sum to the truth"
    );
    a
}
