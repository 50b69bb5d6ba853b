//! The tests that share the running stack (`make up`) and leave it standing, as modules of one
//! binary: each links RocksDB, librdkafka and the CQL driver once, not once per file. Every
//! test works in its own keyspace and topic prefix (`common::settings`), so they run side by
//! side. Tests that kill the stack, skew a clock, arm fail points on code other tests run in
//! this process (the write path, the stages in process), or measure latency under load stay
//! binaries of their own (`tests/*.rs`): a fail point is process-wide, and an outage or a load
//! spike would reach every test beside it. `ops_jobs` arms only reconcile's and rebuild's fail
//! points, which no other test here runs in process, under its own lock.

#[path = "../common/mod.rs"]
mod common;

mod api_hostile;
mod api_request_keys;
mod api_write;
mod cli_setup;
mod clock_bound;
mod cql_lwt;
mod deploy_metrics;
mod exactness_holes;
mod import;
mod kafka_roundtrip;
mod ops_jobs;
mod recount_queue;
mod regions_forward;
mod regions_move;
mod regions_tls;
mod schema_rollout;
mod topology_fixture;
mod topology_rebalance;
