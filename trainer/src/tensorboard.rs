//! The metrics of a run as TensorBoard event files (`OUT/tensorboard/`), the TFRecord format that
//! TensorBoard and every experiment tracker imports. The protobuf messages are encoded by hand: only
//! the fields a scalar needs,
//!
//! ```text
//! Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//! Summary { repeated Value value = 1; }
//! Value   { string tag = 1; float simple_value = 2; }
//! ```
//!
//! each framed as a TFRecord: the data's length (u64, little-endian), the masked CRC-32C of those 8
//! bytes, the data, the masked CRC-32C of the data. The first record is the file version
//! (`brain.Event:2`); then one event per metrics line, with one value per finite number of the line.
//!
//! [`read_scalars`] parses such a file back (any TFRecord file of events, not only rlx's), verifying
//! both checksums of every record: its input is untrusted, so a truncated or corrupt file is an error,
//! never a panic, and a record's length is bounded ([`MAX_RECORD`]).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// The directory of the event files inside the run's output directory: `OUT/tensorboard/`.
pub const DIR: &str = "tensorboard";

/// The name of rlx's event file in [`DIR`]. Fixed (not timestamped like TensorFlow's), so that a
/// resumed run rewrites it instead of adding a second file that TensorBoard would merge with it.
pub const FILE: &str = "events.out.tfevents.0.rlx";

/// The file version of the first record: version 2 of TensorBoard's event format.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The largest record [`read_scalars`] accepts, in bytes (a scalar event is well under 1 KiB per
/// metric).
pub const MAX_RECORD: u64 = 16 << 20;

/// The event file of the run in `out`: `out/tensorboard/events.out.tfevents.0.rlx`.
pub fn file_path(out: &Path) -> PathBuf {
    out.join(DIR).join(FILE)
}

