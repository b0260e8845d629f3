//! The compiled fast path of capture's row encoding: the text form of a row (a pgoutput
//! tuple, or a COPY row, every column sent as text) straight to the Avro binary encoding
//! of the change record's row image and of its Kafka key, with no Python object per
//! column in between.
//!
//! The Python path (`capture.rows.codec.TableCodec.row` parsing each column, then
//! `schemas.avro_binary`'s writers) stays the reference and the fallback, and this
//! module is held to it byte for byte:
//!
//! - **Narrow on purpose.** A column is encoded here only in the canonical text form
//!   PostgreSQL prints for its type under capture's session settings (`t`/`f`;
//!   `-?[0-9]+` within the Avro type's range; finite floats; ISO dates, times and
//!   timestamps of years 1 to 9999; valid UTF-8). Anything else makes `encode` return `None`, and the caller runs the
//!   Python path on the whole row, which either encodes it (with the same bytes: the
//!   Python parsers accept a superset of these forms and give the same values for them)
//!   or raises the error the user sees. Errors are therefore worded in one place.
//! - **Same bytes.** Avro's binary encoding
//!   (<https://avro.apache.org/docs/1.12.0/specification/#binary-encoding>): each row
//!   field is the union `["null", T]`, so a null is branch 0 (`0x00`) and a value is
//!   branch 1 (`0x02`) then `T`; an
//!   `int` or `long` is a zig-zag varint, a `string` its byte length (a `long`) then the
//!   bytes, a `boolean` one byte. The key holds the key columns only, a nullable one as
//!   a union, a non-null one bare. `tests/unit/capture/test_native_rows.py` compares both
//!   paths over edge values of every kind, and the recorded-frames digest of
//!   `bench/capture_hot_path.py` covers whole streams.
//! - **No state.** An encoder is the immutable per-table-version plan; calls share
//!   nothing, so one encoder serves any thread.

mod change_decoder;
mod compiled_stream;
mod producer;
mod spool_replay;
mod spool_writer;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// pgoutput message tags (<https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html>).
const INSERT: u8 = b'I';
const UPDATE: u8 = b'U';
const DELETE: u8 = b'D';
/// Before a tuple: the new row, the replica identity's key columns (the others null),
/// or the whole old row (`REPLICA IDENTITY FULL`).
const NEW_TUPLE: u8 = b'N';
const KEY_TUPLE: u8 = b'K';
const OLD_TUPLE: u8 = b'O';
/// A tuple column's kind: NULL, or its text (`u`, unchanged TOAST, and `b`, binary, are
/// left to the Python path).
const COLUMN_NULL: u8 = b'n';
const COLUMN_TEXT: u8 = b't';
/// COPY text format: the NULL field, and the escape character.
const COPY_NULL: &[u8] = b"\\N";
const COPY_ESCAPE: u8 = b'\\';
const COPY_COLUMN_SEPARATOR: u8 = b'\t';
const COPY_ROW_END: u8 = b'\n';

/// Branch 0 of a `["null", T]` union: null, nothing follows.
const NULL: u8 = 0x00;
/// A `boolean` false, and true.
const FALSE: u8 = 0x00;
const TRUE: u8 = 0x01;
/// An empty Avro array: a block count of 0 ends it.
const EMPTY_ARRAY: u8 = 0x00;

/// Which image of the change record a row message's tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Image {
    /// The new row of an Insert or of an Update without an old part: `after`.
    After,
    /// A Delete's replica identity key, the other columns null: `before`, key only.
    KeyBefore,
    /// A Delete's whole old row: `before`.
    OldBefore,
}

impl Image {
    /// The image of a row message's only tuple, from its tag and the byte before the
    /// tuple; None for any other shape (an Update with an old part, another message).
    fn of(tag: u8, tuple: u8) -> Option<Image> {
        match (tag, tuple) {
            (INSERT | UPDATE, NEW_TUPLE) => Some(Image::After),
            (DELETE, KEY_TUPLE) => Some(Image::KeyBefore),
            (DELETE, OLD_TUPLE) => Some(Image::OldBefore),
            _ => None,
        }
    }

