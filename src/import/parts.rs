//! An export in parts (docs/adoption.md, "An export in parts"): warehouses and Spark write a
//! directory of part files, not one file. Each part is imported as a file of its own, with its
//! own checkpoint under `<state dir>/parts/`, one after another in name order, so a killed run
//! resumes inside the part it was in and skips the parts already done. The list of parts is
//! fixed by the first run (`parts.json`): a part added or removed later is refused, not
//! silently left out. Once every part is in, the parts' items and rejects are joined into the
//! state directory's own `items.txt` and `rejects.jsonl`, where a single file's would be.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::checkpoint::StateDir;
use super::source::Format;
use crate::error::{Error, Result};

/// The data files the paths name: a file as it is; a directory's files, walked in name order,
/// without what export tools leave beside them (names starting with `_` or `.`: `_SUCCESS`,
/// `_delta_log/`, `.part-0.crc`) and without the state directory if it lies inside.
pub fn expand(paths: &[PathBuf], state_dir: &Path) -> Result<Vec<PathBuf>> {
    let state = state_dir.canonicalize().ok();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(Error::io(format!("reading {}", p.display())))?;
        let found = if meta.is_dir() {
            let mut files = Vec::new();
            walk(p, state.as_deref(), &mut files)?;
            if files.is_empty() {
                return Err(Error::Input(format!(
                    "{}: no data files in it (names starting with _ or . are skipped)",
                    p.display()
                )));
            }
            files
        } else {
            vec![p.clone()]
        };
        for f in found {
            let key = f.canonicalize().unwrap_or_else(|_| f.clone());
            // One file named twice (a directory and a file in it): imported once.
            if seen.insert(key) {
                out.push(f);
            }
        }
    }
    Ok(out)
}

fn walk(dir: &Path, skip: Option<&Path>, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(Error::io(format!("listing {}", dir.display())))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(Error::io(format!("listing {}", dir.display())))?;
    entries.sort();
    for e in entries {
        let name = e.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('_') || name.starts_with('.') {
            continue;
        }
        if skip.is_some_and(|s| e.canonicalize().is_ok_and(|c| c == s)) {
            continue;
        }
        if e.is_dir() {
            walk(&e, skip, out)?;
        } else {
            out.push(e);
        }
    }
    Ok(())
}

/// Each part's format, all told before anything is written: a part whose format cannot be
/// told stops the import at its start, not halfway through.
pub fn formats(files: &[PathBuf], given: Option<Format>) -> Result<Vec<Format>> {
    files
        .iter()
        .map(|f| given.map_or_else(|| Format::of_path(f), Ok))
        .collect()
}

/// Where part `i`'s checkpoint and side files live.
pub fn part_dir(state: &StateDir, i: usize, file: &Path) -> PathBuf {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("part");
    state.dir.join("parts").join(format!("{i:05}-{name}"))
}

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct Manifest {
    /// The parts, canonical paths, in the order they are imported.
    files: Vec<String>,
}

fn canonical(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| {
            f.canonicalize()
                .unwrap_or_else(|_| f.clone())
                .display()
                .to_string()
        })
        .collect()
}

