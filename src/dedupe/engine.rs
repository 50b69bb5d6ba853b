//! Which RocksDB this process runs, for `likes --version`: the library is linked at run time
//! (the prebuilt one `stack/rocksdb.sh` caches, or the bundled one compiled in; see
//! docs/building.md), so the version is asked of the library itself, not of the build.

use std::path::{Path, PathBuf};

/// What `likes --version` says of RocksDB: its version, and the file it was loaded from (or
/// that it was compiled into the binary).
pub fn describe() -> String {
    let version = running_version().unwrap_or_else(|e| format!("unknown ({e})"));
    match loaded_from() {
        Some(path) => format!("RocksDB {version} ({})", path.display()),
        None => format!("RocksDB {version} (compiled into the binary)"),
    }
}

/// The C API has no version call, but every DB it opens writes an OPTIONS file naming the
/// library's version (`rocksdb_version=11.8.1`): open a throwaway one and read it.
fn running_version() -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("likes-rocksdb-version-{}", std::process::id()));
    let found = (|| {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        drop(rocksdb::DB::open(&opts, &dir).map_err(|e| e.to_string())?);
        options_file_version(&dir)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    found
}

fn options_file_version(dir: &Path) -> Result<String, String> {
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let is_options = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("OPTIONS-"));
        if !is_options {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        if let Some(v) = version_line(&text) {
            return Ok(v.to_string());
        }
    }
    Err("no OPTIONS file named a version".into())
}

fn version_line(options: &str) -> Option<&str> {
    options
        .lines()
        .find_map(|l| l.trim().strip_prefix("rocksdb_version="))
        .map(str::trim)
}

extern "C" {
    /// Any symbol of RocksDB's C API: where it lives says where RocksDB was loaded from.
    fn rocksdb_options_create() -> *mut std::ffi::c_void;
}

/// The shared library RocksDB was loaded from, if it is one: asked of the dynamic loader
/// (`dladdr`), which needs no /proc (the image's smoke run may be a chroot without it).
fn loaded_from() -> Option<PathBuf> {
    let symbol = rocksdb_options_create as *const std::ffi::c_void;
    // SAFETY: dladdr only reads the loader's tables for this address and fills `info`, which
    // is plain data; dli_fname, when set, is a NUL-terminated string the loader owns for the
    // life of the process.
    let name = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(symbol, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    };
    let path = PathBuf::from(name);
    let is_library = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("librocksdb"));
    // The loader's path may go through the rpath's `$ORIGIN/..`: show where it leads.
    is_library.then(|| path.canonicalize().unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_from_an_options_file() {
        let text = "[Version]\n  rocksdb_version=11.8.1\n  options_file_version=1.1\n";
        assert_eq!(version_line(text), Some("11.8.1"));
        assert_eq!(version_line("[DBOptions]\n"), None);
    }

    #[test]
    fn the_running_library_names_its_version() {
        let v = running_version().unwrap();
        assert!(
            v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()),
            "{v}"
        );
    }
}