    /// The record's fields after `ordinal`: `before_key_only`, `before`, `after` and
    /// `unchanged_columns` (none: only an Update with unchanged TOAST has some, and
    /// those are left to the Python path).
    fn write(self, value: &mut Vec<u8>, row: &[u8]) {
        match self {
            Image::After => {
                value.extend_from_slice(&[FALSE, NULL, NON_NULL]);
                value.extend_from_slice(row);
                value.push(EMPTY_ARRAY);
            }
            Image::KeyBefore | Image::OldBefore => {
                let key_only = if self == Image::KeyBefore { TRUE } else { FALSE };
                value.extend_from_slice(&[key_only, NON_NULL]);
                value.extend_from_slice(row);
                value.extend_from_slice(&[NULL, EMPTY_ARRAY]);
            }
        }
    }
}
/// Branch 1 of a `["null", T]` union: the value follows.
const NON_NULL: u8 = 0x02;

/// How one column's text is read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `bool`: `t` or `f` -> Avro `boolean`.
    Boolean,
    /// `int2`, `int4`: a decimal integer within 32 bits -> Avro `int`.
    Int,
    /// `int8`, `oid`: a decimal integer within 64 bits -> Avro `long`.
    Long,
    /// Any type published as its text (`text`, `varchar`, `bpchar`, `uuid`, `json`...):
    /// valid UTF-8 -> Avro `string`.
    String,
    /// `float4`: a finite decimal number -> Avro `float`, rounded through a double as
    /// Python's `float()` then `struct.pack("<f")` do.
    Float,
    /// `float8`: a finite decimal number -> Avro `double`.
    Double,
    /// `date`: `YYYY-MM-DD` -> days since 1970-01-01, an Avro `int`.
    Date,
    /// `time`: `HH:MM:SS[.ffffff]` -> microseconds after midnight, an Avro `long`.
    Time,
    /// `timestamp`: `YYYY-MM-DD HH:MM:SS[.ffffff]` -> microseconds since 1970-01-01, a
    /// `long`.
    Timestamp,
    /// `timestamptz`: the same followed by the offset PostgreSQL prints (`+00`, `-05:30`,
    /// `+05:53:28`) -> microseconds since 1970-01-01 UTC, a `long`.
    TimestampTz,
}

impl Kind {
    fn named(name: &str) -> Option<Kind> {
        match name {
            "boolean" => Some(Kind::Boolean),
            "int" => Some(Kind::Int),
            "long" => Some(Kind::Long),
            "string" => Some(Kind::String),
            "float" => Some(Kind::Float),
            "double" => Some(Kind::Double),
            "date" => Some(Kind::Date),
            "time" => Some(Kind::Time),
            "timestamp" => Some(Kind::Timestamp),
            "timestamptz" => Some(Kind::TimestampTz),
            _ => None,
        }
    }
}

