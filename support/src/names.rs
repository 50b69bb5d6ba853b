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
    fn names_never_repeat_and_stay_cql_safe() {
        let (a, b) = (super::unique("t"), super::unique("t"));
        assert_ne!(a, b);
        assert!(
            a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{a}"
        );
    }
}
