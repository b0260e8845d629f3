//! The compiled stream: streamed changes from the replication connection's buffer to the
//! producer's queue in one call per burst, with no Python object per frame or record.
//!
//! In the Python loop a streamed change cost about 25 µs of one core, of which the
//! compiled encoder was a small part: reading the frame, the transaction's state, the
//! record object, routing, the in-flight book's ticket, producing, and a Python callback
//! per delivery report. The compiled stream does those steps here for the frames that
//! need no decision (`capture/stream/compiled_stream.py` says which; `docs/capture.md`,
//! "The compiled stream"):
//!
//! - **Reading.** `read` takes the frames libpq already holds (`PQgetCopyData`, async:
//!   never waits, never reads the socket) from the connection psycopg owns, by its
//!   `PGconn` pointer, with the functions of the libpq psycopg loaded.
//! - **What it takes.** An XLogData frame holding a Begin, a Commit, or an Insert, a
//!   new-tuple-only Update or a Delete of an *armed* table (one the caller found
//!   streaming, with a compiled encoder, its schema published) whose row the encoder
//!   takes, in a transaction that commits after the table's snapshot. Anything else -- a
//!   keepalive, a Relation, a Truncate, a row the encoder leaves to Python, a table not
//!   armed, a malformed message -- is handed back, unread by the compiled stream, for
//!   the Python path, which reads it and says what is wrong with it. So the Python path
//!   stays the reference for every message and every error. A stream block of a
//!   transaction in progress (`streaming` on: Stream Start to Stream Stop, both included)
//!   is handed back whole, frame by frame: its messages carry an xid where a row change
//!   has its relation OID.
//! - **Same records.** Key, value and headers are built exactly as
//!   `capture.stream.change_stream.ChangeStream.handle_frame` builds them (the tests compare
//!   the two paths' topics byte for byte); ordinals continue across the two paths
//!   within a transaction, through `transaction` and `adopt`.
//! - **Bookkeeping stays in Python.** Records carry their transaction's in-flight book
//!   id as their opaque (`producer::streamed_opaque`); the producer sums their reports
//!   per transaction and partition. The compiled stream hands the caller each
//!   transaction's begin, records, bytes and commit (`take_transactions`) to replay into
//!   the book right after every `read`, before anything polls the producer, so every
//!   report finds its transaction in the book.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CString};

use libloading::Library;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::producer::{streamed_opaque, HeaderField, KafkaProducer};
use crate::spool_replay::SpoolReplay;
use crate::spool_writer::{SpoolWriter, SpooledRun};
use crate::{write_long, TextRowEncoder, DELETE, INSERT, UPDATE};

/// Replication CopyData tag of an XLogData message, and its header's size: tag, then
/// `wal_start`, `wal_end` and `send_time` (<https://www.postgresql.org/docs/current/protocol-replication.html>).
const XLOG_DATA: u8 = b'w';
const XLOG_DATA_HEADER: usize = 25;
/// pgoutput Begin and Commit, and their sizes (protocol version 1).
const BEGIN: u8 = b'B';
const BEGIN_SIZE: usize = 21;
const COMMIT: u8 = b'C';
const COMMIT_SIZE: usize = 26;
/// pgoutput Stream Start and Stream Stop (protocol version 2 and later, with `streaming`).
const STREAM_START: u8 = b'S';
const STREAM_STOP: u8 = b'E';
/// A change a streamed transaction's spool holds encoded ([`EncodedChange`]): capture's
/// own message, never sent by a server; no pgoutput message has this tag. Exported as
/// `capture_native.ENCODED_CHANGE`, its one definition.
pub const ENCODED_CHANGE: u8 = b'X';
/// Microseconds from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;
/// librdkafka's error code for a full producer queue.
const QUEUE_FULL: c_int = -184;

/// What `read` stopped on: the one definition, exported to Python as
/// `capture_native.Stop` (`capture/stream/compiled_stream.py` and the loop read it from
/// there). Its values compare with each other only, never with their numbers, which are
/// part of no protocol.
#[pyclass(module = "capture_native", frozen, eq, hash)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stop {
    /// Nothing more is buffered.
    #[pyo3(name = "EMPTY")]
    Empty = 0,
    /// A frame for the Python path, returned with it.
    #[pyo3(name = "FRAME")]
    Frame = 1,
    /// The producer's queue is full: serve reports, then read again.
    #[pyo3(name = "FULL")]
    Full = 2,
    /// `budget` frames taken, or a commit reached `stop_at`.
    #[pyo3(name = "LIMIT")]
    Limit = 3,
    /// The server ended the COPY stream.
    #[pyo3(name = "ENDED")]
    Ended = 4,
    /// libpq failed to read: the connection's error message says why.
    #[pyo3(name = "FAILED")]
    Failed = 5,
}