/// The zig-zag varint of `value` appended to `out`.
fn write_long(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8 & 0x7F) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// A decimal integer in PostgreSQL's output form: an optional `-`, then digits only.
/// `None` for anything else, or beyond 64 bits.
fn parse_integer(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulated as a negative number, so that i64::MIN fits.
    let mut value: i64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_sub(i64::from(digit - b'0'))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

/// A finite number in the form PostgreSQL prints floats (`-?D+(.D+)?(e[+-]D+)?`), as a
/// correctly rounded double, like Python's `float()`. `NaN` and `Infinity` are left to
/// the Python path.
fn parse_double(text: &[u8]) -> Option<f64> {
    let digits = |from: usize| {
        text[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut at = usize::from(text.first() == Some(&b'-'));
    let whole = digits(at);
    if whole == 0 {
        return None;
    }
    at += whole;
    if text.get(at) == Some(&b'.') {
        let fraction = digits(at + 1);
        if fraction == 0 {
            return None;
        }
        at += 1 + fraction;
    }
    if matches!(text.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(text.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let exponent = digits(at);
        if exponent == 0 {
            return None;
        }
        at += exponent;
    }
    if at != text.len() {
        return None;
    }
    // Only ASCII digits, signs, '.' and 'e' are left, so this is valid UTF-8.
    std::str::from_utf8(text).ok()?.parse::<f64>().ok()
}

/// `N` ASCII digits at `text[at..at + N]` as a number.
fn fixed_digits(text: &[u8], at: usize, count: usize) -> Option<i64> {
    let field = text.get(at..at + count)?;
    field.iter().try_fold(0i64, |value, &digit| {
        digit
            .is_ascii_digit()
            .then(|| value * 10 + i64::from(digit - b'0'))
    })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`, as `capture.typemap` computes it).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `YYYY-MM-DD` at the start of `text`, a real date of years 1 to 9999 (what
/// `date.fromisoformat` reads): days since 1970-01-01.
fn parse_date(text: &[u8]) -> Option<i64> {
    let (year, month, day) = (
        fixed_digits(text, 0, 4)?,
        fixed_digits(text, 5, 2)?,
        fixed_digits(text, 8, 2)?,
    );
    if text[4] != b'-' || text[7] != b'-' || year == 0 || !(1..=12).contains(&month) {
        return None;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    (1..=month_days)
        .contains(&day)
        .then(|| days_from_civil(year, month, day))
}

/// `HH:MM:SS[.f{1,6}]` at `text[at..]`, hours below 24: microseconds after midnight and
/// where the time ends.
fn parse_time_of_day(text: &[u8], at: usize) -> Option<(i64, usize)> {
    let (hour, minute, second) = (
        fixed_digits(text, at, 2)?,
        fixed_digits(text, at + 3, 2)?,
        fixed_digits(text, at + 6, 2)?,
    );
    if text[at + 2] != b':' || text[at + 5] != b':' || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut micros = ((hour * 60 + minute) * 60 + second) * 1_000_000;
    let mut end = at + 8;
    if text.get(end) == Some(&b'.') {
        let count = text[end + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=6).contains(&count) {
            return None;
        }
        let fraction = fixed_digits(text, end + 1, count)?;
        micros += fraction * 10i64.pow(6 - count as u32);
        end += 1 + count;
    }
    Some((micros, end))
}

/// A timestamp's microseconds since 1970-01-01 (UTC when `zoned`, where the text must end
/// with the offset PostgreSQL prints; without it, none may follow).
fn parse_timestamp(text: &[u8], zoned: bool) -> Option<i64> {
    if text.len() < 19 || text[10] != b' ' {
        return None;
    }
    let days = parse_date(&text[..10])?;
    let (micros, end) = parse_time_of_day(text, 11)?;
    let local = days * 86_400_000_000 + micros;
    if !zoned {
        return (end == text.len()).then_some(local);
    }
    let sign = match text.get(end) {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return None,
    };
    // +HH, +HH:MM or +HH:MM:SS
    let mut offset = fixed_digits(text, end + 1, 2)? * 3600;
    let mut at = end + 3;
    for unit in [60, 1] {
        if at == text.len() {
            break;
        }
        if text[at] != b':' {
            return None;
        }
        offset += fixed_digits(text, at + 1, 2)? * unit;
        at += 3;
    }
    (at == text.len()).then(|| local - sign * offset * 1_000_000)
}

/// Appends the Avro encoding of one column's text; false when the text is not in the
/// form this module takes (the caller falls back to the Python path).
fn write_value(out: &mut Vec<u8>, kind: Kind, text: &[u8]) -> bool {
    match kind {
        Kind::Boolean => match text {
            b"t" => out.push(1),
            b"f" => out.push(0),
            _ => return false,
        },
        Kind::Int => match parse_integer(text) {
            Some(value) if i32::try_from(value).is_ok() => write_long(out, value),
            _ => return false,
        },
        Kind::Long => match parse_integer(text) {
            Some(value) => write_long(out, value),
            None => return false,
        },
        Kind::Double => match parse_double(text) {
            Some(value) => out.extend_from_slice(&value.to_le_bytes()),
            None => return false,
        },
        Kind::Float => match parse_double(text) {
            Some(value) => {
                let single = value as f32;
                if single.is_infinite() {
                    return false; // beyond a float: Python's pack refuses it
                }
                out.extend_from_slice(&single.to_le_bytes());
            }
            None => return false,
        },
        Kind::Date => match (text.len() == 10).then(|| parse_date(text)).flatten() {
            Some(days) => write_long(out, days),
            None => return false,
        },
        Kind::Time => match parse_time_of_day(text, 0) {
            Some((micros, end)) if end == text.len() => write_long(out, micros),
            _ => return false,
        },
        Kind::Timestamp | Kind::TimestampTz => {
            match parse_timestamp(text, kind == Kind::TimestampTz) {
                Some(micros) => write_long(out, micros),
                None => return false,
            }
        }
        Kind::String => {
            if std::str::from_utf8(text).is_err() {
                return false;
            }
            // A slice's length always fits an i64 on the platforms Python runs on.
            write_long(out, text.len() as i64);
            out.extend_from_slice(text);
        }
    }
    true
}

/// A row's Avro fields, as `encode` returns them: both without any header.
///
/// Made once per row: `freelist` keeps freed ones for reuse, so the named fields cost
/// no more allocations than a tuple would.
#[pyclass(module = "capture_native", frozen, get_all, freelist = 16)]
struct EncodedRow {
    /// The row image's fields as the change record writes them (each a `["null", T]`
    /// union).
    row: Py<PyBytes>,
    /// The key record's fields.
    key: Py<PyBytes>,
}

/// The whole record of a row message, as `encode_change` returns it (once per row
/// change: `freelist` as for [`EncodedRow`]).
#[pyclass(module = "capture_native", frozen, get_all, freelist = 16)]
struct ChangeRecord {
    /// The key, its header first.
    key: Py<PyBytes>,
    /// The value, its header first.
    value: Py<PyBytes>,
    /// The change LSN as PostgreSQL prints it (`%X/%X`), for the record's header.
    change_lsn_text: Py<PyBytes>,
}

/// A snapshot chunk's records, as `encode_copy` returns them.
#[pyclass(module = "capture_native", frozen, get_all)]
struct CopyRecords {
    /// One key per complete line, in order: the record's key, or None for a line the
    /// encoder left to the Python path.
    keys: Py<PyList>,
    /// One value per complete line: the record's value, or (key None) the line itself.
    values: Py<PyList>,
    /// What follows the last newline: the start of a line still to come.
    rest: Py<PyBytes>,
}

/// The row image and key of one table version, from rows whose every column is text.
#[pyclass(frozen, module = "capture_native")]
struct TextRowEncoder {
    kinds: Vec<Kind>,
    /// `(column index, nullable)` of each key column, in key order.
    key: Vec<(usize, bool)>,
}

impl TextRowEncoder {
    /// The row fields of one COPY line into `row`; false when the line is not one the
    /// encoder takes.
    fn copy_row(
        &self,
        line: &[u8],
        row: &mut Vec<u8>,
        spans: &mut Vec<Option<(usize, usize)>>,
    ) -> bool {
        let mut fields = line.split(|&b| b == COPY_COLUMN_SEPARATOR);
        for &kind in &self.kinds {
            let Some(field) = fields.next() else {
                return false; // fewer columns than the table has
            };
            if field == COPY_NULL {
                row.push(NULL);
                spans.push(None);
            } else if field.contains(&COPY_ESCAPE) || !write_field(row, spans, kind, field) {
                return false; // an escape: the Python path unescapes it
            }
        }
        fields.next().is_none()
    }

    /// The row fields, key fields and image of a row message [`encode_change`] takes.
    fn row_message_fields(&self, message: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Image)> {
        let image = Image::of(*message.first()?, *message.get(5)?)?;
        let columns = u16::from_be_bytes(message.get(6..8)?.try_into().ok()?);
        if usize::from(columns) != self.kinds.len() {
            return None;
        }
        let mut row: Vec<u8> = Vec::with_capacity(64 + 16 * self.kinds.len());
        let mut spans: Vec<Option<(usize, usize)>> = Vec::with_capacity(self.kinds.len());
        let mut at = 8;
        for &kind in &self.kinds {
            match *message.get(at)? {
                COLUMN_NULL => {
                    row.push(NULL);
                    spans.push(None);
                    at += 1;
                }
                COLUMN_TEXT => {
                    let length = u32::from_be_bytes(message.get(at + 1..at + 5)?.try_into().ok()?);
                    let start = at + 5;
                    let end = start.checked_add(usize::try_from(length).ok()?)?;
                    if !write_field(&mut row, &mut spans, kind, message.get(start..end)?) {
                        return None;
                    }
                    at = end;
                }
                _ => return None, // unchanged TOAST or binary: the Python path
            }
        }
        if at != message.len() {
            return None;
        }
        let mut key: Vec<u8> = Vec::with_capacity(32);
        if !self.key_fields(&row, &spans, &mut key) {
            return None;
        }
        Some((row, key, image))
    }

    /// The key record's fields from a row's fields; false when a non-null key field is
    /// null.
    fn key_fields(&self, row: &[u8], spans: &[Option<(usize, usize)>], key: &mut Vec<u8>) -> bool {
        for &(index, nullable) in &self.key {
            match (spans[index], nullable) {
                (Some((start, end)), true) => {
                    key.push(NON_NULL);
                    key.extend_from_slice(&row[start..end]);
                }
                (Some((start, end)), false) => key.extend_from_slice(&row[start..end]),
                (None, true) => key.push(NULL),
                // A null in a non-null key field: the Python path says what is wrong.
                (None, false) => return false,
            }
        }
        true
    }
}

/// One non-null field (`0x02` then the value) appended to `row`, its value's span to
/// `spans`; false when the text is not one the encoder takes.
fn write_field(
    row: &mut Vec<u8>,
    spans: &mut Vec<Option<(usize, usize)>>,
    kind: Kind,
    text: &[u8],
) -> bool {
    row.push(NON_NULL);
    let start = row.len();
    if !write_value(row, kind, text) {
        return false;
    }
    spans.push(Some((start, row.len())));
    true
}

#[pymethods]
impl TextRowEncoder {
    /// `kinds`: one of `boolean`, `int`, `long`, `string`, `float`, `double`, `date`,
    /// `time`, `timestamp`, `timestamptz` per column, in column order.
    /// `key_columns` and `key_nullable`: the key columns' indexes, in key order, and
    /// whether each is nullable in the key schema.
    #[new]
    fn new(kinds: Vec<String>, key_columns: Vec<usize>, key_nullable: Vec<bool>) -> PyResult<Self> {
        let kinds = kinds
            .iter()
            .map(|name| {
                Kind::named(name).ok_or_else(|| {
                    PyValueError::new_err(format!("{name:?} is not a kind the encoder knows"))
                })
            })
            .collect::<PyResult<Vec<Kind>>>()?;
        if key_columns.len() != key_nullable.len() {
            return Err(PyValueError::new_err(
                "one nullable flag per key column is required",
            ));
        }
        if let Some(index) = key_columns.iter().find(|&&index| index >= kinds.len()) {
            return Err(PyValueError::new_err(format!(
                "key column {index} is not one of the {} columns",
                kinds.len()
            )));
        }
        let key = key_columns.into_iter().zip(key_nullable).collect();
        Ok(TextRowEncoder { kinds, key })
    }

    /// The row fields and key fields ([`EncodedRow`]) of a row given as the text of each
    /// column, `None` for a NULL (never for an unchanged TOAST value: the caller keeps
    /// those rows). `None` when a value is
    /// neither `bytes` nor None, the count differs, a non-null key field is null, or a
    /// text is not in the form this module takes: the Python path then encodes the row,
    /// or says what is wrong with it.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyTuple>,
    ) -> Option<EncodedRow> {
        if values.len() != self.kinds.len() {
            return None;
        }
        let mut row: Vec<u8> = Vec::with_capacity(64 + 16 * self.kinds.len());
        // Where each column's value starts and ends in `row`, for the key; None: null.
        let mut spans: Vec<Option<(usize, usize)>> = Vec::with_capacity(self.kinds.len());
        for (item, &kind) in values.iter().zip(&self.kinds) {
            if item.is_none() {
                row.push(NULL);
                spans.push(None);
                continue;
            }
            let text = item.cast::<PyBytes>().ok()?.as_bytes();
            if !write_field(&mut row, &mut spans, kind, text) {
                return None;
            }
        }
        let mut key: Vec<u8> = Vec::with_capacity(32);
        if !self.key_fields(&row, &spans, &mut key) {
            return None;
        }
        Some(EncodedRow { row: PyBytes::new(py, &row).unbind(), key: PyBytes::new(py, &key).unbind() })
    }

    /// A snapshot's records from COPY text (`COPY ... TO STDOUT`, one row per line, tabs
    /// between columns, `\\N` for NULL): [`CopyRecords`]. Each complete line of
    /// `data` gives one record, in order, with ordinals from `first_ordinal` on: the key
    /// is `key_header` then the key fields, the value `value_head` (everything before
    /// the ordinal, the same for all of a chunk's records) then the ordinal and an
    /// after-only image. A line the encoder does not take (a backslash escape, a column
    /// count that differs, a text left to the Python path) gives a key of `None` and the
    /// line itself as the value: the caller encodes it, with its ordinal. `rest` is what
    /// follows the last newline, the start of a line still to come.
    fn encode_copy<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        key_header: &[u8],
        value_head: &[u8],
        first_ordinal: i64,
    ) -> PyResult<CopyRecords> {
        let keys = PyList::empty(py);
        let values = PyList::empty(py);
        let complete = data
            .iter()
            .rposition(|&b| b == COPY_ROW_END)
            .map_or(0, |end| end + 1);
        let mut row: Vec<u8> = Vec::with_capacity(256);
        let mut spans: Vec<Option<(usize, usize)>> = Vec::with_capacity(self.kinds.len());
        let mut key: Vec<u8> = Vec::with_capacity(64);
        let mut value: Vec<u8> = Vec::with_capacity(512);
        let lines = data[..complete].split_inclusive(|&b| b == COPY_ROW_END);
        for (ordinal, terminated) in (first_ordinal..).zip(lines) {
            let line = &terminated[..terminated.len() - 1];
            row.clear();
            spans.clear();
            key.clear();
            if self.copy_row(line, &mut row, &mut spans) && self.key_fields(&row, &spans, &mut key)
            {
                value.clear();
                value.extend_from_slice(value_head);
                write_long(&mut value, ordinal);
                Image::After.write(&mut value, &row);
                let mut framed = Vec::with_capacity(key_header.len() + key.len());
                framed.extend_from_slice(key_header);
                framed.extend_from_slice(&key);
                keys.append(PyBytes::new(py, &framed))?;
                values.append(PyBytes::new(py, &value))?;
            } else {
                keys.append(py.None())?;
                values.append(PyBytes::new(py, line))?;
            }
        }
        Ok(CopyRecords {
            keys: keys.unbind(),
            values: values.unbind(),
            rest: PyBytes::new(py, &data[complete..]).unbind(),
        })
    }

    /// The whole record of a row message as the stream publishes it ([`ChangeRecord`]:
    /// key, value, change LSN text). The message is one the server sends outside a streamed
    /// transaction with a single tuple: an Insert (`I`, relation oid, `N`, tuple), an
    /// Update with only its new tuple (`U`, relation oid, `N`, tuple), or a Delete
    /// (`D`, relation oid, `K` or `O`, tuple). The tuple's columns must be text or NULL.
    ///
    /// The key is `key_header` then the key fields. The value is `value_start`, the
    /// zig-zag `change_lsn`, `value_middle`, the zig-zag `ordinal`, then the images: the
    /// new row as `after`, or the Delete's tuple as `before` (key only for `K`), no
    /// unchanged columns. The caller's two parts are what the change record holds before
    /// and after `change_lsn` (header, `op`, `commit_lsn`; `xid`, `commit_ts`), the same
    /// for every record of a transaction, table version and operation. The text is
    /// `change_lsn` as PostgreSQL prints an LSN (`%X/%X`), for the record's
    /// `change_lsn` header. One call instead of the row fields and then the record's
    /// assembly in Python, which cost more than the row itself.
    ///
    /// `None` for anything else -- another message or shape, an unchanged TOAST or
    /// binary column, a text this module does not take, bytes that do not parse to
    /// exactly the message's end: the caller then decodes the message in Python, which
    /// reads it or says what is wrong (`capture.pgoutput.decode`). The relation oid is
    /// the caller's to check.
    #[allow(clippy::too_many_arguments)]
    fn encode_change<'py>(
        &self,
        py: Python<'py>,
        message: &[u8],
        key_header: &[u8],
        value_start: &[u8],
        change_lsn: u64,
        value_middle: &[u8],
        ordinal: i64,
    ) -> Option<ChangeRecord> {
        let (row, key_fields, image) = self.row_message_fields(message)?;
        let mut key = Vec::with_capacity(key_header.len() + key_fields.len());
        key.extend_from_slice(key_header);
        key.extend_from_slice(&key_fields);
        let mut value = Vec::with_capacity(value_start.len() + value_middle.len() + row.len() + 24);
        value.extend_from_slice(value_start);
        // An LSN is a long in the record: its 64 bits as a signed value, as Python's
        // writer takes it (every LSN a server gives is below 2^63).
        write_long(&mut value, i64::try_from(change_lsn).ok()?);
        value.extend_from_slice(value_middle);
        write_long(&mut value, ordinal);
        image.write(&mut value, &row);
        let lsn_text = format!("{:X}/{:X}", change_lsn >> 32, change_lsn & 0xFFFF_FFFF);
        Some(ChangeRecord {
            key: PyBytes::new(py, &key).unbind(),
            value: PyBytes::new(py, &value).unbind(),
            change_lsn_text: PyBytes::new(py, lsn_text.as_bytes()).unbind(),
        })
    }

    /// The number of columns a row has.
    fn __len__(&self) -> usize {
        self.kinds.len()
    }
}

/// Kafka's murmur2 of `data` (the Java client's `Utils.murmur2`, which librdkafka's
/// `murmur2_random` partitioner reproduces): 32-bit arithmetic that wraps, seed
/// `0x9747b28c`, the tail bytes mixed in little-endian order.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ (data.len() as u32);
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The partition of each key among `count`: `(murmur2(key) & 0x7fffffff) % count`, what
/// the Java client's default partitioner and librdkafka's `murmur2_random` choose for a
/// record with a key (`capture/publish/partitioning.py`, the Python twin, says why capture
/// computes it itself).
#[pyfunction]
fn key_partitions(keys: &Bound<'_, PyList>, count: u32) -> PyResult<Vec<u32>> {
    if count == 0 {
        return Err(PyValueError::new_err("a topic has at least one partition"));
    }
    let mut partitions = Vec::with_capacity(keys.len());
    for key in keys.iter() {
        // Read in place: a snapshot batch's keys are not copied to be hashed.
        let key = key.cast::<PyBytes>()?;
        partitions.push((murmur2(key.as_bytes()) & 0x7fff_ffff) % count);
    }
    Ok(partitions)
}

#[pymodule]
fn capture_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<TextRowEncoder>()?;
    module.add_class::<EncodedRow>()?;
    module.add_class::<ChangeRecord>()?;
    module.add_class::<CopyRecords>()?;
    module.add_class::<producer::KafkaProducer>()?;
    module.add_class::<producer::Delivered>()?;
    module.add_class::<producer::BatchProduced>()?;
    module.add_class::<producer::Polled>()?;
    module.add_class::<producer::UnreportedFailure>()?;
    module.add_class::<producer::ClientError>()?;
    module.add_class::<producer::StreamedRun>()?;
    module.add_class::<compiled_stream::CompiledStream>()?;
    module.add_class::<compiled_stream::Stop>()?;
    module.add_class::<compiled_stream::CompiledStreamRead>()?;
    module.add_class::<compiled_stream::TransactionPart>()?;
    module.add_class::<compiled_stream::TableCount>()?;
    module.add_class::<compiled_stream::OpenTransaction>()?;
    module.add_class::<spool_replay::SpoolReplay>()?;
    module.add_class::<spool_writer::SpooledRun>()?;
    module.add("SpoolDamagedError", module.py().get_type::<spool_replay::SpoolDamagedError>())?;
    module.add_class::<change_decoder::ChangeDecoder>()?;
    module.add_class::<change_decoder::DecodedFields>()?;
    module.add_function(wrap_pyfunction!(key_partitions, module)?)?;
    module.add("ENCODED_CHANGE", compiled_stream::ENCODED_CHANGE)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_bytes(value: i64) -> Vec<u8> {
        let mut out = Vec::new();
        write_long(&mut out, value);
        out
    }

    #[test]
    fn murmur2_gives_the_java_clients_hashes() {
        // Apache Kafka's own vectors (UtilsTest.testMurmur2), as the Java client's signed ints.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ];
        for (data, expected) in cases {
            assert_eq!(murmur2(data) as i32, expected);
        }
    }

    #[test]
    fn zig_zag_varints() {
        assert_eq!(long_bytes(0), [0x00]);
        assert_eq!(long_bytes(-1), [0x01]);
        assert_eq!(long_bytes(1), [0x02]);
        assert_eq!(long_bytes(-64), [0x7F]);
        assert_eq!(long_bytes(64), [0x80, 0x01]);
        assert_eq!(long_bytes(i64::MAX).len(), 10);
        assert_eq!(
            long_bytes(i64::MIN),
            [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
    }

    #[test]
    fn integers_in_the_output_form_only() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"-42"), Some(-42));
        assert_eq!(parse_integer(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_integer(b"9223372036854775808"), None);
        for text in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"1_000",
            b"0x1",
            b"1.0",
        ] {
            assert_eq!(parse_integer(text), None, "{text:?}");
        }
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(parse_date(b"1970-01-01"), Some(0));
        assert_eq!(parse_date(b"2000-03-01"), Some(11_017));
        assert_eq!(parse_date(b"0001-01-01"), Some(-719_162));
        assert_eq!(parse_date(b"2024-02-29"), Some(19_782));
        for text in [
            &b"2023-02-29"[..],
            b"2024-13-01",
            b"0000-01-01",
            b"2024-1-01",
            b"20240101",
        ] {
            assert_eq!(parse_date(text), None, "{text:?}");
        }
        assert_eq!(
            parse_time_of_day(b"23:59:59.5", 0),
            Some((86_399_500_000, 10))
        );
        assert_eq!(parse_time_of_day(b"24:00:00", 0), None);
        assert_eq!(parse_time_of_day(b"00:00:00.1234567", 0), None);
        assert_eq!(
            parse_timestamp(b"1970-01-01 00:00:01", false),
            Some(1_000_000)
        );
        assert_eq!(
            parse_timestamp(b"1970-01-01 00:00:01+00", true),
            Some(1_000_000)
        );
        assert_eq!(parse_timestamp(b"1970-01-01 05:30:00+05:30", true), Some(0));
        assert_eq!(parse_timestamp(b"1969-12-31 23:00:00-01", true), Some(0));
        assert_eq!(
            parse_timestamp(b"1970-01-01 00:00:00+00:00:01", true),
            Some(-1_000_000)
        );
        assert_eq!(parse_timestamp(b"1970-01-01 00:00:00+00", false), None);
        assert_eq!(parse_timestamp(b"1970-01-01 00:00:00", true), None);
        assert_eq!(parse_timestamp(b"1970-01-01 00:00:00 BC", false), None);
    }

    #[test]
    fn floats_in_the_output_form_only() {
        assert_eq!(parse_double(b"1.5"), Some(1.5));
        assert_eq!(parse_double(b"-0"), Some(-0.0));
        assert_eq!(parse_double(b"1e+100"), Some(1e100));
        assert_eq!(
            parse_double(b"2.2250738585072014e-308"),
            Some(f64::MIN_POSITIVE)
        );
        for text in [
            &b"NaN"[..],
            b"Infinity",
            b"-Infinity",
            b"1.",
            b".5",
            b"1e",
            b"+1",
            b" 1",
        ] {
            assert_eq!(parse_double(text), None, "{text:?}");
        }
    }

    #[test]
    fn values_outside_the_form_fall_back() {
        let mut out = Vec::new();
        assert!(!write_value(&mut out, Kind::Boolean, b"true"));
        assert!(!write_value(&mut out, Kind::Int, b"2147483648"));
        assert!(write_value(&mut out, Kind::Int, b"-2147483648"));
        assert!(!write_value(&mut out, Kind::String, b"\xff"));
        assert!(!write_value(&mut out, Kind::String, b"\xed\xa0\x80")); // a surrogate
    }
}
