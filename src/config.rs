//! Settings: the embedded `config/default.toml`, then an optional file, then environment
//! variables `LIKES__SECTION__KEY`. Typed, validated at start, unknown keys rejected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The defaults compiled into the binary.
pub const DEFAULTS: &str = include_str!("../config/default.toml");

/// Everything a `likes` process is configured with.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub cql: CqlSettings,
    pub dedupe: DedupeSettings,
    pub count: CountSettings,
    pub metrics: MetricsSettings,
    pub api: ApiSettings,
    pub topology: TopologySettings,
    pub log: LogSettings,
    pub ops: OpsSettings,
    pub region: RegionSettings,
}

/// Home regions (docs/multi-region.md). Without a `name`, one region: no range table is read
/// and every item's writes are this deployment's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionSettings {
    /// This process's region, as the range table names homes.
    #[serde(default)]
    pub name: Option<String>,
    /// How often a writer reads the range table again.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
    /// A writer starts a write only with a view of the range table younger than this
    /// (counted from when it sent the read); a move waits it out (plus the write's deadline
    /// and one CQL timeout) before the new home takes the range.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How many ranges `likes region init` splits the items into (hash of the item id).
    pub ranges: u32,
    /// Each other region's API, `https://host:port` (or `http://` where a mesh encrypts),
    /// where writes of its items are forwarded with the user's token. A region missing here is
    /// not forwarded to: its items' writes answer 503 `not_home`.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    /// PEM file of the CA that signs the peers' certificates: the only root trusted for
    /// `https://` peers.
    #[serde(default)]
    pub peer_ca: String,
    /// PEM files of this region's client certificate and key, presented to peers that ask for
    /// one (`api.tls_client_ca` there).
    #[serde(default)]
    pub peer_cert: String,
    #[serde(default)]
    pub peer_key: String,
    /// Forwards in flight at once, to all peers: past it a forward is refused at once (503),
    /// so a slow or hung home holds this many requests, never this region's own write slots.
    #[serde(default = "default_max_forwards")]
    pub max_forwards_in_flight: usize,
}

fn default_connections_per_shard() -> usize {
    1
}

fn default_max_forwards() -> usize {
    64
}

/// The operations jobs: erase, drift, reconcile, rebuild.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsSettings {
    pub erase_rate: f64,
    #[serde(with = "humantime_serde")]
    pub erase_purge_after: Duration,
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    pub recount_concurrency: usize,
}

/// A secret as `likes config` prints it: whether it is set, never its bytes (issue 44: the
/// session key and the admin token were printed whole).
fn redacted<S: serde::Serializer>(secret: &str, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(if secret.is_empty() { "" } else { "***" })
}

impl std::fmt::Debug for ApiSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field as serialized, so the secrets show as `likes config` shows them.
        match serde_json::to_string(self) {
            Ok(json) => write!(f, "ApiSettings {json}"),
            Err(_) => f.write_str("ApiSettings { .. }"),
        }
    }
}

