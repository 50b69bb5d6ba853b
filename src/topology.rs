//! The topology spec (`topology/topology.toml`): topics with their partitions and configs,
//! the bucket count, the window and tick timing, the dedupe horizon and the consumer groups.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The spec compiled into the binary.
pub const EMBEDDED: &str = include_str!("../topology/topology.toml");

/// The validated topology.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// B: edges of one item spread over this many buckets (CQL partitions and Kafka keys).
    pub buckets: u32,
    /// Window length on the deltas partition's log-append clock.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Stage 1 ticks every deltas partition at least this often.
    #[serde(with = "humantime_serde")]
    pub tick_interval: Duration,
    /// Per-edge dedupe state lives this long: the replay horizon.
    #[serde(with = "humantime_serde")]
    pub dedupe_ttl: Duration,
    /// `like_counts` partitions: one conditional batch fences many items of one shard.
    /// A multiple of the deltas partitions, so each shard has exactly one writer.
    pub counter_shards: u32,
    pub groups: Groups,
    pub topics: Topics,
}

/// Consumer group names of the two stages, and of the recount queue's drain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Groups {
    pub dedupe: String,
    pub count: String,
    /// `likes reconcile --dead-letters` commits here how far into `likes.dlq` it has
    /// recounted (a topology file older than it gets `likes-recount`).
    #[serde(default = "default_recount_group")]
    pub recount: String,
}

fn default_recount_group() -> String {
    "likes-recount".into()
}

/// The topics of the topology, by role.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topics {
    pub events: TopicSpec,
    pub deltas: TopicSpec,
    pub dlq: TopicSpec,
    pub dedupe_changelog: TopicSpec,
}

/// One topic: its name (before the configured prefix), partitions and topic configs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

