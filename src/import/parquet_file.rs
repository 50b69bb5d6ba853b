//! Edge files in Parquet, as a warehouse would export them (item_id, user_id, liked,
//! liked_at as TIMESTAMP(MILLIS), snappy): for source.rs's unit test, which must hand the reader
//! the format teams use, not only CSV. Compiled for tests only.

use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

use crate::error::{Error, Result};

const SCHEMA: &str = "
    message edges {
        REQUIRED BYTE_ARRAY item_id (UTF8);
        REQUIRED BYTE_ARRAY user_id (UTF8);
        REQUIRED BOOLEAN liked;
        REQUIRED INT64 liked_at (TIMESTAMP(MILLIS,true));
    }";

/// Rows per row group.
const GROUP: usize = 65_536;

/// Writes (item, user, liked, liked_at ms) rows.
pub fn write(path: &Path, rows: &[(&str, &str, bool, i64)]) -> Result<()> {
    let err = |e: parquet::errors::ParquetError| Error::Input(format!("{}: {e}", path.display()));
    let schema = Arc::new(parquet::schema::parser::parse_message_type(SCHEMA).map_err(err)?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file =
        std::fs::File::create(path).map_err(Error::io(format!("creating {}", path.display())))?;
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(err)?;
    for group in rows.chunks(GROUP) {
        let mut rg = writer.next_row_group().map_err(err)?;
        let mut col = 0;
        while let Some(mut c) = rg.next_column().map_err(err)? {
            match col {
                0 | 1 => {
                    let v: Vec<ByteArray> = group
                        .iter()
                        .map(|r| ByteArray::from(if col == 0 { r.0 } else { r.1 }))
                        .collect();
                    c.typed::<ByteArrayType>()
                        .write_batch(&v, None, None)
                        .map_err(err)?;
                }
                2 => {
                    let v: Vec<bool> = group.iter().map(|r| r.2).collect();
                    c.typed::<BoolType>()
                        .write_batch(&v, None, None)
                        .map_err(err)?;
                }
                _ => {
                    let v: Vec<i64> = group.iter().map(|r| r.3).collect();
                    c.typed::<Int64Type>()
                        .write_batch(&v, None, None)
                        .map_err(err)?;
                }
            }
            c.close().map_err(err)?;
            col += 1;
        }
        rg.close().map_err(err)?;
    }
    writer.close().map_err(err)?;
    Ok(())
}
