//! What the tests (`tests/common/`) and the tools (`tools/`) share about the local stack that
//! `make up` runs and the namespaces they work in. The product library carries none of it.
//!
//! - [`stack`]: where `stack/stack.sh` keeps its pid files, kill -9 of its Kafka or
//!   Cassandra, and `stack.sh up`.
//! - [`names`]: a keyspace and topic prefix no other run uses, and the environment that points
//!   a `likes` child process at them.
//! - [`repo`]: the checkout's root, found at run time (the build cache is shared).

pub mod names;
pub mod repo;
pub mod stack;