impl Topology {
    /// Loads `path`, or the embedded spec when `None`, and validates it.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        match path {
            None => Self::parse(EMBEDDED, "embedded topology"),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| Error::Topology(format!("cannot read {}: {e}", p.display())))?;
                Self::parse(&text, &p.display().to_string())
            }
        }
    }

    /// Parses and validates a spec; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let t: Topology =
            toml::from_str(text).map_err(|e| Error::Topology(format!("{origin}: {e}")))?;
        t.validate()
            .map_err(|m| Error::Topology(format!("{origin}: {m}")))?;
        Ok(t)
    }

    /// This topology with another window length, validated like a loaded one (the tick
    /// interval shrinks to a fifth of the window when it would not fit).
    pub fn with_window(mut self, window: Duration) -> Result<Self> {
        self.window = window;
        if self.tick_interval >= window {
            self.tick_interval = window / 5;
        }
        self.validate()
            .map_err(|e| Error::Topology(format!("--window: {e}")))?;
        Ok(self)
    }

    /// The `like_counts` partition of an item. Because `counter_shards` is a multiple of the
    /// deltas partitions, `shard % partitions` is the item's deltas partition: one writer.
    pub fn counter_shard(&self, item_id: &str) -> i32 {
        crate::hash::partition_for(item_id.as_bytes(), self.counter_shards) as i32
    }

    /// Every topic with its role, in creation order.
    pub fn topics(&self) -> [(&'static str, &TopicSpec); 4] {
        [
            ("events", &self.topics.events),
            ("deltas", &self.topics.deltas),
            ("dlq", &self.topics.dlq),
            ("dedupe_changelog", &self.topics.dedupe_changelog),
        ]
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=4096).contains(&self.buckets) {
            return Err(format!("buckets = {} must be in 1..=4096", self.buckets));
        }
        if self.window < Duration::from_millis(100) {
            return Err(format!("window = {:?} must be at least 100ms", self.window));
        }
        if self.tick_interval.is_zero() || self.tick_interval >= self.window {
            return Err(format!(
                "tick_interval = {:?} must be above zero and below window = {:?}, or idle partitions would hold windows open",
                self.tick_interval, self.window
            ));
        }
        let deltas = self.topics.deltas.partitions.max(1) as u32;
        if !(1..=65_536).contains(&self.counter_shards)
            || !self.counter_shards.is_multiple_of(deltas)
        {
            return Err(format!(
                "counter_shards = {} must be in 1..=65536 and a multiple of topics.deltas.partitions = {deltas}, so each shard has one writer",
                self.counter_shards
            ));
        }
        if self.dedupe_ttl < self.window {
            return Err("dedupe_ttl must be at least one window".into());
        }
        if self.groups.dedupe.is_empty()
            || self.groups.count.is_empty()
            || self.groups.dedupe == self.groups.count
        {
            return Err("groups.dedupe and groups.count must be non-empty and distinct".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for (role, t) in self.topics() {
            if t.name.is_empty() || t.name.len() > 200 || !t.name.chars().all(is_topic_char) {
                return Err(format!(
                    "topics.{role}.name {:?} must be 1-200 ASCII letters, digits, '.', '_' or '-'",
                    t.name
                ));
            }
            if !(1..=10_000).contains(&t.partitions) {
                return Err(format!("topics.{role}.partitions must be in 1..=10000"));
            }
            if !names.insert(&t.name) {
                return Err(format!("topics.{role}.name {:?} is used twice", t.name));
            }
        }
        // Invariants the stages rely on, checked here so a bad spec never reaches a cluster.
        if self.topics.deltas.config.get("message.timestamp.type")
            != Some(&"LogAppendTime".to_string())
        {
            return Err(
                "topics.deltas.config must set message.timestamp.type = \"LogAppendTime\": windows are a function of the log"
                    .into(),
            );
        }
        if !self
            .topics
            .dedupe_changelog
            .config
            .get("cleanup.policy")
            .is_some_and(|p| p.contains("compact"))
        {
            return Err(
                "topics.dedupe_changelog.config must set cleanup.policy = \"compact\"".into(),
            );
        }
        if self.topics.dedupe_changelog.partitions != self.topics.events.partitions {
            return Err(
                "topics.dedupe_changelog.partitions must equal topics.events.partitions: a changelog partition holds one events partition's state"
                    .into(),
            );
        }
        self.changelog_keeps_the_horizon()
    }

    /// Stage 1 rebuilds a lost disk from the changelog: an edge's state deleted from it while
    /// the horizon still vouches for it would be "nothing remembered" inside the horizon,
    /// and an unlike would count 0 against its counted like, silently (issue 56). So with
    /// `delete` in its cleanup policy the changelog must keep records at least `dedupe_ttl`
    /// (`retention.ms` named here, so the broker's default cannot decide it; -1: forever).
    fn changelog_keeps_the_horizon(&self) -> Result<(), String> {
        let config = &self.topics.dedupe_changelog.config;
        if !config
            .get("cleanup.policy")
            .is_some_and(|p| p.split(',').any(|x| x.trim() == "delete"))
        {
            return Ok(());
        }
        let horizon_ms = self.dedupe_ttl.as_millis();
        let why = match config.get("retention.ms").map(|v| v.trim().parse::<i64>()) {
            None => "is not set (the broker's default would decide it)".to_string(),
            Some(Err(_)) => "is not a number of milliseconds".to_string(),
            Some(Ok(-1)) => return Ok(()),
            Some(Ok(ms)) if ms >= 0 && ms as u128 >= horizon_ms => return Ok(()),
            Some(Ok(ms)) => format!("is {ms} ms, below it"),
        };
        Err(format!(
            "topics.dedupe_changelog.config \"retention.ms\" {why}: with cleanup.policy \"delete\" \
             it must be at least dedupe_ttl ({horizon_ms} ms), or a lost stage-1 disk is rebuilt \
             without edges the horizon still vouches for; raise it with dedupe_ttl (or set -1)"
        ))
    }
}

/// A character Kafka accepts in a topic name.
pub fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_spec_is_valid() {
        let t = Topology::load(None).unwrap();
        assert_eq!(t.buckets, 64);
        assert_eq!(t.window, Duration::from_secs(1));
        assert_eq!(t.tick_interval, Duration::from_millis(200));
        assert_eq!(t.dedupe_ttl, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(t.topics.events.name, "likes.events");
    }

    #[test]
    fn a_counter_shard_has_one_writer() {
        let t = Topology::load(None).unwrap();
        let partitions = t.topics.deltas.partitions as u32;
        for i in 0..1000 {
            let item = format!("item-{i}");
            let partition = crate::hash::partition_for(item.as_bytes(), partitions) as i32;
            assert_eq!(
                t.counter_shard(&item) % partitions as i32,
                partition,
                "{item}"
            );
        }
    }

    #[test]
    fn a_bench_window_keeps_the_tick_inside_it() {
        let t = Topology::load(None)
            .unwrap()
            .with_window(Duration::from_millis(150))
            .unwrap();
        assert!(t.tick_interval < t.window);
        assert!(Topology::load(None)
            .unwrap()
            .with_window(Duration::from_millis(10))
            .is_err());
    }

    fn edited(from: &str, to: &str) -> Result<Topology> {
        assert!(EMBEDDED.contains(from), "fixture drifted: {from}");
        Topology::parse(&EMBEDDED.replacen(from, to, 1), "test")
    }

    #[test]
    fn rejects_specs_that_break_invariants() {
        let cases = [
            ("buckets = 64", "buckets = 0", "buckets"),
            (
                "tick_interval = \"200ms\"",
                "tick_interval = \"2s\"",
                "tick_interval",
            ),
            (
                "\"message.timestamp.type\" = \"LogAppendTime\"",
                "\"message.timestamp.type\" = \"CreateTime\"",
                "LogAppendTime",
            ),
            (
                "name = \"likes.dlq\"",
                "name = \"likes.events\"",
                "used twice",
            ),
            (
                "counter_shards = 256",
                "counter_shards = 260",
                "multiple of topics.deltas.partitions",
            ),
            (
                "name = \"likes.dlq\"",
                "name = \"likes dlq\"",
                "topics.dlq.name",
            ),
            (
                "partitions = 8",
                "partitions = 0",
                "topics.deltas.partitions",
            ),
            ("buckets = 64", "buckets = 64\nbucket = 3", "unknown field"),
        ];
        for (from, to, needle) in cases {
            let err = edited(from, to).unwrap_err().to_string();
            assert!(err.contains(needle), "{to}: {err}");
        }
    }

    #[test]
    fn changelog_retention_must_cover_the_horizon() {
        // Issue 56: a 14-day horizon over a 7-day changelog was taken as is.
        let err = edited("dedupe_ttl = \"7d\"", "dedupe_ttl = \"14d\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("retention.ms") && err.contains("dedupe_ttl"),
            "{err}"
        );
        let changelog = "\"cleanup.policy\" = \"compact,delete\"\n\"retention.ms\" = \"604800000\"";
        assert!(EMBEDDED.contains(changelog), "fixture drifted");
        let with = |retention: &str| {
            let text = EMBEDDED
                .replacen("dedupe_ttl = \"7d\"", "dedupe_ttl = \"14d\"", 1)
                .replacen(changelog, retention, 1);
            Topology::parse(&text, "test")
        };
        assert!(
            with("\"cleanup.policy\" = \"compact,delete\"\n\"retention.ms\" = \"1209600000\"")
                .is_ok()
        );
        assert!(with("\"cleanup.policy\" = \"compact,delete\"\n\"retention.ms\" = \"-1\"").is_ok());
        assert!(
            with("\"cleanup.policy\" = \"compact\"").is_ok(),
            "compacted only: nothing expires"
        );
        let unset = with("\"cleanup.policy\" = \"compact,delete\"")
            .unwrap_err()
            .to_string();
        assert!(unset.contains("is not set"), "{unset}");
    }

    #[test]
    fn changelog_must_match_events_partitions() {
        let text = EMBEDDED.replacen("partitions = 16", "partitions = 12", 1);
        let err = Topology::parse(&text, "test").unwrap_err().to_string();
        assert!(err.contains("dedupe_changelog.partitions"), "{err}");
    }
}