/// What one `read` did.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct CompiledStreamRead {
    /// What it stopped on.
    stopped: Stop,
    /// With [`Stop::Frame`], the frame for the Python path (the whole CopyData
    /// payload); otherwise None.
    frame: Option<Py<PyBytes>>,
    /// How many frames the compiled stream took (its own, not counting `frame`).
    taken: usize,
}

impl CompiledStreamRead {
    fn stopped(stopped: Stop, taken: usize) -> CompiledStreamRead {
        CompiledStreamRead { stopped, frame: None, taken }
    }
}

/// The libpq functions the compiled stream calls.
struct LibPq {
    get_copy_data: unsafe extern "C" fn(*mut c_void, *mut *mut c_char, c_int) -> c_int,
    free_memory: unsafe extern "C" fn(*mut c_void),
    _library: Library,
}

impl LibPq {
    fn load(path: &str) -> Result<LibPq, libloading::Error> {
        // SAFETY: the library is the one psycopg already loaded; the signatures are
        // libpq's documented ones.
        unsafe {
            let library = Library::new(path)?;
            Ok(LibPq {
                get_copy_data: *library.get(b"PQgetCopyData\0")?,
                free_memory: *library.get(b"PQfreemem\0")?,
                _library: library,
            })
        }
    }
}

/// How the caller arms one operation of a table: its pgoutput tag, the value's bytes
/// before `commit_lsn`, and the `op` and fingerprint headers as `(name, value)`.
type ArmedOperation = (u8, Vec<u8>, (String, Vec<u8>), (String, Vec<u8>));

/// What every record of an armed table and operation shares.
struct Operation {
    value_prefix: Vec<u8>,
    /// The `op` and schema fingerprint headers: `(name, value)`.
    headers: [(String, Vec<u8>); 2],
}

/// An armed table version.
struct Table {
    encoder: Py<TextRowEncoder>,
    topic: CString,
    key_header: Vec<u8>,
    /// Changes of transactions committing at or before this LSN go to the Python path
    /// (which drops them: the table's snapshot holds them).
    publish_after: u64,
    /// By operation: Insert, Update, Delete; None when the operation is not armed.
    operations: [Option<Operation>; 3],
    /// Records and bytes produced per operation since the last `take_counts`.
    counts: [(u64, u64); 3],
}

/// The open transaction.
struct Transaction {
    id: u64,
    commit_lsn: u64,
    xid: u32,
    commit_ts: i64,
    ordinal: i64,
    /// The value's `commit_lsn`, and its `xid` and `commit_ts`, encoded.
    commit_field: Vec<u8>,
    transaction_fields: Vec<u8>,
    /// `commit_lsn` as PostgreSQL prints it, for the header.
    commit_text: Vec<u8>,
}

impl Transaction {
    fn new(id: u64, commit_lsn: u64, xid: u32, commit_ts: i64, ordinal: i64) -> Transaction {
        let mut commit_field = Vec::with_capacity(10);
        write_long(&mut commit_field, commit_lsn as i64);
        let mut transaction_fields = Vec::with_capacity(20);
        write_long(&mut transaction_fields, i64::from(xid));
        write_long(&mut transaction_fields, commit_ts);
        Transaction {
            id,
            commit_lsn,
            xid,
            commit_ts,
            ordinal,
            commit_field,
            transaction_fields,
            commit_text: lsn_text(commit_lsn),
        }
    }
}

/// One transaction's part of what the compiled stream did since the last
/// `take_transactions`: what the caller replays into its in-flight book, in order.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct TransactionPart {
    /// The transaction's id in the book (the compiled stream's records carry it as their
    /// opaque).
    id: u64,
    commit_lsn: u64,
    /// Whether its Begin is in this part (the book must begin it).
    began: bool,
    /// Records the compiled stream produced for it in this part, and their key and value
    /// bytes.
    records: u64,
    bytes: u64,
    /// The Commit's end LSN when the Commit is in this part; 0 while it is open.
    end_lsn: u64,
}

/// The records and bytes the compiled stream produced for one armed table and operation
/// since the last `take_counts`, for the caller's metrics.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct TableCount {
    /// The table's relation oid, as armed.
    oid: u32,
    /// The operation's pgoutput tag: `I`, `U` or `D` as a number.
    tag: u8,
    records: u64,
    /// Their key and value bytes.
    bytes: u64,
}

/// An open transaction as the compiled stream and the Python path hand it to each other
/// (`transaction`, `adopt`): enough to go on writing its records.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct OpenTransaction {
    commit_lsn: u64,
    xid: u32,
    /// The commit timestamp, microseconds since 1970-01-01 UTC.
    commit_ts: i64,
    /// The ordinal the transaction's next record gets.
    ordinal: i64,
    /// Its id in the in-flight book.
    id: u64,
}

