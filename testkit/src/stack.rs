//! The local stack as `stack/stack.sh` runs it: pid files under one folder, and the script
//! that starts what is down.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The folder of `make up`'s data, logs and pid files, found as stack/stack.sh finds it:
/// `LIKES_STACK_DIR`, else `$LIKES_CACHE/stack`, else `~/.cache/likes/stack`.
pub fn dir() -> PathBuf {
    std::env::var_os("LIKES_STACK_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("LIKES_CACHE").map(|c| PathBuf::from(c).join("stack")))
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/likes/stack")
        })
}

/// The project's cache (jars, built tools): `LIKES_CACHE`, else `~/.cache/likes`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("LIKES_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/likes")
        })
}

/// The repository's `stack/stack.sh`.
pub fn script() -> PathBuf {
    crate::repo::root().join("stack/stack.sh")
}

/// kill -9 of the stack's `kafka` or `cassandra`, as a crashed node dies, and the wait until
/// it is gone (so nobody starts it again while it still holds its ports). Refuses a pid that
/// is not the JVM the stack started: after a hard stop the pid may be someone else's.
pub fn kill9(stack_dir: &Path, name: &str) -> Result<(), String> {
    let pidfile = stack_dir.join(format!("{name}.pid"));
    let pid = std::fs::read_to_string(&pidfile)
        .map_err(|e| format!("{}: {e} (is the stack up?)", pidfile.display()))?;
    let pid = pid.trim().to_string();
    let main = match name {
        "kafka" | "cluster-kafka-1" | "cluster-kafka-2" | "cluster-kafka-3" => "kafka.Kafka",
        "cassandra"
        | "cassandra-region-a"
        | "cassandra-region-b"
        | "cluster-cassandra-1"
        | "cluster-cassandra-2"
        | "cluster-cassandra-3" => "CassandraDaemon",
        other => {
            return Err(format!(
                "the stack runs kafka, cassandra, the regions' cassandra-region-a and -b and the replicated stack's cluster-kafka-1..3 and cluster-cassandra-1..3, not {other}"
            ))
        }
    };
    let cmdline = |pid: &str| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline(&pid)).contains(main) {
        return Err(format!(
            "{name} (pid {pid} in {}) is not running; is the stack up?",
            pidfile.display()
        ));
    }
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    // A zombie keeps its /proc entry with an empty command line: gone for this purpose.
    while !cmdline(&pid).is_empty() {
        if Instant::now() > deadline {
            return Err(format!("{name} (pid {pid}) outlived kill -9 by 30 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `stack/stack.sh up` (the given script): starts what is down and waits until it serves.
pub fn up(script: &Path) -> Result<(), String> {
    run(script, "up")
}

/// `stack/stack.sh up-regions`: the two-datacenter cluster, what of it is down.
pub fn up_regions(script: &Path) -> Result<(), String> {
    run(script, "up-regions")
}

/// `stack/cluster.sh start NODE`: one node of the replicated stack, after a kill.
pub fn start_node(cluster_script: &Path, node: &str) -> Result<(), String> {
    run_args(cluster_script, &["start", node])
}

fn run(script: &Path, verb: &str) -> Result<(), String> {
    run_args(script, &[verb])
}

fn run_args(script: &Path, args: &[&str]) -> Result<(), String> {
    let verb = args.join(" ");
    let out = std::process::Command::new(script)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {verb} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
