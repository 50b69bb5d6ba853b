//! Compiles `schemas/` with protox (a pure-Rust protobuf compiler: no protoc download) and
//! generates the prost types included by `src/schema.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=schemas");
    let files = protox::compile(["likes/v1/events.proto"], ["schemas"])?;
    prost_build::Config::new().compile_fds(files)?;
    Ok(())
}
