//! Where an import stands, in its state directory (docs/adoption.md, "Resuming"):
//! `checkpoint.json` (replaced atomically), `rejects.jsonl` (one line per rejected row, with
//! its reason) and `items.txt` (every item with an accepted row, written or found already there, for `likes reconcile
//! --items-from`). The checkpoint names the rows before which every row is settled and the
//! length each side file had then, so a resumed run cuts the side files back to those
//! lengths and redoes only rows after it (whose writes are conditional: redoing one
//! changes nothing).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::source::{Format, Mapping};
use crate::error::{Error, Result};

/// The file the import reads, as far as telling it from another goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub path: String,
    pub size: u64,
    pub modified_ms: i64,
}

impl FileId {
    pub fn of(path: &Path) -> Result<FileId> {
        let meta =
            std::fs::metadata(path).map_err(Error::io(format!("reading {}", path.display())))?;
        let modified_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        Ok(FileId {
            path: path
                .canonicalize()
                .unwrap_or_else(|_| path.to_path_buf())
                .display()
                .to_string(),
            size: meta.len(),
            modified_ms,
        })
    }
}

/// What the rows before `rows_done` came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Edges written (new rows, and the import's own rows replaced by a newer source row).
    pub loaded: u64,
    /// The import's own rows replaced by a later row of the same edge.
    #[serde(default)]
    pub updated: u64,
    /// Rows that changed nothing, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Rows refused (each with its reason in rejects.jsonl).
    pub rejected: u64,
}

impl Tally {
    pub fn rows(&self) -> u64 {
        self.loaded + self.updated + self.rejected + self.skipped.values().sum::<u64>()
    }

    /// Another part's tally, added to this one (an export in parts).
    pub fn add(&mut self, o: &Tally) {
        self.loaded += o.loaded;
        self.updated += o.updated;
        self.rejected += o.rejected;
        for (why, n) in &o.skipped {
            *self.skipped.entry(why.clone()).or_default() += n;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub file: FileId,
    pub format: Format,
    pub mapping: Mapping,
    pub keyspace: String,
    /// The import's clock at its first start, kept so a resumed run shapes rows as the
    /// first did (`row::Shape`).
    pub started_ms: i64,
    pub rows_done: u64,
    pub tally: Tally,
    pub rejects_len: u64,
    pub items_len: u64,
    pub finished: bool,
}

pub struct StateDir {
    pub dir: PathBuf,
}

impl StateDir {
    pub fn open(dir: &Path) -> Result<StateDir> {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(StateDir {
            dir: dir.to_path_buf(),
        })
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.dir.join("checkpoint.json")
    }

    pub fn rejects_path(&self) -> PathBuf {
        self.dir.join("rejects.jsonl")
    }

    pub fn items_path(&self) -> PathBuf {
        self.dir.join("items.txt")
    }

    pub fn load(&self) -> Result<Option<Checkpoint>> {
        let p = self.checkpoint_path();
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                Error::State(format!(
                    "{}: {e}; not an import checkpoint (remove it to start over)",
                    p.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", p.display()))(e)),
        }
    }

    /// Writes the checkpoint whole or not at all (a kill -9 mid-write leaves the last one).
    pub fn save(&self, c: &Checkpoint) -> Result<()> {
        let p = self.checkpoint_path();
        let tmp = p.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(c).map_err(|e| Error::State(e.to_string()))?;
        let mut f = File::create(&tmp).map_err(Error::io(format!("creating {}", tmp.display())))?;
        f.write_all(&body)
            .and_then(|_| f.sync_data())
            .map_err(Error::io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &p).map_err(Error::io(format!("renaming to {}", p.display())))
    }

    /// A side file opened for appending, first cut back to `len` (what the checkpoint saw).
    pub fn side_file(&self, path: &Path, len: u64) -> Result<File> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(Error::io(format!("opening {}", path.display())))?;
        f.set_len(len)
            .map_err(Error::io(format!("truncating {}", path.display())))?;
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_survives_a_round_trip_and_side_files_are_cut_back() {
        let dir = std::env::temp_dir().join(format!("likes-ckpt-{}", rand::random::<u32>()));
        let s = StateDir::open(&dir).unwrap();
        assert_eq!(s.load().unwrap(), None);
        let c = Checkpoint {
            file: FileId {
                path: "/x.csv".into(),
                size: 9,
                modified_ms: 1,
            },
            format: Format::Csv,
            mapping: Mapping {
                item: "i".into(),
                user: "u".into(),
                liked: None,
                time: "t".into(),
            },
            keyspace: "k".into(),
            started_ms: 5,
            rows_done: 10,
            tally: Tally {
                loaded: 7,
                updated: 0,
                skipped: BTreeMap::from([("dup".to_string(), 2)]),
                rejected: 1,
            },
            rejects_len: 3,
            items_len: 0,
            finished: false,
        };
        s.save(&c).unwrap();
        assert_eq!(s.load().unwrap(), Some(c.clone()));
        assert_eq!(c.tally.rows(), 10);
        let p = s.rejects_path();
        std::fs::write(&p, "abcdef").unwrap();
        let mut f = s.side_file(&p, 3).unwrap();
        f.write_all(b"Z").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "abcZ");
    }
}
