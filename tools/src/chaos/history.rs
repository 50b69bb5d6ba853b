//! The run's client history, checked edge by edge for linearizability by Porcupine
//! (tools/linearizability, a Go program `make chaos-build` builds): every like, unlike and
//! retry with its request key, and the actor's own reads, each with its call and return times
//! and its answer, or no return when the client cannot know its outcome (docs/testing.md,
//! "Histories and their check").
//!
//! End-state checks cannot see a like that was acknowledged, briefly lost and back, or a read
//! that went back in time; this check does.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};

use crate::loadgen::Recorded;

/// What the checker found (its JSON summary), and where the history is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Linearizability {
    pub operations: usize,
    pub unknown_outcomes: usize,
    pub edges: usize,
    pub linearizable: usize,
    /// Edges whose history no order of its operations explains.
    pub illegal: usize,
    /// Edges the checker could neither prove nor refute within its timeout.
    pub timed_out: usize,
    pub illegal_edges: Vec<String>,
    /// Porcupine's HTML visualization of the illegal edges.
    #[serde(default)]
    pub visualization: Option<String>,
    /// The history checked (JSON lines).
    #[serde(default)]
    pub history: String,
}

impl Linearizability {
    pub fn passed(&self) -> bool {
        self.illegal == 0 && self.edges > 0
    }
}

impl std::fmt::Display for Linearizability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} operations on {} edges ({} outcomes unknown): {} linearizable, {} not, {} undecided",
            self.operations,
            self.edges,
            self.unknown_outcomes,
            self.linearizable,
            self.illegal,
            self.timed_out
        )?;
        if let Some(v) = &self.visualization {
            write!(
                f,
                "; first illegal edges {:?}, see {v}",
                &self.illegal_edges[..self.illegal_edges.len().min(5)]
            )?;
        }
        Ok(())
    }
}

/// The checker binary: `--checker`, else `$LIKES_CACHE/bin/likes-linearizability` (where
/// `make chaos-build` puts it).
pub fn checker(given: Option<&Path>) -> PathBuf {
    given.map(Path::to_path_buf).unwrap_or_else(|| {
        likes_testkit::stack::cache_dir()
            .join("bin")
            .join("likes-linearizability")
    })
}

/// Writes the history (leaving out the edges of `erased` users: their erasure wrote them
/// behind the client's back) beside the run's logs and checks it.
pub fn check(
    history: &[Recorded],
    erased: &[String],
    dir: &Path,
    checker: &Path,
) -> Result<Linearizability> {
    if !checker.exists() {
        return Err(anyhow!(
            "the linearizability checker {} is missing: `make chaos-build` builds it (Go, tools/linearizability)",
            checker.display()
        ));
    }
    let path = dir.join("history.jsonl");
    let mut text = String::new();
    for op in history.iter().filter(|op| !erased.contains(&op.user)) {
        text.push_str(&serde_json::to_string(op).map_err(|e| anyhow!("history: {e}"))?);
        text.push('\n');
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let out = std::process::Command::new(checker)
        .arg("-history")
        .arg(&path)
        .arg("-visualization")
        .arg(dir.join("linearizability.html"))
        .output()
        .with_context(|| format!("running {}", checker.display()))?;
    // Exit 0: linearizable; 1: not (the summary says where); 2: the history was unreadable.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(anyhow!(
            "{} failed ({}): {}",
            checker.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut found: Linearizability =
        serde_json::from_slice(&out.stdout).map_err(|e| anyhow!("the checker's summary: {e}"))?;
    found.history = path.display().to_string();
    Ok(found)
}