/// The HTTP API (`likes api`).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// host:port to serve on.
    pub listen: String,
    /// HMAC-SHA256 key of session tokens; `likes api` refuses to start without one. Printed
    /// (`likes config`, Debug) only as whether it is set.
    #[serde(serialize_with = "redacted")]
    pub session_key: String,
    /// The credential of `POST /v1/admin/retractions` (header X-Admin-Token); empty or under
    /// 32 bytes disables the endpoint. Printed only as whether it is set.
    #[serde(serialize_with = "redacted")]
    pub admin_token: String,
    /// Removed: request keys live on the edge row, so there is no claim to take over.
    /// Accepted (and warned about at start) so that a configuration of an earlier version
    /// still loads during a rolling upgrade.
    #[serde(default, with = "humantime_serde", skip_serializing)]
    pub claim_takeover: Option<Duration>,
    /// Writes in flight past which new writes get 503 + Retry-After at once: the ceiling of
    /// the adaptive limit (src/api/limit.rs).
    pub max_writes_in_flight: usize,
    /// The p99 latency the adaptive limit keeps admitted writes under (0: a fixed bound at
    /// `max_writes_in_flight`).
    #[serde(with = "humantime_serde")]
    pub write_latency_target: Duration,
    /// Writes a second past which new writes get 429 + Retry-After (0: no rate bound).
    pub max_writes_per_s: f64,
    /// Each acting user's share: writes a second past which that user's writes get 429 +
    /// Retry-After while everyone else's go on (0: no per-user bound).
    pub max_writes_per_user_per_s: f64,
    /// The writes one user may make at once before `max_writes_per_user_per_s` applies.
    pub user_write_burst: f64,
    /// Run the relay inside `likes api` too.
    pub relay: bool,
    /// How often the relay walks the outbox.
    #[serde(with = "humantime_serde")]
    pub relay_interval: Duration,
    /// A relay drains an outbox shard only while it holds its lease (`outbox_lease`), so the
    /// relays of many pods do not all publish the same entries; a dead relay's shards free
    /// up after this long (0s: no leases).
    #[serde(with = "humantime_serde")]
    pub relay_lease: Duration,
    /// Outbox entries younger than this belong to requests in flight; the relay leaves them.
    /// Must exceed `write_deadline` + `cql.request_timeout` + 2 × `cql.max_clock_skew`
    /// (checked at start).
    #[serde(with = "humantime_serde")]
    pub relay_min_age: Duration,
    /// How often each API pod reads the erasures of the last minutes into its set of erased
    /// accounts, so that a write asks the database only about an account in the set (or
    /// when the set is five intervals old). "0s": no set, every user's write reads
    /// `erased_users` (src/write/erased_set.rs).
    #[serde(with = "humantime_serde")]
    pub erased_refresh: Duration,
    /// A write that has not finished this long after it started fails with 503; the
    /// client retries with the same key.
    #[serde(with = "humantime_serde")]
    pub write_deadline: Duration,
    /// PEM files of the API's certificate chain and key: set, it serves HTTPS only (the
    /// regions' peers, src/api/tls.rs).
    #[serde(default)]
    pub tls_cert: String,
    #[serde(default)]
    pub tls_key: String,
    /// PEM file of a CA: set, every client must present a certificate it signed (mutual TLS).
    #[serde(default)]
    pub tls_client_ca: String,
    /// Connections the API holds at once; past it the next is accepted when one closes.
    pub max_connections: usize,
    /// `POST /v1/likes:batchGet` calls served at once (each reads up to 200 rows); past it
    /// the next gets 503 with Retry-After at once.
    pub max_batch_gets_in_flight: usize,
    /// A request's headers must arrive within this, counted from when the server waits for
    /// them (an idle keep-alive connection is closed after it too).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A request not answered within this gets 503 (bounds a slow body too). Must exceed
    /// `write_deadline` + `cql.request_timeout` + `publish_wait`.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a write waits for the broker to acknowledge its event once its flip has
    /// applied. Past it (or on a broker error) the write is answered anyway: the flip is on the
    /// edge row and its outbox entry stands for the event, which the relay publishes later.
    #[serde(with = "humantime_serde")]
    pub publish_wait: Duration,
}

/// Stage 1 (`likes dedupe`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupeSettings {
    pub state_dir: PathBuf,
    pub instance_id: String,
    pub max_batch: usize,
    pub block_cache_mb: usize,
    #[serde(with = "humantime_serde")]
    pub transaction_timeout: Duration,
    /// Let stage 1 start with a `dedupe_ttl` under its floor (tests, demos, chaos runs on a
    /// short horizon); see [`DedupeSettings::horizon_floor`].
    #[serde(default)]
    pub allow_short_horizon: bool,
}

impl DedupeSettings {
    /// The shortest horizon stage 1 starts with: four times what a flip may spend on its way
    /// without a broker outage (a transaction's timeout, a commit resumed past two request
    /// timeouts, the relay's minimum age, and the lease of a relay that died holding the
    /// entry's shard). A horizon near it turns a flip delayed by an outage into one stage 1
    /// can no longer tell from a copy (issue 43, hole 7a).
    pub fn horizon_floor(&self, kafka: &KafkaSettings, api: &ApiSettings) -> Duration {
        (self.transaction_timeout + kafka.request_timeout * 2 + api.relay_min_age + api.relay_lease)
            * 4
    }
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub listen: String,
    /// A stage with input waiting that has committed nothing for this long answers 503 on
    /// `/healthz` (its liveness probe), so that it is restarted.
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
}

