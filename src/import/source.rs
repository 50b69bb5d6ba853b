//! The files `likes import` reads (docs/adoption.md, "The file"): CSV with a header line, JSON
//! Lines (either gzip- or zstd-compressed as well: `.csv.gz`, `.jsonl.zst`, what warehouse
//! unloads write), Parquet; each read row by row, so memory does not grow with the file. A row comes
//! out as its four mapped values and its original text (for the reject file); turning the
//! values into an edge, or a reason why not, is `row`'s.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// The file's format: from `--format`, else from its name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Jsonl,
    Parquet,
}

impl Format {
    pub fn parse(s: &str) -> Result<Format> {
        match s.to_ascii_lowercase().as_str() {
            "csv" => Ok(Format::Csv),
            "jsonl" | "ndjson" | "json" => Ok(Format::Jsonl),
            "parquet" => Ok(Format::Parquet),
            _ => Err(Error::Input(format!(
                "format {s:?}: use csv, jsonl or parquet"
            ))),
        }
    }

    pub fn of_path(path: &Path) -> Result<Format> {
        // `likes.csv.gz`: the format is the name's before the compression's.
        let bare = match Compression::of_path(path) {
            Compression::None => path,
            _ => Path::new(path.file_stem().unwrap_or_default()),
        };
        let ext = bare.extension().and_then(|e| e.to_str()).unwrap_or("");
        Format::parse(ext).map_err(|_| {
            Error::Input(format!(
                "{}: cannot tell the format from the name; say --format csv|jsonl|parquet",
                path.display()
            ))
        })
    }
}

/// How a CSV or JSON Lines file is compressed: by its name's last extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn of_path(path: &Path) -> Compression {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("gz") => Compression::Gzip,
            Some(e) if e.eq_ignore_ascii_case("zst") => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// The file's bytes as read from disk, counted: with the file's size, the progress estimate
/// (a compressed file's text is longer than the file).
struct Counted {
    file: File,
    read: Arc<AtomicU64>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

type Text = Box<dyn Read + Send>;

/// Which column holds what (`--item-column` and the others).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mapping {
    pub item: String,
    pub user: String,
    /// None: every row is a like (a table of current likes).
    pub liked: Option<String>,
    pub time: String,
}

impl Default for Mapping {
    /// The columns `likes import` reads unless told otherwise (docs/adoption.md, "The file").
    fn default() -> Self {
        Mapping {
            item: "item_id".into(),
            user: "user_id".into(),
            liked: Some("liked".into()),
            time: "liked_at".into(),
        }
    }
}

/// One value as the file holds it.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    #[default]
    Missing,
    Text(String),
    Int(i64),
    Bool(bool),
    /// A Parquet timestamp, already in ms.
    TimeMs(i64),
    Other(String),
}

/// One row: its number in the file (0-based, header not counted), the mapped values (item,
/// user, liked, time) and its original text.
#[derive(Debug, Clone)]
pub struct RawRow {
    pub seq: u64,
    pub values: std::result::Result<[Value; 4], RowError>,
    pub raw: String,
}

/// A row the file could not give as values: why, in the reject file.
pub type RowError = String;

pub struct Source {
    inner: Inner,
    read: Arc<AtomicU64>,
    pub size_bytes: u64,
    /// Exact when the file says it (Parquet).
    pub rows: Option<u64>,
    seq: u64,
}

enum Inner {
    Csv {
        reader: csv::Reader<Text>,
        cols: [Option<usize>; 4],
    },
    Jsonl {
        reader: BufReader<Text>,
        names: [Option<String>; 4],
        line: Vec<u8>,
    },
    Parquet {
        rows: parquet::record::reader::RowIter<'static>,
        names: [Option<String>; 4],
    },
}

fn names_of(m: &Mapping) -> [Option<String>; 4] {
    [
        Some(m.item.clone()),
        Some(m.user.clone()),
        m.liked.clone(),
        Some(m.time.clone()),
    ]
}

fn missing_column(path: &Path, want: &str, have: &[String]) -> Error {
    Error::Input(format!(
        "{}: no column {want:?} (it has: {}); map yours with --item-column, --user-column, \
         --liked-column (or --all-liked) and --time-column",
        path.display(),
        have.join(", ")
    ))
}

