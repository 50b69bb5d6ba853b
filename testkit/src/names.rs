//! Namespaces on the shared stack: a keyspace and a topic prefix of a run's own, so runs side
//! by side (tests in parallel, a benchmark beside a demo) never see each other's data.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A name no other test or run uses: `<base>_<pid>_<millis>_<n>`, CQL- and Kafka-safe.
pub fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        % 100_000_000;
    format!(
        "{base}_{}_{ms}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The process that named `namespace` with [`unique`] (a keyspace, or a topic's prefix up to
/// its first dot), if it is such a name: `<base>_<pid>_<millis>_<n>`.
pub fn owner_pid(namespace: &str) -> Option<u32> {
    let namespace = namespace.split('.').next()?;
    let mut parts = namespace.rsplitn(4, '_');
    let (n, ms, pid, base) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // As `unique` writes them: no leading zeros, millis below 10^8, a pid Linux can give
    // (pid_max is at most 2^22). A date-like `likes_2024_06_01` is not one.
    let number = |s: &str, max_len: usize| {
        !s.is_empty()
            && s.len() <= max_len
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'))
    };
    if base.is_empty() || !number(n, 10) || !number(ms, 8) || !number(pid, 7) {
        return None;
    }
    pid.parse().ok().filter(|&p: &u32| p > 0 && p <= 1 << 22)
}

/// A namespace [`unique`] named whose process has exited: what a test run that failed, or
/// was killed, left on the stack (a passing test drops its own). Namespaces of processes
/// still alive (a run beside this one) and every other name are never this.
pub fn is_left_behind(namespace: &str) -> bool {
    owner_pid(namespace).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// The environment that makes a `likes` child process use `keyspace` and `topic_prefix`
/// (configuration's `cql.keyspace` and `kafka.topic_prefix`).
pub fn namespace_env(keyspace: &str, topic_prefix: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LIKES__CQL__KEYSPACE", keyspace.to_string()),
        ("LIKES__KAFKA__TOPIC_PREFIX", topic_prefix.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_names_of_exited_processes_are_left_behind() {
        let mine = super::unique("regions_move");
        assert_eq!(super::owner_pid(&mine), Some(std::process::id()));
        assert!(!super::is_left_behind(&mine));
        assert!(!super::is_left_behind(&format!("{mine}.b.likes.events")));
        // A pid nothing runs under now, counting down from Linux's largest.
        let gone = (1..=1u32 << 22)
            .rev()
            .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .unwrap();
        assert!(super::is_left_behind(&format!(
            "regions_down_{gone}_91333182_1.a.likes.dlq"
        )));
        for other in [
            "likes",
            "chaos_2_177791",
            "demo.likes.events",
            "__consumer_offsets",
            "a_1_x_2",
            "likes_2024_06_01",
            "t_99999999_1_0",
        ] {
            assert_eq!(super::owner_pid(other), None, "{other}");
        }
    }

    #[test]
    fn names_never_repeat_and_stay_cql_safe() {
        let (a, b) = (super::unique("t"), super::unique("t"));
        assert_ne!(a, b);
        assert!(
            a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{a}"
        );
    }
}