/// Stage 2 (`likes count`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountSettings {
    pub max_in_flight: usize,
    pub max_batch: usize,
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    pub batch_rows: usize,
    pub audit_log: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// Prepended to every topic name of the topology, so tests (and tenants) can share a cluster.
    pub topic_prefix: String,
    /// Replication factor of topics created by `likes topics`.
    pub replication_factor: i32,
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CqlSettings {
    pub nodes: Vec<String>,
    pub keyspace: String,
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How far this host's clock may be from the database's (docs/exactness.md, "The clock
    /// bound"): checked at connect and every `clock_check_every`; twice it must fit in the
    /// relay's margin (checked at start).
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
    /// How often the API and the relay check their clock again while they run (0s: never).
    #[serde(with = "humantime_serde")]
    pub clock_check_every: Duration,
    /// Connections to each shard of each node (Cassandra: each node). More than one spreads
    /// a busy pod's requests over several sockets.
    #[serde(default = "default_connections_per_shard")]
    pub connections_per_shard: usize,
    pub replication: Replication,
    /// The datacenter of this process's region: requests go to its nodes only, and
    /// `LOCAL_*` consistencies mean it (docs/multi-region.md). Unset: any node, for a
    /// cluster of one datacenter.
    #[serde(default)]
    pub local_datacenter: Option<String>,
}

/// The keyspace's replication, as `CREATE KEYSPACE` takes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replication {
    pub class: ReplicationClass,
    /// SimpleStrategy's replication factor.
    pub factor: u32,
    /// NetworkTopologyStrategy's replication factor per datacenter.
    pub datacenters: BTreeMap<String, u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicationClass {
    SimpleStrategy,
    NetworkTopologyStrategy,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySettings {
    /// A topology file; empty means the spec embedded in the binary.
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub filter: String,
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Settings {
    /// The embedded defaults alone, as a process with no file and no `LIKES__*` would run.
    pub fn defaults() -> Result<Self> {
        Figment::from(Toml::string(DEFAULTS))
            .extract()
            .map_err(|e| Error::Config(e.to_string()))
    }

    /// Loads defaults, then `file` (which must exist if given), then `LIKES__*` variables.
    pub fn load(file: Option<&Path>) -> Result<Self> {
        let mut figment = Figment::from(Toml::string(DEFAULTS));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(Error::Config(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        figment = figment.merge(Env::prefixed("LIKES__").split("__"));
        let settings: Settings = figment
            .extract()
            .map_err(|e| Error::Config(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what types alone cannot: names CQL and Kafka will accept, non-empty lists.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.kafka.brokers.trim().is_empty() {
            return bad("kafka.brokers is empty".into());
        }
        if self.ops.erase_rate.is_nan()
            || self.ops.erase_rate <= 0.0
            || self.ops.recount_concurrency == 0
        {
            return bad("ops.erase_rate and ops.recount_concurrency must be above 0".into());
        }
        if !self
            .kafka
            .topic_prefix
            .chars()
            .all(crate::topology::is_topic_char)
        {
            return bad(format!(
                "kafka.topic_prefix {:?} may only hold ASCII letters, digits, '.', '_' and '-'",
                self.kafka.topic_prefix
            ));
        }
        if self.kafka.replication_factor < 1 {
            return bad("kafka.replication_factor must be at least 1".into());
        }
        if self.dedupe.max_batch == 0
            || self.count.max_batch == 0
            || self.count.max_in_flight == 0
            || self.count.batch_rows == 0
        {
            return bad(
                "dedupe.max_batch, count.max_batch, count.max_in_flight and count.batch_rows must be at least 1"
                    .into(),
            );
        }
        if self.count.flush_interval < Duration::from_millis(10) {
            return bad("count.flush_interval must be at least 10ms".into());
        }
        if self.api.publish_wait.is_zero() {
            return bad("api.publish_wait must be above zero".into());
        }
        if self.api.write_deadline.is_zero() {
            return bad("api.write_deadline must be above zero".into());
        }
        // A request abandoned at its deadline sends no CAS after it; the relay must not take
        // the entry of a request that may still send one. (One already sent may land any
        // time later: the relay fences the row before it drops the entry, docs/exactness.md,
        // "The row fence"; this margin only keeps fences off requests still at work.)
        // Two hosts each within cql.max_clock_skew of the database may be twice that apart:
        // the writer that stamped an entry behind, the relay that judges its age ahead.
        let in_flight =
            self.api.write_deadline + self.cql.request_timeout + self.cql.max_clock_skew * 2;
        if self.api.relay_min_age <= in_flight {
            return bad(format!(
                "api.relay_min_age ({:?}) must exceed api.write_deadline + cql.request_timeout + \
                 2 × cql.max_clock_skew ({:?}): the relay would take the outbox entry of a \
                 request still in flight",
                self.api.relay_min_age, in_flight
            ));
        }
        // A forward waits for the home up to its deadline and one CQL timeout.
        let longest = self.api.write_deadline + self.cql.request_timeout + self.api.publish_wait;
        if self.api.request_timeout <= longest {
            return bad(format!(
                "api.request_timeout ({:?}) must exceed api.write_deadline + cql.request_timeout \
                 + api.publish_wait ({longest:?}): writes, and forwards to a home region, would \
                 be cut before they answer",
                self.api.request_timeout
            ));
        }
        if self.api.max_connections == 0 || self.api.header_read_timeout.is_zero() {
            return bad(
                "api.max_connections and api.header_read_timeout must be above zero".into(),
            );
        }
        if !self.api.relay_lease.is_zero() && self.api.relay_lease <= self.api.relay_interval * 2 {
            return bad(format!(
                "api.relay_lease ({:?}) must exceed 2 × api.relay_interval ({:?}) or be 0s: a \
                 relay renews its shards at half the lease, once a pass",
                self.api.relay_lease, self.api.relay_interval
            ));
        }
        if self.region.refresh.is_zero() || self.region.lease <= self.region.refresh {
            return bad(format!(
                "region.lease ({:?}) must exceed region.refresh ({:?}), above zero: a writer would \
                 lose its lease between two reads of the range table",
                self.region.lease, self.region.refresh
            ));
        }
        for (name, url) in &self.region.peers {
            if url.starts_with("https://") {
                if self.region.peer_ca.is_empty() {
                    return bad(format!(
                        "region.peers.{name} = {url:?}: an https:// peer needs region.peer_ca, the \
                         CA its certificate is signed by (no system roots are trusted for peers)"
                    ));
                }
            } else if !url.starts_with("http://") {
                return bad(format!(
                    "region.peers.{name} = {url:?}: a peer is https://host:port (or http:// where \
                     a mesh encrypts between regions)"
                ));
            }
        }
        if self.api.tls_cert.is_empty() != self.api.tls_key.is_empty() {
            return bad("api.tls_cert and api.tls_key go together (both PEM files)".into());
        }
        if !self.api.tls_client_ca.is_empty() && self.api.tls_cert.is_empty() {
            return bad("api.tls_client_ca needs api.tls_cert and api.tls_key".into());
        }
        if self.region.peer_cert.is_empty() != self.region.peer_key.is_empty() {
            return bad("region.peer_cert and region.peer_key go together (both PEM files)".into());
        }
        if !(1..=4096).contains(&self.region.ranges) {
            return bad("region.ranges must be 1 to 4096".into());
        }
        let region_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if self
            .region
            .name
            .as_deref()
            .is_some_and(|n| n.is_empty() || n.len() > 64 || !n.chars().all(region_char))
        {
            return bad("region.name must be 1-64 of [A-Za-z0-9_-]".into());
        }
        if self.dedupe.transaction_timeout < Duration::from_secs(1) {
            return bad("dedupe.transaction_timeout must be at least 1s".into());
        }
        if self.metrics.stall_after <= self.dedupe.transaction_timeout {
            return bad(format!(
                "metrics.stall_after ({:?}) must exceed dedupe.transaction_timeout ({:?}): \
                 a commit may take that long, and a stage is not stalled while one is under way",
                self.metrics.stall_after, self.dedupe.transaction_timeout
            ));
        }
        if !self.metrics.listen.is_empty()
            && self.metrics.listen.parse::<std::net::SocketAddr>().is_err()
        {
            return bad(format!(
                "metrics.listen {:?} is not host:port",
                self.metrics.listen
            ));
        }
        if self.cql.nodes.is_empty() {
            return bad("cql.nodes is empty".into());
        }
        if !is_cql_identifier(&self.cql.keyspace) {
            return bad(format!(
                "cql.keyspace {:?} must start with a letter and hold at most 48 letters, digits or '_'",
                self.cql.keyspace
            ));
        }
        match self.cql.replication.class {
            ReplicationClass::SimpleStrategy if self.cql.replication.factor == 0 => {
                return bad("cql.replication.factor must be at least 1".into())
            }
            ReplicationClass::NetworkTopologyStrategy
                if self.cql.replication.datacenters.is_empty() =>
            {
                return bad(
                    "cql.replication.datacenters must name at least one datacenter for NetworkTopologyStrategy"
                        .into(),
                )
            }
            _ => {}
        }
        Ok(())
    }

    /// The topology file to load, if one is configured.
    pub fn topology_path(&self) -> Option<PathBuf> {
        (!self.topology.path.is_empty()).then(|| PathBuf::from(&self.topology.path))
    }

    /// This instance's stable name: `dedupe.instance_id`, else the hostname.
    pub fn instance_id(&self) -> String {
        if !self.dedupe.instance_id.is_empty() {
            return self.dedupe.instance_id.clone();
        }
        std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "likes".into())
    }

    /// A topology topic name as it exists on the cluster (with the prefix).
    pub fn topic(&self, name: &str) -> String {
        format!("{}{}", self.kafka.topic_prefix, name)
    }

    /// A topology consumer group's name as it exists on the cluster (with the prefix).
    pub fn group(&self, name: &str) -> String {
        format!("{}{}", self.kafka.topic_prefix, name)
    }
}

/// An unquoted CQL identifier: what keyspace names may be in both Cassandra and ScyllaDB.
pub fn is_cql_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && s.len() <= 48
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
// figment::Jail's closures return figment's own (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let mut s = Settings::load(None).unwrap();
        s.api.session_key = "k".repeat(40);
        s.api.admin_token = "a".repeat(40);
        let shown = format!("{}\n{:?}", toml::to_string(&s).unwrap(), s);
        assert!(!shown.contains(&s.api.session_key), "{shown}");
        assert!(!shown.contains(&s.api.admin_token), "{shown}");
        assert!(shown.contains("session_key = \"***\""), "{shown}");
    }

    #[test]
    fn defaults_load_and_validate() {
        figment::Jail::expect_with(|_| {
            let s = Settings::load(None).unwrap();
            assert_eq!(s.cql.keyspace, "likes");
            assert_eq!(s.kafka.request_timeout, Duration::from_secs(30));
            Ok(())
        });
    }

    #[test]
    fn env_overrides_file_overrides_defaults() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("likes.toml", "[cql]\nkeyspace = \"from_file\"\n")?;
            let s = Settings::load(Some(Path::new("likes.toml"))).unwrap();
            assert_eq!(s.cql.keyspace, "from_file");
            jail.set_env("LIKES__CQL__KEYSPACE", "from_env");
            jail.set_env("LIKES__KAFKA__REQUEST_TIMEOUT", "5s");
            let s = Settings::load(Some(Path::new("likes.toml"))).unwrap();
            assert_eq!(s.cql.keyspace, "from_env");
            assert_eq!(s.kafka.request_timeout, Duration::from_secs(5));
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_rejected() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("LIKES__CQL__KEYSPAEC", "typo");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("keyspaec"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn bad_values_are_rejected_with_the_key_named() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("LIKES__CQL__KEYSPACE", "drop table;");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("cql.keyspace"), "{err}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("LIKES__CQL__REPLICATION__CLASS", "NetworkTopologyStrategy");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("datacenters"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_relay_never_takes_the_entry_of_a_request_in_flight() {
        figment::Jail::expect_with(|jail| {
            // 5 s deadline + 10 s CQL timeout: a 12 s minimum age could catch a live CAS.
            jail.set_env("LIKES__API__RELAY_MIN_AGE", "12s");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("api.relay_min_age"), "{err}");
            Ok(())
        });
    }

    /// Issue 43, hole 2: two hosts each within the bound may be twice it apart, and the
    /// relay's margin must hold for that too.
    #[test]
    fn the_relay_margin_covers_twice_the_clock_bound() {
        figment::Jail::expect_with(|jail| {
            // 5 s + 10 s + 2 × 2 s = 19 s < 20 s: the defaults hold.
            Settings::load(None).unwrap();
            jail.set_env("LIKES__CQL__MAX_CLOCK_SKEW", "3s");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("2 × cql.max_clock_skew"), "{err}");
            jail.set_env("LIKES__API__RELAY_MIN_AGE", "22s");
            Settings::load(None).unwrap();
            Ok(())
        });
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = Settings::load(Some(Path::new("/nonexistent/likes.toml"))).unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }

    /// docs/configuration.md's "Every key" tables name every key of `Settings`, and only
    /// those: a row whose first cell is the key in backticks (or several, comma-separated),
    /// under a heading `### <section>`; a nested key is written `replication.class`. The keys
    /// are those `likes config` prints: the defaults serialized, the unset options set.
    #[test]
    fn every_key_is_documented_and_every_documented_key_exists() {
        use std::collections::BTreeSet;
        const DOC: &str = include_str!("../docs/configuration.md");
        // Accepted on load but never printed (`skip_serializing`), with a value to load.
        const NOT_PRINTED: &[(&str, &str, &str)] = &[("api", "claim_takeover", "1s")];

        fn walk(prefix: &str, table: &toml::Table, keys: &mut BTreeSet<String>) {
            for (name, value) in table {
                let key = match prefix {
                    "" => name.clone(),
                    _ => format!("{prefix}.{name}"),
                };
                match value {
                    // A struct of settings; an empty map (`peers = {}`) is a key itself.
                    toml::Value::Table(t) if !t.is_empty() => walk(&key, t, keys),
                    _ => {
                        keys.insert(key);
                    }
                }
            }
        }
        let mut s = Settings::defaults().unwrap();
        s.region.name = Some("region-a".into());
        s.cql.local_datacenter = Some("dc1".into());
        let printed: toml::Table = toml::from_str(&toml::to_string(&s).unwrap()).unwrap();
        let mut keys = BTreeSet::new();
        walk("", &printed, &mut keys);

        let every_key = DOC
            .split("\n## Every key\n")
            .nth(1)
            .expect("docs/configuration.md has a part '## Every key'");
        let every_key = every_key.split("\n## ").next().unwrap();
        let (mut section, mut documented) = (None, BTreeSet::new());
        for line in every_key.lines() {
            if let Some(heading) = line.strip_prefix("### ") {
                section = heading.split_whitespace().next();
            } else if line.starts_with("| `") {
                let section = section.expect("a key row under a '### section' heading");
                for name in line.split('|').nth(1).unwrap().split(',') {
                    documented.insert(format!("{section}.{}", name.trim().trim_matches('`')));
                }
            }
        }

        let undocumented: Vec<_> = keys.difference(&documented).collect();
        assert!(
            undocumented.is_empty(),
            "keys missing from docs/configuration.md: {undocumented:?}"
        );
        let stale: Vec<_> = documented
            .difference(&keys)
            .filter(|k| {
                !NOT_PRINTED
                    .iter()
                    .any(|(s, n, _)| **k == format!("{s}.{n}"))
            })
            .collect();
        assert!(
            stale.is_empty(),
            "docs/configuration.md documents keys Settings does not have: {stale:?}"
        );
        for (section, name, value) in NOT_PRINTED {
            let key = format!("{section}.{name}");
            assert!(documented.contains(&key), "{key} is not documented");
            assert!(
                !keys.contains(&key),
                "{key} is printed now: drop it from NOT_PRINTED"
            );
            let mut table = printed.clone();
            table[*section]
                .as_table_mut()
                .unwrap()
                .insert(name.to_string(), toml::Value::String(value.to_string()));
            if let Err(e) = toml::Value::Table(table).try_into::<Settings>() {
                panic!("{key} is documented but no longer accepted: {e}");
            }
        }
    }
}
