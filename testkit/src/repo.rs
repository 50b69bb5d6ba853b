//! Where the repository is, found when the program runs rather than when it was compiled.
//!
//! The build cache (`~/.cache/likes/target`) is shared by every checkout on a machine, CI's
//! clean clone included, and cargo does not rebuild a crate for moving: a path baked in with
//! `env!("CARGO_MANIFEST_DIR")` can name a checkout that is gone, or another one's files.

use std::path::{Path, PathBuf};

/// The checkout's root: the nearest folder holding `stack/stack.sh`, looking up from the
/// package dir cargo gives a test or `cargo run` at run time, then from the current
/// folder, then from where this crate was compiled.
pub fn root() -> PathBuf {
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    starts
        .into_iter()
        .flatten()
        .find_map(|start| {
            start
                .ancestors()
                .find(|d| is_root(d))
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")))
}

fn is_root(dir: &Path) -> bool {
    dir.join("stack/stack.sh").is_file() && dir.join("Cargo.toml").is_file()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_root_is_this_checkout() {
        // The package dir as cargo gives it when the test runs: a compiled-in path names the
        // checkout the cached binary was built in, maybe another one, maybe gone (CI's).
        let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo");
        let here = std::path::Path::new(&dir).join("..");
        assert_eq!(
            super::root().canonicalize().unwrap(),
            here.canonicalize().unwrap()
        );
    }
}
