//! The shared local stack's processes, for the tests that kill them: each such test is a
//! test binary of its own (cargo runs test binaries one at a time), so no other test sees
//! the outage.

/// kill -9 of `kafka` or `cassandra`, as a crashed node dies; returns once it is gone.
pub fn kill9(name: &str) {
    likes_testkit::stack::kill9(&likes_testkit::stack::dir(), name).unwrap();
}

/// Starts whatever of the stack is down and waits until it serves (`stack/stack.sh up`).
pub fn up() {
    likes_testkit::stack::up(&likes_testkit::stack::script())
        .unwrap_or_else(|e| panic!("restarting the stack: {e}"));
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
