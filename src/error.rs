//! The crate's error type: one enum, with `#[from]` for each client library, and a
//! retryable / fatal classification that loops use to decide whether to try again.

use std::time::Duration;

/// Everything that can go wrong in `likes`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),

    #[error("topology: {0}")]
    Topology(String),

    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),

    #[error("kafka topic {topic}: {reason}")]
    Topic { topic: String, reason: String },

    #[error("cql: could not connect: {0}")]
    CqlConnect(#[from] scylla::errors::NewSessionError),

    #[error("cql: {0}")]
    CqlExecution(#[from] scylla::errors::ExecutionError),

    #[error("cql: unexpected result: {0}")]
    CqlResult(#[from] scylla::errors::IntoRowsResultError),

    #[error("cql: unexpected rows: {0}")]
    CqlRows(#[from] scylla::errors::RowsError),

    #[error("cql: could not decode a row: {0}")]
    CqlDecode(#[from] scylla::errors::DeserializationError),

    #[error("cql schema: {0}")]
    Schema(String),

    #[error("protobuf: {0}")]
    Decode(#[from] prost::DecodeError),

    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
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
            Error::CqlConnect(_) | Error::CqlExecution(_) | Error::Timeout(..) => true,
            _ => false,
        }
    }
}
