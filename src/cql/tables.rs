//! The keyspace `likes` (docs/design.md, "Data model"): one table spec per table, from which both
//! the DDL and the check of an existing table are derived, so the two cannot drift.

use crate::config::{Replication, ReplicationClass};

/// One table: its columns (name, CQL type as `system_schema.columns` spells it), its primary
/// key (partition key columns, then clustering columns) and table options.
#[derive(Debug)]
pub struct TableSpec {
    pub name: &'static str,
    pub columns: &'static [(&'static str, &'static str)],
    pub partition_key: &'static [&'static str],
    pub clustering: &'static [&'static str],
    pub options: &'static str,
    /// Why the table exists, printed by `likes migrate`.
    pub purpose: &'static str,
}

/// Every table of the keyspace, in creation order.
pub const TABLES: &[TableSpec] = &[
    TableSpec {
        name: "edges",
        // state: 2 = LIKED, 1 = UNLIKED (EdgeState). op_id: +1 per real flip, in the same LWT.
        columns: &[
            ("item_id", "text"),
            ("bucket", "int"),
            ("user_id", "text"),
            ("state", "tinyint"),
            ("op_id", "bigint"),
            ("updated_at", "timestamp"),
            ("prev_at", "timestamp"),
            ("epoch", "bigint"),
            // A ring of 16 slots, each one request on this edge (key, operation, answer;
            // store/request_keys.rs), written by the same compare-and-set as the flip.
            ("recent_keys", "map<int, text>"),
            // The ClientPlatform of the request that made the current flip, for the relay to
            // republish (added after v1.0.0; `likes migrate` adds it to older keyspaces).
            ("platform", "tinyint"),
            // The times of the flips before prev_at, newest first, at most 15: events carry
            // them so stage 1 finds a forgotten edge's counted baseline (added after v1.0.0).
            ("earlier_at", "frozen<list<bigint>>"),
            // The row's fence stamp (docs/exactness.md, "The row fence"): every compare-and-set
            // of a request names the value it read; the relay moves it before it drops an
            // outbox entry unpublished, so that entry's statement, landing late, fails.
            // Null until the first fence (added after v1.1: `likes migrate` adds it).
            ("fence", "bigint"),
        ],
        partition_key: &["item_id", "bucket"],
        clustering: &["user_id"],
        options: "",
        purpose: "one row per (item, user) with its recent request keys; written only by LWT",
    },
    TableSpec {
        name: "edges_by_user",
        columns: &[
            ("user_id", "text"),
            ("item_id", "text"),
            ("created_at", "timestamp"),
        ],
        partition_key: &["user_id"],
        clustering: &["item_id"],
        options: "",
        purpose: "user -> items, walked by erasure; written before the edge flip",
    },
    TableSpec {
        name: "outbox",
        // Partitioned by minute as well: a drained entry leaves a tombstone, and the relay
        // scans only minutes that may still hold live entries, never a day of tombstones.
        columns: &[
            ("shard", "int"),
            ("minute", "bigint"),
            ("item_id", "text"),
            ("user_id", "text"),
            ("entry", "text"),
            ("created_at", "timestamp"),
        ],
        partition_key: &["shard", "minute"],
        clustering: &["item_id", "user_id", "entry"],
        options: "",
        purpose: "edges whose event may not be published yet; drained by the relay",
    },
    TableSpec {
        name: "outbox_floor",
        // after_*: within the floor minute, once settled, the clustering position up to which
        // every entry is deleted: passes and cuts start after it, past the tombstones of an
        // interrupted drain (issue 56; added after v1.1: `likes migrate` adds them).
        columns: &[
            ("shard", "int"),
            ("minute", "bigint"),
            ("after_item", "text"),
            ("after_user", "text"),
            ("after_entry", "text"),
        ],
        partition_key: &["shard"],
        clustering: &[],
        options: "",
        purpose: "per outbox shard, the oldest minute that may hold an entry and where in it the live entries start; the relay starts there",
    },
    TableSpec {
        name: "outbox_lease",
        // Written only by compare-and-set, with a TTL: a relay that dies lets its shards go.
        // Per region: the outbox is shared, and each region's relays publish its items only.
        columns: &[("region", "text"), ("shard", "int"), ("owner", "text")],
        partition_key: &["region", "shard"],
        clustering: &[],
        options: "",
        purpose: "per outbox shard, the relay that drains it for now, so relays do not all publish the same entries",
    },
    TableSpec {
        name: "retractions",
        columns: &[
            ("item_id", "text"),
            ("user_id", "text"),
            ("retracted_at", "timestamp"),
            ("reason", "text"),
            ("request_key", "text"),
        ],
        partition_key: &["item_id"],
        clustering: &["user_id", "request_key"],
        options: "",
        purpose: "admin/abuse unlikes with their reason (one row per request key, so a retry writes the same row); the unlike itself goes the normal way",
    },
    TableSpec {
        name: "like_counts",
        columns: &[
            ("shard", "int"),
            ("item_id", "text"),
            ("count", "bigint"),
            ("last_window", "bigint"),
            ("as_of", "timestamp"),
            // The cut (ms) of the last reconcile correction applied: the correction fence.
            ("last_correction", "bigint"),
        ],
        partition_key: &["shard"],
        clustering: &["item_id"],
        options: "",
        purpose: "public counts; written only through the LWT fence (last_window: the end time, ms, of the last window applied)",
    },
    TableSpec {
        name: "erasures",
        // user_id is removed when the erasure is purged: afterwards the row says only that an
        // erasure ran, when, and how many likes it took back.
        columns: &[
            ("id", "text"),
            ("user_id", "text"),
            ("requested_at", "timestamp"),
            ("state", "text"),
            ("cursor", "text"),
            ("walked", "bigint"),
            ("unliked", "bigint"),
            ("updated_at", "timestamp"),
            ("unliked_at", "timestamp"),
            ("purged_at", "timestamp"),
        ],
        partition_key: &["id"],
        clustering: &[],
        options: "",
        purpose: "account erasure requests and their progress (the erase job's checkpoint)",
    },
    TableSpec {
        name: "erased_users",
        // user_key: SHA-256 of the user id (store/erasures.rs), never the id itself: it must
        // outlive the purge, which removes the id everywhere else.
        columns: &[
            ("user_key", "text"),
            ("erasure_id", "text"),
            ("requested_at", "timestamp"),
        ],
        partition_key: &["user_key"],
        clustering: &[],
        options: "",
        purpose: "a one-way fingerprint of each erased account: the API refuses writes from sessions that outlived it",
    },
    TableSpec {
        name: "erasures_by_minute",
        // The same fingerprints by the minute they were requested, kept a day: what each API
        // pod reads every `api.erased_refresh` to keep its set of erased accounts current
        // without a read per write (src/write/erased_set.rs; added after v1.1).
        columns: &[
            ("minute", "bigint"),
            ("user_key", "text"),
            ("erasure_id", "text"),
        ],
        partition_key: &["minute"],
        clustering: &["user_key"],
        options: "default_time_to_live = 86400",
        purpose: "recent erasures by minute: the API pods' refresh of their erased-account sets",
    },
    TableSpec {
        name: "ranges",
        // moving_from: set while a move is under way; home_since: when the range's home last
        // began writing it; recount_due: settled, its recount not done yet (store/ranges.rs).
        columns: &[
            ("range", "int"),
            ("home", "text"),
            ("epoch", "bigint"),
            ("moving_from", "text"),
            ("moved_at", "timestamp"),
            ("home_since", "timestamp"),
            ("recount_due", "boolean"),
        ],
        partition_key: &["range"],
        clustering: &[],
        options: "",
        purpose: "each item range's home region and epoch (docs/multi-region.md); written only by LWT, read by writers with region.name set",
    },
    TableSpec {
        name: "topology_record",
        columns: &[("name", "text"), ("value", "bigint")],
        partition_key: &["name"],
        clustering: &[],
        options: "",
        purpose: "the bucket count and window length the keyspace was built with; processes refuse a silent change",
    },
];

