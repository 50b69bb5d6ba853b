//! Linking the prebuilt RocksDB that `stack/rocksdb.sh` caches (docs/building.md), for the
//! build scripts of every package whose binaries link it (`likes`, `likes-tools`): fail at once
//! with the fix when the library is absent (instead of after minutes of compiling, at the
//! link), and give the binaries an rpath so they find it without LD_LIBRARY_PATH.

use std::path::Path;

/// Where an installed `likes` finds the library: `<prefix>/lib/likes/librocksdb.so` beside
/// `<prefix>/bin/likes` (the image's layout, `image/rootfs.sh`).
const INSTALLED: &str = "$ORIGIN/../lib/likes";

pub fn link() {
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
    println!("cargo:rerun-if-env-changed=ROCKSDB_COMPILE");
    let compile = std::env::var("ROCKSDB_COMPILE").unwrap_or_default();
    if compile == "1" || compile.eq_ignore_ascii_case("true") {
        return; // the bundled RocksDB, compiled from source and linked statically
    }
    let Ok(dir) = std::env::var("ROCKSDB_LIB_DIR") else {
        return; // no prebuilt library named: the rocksdb crate compiles its own
    };
    let lib = Path::new(&dir).join("librocksdb.so");
    println!("cargo:rerun-if-changed={}", lib.display());
    let Ok(lib) = lib.canonicalize() else {
        // A message and an exit, not a panic: the person reading it needs the command, not a
        // backtrace of this script.
        eprintln!(
            "\n\nRocksDB's prebuilt library is not at {}.\n\
             Fetch it once (Maven Central's rocksdbjni, cached in ~/.cache/likes/rocksdb):\n\n    \
             stack/rocksdb.sh\n\n\
             (`make build`, `make test` and `make demo` run it for you.) To compile RocksDB from \
             source instead (15+ minutes), set ROCKSDB_COMPILE=1. See docs/building.md.\n",
            lib.display()
        );
        std::process::exit(1);
    };
    let cached = lib.parent().expect("a file has a parent directory");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cached.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{INSTALLED}");
}