#[pymethods]
impl OpenTransaction {
    #[new]
    fn new(commit_lsn: u64, xid: u32, commit_ts: i64, ordinal: i64, id: u64) -> Self {
        OpenTransaction { commit_lsn, xid, commit_ts, ordinal, id }
    }
}

fn lsn_text(lsn: u64) -> Vec<u8> {
    LsnText::new(lsn).as_bytes().to_vec()
}

/// An LSN as PostgreSQL prints it (`16/B374D848`: the high and low 32 bits in upper-case
/// hex without leading zeros), built on the stack: a record's change LSN header needs
/// one per record, and an allocation per record showed in the replay's profile.
struct LsnText {
    bytes: [u8; 17],
    len: usize,
}

impl LsnText {
    fn new(lsn: u64) -> LsnText {
        let mut text = LsnText { bytes: [0; 17], len: 0 };
        text.push_hex((lsn >> 32) as u32);
        text.bytes[text.len] = b'/';
        text.len += 1;
        text.push_hex(lsn as u32);
        text
    }

    fn push_hex(&mut self, value: u32) {
        const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
        let digits = if value == 0 { 1 } else { (32 - value.leading_zeros() as usize).div_ceil(4) };
        for digit in (0..digits).rev() {
            self.bytes[self.len] = DIGITS[((value >> (4 * digit)) & 0xF) as usize];
            self.len += 1;
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Whether a stream block is open after a message with `tag`, given whether one was open
/// before it. Inside a block, Relation, Insert, Update, Delete... carry an xid right after
/// the tag, where the compiled stream would read a relation OID: the whole block goes to
/// the Python path, which spools it (`capture/stream/in_progress.py`). A block inside a
/// block, or a Stream Stop outside one, is passed on too, for the Python path to refuse.
fn in_block_after(open: bool, tag: u8) -> bool {
    match tag {
        STREAM_START => true,
        STREAM_STOP => false,
        _ => open,
    }
}

/// The XLogData frame holding `message` at `wal_start` (also its `wal_end`, send time 0),
/// as `capture.stream.copy_data.encode_xlog_data` builds it for a replayed change.
fn xlog_data(py: Python<'_>, wal_start: u64, message: &[u8]) -> PyResult<Py<PyBytes>> {
    PyBytes::new_with(py, XLOG_DATA_HEADER + message.len(), |frame| {
        frame[0] = XLOG_DATA;
        frame[1..9].copy_from_slice(&wal_start.to_be_bytes());
        frame[9..17].copy_from_slice(&wal_start.to_be_bytes());
        frame[17..XLOG_DATA_HEADER].fill(0);
        frame[XLOG_DATA_HEADER..].copy_from_slice(message);
        Ok(())
    })
    .map(Bound::unbind)
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(data[at..at + 8].try_into().expect("eight bytes"))
}

/// What happened to one frame.
enum Taken {
    Done,
    Pass,
    Full,
}

#[pyclass(module = "capture_native")]
pub struct CompiledStream {
    producer: Py<KafkaProducer>,
    libpq: LibPq,
    commit_header: String,
    change_header: String,
    tables: HashMap<u32, Table>,
    transaction: Option<Transaction>,
    next_id: u64,
    entries: Vec<TransactionPart>,
    /// A frame taken from libpq that the producer's full queue held back.
    pending: Option<Vec<u8>>,
    stop_at: u64,
    /// Whether a stream block is open: from a Stream Start to its Stream Stop, both
    /// included, every frame goes to the Python path but the row changes `spool` takes.
    in_block: bool,
    /// The open block's spool, while the caller has it armed (`spool_writer.rs`), and
    /// the buffer its writers hand on to each other.
    spool: Option<SpoolWriter>,
    spool_buffer: Vec<u8>,
    /// The record being produced: its key and value, reused from record to record.
    key_buffer: Vec<u8>,
    value_buffer: Vec<u8>,
}

impl CompiledStream {
    fn take(&mut self, frame: &[u8]) -> Taken {
        if frame.len() <= XLOG_DATA_HEADER || frame[0] != XLOG_DATA {
            return Taken::Pass;
        }
        self.take_message(u64_at(frame, 1), &frame[XLOG_DATA_HEADER..])
    }

    /// The pgoutput `message` of an XLogData frame at `wal_start` (`take`), or of a
    /// replayed spool (`take_spool`, where the frame is never built).
    fn take_message(&mut self, wal_start: u64, message: &[u8]) -> Taken {
        if message.is_empty() {
            return Taken::Pass;
        }
        let open = self.in_block;
        self.in_block = in_block_after(open, message[0]);
        if open && self.in_block {
            let spooled = self.spool.as_mut().is_some_and(|spool| spool.spool(wal_start, message));
            return if spooled { Taken::Done } else { Taken::Pass };
        }
        if open || self.in_block {
            return Taken::Pass;
        }
        match message[0] {
            BEGIN if message.len() == BEGIN_SIZE && self.transaction.is_none() => {
                let commit_lsn = u64_at(message, 1);
                let commit_time = u64_at(message, 9) as i64;
                let xid = u32::from_be_bytes(message[17..21].try_into().expect("four bytes"));
                // Beyond a long's range the Python path says what cannot be encoded.
                let Some(commit_ts) = commit_time.checked_add(PG_EPOCH_UNIX_MICROS) else {
                    return Taken::Pass;
                };
                if commit_lsn > i64::MAX as u64 {
                    return Taken::Pass;
                }
                let id = self.next_id;
                self.next_id += 1;
                self.transaction = Some(Transaction::new(id, commit_lsn, xid, commit_ts, 0));
                self.entries.push(TransactionPart { id, commit_lsn, began: true, records: 0, bytes: 0, end_lsn: 0 });
                Taken::Done
            }
            COMMIT if message.len() == COMMIT_SIZE && message[1] == 0 && self.transaction.is_some() => {
                let end_lsn = u64_at(message, 10);
                self.entry().end_lsn = end_lsn;
                self.transaction = None;
                Taken::Done
            }
            INSERT | UPDATE | DELETE => self.row_change(wal_start, message),
            ENCODED_CHANGE => self.encoded_change(wal_start, message),
            _ => Taken::Pass,
        }
    }

    /// The open transaction's entry, continued in a new part if the last was taken.
    fn entry(&mut self) -> &mut TransactionPart {
        let transaction = self.transaction.as_ref().expect("a transaction is open");
        if self.entries.last().is_none_or(|entry| entry.id != transaction.id) {
            self.entries.push(TransactionPart {
                id: transaction.id,
                commit_lsn: transaction.commit_lsn,
                began: false,
                records: 0,
                bytes: 0,
                end_lsn: 0,
            });
        }
        self.entries.last_mut().expect("just pushed")
    }

    fn row_change(&mut self, wal_start: u64, message: &[u8]) -> Taken {
        if message.len() < 6 {
            return Taken::Pass;
        }
        let oid = u32::from_be_bytes(message[1..5].try_into().expect("four bytes"));
        let Some(slot) = self.armed_slot(oid, message[0], wal_start) else {
            return Taken::Pass;
        };
        let table = self.tables.get(&oid).expect("armed");
        let Some((row, key_fields, image)) = table.encoder.get().row_message_fields(message) else {
            return Taken::Pass;
        };
        self.produce(wal_start, oid, slot, &key_fields, |value| image.write(value, &row))
    }

    /// A change its streamed transaction's spool holds encoded already
    /// (`capture/stream/encoded_change.py`): produced as `row_change` produces a row
    /// message, its key fields and images as they are, when the table version armed for
    /// its oid is the one that encoded it (the same encoder object); anything else goes
    /// to the Python path.
    fn encoded_change(&mut self, wal_start: u64, message: &[u8]) -> Taken {
        let Some(change) = EncodedChange::read(message) else {
            return Taken::Pass;
        };
        let Some(slot) = self.armed_slot(change.oid, change.tag, wal_start) else {
            return Taken::Pass;
        };
        let table = self.tables.get(&change.oid).expect("armed");
        if table.encoder.as_ptr() as u64 != change.encoder {
            return Taken::Pass;
        }
        self.produce(wal_start, change.oid, slot, change.key_fields, |value| {
            value.extend_from_slice(change.images);
        })
    }

    /// The operation slot of a change with `tag` of the table `oid` in the open
    /// transaction, when the compiled stream may produce it: a transaction is open, the
    /// table and operation are armed, and the transaction commits after the table's
    /// snapshot.
    fn armed_slot(&self, oid: u32, tag: u8, wal_start: u64) -> Option<usize> {
        let transaction = self.transaction.as_ref()?;
        let table = self.tables.get(&oid)?;
        let slot = match tag {
            INSERT => 0,
            UPDATE => 1,
            DELETE => 2,
            _ => return None,
        };
        table.operations[slot].as_ref()?;
        if transaction.commit_lsn <= table.publish_after || wal_start > i64::MAX as u64 {
            return None;
        }
        Some(slot)
    }

    /// Produce the record of an armed table and operation (`armed_slot`): key
    /// `key_fields` after the table's key header; value the operation's prefix, the
    /// transaction's fields, `wal_start`, the ordinal, then what `images` writes.
    fn produce(&mut self, wal_start: u64, oid: u32, slot: usize, key_fields: &[u8], images: impl FnOnce(&mut Vec<u8>)) -> Taken {
        // The record's bytes are built in buffers the stream keeps (librdkafka copies
        // them): no allocation per record for them.
        let mut key = std::mem::take(&mut self.key_buffer);
        let mut value = std::mem::take(&mut self.value_buffer);
        key.clear();
        value.clear();
        let transaction = self.transaction.as_ref().expect("checked by armed_slot");
        let table = self.tables.get(&oid).expect("checked by armed_slot");
        let operation = table.operations[slot].as_ref().expect("checked by armed_slot");
        key.extend_from_slice(&table.key_header);
        key.extend_from_slice(key_fields);
        value.extend_from_slice(&operation.value_prefix);
        value.extend_from_slice(&transaction.commit_field);
        write_long(&mut value, wal_start as i64);
        value.extend_from_slice(&transaction.transaction_fields);
        write_long(&mut value, transaction.ordinal);
        images(&mut value);
        let change_text = LsnText::new(wal_start);
        let headers = [
            HeaderField { name: &self.commit_header, value: Some(&transaction.commit_text) },
            HeaderField { name: &self.change_header, value: Some(change_text.as_bytes()) },
            HeaderField { name: &operation.headers[0].0, value: Some(&operation.headers[0].1) },
            HeaderField { name: &operation.headers[1].0, value: Some(&operation.headers[1].1) },
        ];
        let opaque = streamed_opaque(transaction.id);
        let code = self.producer.get().produce_one(&table.topic, -1, &key, Some(&value), &headers, opaque);
        let size = (key.len() + value.len()) as u64;
        self.key_buffer = key;
        self.value_buffer = value;
        if code == QUEUE_FULL {
            return Taken::Full;
        }
        if code != 0 {
            // Any other refusal: the Python path produces the record and raises the
            // producer's error.
            return Taken::Pass;
        }
        let table = self.tables.get_mut(&oid).expect("looked up above");
        table.counts[slot].0 += 1;
        table.counts[slot].1 += size;
        self.transaction.as_mut().expect("checked above").ordinal += 1;
        let entry = self.entry();
        entry.records += 1;
        entry.bytes += size;
        Taken::Done
    }
}

/// A change of a streamed transaction encoded when it arrived, as its spool holds it
/// (`capture/stream/encoded_change.py` writes it): [`ENCODED_CHANGE`], Int32 relation
/// oid, Int8 pgoutput tag (`I`, `U`, `D`), Int64 the encoder's identity (the address of
/// the `TextRowEncoder` that encoded it), Int32 the key fields' length, the key fields,
/// then the value's fields after `ordinal` (the images) to the end.
struct EncodedChange<'a> {
    oid: u32,
    tag: u8,
    encoder: u64,
    key_fields: &'a [u8],
    images: &'a [u8],
}

/// Size of an [`EncodedChange`]'s fixed head.
const ENCODED_CHANGE_HEAD: usize = 18;

impl<'a> EncodedChange<'a> {
    /// The change in `message`; None when it is not one or is cut short (the Python
    /// path then says what is wrong with it).
    fn read(message: &'a [u8]) -> Option<EncodedChange<'a>> {
        if *message.first()? != ENCODED_CHANGE || message.len() < ENCODED_CHANGE_HEAD {
            return None;
        }
        let oid = u32::from_be_bytes(message[1..5].try_into().ok()?);
        let tag = message[5];
        let encoder = u64_at(message, 6);
        let key_length = usize::try_from(u32::from_be_bytes(message[14..18].try_into().ok()?)).ok()?;
        let key_end = ENCODED_CHANGE_HEAD.checked_add(key_length)?;
        let key_fields = message.get(ENCODED_CHANGE_HEAD..key_end)?;
        Some(EncodedChange { oid, tag, encoder, key_fields, images: &message[key_end..] })
    }
}

#[pymethods]
impl CompiledStream {
    /// A compiled stream producing with `producer`, reading with the libpq at `libpq`
    /// (the file psycopg loaded); `commit_header` and `change_header` name the LSN
    /// headers.
    #[new]
    fn new(producer: Py<KafkaProducer>, libpq: &str, commit_header: String, change_header: String) -> PyResult<Self> {
        let libpq = LibPq::load(libpq).map_err(|e| PyOSError::new_err(format!("cannot load libpq from {libpq}: {e}")))?;
        Ok(CompiledStream {
            producer,
            libpq,
            commit_header,
            change_header,
            tables: HashMap::new(),
            transaction: None,
            next_id: 0,
            entries: Vec::new(),
            pending: None,
            stop_at: 0,
            in_block: false,
            spool: None,
            spool_buffer: Vec::new(),
            key_buffer: Vec::with_capacity(64),
            value_buffer: Vec::with_capacity(512),
        })
    }

    /// Arm a table version: `operations` holds, per pgoutput tag it takes (`I`, `U`,
    /// `D`), the value's bytes before `commit_lsn` and the `op` and fingerprint headers.
    /// Replaces what `oid` had.
    #[allow(clippy::too_many_arguments)]
    fn arm(
        &mut self,
        oid: u32,
        encoder: Py<TextRowEncoder>,
        topic: &str,
        key_header: Vec<u8>,
        publish_after: u64,
        operations: Vec<ArmedOperation>,
    ) -> PyResult<()> {
        let topic = CString::new(topic).map_err(|_| PyValueError::new_err("a topic name has no NUL character"))?;
        let mut armed: [Option<Operation>; 3] = [None, None, None];
        for (tag, value_prefix, op_header, fingerprint_header) in operations {
            let slot = match tag {
                INSERT => 0,
                UPDATE => 1,
                DELETE => 2,
                _ => return Err(PyValueError::new_err(format!("tag {tag} is not I, U or D"))),
            };
            armed[slot] = Some(Operation { value_prefix, headers: [op_header, fingerprint_header] });
        }
        self.tables.insert(oid, Table { encoder, topic, key_header, publish_after, operations: armed, counts: [(0, 0); 3] });
        Ok(())
    }

    /// Disarm every table (after `take_counts`, so no count is lost).
    fn disarm(&mut self) {
        self.tables.clear();
    }

    /// Take the frames libpq holds for the connection at `connection` (a `PGconn *`),
    /// at most `budget` of them: what it stopped on ([`Stop`]), the frame for the
    /// Python path if that is what it stopped on, and how many frames it took.
    fn read(&mut self, py: Python<'_>, connection: usize, budget: usize) -> CompiledStreamRead {
        let mut taken = 0;
        while taken < budget {
            let frame = match self.pending.take() {
                Some(frame) => frame,
                None => {
                    let mut buffer: *mut c_char = std::ptr::null_mut();
                    // SAFETY: `connection` is the live PGconn psycopg holds; async mode
                    // only parses what is buffered.
                    let size = unsafe { (self.libpq.get_copy_data)(connection as *mut c_void, &mut buffer, 1) };
                    if size == 0 {
                        return CompiledStreamRead::stopped(Stop::Empty, taken);
                    }
                    if size == -1 {
                        return CompiledStreamRead::stopped(Stop::Ended, taken);
                    }
                    if size < 0 || buffer.is_null() {
                        return CompiledStreamRead::stopped(Stop::Failed, taken);
                    }
                    // SAFETY: libpq hands over `size` bytes, ours until PQfreemem.
                    let frame = unsafe { std::slice::from_raw_parts(buffer as *const u8, size as usize).to_vec() };
                    unsafe { (self.libpq.free_memory)(buffer as *mut c_void) };
                    frame
                }
            };
            let was_open = self.transaction.is_some();
            match self.take(&frame) {
                Taken::Done => {
                    taken += 1;
                    if was_open && self.transaction.is_none() && self.stop_at != 0 {
                        let end_lsn = self.entries.last().map_or(0, |entry| entry.end_lsn);
                        if end_lsn >= self.stop_at {
                            return CompiledStreamRead::stopped(Stop::Limit, taken);
                        }
                    }
                }
                Taken::Pass => {
                    let frame = Some(PyBytes::new(py, &frame).unbind());
                    return CompiledStreamRead { stopped: Stop::Frame, frame, taken };
                }
                Taken::Full => {
                    self.pending = Some(frame);
                    return CompiledStreamRead::stopped(Stop::Full, taken);
                }
            }
        }
        CompiledStreamRead::stopped(Stop::Limit, taken)
    }

    /// Take `frames[start..]` as `read` takes libpq's frames: a committed streamed
    /// transaction replayed from its spool (`capture/stream/in_progress.py`), each frame
    /// an XLogData payload built as the server sends an unstreamed transaction's. Stops
    /// with [`Stop::Frame`] at a frame for the Python path (`frames[start + taken]`,
    /// returned in `frame`), with [`Stop::Full`] at one the producer's queue held back
    /// (`frames[start + taken]`, to be given again), and with [`Stop::Empty`] once every
    /// frame is taken.
    fn take_frames(&mut self, frames: Vec<Bound<'_, PyBytes>>, start: usize) -> CompiledStreamRead {
        let mut taken = 0;
        for frame in frames.iter().skip(start) {
            match self.take(frame.as_bytes()) {
                Taken::Done => taken += 1,
                Taken::Pass => {
                    return CompiledStreamRead { stopped: Stop::Frame, frame: Some(frame.clone().unbind()), taken };
                }
                Taken::Full => return CompiledStreamRead::stopped(Stop::Full, taken),
            }
        }
        CompiledStreamRead::stopped(Stop::Empty, taken)
    }

    /// Take a committed streamed transaction from its spool (`replay`: Begin, the
    /// entries of the spool's live ranges, Commit) as `take_frames` takes the frames of
    /// its replay, with no frame built and no Python object per change: at most `budget`
    /// messages. Stops with [`Stop::Frame`] at a message for the Python path, returned as
    /// the XLogData frame the server would have sent (the replay goes on after it), with
    /// [`Stop::Full`] at one the producer's queue held back (the replay hands it out
    /// again), with [`Stop::Limit`] once `budget` are taken and with [`Stop::Empty`] once
    /// the Commit is. A damaged spool raises `SpoolDamagedError`, a failed read OSError.
    fn take_spool(&mut self, py: Python<'_>, mut replay: PyRefMut<'_, SpoolReplay>, budget: usize) -> PyResult<CompiledStreamRead> {
        let replay = &mut *replay;
        let mut taken = 0;
        while taken < budget {
            let (wal_start, message) = match replay.replay.next_message() {
                Ok(Some(next)) => next,
                Ok(None) => return Ok(CompiledStreamRead::stopped(Stop::Empty, taken)),
                Err(error) => return Err(replay.error(error)),
            };
            match self.take_message(wal_start, message) {
                Taken::Done => {
                    replay.replay.advance();
                    taken += 1;
                }
                Taken::Pass => {
                    let frame = Some(xlog_data(py, wal_start, message)?);
                    replay.replay.advance();
                    return Ok(CompiledStreamRead { stopped: Stop::Frame, frame, taken });
                }
                Taken::Full => return Ok(CompiledStreamRead::stopped(Stop::Full, taken)),
            }
        }
        Ok(CompiledStreamRead::stopped(Stop::Limit, taken))
    }

    /// Arm the open stream block's spool (`spool_writer.rs`): the transaction's spool
    /// file by descriptor `fd`, its next entry at byte `at`, `room` bytes
    /// left under the spool limit, the rolled-back subxids `void`, per relation oid the
    /// compiled encoder of the transaction's current table version, and the pgoutput
    /// tags (`I`, `U`, `D`) it encodes. Replaces the armed one, whose runs must have been
    /// taken (`take_spooled`).
    #[allow(clippy::too_many_arguments)]
    fn spool_block(
        &mut self,
        fd: i32,
        at: u64,
        room: u64,
        void: HashSet<u32>,
        encoders: Vec<(u32, Py<TextRowEncoder>)>,
        tags: Vec<u8>,
    ) -> PyResult<()> {
        self.end_spool_block()?;
        let buffer = std::mem::take(&mut self.spool_buffer);
        self.spool = Some(SpoolWriter::new(fd, at, room, void, encoders.into_iter().collect(), &tags, buffer)?);
        Ok(())
    }

    /// Disarm the block's spool: the Python path spools every frame of a block.
    fn end_spool_block(&mut self) -> PyResult<()> {
        if let Some(mut spool) = self.spool.take() {
            let runs = spool.take_runs()?;
            self.spool_buffer = spool.into_buffer();
            if !runs.is_empty() {
                return Err(PyValueError::new_err(
                    "the armed spool holds runs the caller has not taken: take_spooled first",
                ));
            }
        }
        Ok(())
    }

    /// The runs the armed block's spool appended since the last call, all written to its
    /// file; empty when none is armed. A failed write raises OSError.
    fn take_spooled(&mut self) -> PyResult<Vec<SpooledRun>> {
        match self.spool.as_mut() {
            Some(spool) => Ok(spool.take_runs()?),
            None => Ok(Vec::new()),
        }
    }

    /// What the compiled stream did since the last call, one part per transaction it
    /// touched, in order (the parts move to Python as they are: no copy).
    fn take_transactions(&mut self) -> Vec<TransactionPart> {
        std::mem::take(&mut self.entries)
    }

    /// Records and bytes produced per armed table and tag since the last call, nonzero
    /// ones only.
    fn take_counts(&mut self) -> Vec<TableCount> {
        let mut counts = Vec::new();
        for (&oid, table) in &mut self.tables {
            for (slot, tag) in [INSERT, UPDATE, DELETE].into_iter().enumerate() {
                let (records, bytes) = std::mem::take(&mut table.counts[slot]);
                if records != 0 {
                    counts.push(TableCount { oid, tag, records, bytes });
                }
            }
        }
        counts
    }

    /// The open transaction, or None.
    fn transaction(&self) -> Option<OpenTransaction> {
        self.transaction.as_ref().map(|t| OpenTransaction {
            commit_lsn: t.commit_lsn,
            xid: t.xid,
            commit_ts: t.commit_ts,
            ordinal: t.ordinal,
            id: t.id,
        })
    }

    /// Take over the open transaction as the Python path left it (None: none is open),
    /// and the book id the next Begin gets.
    fn adopt(&mut self, transaction: Option<&Bound<'_, OpenTransaction>>, next_id: u64) {
        self.transaction = transaction.map(|t| {
            let t = t.get();
            Transaction::new(t.id, t.commit_lsn, t.xid, t.commit_ts, t.ordinal)
        });
        self.next_id = next_id;
    }

    /// After a Commit whose end LSN reaches `lsn`, `read` stops (0: never).
    fn stop_at(&mut self, lsn: u64) {
        self.stop_at = lsn;
    }

    /// How many tables are armed.
    fn __len__(&self) -> usize {
        self.tables.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_bytes(values: &[i64]) -> Vec<u8> {
        let mut out = Vec::new();
        for &value in values {
            write_long(&mut out, value);
        }
        out
    }

    #[test]
    fn lsns_print_as_postgresql_prints_them() {
        assert_eq!(lsn_text(0), b"0/0");
        assert_eq!(lsn_text(0x16_B374_D848), b"16/B374D848");
        assert_eq!(lsn_text(0xFFFF_FFFF), b"0/FFFFFFFF");
        assert_eq!(lsn_text(u64::MAX), b"FFFFFFFF/FFFFFFFF");
        // As Rust's own hex formatting prints them, over each digit count of both halves.
        for high in [0u64, 1, 0xF, 0x10, 0xABC, 0x1_0000, 0xFFFF_FFFF] {
            for low in [0u64, 9, 0xA, 0xFF, 0x100, 0xDEAD_BEEF, 0x1000_0000, 0xFFFF_FFFF] {
                let lsn = (high << 32) | low;
                assert_eq!(LsnText::new(lsn).as_bytes(), format!("{high:X}/{low:X}").as_bytes());
            }
        }
    }

    #[test]
    fn a_transaction_encodes_its_shared_fields_once() {
        let transaction = Transaction::new(7, 0x2000, 777, -1, 5);
        assert_eq!(transaction.commit_field, long_bytes(&[0x2000]));
        assert_eq!(transaction.transaction_fields, long_bytes(&[777, -1]));
        assert_eq!(transaction.commit_text, b"0/2000");
        // The xid is unsigned on the wire; the record's long holds it without a sign.
        let wide = Transaction::new(0, 1, u32::MAX, 0, 0);
        assert_eq!(wide.transaction_fields, long_bytes(&[i64::from(u32::MAX), 0]));
    }

    /// Runs Python: `cargo test` links libpython for this (native/check.sh).
    #[test]
    fn stops_compare_with_each_other_by_value_and_never_with_numbers() {
        Python::initialize();
        Python::attach(|py| {
            let frame = Py::new(py, Stop::Frame).unwrap().into_bound(py).into_any();
            let again = Py::new(py, Stop::Frame).unwrap().into_bound(py).into_any();
            let full = Py::new(py, Stop::Full).unwrap().into_bound(py).into_any();
            // Each read returns a new object: `==` and hashing, not identity, match them.
            assert!(frame.eq(&again).unwrap());
            assert_eq!(frame.hash().unwrap(), again.hash().unwrap());
            assert!(!frame.eq(&full).unwrap());
            assert!(!frame.eq(Stop::Frame as u8).unwrap());
        });
    }

    #[test]
    fn a_stream_block_goes_to_python_from_its_start_to_its_stop() {
        // Stream Start, an Insert carrying its xid, Stream Stop, then an unstreamed
        // transaction's Insert: (open after, passed).
        let mut open = false;
        let mut seen = Vec::new();
        for tag in [STREAM_START, INSERT, STREAM_STOP, BEGIN, INSERT, COMMIT] {
            let before = open;
            open = in_block_after(open, tag);
            seen.push((open, before || open));
        }
        assert_eq!(
            seen,
            [(true, true), (true, true), (false, true), (false, false), (false, false), (false, false)]
        );
        // Out of order: still passed, for the Python path to refuse.
        assert!(in_block_after(true, STREAM_START));
        assert!(!in_block_after(false, STREAM_STOP));
    }

    #[test]
    fn an_encoded_change_reads_back_its_parts_and_refuses_a_short_one() {
        let mut message = vec![ENCODED_CHANGE];
        message.extend_from_slice(&16384u32.to_be_bytes());
        message.push(INSERT);
        message.extend_from_slice(&0x7F00_0000_1234u64.to_be_bytes());
        message.extend_from_slice(&2u32.to_be_bytes());
        message.extend_from_slice(&[0x02, 0x04, 0x00, 0x02, 0x06]);
        let change = EncodedChange::read(&message).expect("a whole change");
        assert_eq!((change.oid, change.tag, change.encoder), (16384, INSERT, 0x7F00_0000_1234));
        assert_eq!(change.key_fields, [0x02, 0x04]);
        assert_eq!(change.images, [0x00, 0x02, 0x06]);
        // Key fields longer than what follows, a cut head, another tag: not taken.
        assert!(EncodedChange::read(&message[..ENCODED_CHANGE_HEAD + 1]).is_none());
        assert!(EncodedChange::read(&message[..ENCODED_CHANGE_HEAD - 1]).is_none());
        assert!(EncodedChange::read(&[INSERT; 32]).is_none());
        assert!(EncodedChange::read(&[]).is_none());
    }

    #[test]
    fn big_endian_fields_read_where_the_protocol_puts_them() {
        let mut frame = vec![XLOG_DATA];
        frame.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        assert_eq!(u64_at(&frame, 1), 0x0102_0304_0506_0708);
    }
}