/// `CREATE KEYSPACE IF NOT EXISTS` for the configured replication.
pub fn create_keyspace(keyspace: &str, replication: &Replication) -> String {
    format!(
        "CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {}",
        replication_literal(replication)
    )
}

/// The replication map as a CQL literal.
pub fn replication_literal(r: &Replication) -> String {
    match r.class {
        ReplicationClass::SimpleStrategy => format!(
            "{{'class': 'SimpleStrategy', 'replication_factor': {}}}",
            r.factor
        ),
        ReplicationClass::NetworkTopologyStrategy => {
            let dcs: Vec<String> = r
                .datacenters
                .iter()
                .map(|(dc, n)| format!("'{dc}': {n}"))
                .collect();
            format!("{{'class': 'NetworkTopologyStrategy', {}}}", dcs.join(", "))
        }
    }
}

/// The replication map as `system_schema.keyspaces` reports it, for comparison.
pub fn replication_map(r: &Replication) -> std::collections::BTreeMap<String, String> {
    let mut m = std::collections::BTreeMap::new();
    match r.class {
        ReplicationClass::SimpleStrategy => {
            m.insert(
                "class".into(),
                "org.apache.cassandra.locator.SimpleStrategy".into(),
            );
            m.insert("replication_factor".into(), r.factor.to_string());
        }
        ReplicationClass::NetworkTopologyStrategy => {
            m.insert(
                "class".into(),
                "org.apache.cassandra.locator.NetworkTopologyStrategy".into(),
            );
            for (dc, n) in &r.datacenters {
                m.insert(dc.clone(), n.to_string());
            }
        }
    }
    m
}

