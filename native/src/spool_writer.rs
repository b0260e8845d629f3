//! A stream block's row changes spooled by the compiled stream: encoded as they arrive
//! and appended to their transaction's spool file, with no Python object per change.
//!
//! With `streaming` on, a big transaction comes in stream blocks while it runs
//! (`capture/stream/in_progress.py`). In the Python path each of its rows cost about
//! 7 to 8 µs: the frame handed back, parsed, the xid split off, the compiled encoder
//! called, the spool's entry packed and written. The compiled stream now does that for
//! the frames that need no decision, the way it takes an unstreamed transaction's rows:
//!
//! - **Armed by the caller.** Python arms one block's spool ([`SpoolWriter`]): the
//!   transaction's spool file (by descriptor, duplicated), where its next entry goes, the
//!   bytes the spool limit leaves, the rolled-back subxids, and per relation oid the
//!   compiled encoder of the transaction's own current table version. It re-arms after
//!   every frame of the block the Python path handles (a Relation changes the versions;
//!   a change the compiled stream left writes its own entry) and disarms at Stream Stop.
//! - **What it takes.** An Insert, Update or Delete carrying its subxid, of an oid armed
//!   for the block, with an operation the caller armed, whose row the encoder takes
//!   whole and that fits in the room left. Anything else -- a Relation, a Truncate, a row
//!   of a table not armed, a change of a rolled-back subxid, one the limit refuses, a
//!   message cut short -- goes to the Python path, which spools it or says what is
//!   wrong.
//! - **Same bytes.** The entry is the one `capture/stream/streamed_transactions.py` and
//!   `capture/stream/encoded_change.py` write for the same change: Int32 subxid, Int64
//!   change LSN, Int32 length, then the encoded change (`ENCODED_CHANGE`, oid, tag, the
//!   encoder's identity, key fields, images). The tests compare the two paths' spools.
//! - **Written at positions.** Entries are buffered and written with `pwrite` at the
//!   spool's own offsets, before the compiled stream returns to Python (and whenever the
//!   buffer grows past [`FLUSH_SIZE`]), so the Python file object's buffer is never
//!   behind or ahead of the file when Python acts; it seeks to the spool's size before
//!   its next write of its own.
//! - **Bookkeeping stays in Python.** What was written comes back as *runs*, the byte
//!   ranges of consecutive entries of one subxid (`take_spooled`), which the spool's
//!   bookkeeping takes as it takes its own entries.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::compiled_stream::ENCODED_CHANGE;
use crate::spool_replay::ENTRY_HEADER;
use crate::{TextRowEncoder, DELETE, INSERT, UPDATE};

/// Buffered bytes that are written out at once, mid-burst.
const FLUSH_SIZE: usize = 1 << 20;
/// An encoded change's head: tag, oid, pgoutput tag, encoder identity, key length.
const ENCODED_HEAD: usize = 18;
/// A streamed row message's head before its relation oid: tag and the subxid.
const STREAMED_HEAD: usize = 5;

/// Consecutive entries of one subxid the writer appended: bytes `start` to `end`.
#[pyclass(module = "capture_native", frozen, get_all)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpooledRun {
    pub subxid: u32,
    pub start: u64,
    pub end: u64,
}

/// One stream block's spool, as the caller armed it (see the module's text).
pub struct SpoolWriter {
    file: File,
    /// Where the next entry goes, and the bytes the spool limit leaves.
    at: u64,
    room: u64,
    void: HashSet<u32>,
    encoders: HashMap<u32, Py<TextRowEncoder>>,
    /// Whether Insert, Update, Delete are taken.
    operations: [bool; 3],
    /// Entries not written yet, from `buffer_at`.
    buffer: Vec<u8>,
    buffer_at: u64,
    runs: Vec<SpooledRun>,
    /// A failed write: every later entry is dropped, and `take_runs` reports it.
    error: Option<io::Error>,
}

impl SpoolWriter {
    /// A writer of the spool whose file has descriptor `fd` (duplicated: the caller's
    /// file may be closed first), the next entry at `at`, buffering in `buffer` (the
    /// last writer's, [`SpoolWriter::into_buffer`]: a block is armed again after each
    /// frame the Python path handles, which must not cost an allocation each time).
    pub fn new(
        fd: RawFd,
        at: u64,
        room: u64,
        void: HashSet<u32>,
        encoders: HashMap<u32, Py<TextRowEncoder>>,
        tags: &[u8],
        mut buffer: Vec<u8>,
    ) -> PyResult<SpoolWriter> {
        buffer.clear();
        if fd < 0 {
            return Err(PyValueError::new_err(format!("{fd} is not a file descriptor")));
        }
        // SAFETY: the caller's spool file is open for the duration of this call.
        let file = File::from(unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?);
        let mut operations = [false; 3];
        for &tag in tags {
            match slot(tag) {
                Some(at) => operations[at] = true,
                None => return Err(PyValueError::new_err(format!("tag {tag} is not I, U or D"))),
            }
        }
        Ok(SpoolWriter {
            file,
            at,
            room,
            void,
            encoders,
            operations,
            buffer,
            buffer_at: at,
            runs: Vec::new(),
            error: None,
        })
    }