impl Source {
    pub fn open(path: &Path, format: Format, mapping: &Mapping) -> Result<Source> {
        let file = File::open(path).map_err(Error::io(format!("opening {}", path.display())))?;
        let size_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        let names = names_of(mapping);
        let read = Arc::new(AtomicU64::new(0));
        let compression = Compression::of_path(path);
        let text = || -> Result<Text> {
            let counted = Counted {
                file: file
                    .try_clone()
                    .map_err(Error::io(format!("opening {}", path.display())))?,
                read: read.clone(),
            };
            Ok(match compression {
                Compression::None => Box::new(counted),
                Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(counted)),
                Compression::Zstd => Box::new(
                    zstd::stream::read::Decoder::new(counted)
                        .map_err(|e| Error::Input(format!("{}: not zstd: {e}", path.display())))?,
                ),
            })
        };
        let (inner, rows) = match format {
            Format::Parquet if compression != Compression::None => {
                return Err(Error::Input(format!(
                    "{}: a Parquet file compresses its own pages; decompress the file first",
                    path.display()
                )))
            }
            Format::Csv => {
                let mut reader = csv::ReaderBuilder::new()
                    .flexible(true)
                    .trim(csv::Trim::All)
                    .from_reader(text()?);
                let header: Vec<String> = reader
                    .headers()
                    .map_err(|e| Error::Input(format!("{}: its header line: {e}", path.display())))?
                    .iter()
                    .map(str::to_string)
                    .collect();
                let mut cols = [None; 4];
                for (slot, name) in cols.iter_mut().zip(&names) {
                    if let Some(n) = name {
                        *slot = Some(
                            header
                                .iter()
                                .position(|h| h == n)
                                .ok_or_else(|| missing_column(path, n, &header))?,
                        );
                    }
                }
                (Inner::Csv { reader, cols }, None)
            }
            Format::Jsonl => (
                Inner::Jsonl {
                    reader: BufReader::with_capacity(1 << 16, text()?),
                    names,
                    line: Vec::new(),
                },
                None,
            ),
            Format::Parquet => {
                use parquet::file::reader::FileReader;
                let reader = parquet::file::serialized_reader::SerializedFileReader::new(file)
                    .map_err(|e| {
                        Error::Input(format!("{}: not a Parquet file: {e}", path.display()))
                    })?;
                let meta = reader.metadata().file_metadata();
                let rows = meta.num_rows().max(0) as u64;
                let fields = meta.schema().get_fields();
                let have: Vec<String> = fields.iter().map(|f| f.name().to_string()).collect();
                // Read only the mapped columns: a warehouse export may have dozens.
                let mut picked = Vec::new();
                for n in names.iter().flatten() {
                    let f = fields
                        .iter()
                        .find(|f| f.name() == n)
                        .ok_or_else(|| missing_column(path, n, &have))?;
                    if !f.is_primitive() {
                        return Err(Error::Input(format!(
                            "{}: column {n:?} is nested; the import reads flat columns",
                            path.display()
                        )));
                    }
                    if !picked
                        .iter()
                        .any(|p: &std::sync::Arc<parquet::schema::types::Type>| p.name() == n)
                    {
                        picked.push(f.clone());
                    }
                }
                let proj = parquet::schema::types::Type::group_type_builder(meta.schema().name())
                    .with_fields(picked)
                    .build()
                    .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
                let iter = parquet::record::reader::RowIter::from_file_into(Box::new(reader))
                    .project(Some(proj))
                    .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
                (Inner::Parquet { rows: iter, names }, Some(rows))
            }
        };
        Ok(Source {
            inner,
            read,
            size_bytes,
            rows,
            seq: 0,
        })
    }

    /// The file's bytes read so far (CSV, JSON Lines; read ahead of the rows by a buffer):
    /// with the size, the progress estimate.
    pub fn bytes_read(&self) -> u64 {
        match &self.inner {
            Inner::Csv { .. } | Inner::Jsonl { .. } => self.read.load(Ordering::Relaxed),
            Inner::Parquet { .. } => 0,
        }
    }

    /// The next row; Err only when the file cannot be read on (an I/O error, a corrupt page).
    pub fn next_row(&mut self) -> Option<Result<RawRow>> {
        let seq = self.seq;
        let row = match &mut self.inner {
            Inner::Csv { reader, cols } => {
                let mut rec = csv::ByteRecord::new();
                match reader.read_byte_record(&mut rec) {
                    Ok(false) => return None,
                    Ok(true) => csv_row(seq, &rec, cols),
                    // A row the parser refuses is the row's fault; an I/O error is the file's.
                    Err(e) if matches!(e.kind(), csv::ErrorKind::Io(_)) => {
                        return Some(Err(Error::Input(format!("reading the file: {e}"))))
                    }
                    Err(e) => RawRow {
                        seq,
                        values: Err(format!("not CSV: {e}")),
                        raw: String::from_utf8_lossy(rec.as_slice()).into_owned(),
                    },
                }
            }
            Inner::Jsonl {
                reader,
                names,
                line,
            } => loop {
                line.clear();
                match reader.read_until(b'\n', line) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(e) => return Some(Err(Error::Input(format!("reading the file: {e}")))),
                }
                // Blank lines are not rows.
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                break json_row(seq, line, names);
            },
            Inner::Parquet { rows, names } => match rows.next()? {
                Ok(r) => parquet_row(seq, &r, names),
                Err(e) => {
                    return Some(Err(Error::Input(format!(
                        "reading the Parquet file at row {seq}: {e}"
                    ))))
                }
            },
        };
        self.seq += 1;
        Some(Ok(row))
    }
}