/// Appends the metrics of a run to its event file, one event per metrics line.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Creates `out/tensorboard/` and (re)writes its rlx event file ([`file_path`]), starting with the
    /// file-version record and then one event per line of `history` (the metrics lines kept from
    /// before a resume), then is ready to append with [`EventWriter::write_line`].
    pub fn create(out: &Path, history: &[Map<String, Value>]) -> Result<EventWriter, String> {
        let path = file_path(out);
        let dir = out.join(DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot write {}: {e}", dir.display()))?;
        let file =
            File::create(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let mut writer = EventWriter {
            path,
            file: BufWriter::new(file),
        };
        let mut event = Vec::new();
        put_double(&mut event, 1, now());
        put_bytes(&mut event, 3, FILE_VERSION.as_bytes());
        writer.record(&event)?;
        for line in history {
            writer.event(line)?;
        }
        writer.flush()?;
        Ok(writer)
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event at step `line["step"]` with one scalar per finite number of `line` except
    /// `"step"` (nulls, strings, booleans, arrays and objects are skipped), and flushes it to disk. A
    /// line whose `step` is missing or not a non-negative integer is an error; a line with no number
    /// but its step writes nothing.
    pub fn write_line(&mut self, line: &Map<String, Value>) -> Result<(), String> {
        self.event(line)?;
        self.flush()
    }

    fn event(&mut self, line: &Map<String, Value>) -> Result<(), String> {
        let step = step_of(line).map_err(|e| self.fail(e))?;
        let mut summary = Vec::new();
        for (tag, value) in line {
            let Some(v) = value.as_f64().filter(|v| v.is_finite()) else {
                continue;
            };
            if tag == "step" {
                continue;
            }
            let mut encoded = Vec::new();
            put_bytes(&mut encoded, 1, tag.as_bytes());
            put_float(&mut encoded, 2, v as f32);
            put_bytes(&mut summary, 1, &encoded);
        }
        if summary.is_empty() {
            return Ok(());
        }
        let mut event = Vec::new();
        put_double(&mut event, 1, now());
        put_varint(&mut event, 2 << 3, step);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    /// Writes `data` as one TFRecord.
    fn record(&mut self, data: &[u8]) -> Result<(), String> {
        let length = (data.len() as u64).to_le_bytes();
        let mut framed = Vec::with_capacity(data.len() + 16);
        framed.extend_from_slice(&length);
        framed.extend_from_slice(&masked_crc(&length).to_le_bytes());
        framed.extend_from_slice(data);
        framed.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.file.write_all(&framed).map_err(|e| self.fail(e))
    }

    fn flush(&mut self) -> Result<(), String> {
        self.file.flush().map_err(|e| self.fail(e))?;
        self.file.get_ref().sync_data().map_err(|e| self.fail(e))
    }

    fn fail(&self, e: impl std::fmt::Display) -> String {
        format!("cannot write {}: {e}", self.path.display())
    }
}

/// The step of a metrics line: a non-negative integer (as JSON writes it, or a float with no
/// fraction, e.g. `3.0`).
fn step_of(line: &Map<String, Value>) -> Result<u64, String> {
    let value = line
        .get("step")
        .ok_or_else(|| "a metrics line has no \"step\"".to_string())?;
    let step = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|s| *s >= 0.0 && s.fract() == 0.0 && *s < 9.0e15)
            .map(|s| s as u64)
    });
    match step {
        Some(s) if s <= i64::MAX as u64 => Ok(s),
        _ => Err(format!(
            "the metrics line's \"step\" is {value}, not a non-negative integer"
        )),
    }
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// TFRecord's masked CRC-32C.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn put_varint(out: &mut Vec<u8>, key: u64, value: u64) {
    for mut v in [key, value] {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_double(out: &mut Vec<u8>, field: u64, value: f64) {
    out.push(((field << 3) | 1) as u8);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_float(out: &mut Vec<u8>, field: u64, value: f32) {
    out.push(((field << 3) | 5) as u8);
    out.extend_from_slice(&value.to_le_bytes());
}

/// The scalars of an event file, in file order: (step, tag, value) for every value with a
/// `simple_value` of every event's summary. Both checksums of every record are verified; a file that
/// does not start with a file-version record (`brain.Event:…`), a truncated or corrupt record, a
/// record longer than [`MAX_RECORD`] or a malformed message is an error naming the file and the
/// record's byte offset.
pub fn read_scalars(path: &Path) -> Result<Vec<(i64, String, f32)>, String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot read {}: {e}", path.display());
    let file = File::open(path).map_err(|e| fail(&e))?;
    let size = file.metadata().map_err(|e| fail(&e))?.len();
    let mut reader = BufReader::new(file);
    let mut scalars = Vec::new();
    let mut offset = 0u64;
    let mut index = 0usize;
    while offset < size {
        let at = |what: &str| format!("record {index} at byte {offset}: {what}");
        let mut header = [0u8; 12];
        read_exact(&mut reader, &mut header, size - offset)
            .map_err(|e| fail(&at(&format!("truncated header ({e})"))))?;
        let length = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let length_crc = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if masked_crc(&header[..8]) != length_crc {
            return Err(fail(&at(
                "the length's checksum does not match (corrupt file)",
            )));
        }
        if length > MAX_RECORD {
            return Err(fail(&at(&format!(
                "a record of {length} bytes, over the limit of {MAX_RECORD}"
            ))));
        }
        let left = size - offset - 12;
        if length + 4 > left {
            return Err(fail(&at(&format!(
                "truncated: a record of {length} bytes and its checksum, but {left} bytes left"
            ))));
        }
        let mut data = vec![0u8; length as usize + 4];
        read_exact(&mut reader, &mut data, left)
            .map_err(|e| fail(&at(&format!("truncated data ({e})"))))?;
        let data_crc = u32::from_le_bytes(data[length as usize..].try_into().expect("4 bytes"));
        let data = &data[..length as usize];
        if masked_crc(data) != data_crc {
            return Err(fail(&at(
                "the data's checksum does not match (corrupt file)",
            )));
        }
        let event = parse_event(data).map_err(|e| fail(&at(&e)))?;
        if index == 0 {
            match &event.file_version {
                Some(v) if v.starts_with("brain.Event:") => {}
                _ => {
                    return Err(fail(&at(
                        "the first record is not a file version (brain.Event:…): not an event file",
                    )))
                }
            }
        }
        scalars.extend(
            event
                .values
                .into_iter()
                .map(|(tag, value)| (event.step, tag, value)),
        );
        offset += 12 + length + 4;
        index += 1;
    }
    if index == 0 {
        return Err(fail(&"empty: no file version record (not an event file)"));
    }
    Ok(scalars)
}

fn read_exact(reader: &mut impl Read, buf: &mut [u8], left: u64) -> Result<(), String> {
    if (buf.len() as u64) > left {
        return Err(format!("{} bytes needed, {left} left", buf.len()));
    }
    reader.read_exact(buf).map_err(|e| e.to_string())
}

/// The fields of an event that the reader keeps.
struct Event {
    step: i64,
    file_version: Option<String>,
    values: Vec<(String, f32)>,
}

/// A protobuf field's payload.
enum Field<'a> {
    Varint(u64),
    /// A 64-bit payload (the event's `wall_time`), skipped.
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The fields of a protobuf message, in order, each as (field number, payload).
fn fields(mut data: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let key = varint(&mut data)?;
        let number = key >> 3;
        let field = match key & 7 {
            0 => Field::Varint(varint(&mut data)?),
            1 => {
                take(&mut data, 8)?;
                Field::Fixed64
            }
            2 => {
                let length = varint(&mut data)?;
                if length > data.len() as u64 {
                    return Err(format!(
                        "malformed protobuf: field {number} of {length} bytes, {} left",
                        data.len()
                    ));
                }
                Field::Bytes(take(&mut data, length as usize)?)
            }
            5 => Field::Fixed32(take(&mut data, 4)?.try_into().expect("4 bytes")),
            wire => {
                return Err(format!(
                    "malformed protobuf: field {number} has wire type {wire}"
                ))
            }
        };
        out.push((number, field));
    }
    Ok(out)
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if data.len() < n {
        return Err(format!(
            "malformed protobuf: {n} bytes needed, {} left",
            data.len()
        ));
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Ok(head)
}

fn varint(data: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in 0..10 {
        let Some((&byte, rest)) = data.split_first() else {
            return Err("malformed protobuf: truncated varint".into());
        };
        *data = rest;
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("malformed protobuf: varint longer than 10 bytes".into())
}

fn parse_event(data: &[u8]) -> Result<Event, String> {
    let mut event = Event {
        step: 0,
        file_version: None,
        values: Vec::new(),
    };
    for (number, field) in fields(data)? {
        match (number, field) {
            (1, Field::Fixed64) => {}
            (2, Field::Varint(step)) => event.step = step as i64,
            (3, Field::Bytes(version)) => {
                event.file_version = Some(
                    String::from_utf8(version.to_vec())
                        .map_err(|_| "the file version is not UTF-8".to_string())?,
                )
            }
            (5, Field::Bytes(summary)) => {
                for (number, field) in fields(summary)? {
                    if let (1, Field::Bytes(value)) = (number, field) {
                        if let Some(scalar) = parse_value(value)? {
                            event.values.push(scalar);
                        }
                    }
                }
            }
            (1 | 2 | 3 | 5, _) => {
                return Err(format!(
                    "malformed event: field {number} has the wrong wire type"
                ))
            }
            _ => {}
        }
    }
    Ok(event)
}

/// A summary value's (tag, simple_value); `None` for a value of another kind (image, tensor, …).
fn parse_value(data: &[u8]) -> Result<Option<(String, f32)>, String> {
    let mut tag = String::new();
    let mut simple = None;
    for (number, field) in fields(data)? {
        match (number, field) {
            (1, Field::Bytes(t)) => {
                tag = String::from_utf8(t.to_vec())
                    .map_err(|_| "a summary value's tag is not UTF-8".to_string())?
            }
            (2, Field::Fixed32(v)) => simple = Some(f32::from_le_bytes(v)),
            (1 | 2, _) => {
                return Err(format!(
                    "malformed summary value: field {number} has the wrong wire type"
                ))
            }
            _ => {}
        }
    }
    Ok(simple.map(|v| (tag, v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // CRC-32C of "123456789" is 0xe3069283 (the standard check value); masked as TFRecord does.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // ((0xe3069283 >> 15) | (0xe3069283 << 17)) = 0x2507c60d, plus 0xa282ead8 (mod 2^32).
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn varints_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, 8, v);
            let mut data = &out[..];
            assert_eq!(varint(&mut data).unwrap(), 8);
            assert_eq!(varint(&mut data).unwrap(), v);
            assert!(data.is_empty());
        }
        assert!(varint(&mut &[0xff; 11][..]).is_err());
        assert!(varint(&mut &[0x80][..]).is_err());
    }
}