    /// Spool the block's `message` (as the server sent it, with its subxid) made at
    /// `change_lsn`: true when taken, false when it is the Python path's.
    pub fn spool(&mut self, change_lsn: u64, message: &[u8]) -> bool {
        let Some(entry) = self.entry(change_lsn, message) else {
            return false;
        };
        let (subxid, length) = entry;
        let start = self.at;
        let end = start + length;
        match self.runs.last_mut() {
            Some(run) if run.subxid == subxid && run.end == start => run.end = end,
            _ => self.runs.push(SpooledRun { subxid, start, end }),
        }
        self.at = end;
        self.room -= length;
        if self.buffer.len() >= FLUSH_SIZE {
            self.flush();
        }
        true
    }

    /// Encode `message` into the buffer: its subxid and the entry's length, or None
    /// (nothing buffered) when the Python path takes it.
    fn entry(&mut self, change_lsn: u64, message: &[u8]) -> Option<(u32, u64)> {
        let tag = *message.first()?;
        if !self.operations[slot(tag)?] || message.len() < STREAMED_HEAD + 4 {
            return None;
        }
        let subxid = u32::from_be_bytes(message[1..STREAMED_HEAD].try_into().ok()?);
        // Beyond a long's range the Python path says what cannot be encoded; a change of
        // a rolled-back subxid it refuses.
        if self.void.contains(&subxid) || change_lsn > i64::MAX as u64 {
            return None;
        }
        let oid = u32::from_be_bytes(message[STREAMED_HEAD..STREAMED_HEAD + 4].try_into().ok()?);
        let encoder = self.encoders.get(&oid)?;
        // The message in its protocol-version-1 form: the subxid taken off.
        let mut unstreamed = Vec::with_capacity(message.len() - 4);
        unstreamed.push(tag);
        unstreamed.extend_from_slice(&message[STREAMED_HEAD..]);
        let (row, key_fields, image) = encoder.get().row_message_fields(&unstreamed)?;
        let identity = encoder.as_ptr() as u64;
        let key_length = u32::try_from(key_fields.len()).ok()?;
        let entry_at = self.buffer.len();
        let buffer = &mut self.buffer;
        buffer.extend_from_slice(&subxid.to_be_bytes());
        buffer.extend_from_slice(&change_lsn.to_be_bytes());
        buffer.extend_from_slice(&[0; 4]); // the message's length, below
        buffer.push(ENCODED_CHANGE);
        buffer.extend_from_slice(&oid.to_be_bytes());
        buffer.push(tag);
        buffer.extend_from_slice(&identity.to_be_bytes());
        buffer.extend_from_slice(&key_length.to_be_bytes());
        buffer.extend_from_slice(&key_fields);
        image.write(buffer, &row);
        let length = buffer.len() - entry_at;
        let fits = u64::try_from(length).is_ok_and(|length| length <= self.room);
        let Ok(message_length) = u32::try_from(length - ENTRY_HEADER) else {
            buffer.truncate(entry_at);
            return None;
        };
        if !fits {
            buffer.truncate(entry_at);
            return None;
        }
        buffer[entry_at + 12..entry_at + ENTRY_HEADER].copy_from_slice(&message_length.to_be_bytes());
        debug_assert!(length >= ENTRY_HEADER + ENCODED_HEAD);
        Some((subxid, length as u64))
    }

    /// Write out the buffer at its position in the file.
    pub fn flush(&mut self) {
        if !self.buffer.is_empty() && self.error.is_none() {
            if let Err(error) = self.file.write_all_at(&self.buffer, self.buffer_at) {
                self.error = Some(error);
            }
        }
        self.buffer_at = self.at;
        self.buffer.clear();
    }

    /// Its buffer, for the next writer (after `take_runs`: nothing in it is kept).
    pub fn into_buffer(self) -> Vec<u8> {
        self.buffer
    }

    /// The runs appended since the last call, all written out; or the write's error.
    pub fn take_runs(&mut self) -> io::Result<Vec<SpooledRun>> {
        self.flush();
        match self.error.take() {
            Some(error) => Err(error),
            None => Ok(std::mem::take(&mut self.runs)),
        }
    }
}

fn slot(tag: u8) -> Option<usize> {
    match tag {
        INSERT => Some(0),
        UPDATE => Some(1),
        DELETE => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_row_changes_have_an_operation_slot() {
        assert_eq!([INSERT, UPDATE, DELETE].map(slot), [Some(0), Some(1), Some(2)]);
        assert_eq!(slot(b'R'), None);
        assert_eq!(slot(ENCODED_CHANGE), None);
    }
}
