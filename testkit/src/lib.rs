//! The one test kit of `likes`: what the tests (`tests/`) and the tools (`tools/`) share about
//! the local stack that `make up` runs, the namespaces they work in, the product's processes
//! they start, and the ground truth they check counts against. The product library carries
//! none of it (docs/testing.md, "The test kit").
//!
//! - [`stack`]: where `stack/stack.sh` keeps its pid files, kill -9 of its Kafka or
//!   Cassandra, and `stack.sh up`.
//! - [`names`]: a keyspace and topic prefix no other run uses, and the environment that points
//!   a `likes` child process at them.
//! - [`namespace`]: such a namespace created as a deployment creates its own (migrate, the
//!   recorded topology, the topics), and dropped.
//! - [`procs`]: the product's processes as children (`likes api`, the stages, a job): found,
//!   started with their log and pid file, stopped.
//! - [`topics`]: a topic's partitions as the metadata lists them, waited for (a topic just
//!   created is not listed at once).
//! - [`truth`]: what the counts must converge to, read from the edges.
//! - [`repo`]: the checkout's root, found at run time (the build cache is shared).

pub mod names;
pub mod namespace;
pub mod procs;
pub mod repo;
pub mod stack;
pub mod topics;
pub mod truth;