fn csv_row(seq: u64, rec: &csv::ByteRecord, cols: &[Option<usize>; 4]) -> RawRow {
    let values = (|| {
        let mut out: [Value; 4] = Default::default();
        for (slot, col) in out.iter_mut().zip(cols) {
            if let Some(i) = col {
                *slot = match rec.get(*i) {
                    None => Value::Missing,
                    Some(b) => Value::Text(
                        std::str::from_utf8(b)
                            .map_err(|_| format!("column {} is not UTF-8", i + 1))?
                            .to_string(),
                    ),
                };
            }
        }
        Ok::<_, RowError>(out)
    })();
    // The whole record as it was, fields joined back with commas.
    let raw = rec
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect::<Vec<_>>()
        .join(",");
    RawRow { seq, values, raw }
}

fn json_row(seq: u64, line: &[u8], names: &[Option<String>; 4]) -> RawRow {
    let raw = String::from_utf8_lossy(line).trim_end().to_string();
    let values = (|| {
        let v: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
        let obj = v
            .as_object()
            .ok_or_else(|| "not a JSON object".to_string())?;
        let mut out: [Value; 4] = Default::default();
        for (slot, name) in out.iter_mut().zip(names) {
            if let Some(n) = name {
                *slot = match obj.get(n) {
                    None | Some(serde_json::Value::Null) => Value::Missing,
                    Some(serde_json::Value::String(s)) => Value::Text(s.clone()),
                    Some(serde_json::Value::Bool(b)) => Value::Bool(*b),
                    Some(serde_json::Value::Number(x)) => match x.as_i64() {
                        Some(i) => Value::Int(i),
                        None => Value::Other(x.to_string()),
                    },
                    Some(other) => Value::Other(other.to_string()),
                };
            }
        }
        Ok::<_, RowError>(out)
    })();
    RawRow { seq, values, raw }
}

