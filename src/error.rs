//! The crate's error type: one enum, with `#[from]` for each client library, and the one place
//! that decides what an error means for whoever meets it: [`Error::is_retryable`] (try the
//! same call again: a job's loop) and [`Error::ends_process`] (a stage ends its incarnation
//! and starts over, or the process exits). Each variant's label says what the operator must
//! do: `configuration:`, `refused:` (stop what it names first), `raced:` (run again), a
//! dependency's name (wait for it; processes retry by themselves).

use std::time::Duration;

/// Everything that can go wrong in `likes`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),

    /// The command cannot go ahead until something else is done first (it says what): a
    /// range table to create, a state folder holding another run's checkpoint.
    #[error("not yet: {0}")]
    Precondition(String),

    /// What the operator gave a command is wrong (a file, a flag's value): fix it and run again.
    #[error("bad input: {0}")]
    Input(String),

    /// A service the command reports to (not Kafka or CQL: a Pushgateway) failed or refused.
    #[error("unavailable: {0}")]
    Unavailable(String),

    /// The command will not go ahead while something else runs (a consumer group with live
    /// members): the operator stops that first.
    #[error("refused: {0}")]
    Refused(String),

    /// Another writer moved what the job was working on; running the job again settles it.
    #[error("raced: {0}")]
    Raced(String),

    #[error("topology: {0}")]
    Topology(String),

    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),

    #[error("kafka topic {topic}: {reason}")]
    Topic { topic: String, reason: String },

    #[error("cql: could not connect: {0}")]
    CqlConnect(#[source] Box<scylla::errors::NewSessionError>),

    #[error("cql: {0}")]
    CqlExecution(#[source] Box<scylla::errors::ExecutionError>),

    #[error("cql: unexpected result: {0}")]
    CqlResult(#[source] Box<scylla::errors::IntoRowsResultError>),

    #[error("cql: unexpected rows: {0}")]
    CqlRows(#[source] Box<scylla::errors::RowsError>),

    #[error("cql: unexpected rows: {0}")]
    CqlFirstRow(#[source] Box<scylla::errors::MaybeFirstRowError>),

    #[error("cql: unexpected rows: {0}")]
    CqlSingleRow(#[source] Box<scylla::errors::SingleRowError>),

    #[error("cql: could not decode a row: {0}")]
    CqlDecode(#[source] Box<scylla::errors::DeserializationError>),

    #[error("cql: a paged read failed to start: {0}")]
    CqlPaging(#[source] Box<scylla::errors::PagerExecutionError>),

    #[error("cql: a paged read failed: {0}")]
    CqlNextRow(#[source] Box<scylla::errors::NextRowError>),

    #[error("cql: rows of another type than expected: {0}")]
    CqlTypeCheck(#[source] Box<scylla::deserialize::TypeCheckError>),

    #[error("cql schema: {0}")]
    Schema(String),

    /// A CQL failure that a retry may not meet: a prepare while a node restarts, a
    /// compare-and-set that kept losing.
    #[error("cql: {0}")]
    CqlTransient(String),

    #[error("local state: {0}")]
    State(String),

    /// RocksDB, stage 1's local state.
    #[error("local state (RocksDB): {0}")]
    Rocks(#[from] rocksdb::Error),

    /// A socket or file of the process itself (a listener, a state folder, an audit log).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// One stage of a process that runs several ended with an error.
    #[error("{stage} failed: {source}")]
    Stage {
        stage: &'static str,
        #[source]
        source: Box<Error>,
    },

    #[error("protobuf: {0}")]
    Decode(#[from] prost::DecodeError),

    #[error("fail point {0}")]
    Injected(&'static str),

    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
}

/// The driver's errors are large; boxing them keeps every `Result` of the crate small.
macro_rules! boxed_from {
    ($($variant:ident($t:ty)),* $(,)?) => {
        $(impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::$variant(Box::new(e))
            }
        })*
    };
}

boxed_from!(
    CqlConnect(scylla::errors::NewSessionError),
    CqlExecution(scylla::errors::ExecutionError),
    CqlResult(scylla::errors::IntoRowsResultError),
    CqlRows(scylla::errors::RowsError),
    CqlFirstRow(scylla::errors::MaybeFirstRowError),
    CqlSingleRow(scylla::errors::SingleRowError),
    CqlDecode(scylla::errors::DeserializationError),
    CqlPaging(scylla::errors::PagerExecutionError),
    CqlNextRow(scylla::errors::NextRowError),
    CqlTypeCheck(scylla::deserialize::TypeCheckError),
);

/// Who acts on an error: see [`Error::domain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// The person who ran the command: configuration, input, a precondition, a race, the
    /// host's ports and files (a port taken, a folder not writable).
    User,
    /// A dependency (Kafka, CQL, a Pushgateway): processes retry; jobs retry, then say so.
    External,
    /// Ours: decoding, local state, a fault test's injection.
    Internal,
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An io error, saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    /// Whether the same call may succeed if tried again (a broker or node was briefly
    /// unreachable, a timeout). Configuration and schema errors never are.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Kafka(e) => e
                .rdkafka_error_code()
                .map(|c| {
                    use rdkafka::types::RDKafkaErrorCode as C;
                    matches!(
                        c,
                        C::BrokerTransportFailure
                            | C::AllBrokersDown
                            | C::RequestTimedOut
                            | C::OperationTimedOut
                            | C::NotCoordinator
                            | C::CoordinatorLoadInProgress
                            | C::CoordinatorNotAvailable
                            | C::LeaderNotAvailable
                            | C::NotLeaderForPartition
                            | C::NetworkException
                    )
                })
                .unwrap_or(false),
            Error::CqlConnect(_)
            | Error::CqlExecution(_)
            | Error::CqlPaging(_)
            | Error::CqlNextRow(_)
            | Error::CqlTransient(_)
            | Error::Unavailable(_)
            | Error::Timeout(..) => true,
            _ => false,
        }
    }

    /// Who acts on the error (after arroyo's `ErrorDomain`): the person who ran the command
    /// (their configuration, input or timing), the operator of a dependency (wait or repair
    /// it), or us (a bug or broken local state: file an issue with the log).
    pub fn domain(&self) -> Domain {
        match self {
            Error::Config(_)
            | Error::Input(_)
            | Error::Precondition(_)
            | Error::Refused(_)
            | Error::Raced(_)
            | Error::Topology(_)
            | Error::Schema(_)
            | Error::Io { .. } => Domain::User,
            Error::Kafka(_)
            | Error::Topic { .. }
            | Error::CqlConnect(_)
            | Error::CqlExecution(_)
            | Error::CqlPaging(_)
            | Error::CqlNextRow(_)
            | Error::CqlTransient(_)
            | Error::Unavailable(_)
            | Error::Timeout(..) => Domain::External,
            Error::Stage { source, .. } => source.domain(),
            _ => Domain::Internal,
        }
    }

    /// Whether an error ends the process rather than a stage's incarnation: a wrong
    /// configuration, topology or schema, broken local state, a refusal, or a fault test's
    /// crash. Errors of the dependencies (Kafka, Cassandra) start the stage over in-process
    /// (runtime/supervise.rs): a broker or node restart is routine.
    pub fn ends_process(&self) -> bool {
        use rdkafka::error::KafkaError as K;
        match self {
            Error::Kafka(K::ClientConfig(..) | K::ClientCreation(_) | K::Subscription(_)) => true,
            Error::Kafka(_) | Error::Timeout(..) | Error::Unavailable(_) => false,
            Error::CqlConnect(_)
            | Error::CqlExecution(_)
            | Error::CqlPaging(_)
            | Error::CqlNextRow(_)
            | Error::CqlTransient(_) => false,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// What is worth another call is never worth ending the process over.
    #[test]
    fn a_retryable_error_never_ends_the_process() {
        let samples = [
            Error::CqlTransient("x".into()),
            Error::Timeout(std::time::Duration::ZERO, "x".into()),
            Error::Config("x".into()),
            Error::Input("x".into()),
            Error::Precondition("x".into()),
            Error::Unavailable("x".into()),
            Error::Refused("x".into()),
            Error::Raced("x".into()),
            Error::State("x".into()),
            Error::Injected("x"),
        ];
        for e in &samples {
            assert!(!(e.is_retryable() && e.ends_process()), "{e}");
        }
    }

    /// Bad input is the user's to fix and never retried; a dependency's failure is retried.
    #[test]
    fn bad_input_is_the_users_and_a_dependency_failure_is_retried() {
        let input = Error::Input("x".into());
        assert_eq!(input.domain(), super::Domain::User);
        assert!(!input.is_retryable());
        let gone = Error::Unavailable("x".into());
        assert_eq!(gone.domain(), super::Domain::External);
        assert!(gone.is_retryable());
    }
}
