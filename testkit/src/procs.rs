//! The product's processes as children of a tool: found, started with their own log and pid
//! file, and stopped. Every tool that runs `likes api`, `likes dedupe` or `likes count`
//! (demo, chaos, bench) starts them here.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{anyhow, Context, Result};

/// The `likes` binary the tools run: `LIKES_BIN` if set, else the one built beside this
/// binary (`cargo build` puts both in the same target folder).
pub fn likes_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("LIKES_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().context("locating likes-tools itself")?;
    let bin = me.with_file_name("likes");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(anyhow!(
            "{} not found: build it first (`cargo build --bin likes`, or `make build`), \
             or set LIKES_BIN",
            bin.display()
        ))
    }
}

/// A product process a tool started, its pid in `<dir>/<name>.pid`.
pub struct Proc {
    pub name: &'static str,
    pub child: Child,
    /// Killed when dropped ([`spawn_attached`]): a benchmark that fails midway must not leave
    /// a stage on its fixed metrics port, where the next run's stage cannot bind.
    attached: bool,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.attached && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `likes <command>` with `env` added, its output appended to `<dir>/<name>.log`
/// and its pid written to `<dir>/<name>.pid`, in a process group of its own: a Ctrl-C in the
/// terminal reaches the tool, which stops its children in order (the demo leaves them up
/// for a look; `make down` stops them by pid).
pub fn spawn(
    command: &'static str,
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
) -> Result<Proc> {
    start(command, name, dir, env, true)
}

/// [`spawn`], but in the tool's own process group: a Ctrl-C stops the child with the tool
/// (a benchmark's stages, which must not outlive it on their fixed ports).
pub fn spawn_attached(
    command: &'static str,
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
) -> Result<Proc> {
    start(command, name, dir, env, false)
}

/// A one-off `likes <args>` (an operations job), its output to `<dir>/<name>.log`, in a
/// process group of its own.
pub fn spawn_job(
    args: &[&str],
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
) -> Result<Proc> {
    start_with(args, name, dir, env, true)
}

fn start(
    command: &'static str,
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
    own_group: bool,
) -> Result<Proc> {
    start_with(&[command], name, dir, env, own_group)
}

fn start_with(
    args: &[&str],
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
    own_group: bool,
) -> Result<Proc> {
    start_bin(&likes_bin()?, args, name, dir, env, own_group)
}

/// [`spawn_attached`] of a `likes` binary named by path: a side-by-side run of two builds
/// (`bench ab`).
pub fn spawn_bin_attached(
    exe: &Path,
    command: &'static str,
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
) -> Result<Proc> {
    start_bin(exe, &[command], name, dir, env, false)
}

fn start_bin(
    exe: &Path,
    args: &[&str],
    name: &'static str,
    dir: &Path,
    env: &[(String, String)],
    own_group: bool,
) -> Result<Proc> {
    let log_path = dir.join(format!("{name}.log"));
    let child = start_logged(exe, args, env, &log_path, own_group)?;
    let pid_file = dir.join(format!("{name}.pid"));
    std::fs::write(&pid_file, child.id().to_string())
        .with_context(|| format!("writing {}", pid_file.display()))?;
    Ok(Proc {
        name,
        child,
        attached: !own_group,
    })
}

/// Starts `exe args` with `env` added, stdin closed and its output appended to `log`: how
/// every product process a test or a tool starts is started. With `own_group`, in a process
/// group of its own (a Ctrl-C in the terminal reaches only the tool).
pub fn start_logged(
    exe: &Path,
    args: &[&str],
    env: &[(String, String)],
    log: &Path,
    own_group: bool,
) -> Result<Child> {
    let command = args.join(" ");
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .envs(env.iter().filter(|(k, _)| k != RUN_AS).map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    if own_group {
        cmd.process_group(0);
    }
    // The tool's own key, never passed on: a chaos run on the replicated stack runs each
    // process with a group id of its own, which its partition rules match (chaos/cluster.rs).
    if let Some((_, gid)) = env.iter().find(|(k, _)| k == RUN_AS) {
        let gid: u32 = gid
            .parse()
            .map_err(|_| anyhow!("{RUN_AS}={gid} is not a group id"))?;
        cmd.gid(gid);
    }
    cmd.spawn()
        .with_context(|| format!("starting {} {command}", exe.display()))
}

/// In a spawn's environment: the group id to run the process with (see [`start_bin`]).
pub const RUN_AS: &str = "LIKES_TOOLS_RUN_AS_GID";

/// Sends SIGTERM (the product drains on it) and waits for the exit.
pub fn stop(p: &mut Proc) {
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    let _ = p.child.wait();
}

/// `(name, value)` pairs for `spawn`'s environment.
pub fn env<const N: usize>(pairs: [(&str, String); N]) -> Vec<(String, String)> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// [`env`], in the namespace (`keyspace`, `topic_prefix`) of a run (crate::names).
pub fn env_in<const N: usize>(
    keyspace: &str,
    topic_prefix: &str,
    pairs: [(&str, String); N],
) -> Vec<(String, String)> {
    crate::names::namespace_env(keyspace, topic_prefix)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(env(pairs))
        .collect()
}
