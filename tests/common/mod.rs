//! Shared helpers for tests against the real local stack (`make up`).
//!
//! Every test works in its own keyspace and under its own topic prefix, so tests run in
//! parallel and a rerun never sees an earlier run's data.

#![allow(dead_code)] // each test binary uses a different subset

use likes::config::Settings;

/// The name of every thread [`on_own_runtime`] makes.
pub const HELD_JOB: &str = "held-job";

/// Runs a job's future on a thread and runtime of its own (a fail point's sleep blocks its
/// thread, and a job's futures are not all `Send` across spawns); the answer comes back
/// through `spawn_blocking(|| handle.join())`. Its threads are named [`HELD_JOB`], so a fail
/// point's callback can act for this job alone ([`on_held_job`]).
pub fn on_own_runtime<F, T>(job: impl FnOnce() -> F + Send + 'static) -> std::thread::JoinHandle<T>
where
    F: std::future::Future<Output = T>,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(HELD_JOB.into())
        .spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(HELD_JOB)
                .enable_all()
                .build()
                .unwrap()
                .block_on(job())
        })
        .unwrap()
}

/// Whether this thread is a job's of [`on_own_runtime`]. Fail points are global to the test
/// binary: a callback that holds a job must let pass the same point reached by another test's
/// job running in-process beside it (a foreign recount took the hold and the flips meant for
/// the held job's cut, which then settled an item that should have stayed in flight).
pub fn on_held_job() -> bool {
    std::thread::current().name() == Some(HELD_JOB)
}

pub use likes_testkit::names::unique;

/// Settings as the binary would load them (so `LIKES__*` still points tests at another
/// stack), with a fresh keyspace and topic prefix.
pub fn settings(base: &str) -> Settings {
    let mut s = Settings::load(None).expect("settings");
    let name = unique(base);
    s.cql.keyspace = name.clone();
    s.kafka.topic_prefix = format!("{name}.");
    // One host: the clocks agree, and the tests' short in-flight bounds leave room for only
    // a small bound (api.relay_min_age must exceed the deadline, one CQL timeout and twice it).
    s.cql.max_clock_skew = std::time::Duration::from_millis(250);
    // Tests pass horizons in seconds on purpose (the clock seam, short TTLs).
    s.dedupe.allow_short_horizon = true;
    // The tests' clients stand for many people's traffic through few user ids (a churn of a
    // dozen users flipping as fast as they can); each user's share has its own tests.
    s.api.max_writes_per_user_per_s = 0.0;
    s
}

/// The environment that makes the `likes` binary use `settings`' keyspace and prefix.
pub fn env_for(settings: &Settings) -> Vec<(&'static str, String)> {
    let mut e =
        likes_testkit::names::namespace_env(&settings.cql.keyspace, &settings.kafka.topic_prefix);
    e.push((
        "LIKES__CQL__MAX_CLOCK_SKEW",
        format!("{}ms", settings.cql.max_clock_skew.as_millis()),
    ));
    e.push((
        "LIKES__DEDUPE__ALLOW_SHORT_HORIZON",
        settings.dedupe.allow_short_horizon.to_string(),
    ));
    e.push((
        "LIKES__API__MAX_WRITES_PER_USER_PER_S",
        settings.api.max_writes_per_user_per_s.to_string(),
    ));
    e
}

/// A loopback port nothing listens on now (for a child process to bind).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the `likes` binary built for this test run; returns (success, stdout, stderr).
pub fn likes(args: &[&str], env: &[(&'static str, String)]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_likes"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run likes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
pub mod api;
pub mod procs;
pub mod regions;
pub mod stack;
pub mod topology;

/// The first thread to reach fail point `name` stops there until [`Hold::release`]; later
/// ones pass. The guard of the first-caller slot is dropped before the wait (a lock kept in
/// an `if let` would make the others wait on it instead).
pub struct Hold {
    name: &'static str,
    reached: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    go: std::sync::mpsc::Sender<()>,
}

impl Hold {
    pub fn first_at(name: &'static str) -> Self {
        use std::sync::{mpsc, Mutex};
        let (reached_tx, reached) = mpsc::channel::<()>();
        let (go, go_rx) = mpsc::channel::<()>();
        let held = Mutex::new(Some((reached_tx, go_rx)));
        fail::cfg_callback(name, move || {
            let first = held.lock().unwrap().take();
            if let Some((reached, go)) = first {
                reached.send(()).unwrap();
                let _ = go.recv_timeout(std::time::Duration::from_secs(60));
            }
        })
        .unwrap();
        Hold {
            name,
            reached: std::sync::Mutex::new(Some(reached)),
            go,
        }
    }

    /// Waits (off the runtime's threads) until the first thread stops at the point.
    pub async fn reached(&self) {
        let reached = self.reached.lock().unwrap().take().expect("waited once");
        tokio::task::spawn_blocking(move || {
            reached.recv_timeout(std::time::Duration::from_secs(60))
        })
        .await
        .unwrap()
        .unwrap_or_else(|_| panic!("nothing reached fail point {} in 60 s", self.name));
    }

    /// Lets the held thread go on, and the fail point stops no one after.
    pub fn release(&self) {
        let _ = self.go.send(());
        fail::remove(self.name);
    }
}