impl TableSpec {
    /// `((partition, key), clustering, columns)`
    pub fn primary_key(&self) -> String {
        let mut parts = vec![format!("({})", self.partition_key.join(", "))];
        parts.extend(self.clustering.iter().map(|c| c.to_string()));
        format!("({})", parts.join(", "))
    }

    /// `CREATE TABLE IF NOT EXISTS` for this table in `keyspace`.
    pub fn create_statement(&self, keyspace: &str) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|(n, t)| format!("{n} {t}"))
            .collect();
        let mut s = format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.{} ({}, PRIMARY KEY {})",
            self.name,
            cols.join(", "),
            self.primary_key()
        );
        if !self.options.is_empty() {
            s.push_str(" WITH ");
            s.push_str(self.options);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn ddl_is_what_we_expect() {
        let edges = &TABLES[0];
        assert_eq!(
            edges.create_statement("ks"),
            "CREATE TABLE IF NOT EXISTS ks.edges (item_id text, bucket int, user_id text, \
             state tinyint, op_id bigint, updated_at timestamp, prev_at timestamp, epoch bigint, \
             recent_keys map<int, text>, platform tinyint, earlier_at frozen<list<bigint>>, \
             fence bigint, PRIMARY KEY ((item_id, bucket), user_id))"
        );
    }

    #[test]
    fn replication_literals() {
        let simple = Replication {
            class: ReplicationClass::SimpleStrategy,
            factor: 1,
            datacenters: BTreeMap::new(),
        };
        assert_eq!(
            create_keyspace("likes", &simple),
            "CREATE KEYSPACE IF NOT EXISTS likes WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"
        );
        let nts = Replication {
            class: ReplicationClass::NetworkTopologyStrategy,
            factor: 0,
            datacenters: BTreeMap::from([("dc1".to_string(), 3), ("dc2".to_string(), 3)]),
        };
        assert_eq!(
            replication_literal(&nts),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 3}"
        );
    }
}
