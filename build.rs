//! Compiles `schemas/` with protox (a pure-Rust protobuf compiler: no protoc download) and
//! generates the prost types included by `src/schema.rs`. Also compiles the last released
//! schema set (`schemas/released/`) into `OUT_DIR/released/`, for the golden tests that
//! check today's records against it (`tests/schema_golden.rs`). And links the prebuilt
//! RocksDB (`stack/rocksdb_link.rs`).

#[path = "stack/rocksdb_link.rs"]
mod rocksdb_link;

/// The released schema set the golden tests and `make schema-check` compare against.
const RELEASED: &str = "schemas/released/v1.0.0";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rocksdb_link::link();
    println!("cargo:rerun-if-changed=schemas");
    let files = protox::compile(["likes/v1/events.proto"], ["schemas"])?;
    prost_build::Config::new().compile_fds(files)?;

    let released = std::path::Path::new(&std::env::var("OUT_DIR")?).join("released");
    std::fs::create_dir_all(&released)?;
    let files = protox::compile(["likes/v1/events.proto"], [RELEASED])?;
    prost_build::Config::new()
        .out_dir(&released)
        .compile_fds(files)?;
    Ok(())
}
