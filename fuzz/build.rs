//! The fuzz targets link RocksDB through the product's library: the same prebuilt library and
//! rpath as `likes` (docs/building.md).

#[path = "../stack/rocksdb_link.rs"]
mod rocksdb_link;

fn main() {
    rocksdb_link::link();
}