/// Records the parts on the first run; on a later one, refuses a different list (a part
/// added would be imported out of the list's order, a part removed would be left half done).
pub fn fix_manifest(state: &StateDir, files: &[PathBuf]) -> Result<()> {
    let path = state.dir.join("parts.json");
    let now = Manifest {
        files: canonical(files),
    };
    match std::fs::read(&path) {
        Ok(b) => {
            let before: Manifest = serde_json::from_slice(&b).map_err(|e| {
                Error::State(format!(
                    "{}: {e}; not an import's list of parts",
                    path.display()
                ))
            })?;
            if before == now {
                return Ok(());
            }
            let (was, is): (BTreeSet<_>, BTreeSet<_>) =
                (before.files.iter().collect(), now.files.iter().collect());
            let added: Vec<_> = is.difference(&was).take(3).collect();
            let gone: Vec<_> = was.difference(&is).take(3).collect();
            Err(Error::Input(format!(
                "the export's parts differ from those {} started with (added {added:?}, gone \
                 {gone:?}); import new parts with another --state-dir, or delete that one to \
                 start over (which changes nothing already imported)",
                state.dir.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let body = serde_json::to_vec_pretty(&now).map_err(|e| Error::State(e.to_string()))?;
            write_whole(&path, |w| w.write_all(&body))
        }
        Err(e) => Err(Error::io(format!("reading {}", path.display()))(e)),
    }
}

/// The parts' `items.txt` and `rejects.jsonl`, joined into the state directory's own, in the
/// parts' order (each written whole: a kill leaves the last whole one or none).
pub fn join_side_files(state: &StateDir, part_dirs: &[PathBuf]) -> Result<()> {
    for target in [state.items_path(), state.rejects_path()] {
        let name = target.file_name().expect("a file name").to_owned();
        write_whole(&target, |w| {
            for d in part_dirs {
                match std::fs::File::open(d.join(&name)) {
                    Ok(f) => {
                        for line in BufReader::new(f).lines() {
                            writeln!(w, "{}", line?)?;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}

fn write_whole(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let io = Error::io(format!("writing {}", path.display()));
    let f = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = BufWriter::new(f);
    body(&mut w)
        .and_then(|_| w.flush())
        .and_then(|_| w.get_ref().sync_data())
        .map_err(Error::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(Error::io(format!("renaming to {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        let d = std::env::temp_dir().join(format!("likes-parts-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_directory_is_its_data_files_in_name_order_without_the_bookkeeping() {
        let d = scratch();
        let export = d.join("export");
        for f in [
            "part-1.csv",
            "part-0.csv",
            "_SUCCESS",
            ".part-0.csv.crc",
            "dt=2/part-0.jsonl",
            "_temporary/part-9.csv",
            "state/checkpoint.json",
        ] {
            let p = export.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x").unwrap();
        }
        let state = export.join("state");
        let names = |v: Vec<PathBuf>| -> Vec<String> {
            v.iter()
                .map(|p| p.strip_prefix(&export).unwrap().display().to_string())
                .collect()
        };
        let files = expand(std::slice::from_ref(&export), &state).unwrap();
        assert_eq!(
            names(files.clone()),
            ["dt=2/part-0.jsonl", "part-0.csv", "part-1.csv"]
        );
        // A file named beside its directory is imported once.
        let again = expand(&[export.clone(), export.join("part-1.csv")], &state).unwrap();
        assert_eq!(again, files);
        assert_eq!(
            formats(&files, None).unwrap(),
            [Format::Jsonl, Format::Csv, Format::Csv]
        );
        std::fs::write(export.join("notes.txt"), "x").unwrap();
        let files = expand(std::slice::from_ref(&export), &state).unwrap();
        let err = formats(&files, None).unwrap_err().to_string();
        assert!(err.contains("notes.txt"), "{err}");
        let empty = d.join("empty");
        std::fs::create_dir_all(empty.join("_SUCCESS")).unwrap();
        let err = expand(&[empty], &state).unwrap_err().to_string();
        assert!(err.contains("no data files"), "{err}");
    }

    #[test]
    fn the_list_of_parts_is_fixed_by_the_first_run() {
        let d = scratch();
        let (a, b) = (d.join("a.csv"), d.join("b.csv"));
        std::fs::write(&a, "x").unwrap();
        std::fs::write(&b, "x").unwrap();
        let state = StateDir::open(&d.join("state")).unwrap();
        fix_manifest(&state, std::slice::from_ref(&a)).unwrap();
        fix_manifest(&state, std::slice::from_ref(&a)).unwrap();
        let err = fix_manifest(&state, &[a.clone(), b.clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("b.csv") && err.contains("added"), "{err}");
    }

    #[test]
    fn side_files_join_in_the_parts_order() {
        let d = scratch();
        let state = StateDir::open(&d.join("state")).unwrap();
        let parts: Vec<PathBuf> = (0..3).map(|i| d.join(format!("p{i}"))).collect();
        std::fs::create_dir_all(&parts[0]).unwrap();
        std::fs::create_dir_all(&parts[2]).unwrap();
        std::fs::write(parts[0].join("items.txt"), "a\nb\n").unwrap();
        std::fs::write(parts[2].join("items.txt"), "c\n").unwrap();
        std::fs::write(parts[2].join("rejects.jsonl"), "{\"row\":3}\n").unwrap();
        join_side_files(&state, &parts).unwrap();
        assert_eq!(
            std::fs::read_to_string(state.items_path()).unwrap(),
            "a\nb\nc\n"
        );
        assert_eq!(
            std::fs::read_to_string(state.rejects_path()).unwrap(),
            "{\"row\":3}\n"
        );
    }
}