fn parquet_row(seq: u64, row: &parquet::record::Row, names: &[Option<String>; 4]) -> RawRow {
    use parquet::record::Field;
    let mut out: [Value; 4] = Default::default();
    for (slot, name) in out.iter_mut().zip(names) {
        let Some(n) = name else { continue };
        let field = row.get_column_iter().find(|(k, _)| *k == n).map(|(_, f)| f);
        *slot = match field {
            None | Some(Field::Null) => Value::Missing,
            Some(Field::Str(s)) => Value::Text(s.clone()),
            Some(Field::Bool(b)) => Value::Bool(*b),
            Some(Field::Byte(i)) => Value::Int(i64::from(*i)),
            Some(Field::Short(i)) => Value::Int(i64::from(*i)),
            Some(Field::Int(i)) => Value::Int(i64::from(*i)),
            Some(Field::Long(i)) => Value::Int(*i),
            Some(Field::TimestampMillis(ms)) => Value::TimeMs(*ms),
            Some(Field::TimestampMicros(us)) => Value::TimeMs(us.div_euclid(1000)),
            Some(other) => Value::Other(other.to_string()),
        };
    }
    RawRow {
        seq,
        values: Ok(out),
        raw: row.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn all(src: &mut Source) -> Vec<RawRow> {
        std::iter::from_fn(|| src.next_row())
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn csv_rows_come_out_by_column_name_and_bad_ones_as_errors() {
        let dir = std::env::temp_dir().join(format!("likes-src-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("e.csv");
        let mut f = File::create(&p).unwrap();
        write!(
            f,
            "liked_at,user_id,item_id,liked\n5,u1,i1,true\n6,u2\n7,u3,\"i,3\",0\n"
        )
        .unwrap();
        f.write_all(b"8,u\xff,i4,1\n").unwrap();
        drop(f);
        let mut src = Source::open(&p, Format::Csv, &Mapping::default()).unwrap();
        let rows = all(&mut src);
        assert_eq!(rows.len(), 4);
        assert_eq!(
            rows[0].values.as_ref().unwrap(),
            &[
                Value::Text("i1".into()),
                Value::Text("u1".into()),
                Value::Text("true".into()),
                Value::Text("5".into())
            ]
        );
        assert_eq!(rows[1].values.as_ref().unwrap()[0], Value::Missing);
        assert_eq!(
            rows[2].values.as_ref().unwrap()[0],
            Value::Text("i,3".into())
        );
        assert!(rows[3].values.is_err());
        assert_eq!(rows[3].seq, 3);
        let m = Mapping {
            item: "item".into(),
            ..Mapping::default()
        };
        let e = Source::open(&p, Format::Csv, &m).err().unwrap().to_string();
        assert!(
            e.contains("no column \"item\"") && e.contains("item_id"),
            "{e}"
        );
    }

    #[test]
    fn compressed_exports_read_as_their_text_and_progress_counts_the_files_bytes() {
        let dir = std::env::temp_dir().join(format!("likes-src-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut csv = String::from("item_id,user_id,liked,liked_at\n");
        for i in 0..2000 {
            csv.push_str(&format!("i{},u{i},true,{i}\n", i % 7));
        }
        let gz = dir.join("part-0.csv.gz");
        let mut enc = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), Default::default());
        enc.write_all(csv.as_bytes()).unwrap();
        enc.finish().unwrap();
        let jsonl = "{\"item_id\":\"i1\",\"user_id\":\"u1\",\"liked\":true,\"liked_at\":5}\n";
        let zst = dir.join("part-1.JSONL.zst");
        std::fs::write(&zst, zstd::encode_all(jsonl.as_bytes(), 3).unwrap()).unwrap();
        assert_eq!(Format::of_path(&gz).unwrap(), Format::Csv);
        assert_eq!(Format::of_path(&zst).unwrap(), Format::Jsonl);
        assert!(Format::of_path(&dir.join("likes.gz")).is_err());

        let mut src = Source::open(&gz, Format::Csv, &Mapping::default()).unwrap();
        let rows = all(&mut src);
        assert_eq!(rows.len(), 2000);
        assert_eq!(
            rows[1999].values.as_ref().unwrap()[1],
            Value::Text("u1999".into())
        );
        // Every byte of the file, none of the text's: the estimate's denominator is the file.
        assert_eq!(src.bytes_read(), src.size_bytes);
        assert!(src.size_bytes < csv.len() as u64 / 2);

        let mut src = Source::open(&zst, Format::Jsonl, &Mapping::default()).unwrap();
        let rows = all(&mut src);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].values.as_ref().unwrap()[2], Value::Bool(true));

        // Not what the name says: the header cannot be read, and the error says which file.
        let fake = dir.join("fake.csv.gz");
        std::fs::write(&fake, csv.as_bytes()).unwrap();
        let e = Source::open(&fake, Format::Csv, &Mapping::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("fake.csv.gz"), "{e}");
        let pq = dir.join("x.parquet.gz");
        std::fs::write(&pq, b"x").unwrap();
        let e = Source::open(&pq, Format::Parquet, &Mapping::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("decompress"), "{e}");
    }

    #[test]
    fn json_lines_take_strings_numbers_and_bools() {
        let dir = std::env::temp_dir().join(format!("likes-src-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("e.jsonl");
        std::fs::write(
            &p,
            "{\"item_id\":\"i1\",\"user_id\":\"u1\",\"liked\":true,\"liked_at\":5}\n\n[1]\n{\"item_id\":7}\n",
        )
        .unwrap();
        let mut src = Source::open(&p, Format::Jsonl, &Mapping::default()).unwrap();
        let rows = all(&mut src);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].values.as_ref().unwrap()[2], Value::Bool(true));
        assert_eq!(rows[0].values.as_ref().unwrap()[3], Value::Int(5));
        assert!(rows[1].values.is_err());
        assert_eq!(rows[2].values.as_ref().unwrap()[1], Value::Missing);
    }

    #[test]
    fn parquet_rows_come_out_with_their_timestamps_in_ms() {
        let dir = std::env::temp_dir().join(format!("likes-src-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("e.parquet");
        super::super::parquet_file::write(
            &p,
            &[
                ("i1", "u1", true, 1_700_000_000_123),
                ("i2", "u2", false, 5),
            ],
        )
        .unwrap();
        let mut src = Source::open(&p, Format::Parquet, &Mapping::default()).unwrap();
        assert_eq!(src.rows, Some(2));
        let rows = all(&mut src);
        assert_eq!(
            rows[0].values.as_ref().unwrap(),
            &[
                Value::Text("i1".into()),
                Value::Text("u1".into()),
                Value::Bool(true),
                Value::TimeMs(1_700_000_000_123)
            ]
        );
        assert_eq!(rows[1].values.as_ref().unwrap()[2], Value::Bool(false));
    }
}
