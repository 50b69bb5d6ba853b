//! The shared local stack's processes, for the tests that kill them: each such test is a
//! test binary of its own (cargo runs test binaries one at a time), so no other test sees
//! the outage.

use std::path::PathBuf;

/// Where `stack/stack.sh` keeps its pid files.
pub fn dir() -> PathBuf {
    std::env::var_os("LIKES_STACK_DIR")
        .map(Into::into)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("LIKES_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/likes")
                });
            cache.join("stack")
        })
}

/// kill -9 of `kafka` or `cassandra`, as a crashed node dies.
pub fn kill9(name: &str) {
    let pidfile = dir().join(format!("{name}.pid"));
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("{}: {e} (is the stack up?)", pidfile.display()));
    let killed = std::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {name}");
    // Gone for good before anyone starts it again.
    while std::path::Path::new(&format!("/proc/{}", pid.trim())).exists() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Starts whatever of the stack is down and waits until it serves (`stack/stack.sh up`).
pub fn up() {
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/stack/stack.sh"))
        .arg("up")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restarting the stack: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Brings the stack back up when dropped, so a failing kill test leaves a running stack
/// for the tests after it.
pub struct UpOnDrop;

impl Drop for UpOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            up();
        }
    }
}
