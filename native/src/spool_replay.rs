//! A committed streamed transaction's spool read back for the compiled stream: the
//! replay of `capture/stream/in_progress.py` (Begin, the spooled changes, Commit) without
//! a Python object per change.
//!
//! `capture/stream/streamed_transactions.py` writes the spool, one unnamed temporary file
//! per transaction, as entries: Int32 subxid, Int64 change LSN, Int32 message length,
//! then the message (a pgoutput message in its protocol-version-1 form, or a row encoded
//! when it arrived, `capture/stream/encoded_change.py`). At the commit it hands over the
//! file's *live ranges*: the byte ranges whose entries no Stream Abort voided, in file
//! order, and the subxids rolled back. [`SpoolReader`] reads the entries of those ranges
//! and nothing else, and skips an entry of a rolled-back subxid found in them (the
//! ranges leave out every such entry the spool could tell apart; the subxid decides, as
//! in the Python replay).
//!
//! Invariants:
//!
//! - **The file by descriptor, read at positions.** The spool has no name to open, so the
//!   caller passes its descriptor, which [`SpoolReplay`] duplicates: the replay owns its
//!   descriptor until it ends or is closed, and reads with `pread` (`FileExt::read_at`),
//!   so the Python file object's position and buffer are left alone (the caller flushes
//!   it first).
//! - **Bounds-checked.** Every entry must lie inside its range: a header cut short, a
//!   message running past the range's end, or a file ending inside an entry is
//!   [`SpoolError::Damaged`], never a panic or a partial message; the caller turns it
//!   into an error that names the transaction and says to restart capture.
//! - **Bounded memory.** One read buffer of [`READ_SIZE`] bytes (more only for an entry
//!   larger than that), whatever the transaction's size.
//! - **Peek, then advance.** The replay hands out the message at its position and moves
//!   past it only when told ([`Replay::advance`]): a change the producer's full queue held
//!   back is handed out again by the next call, a change given to the Python path is not.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// pgoutput Begin and Commit (protocol version 1), as the replay writes them around the
/// spooled changes (`_BEGIN` and `_COMMIT` in `capture/stream/in_progress.py`).
const BEGIN: u8 = b'B';
const BEGIN_SIZE: usize = 21;
const COMMIT: u8 = b'C';
const COMMIT_SIZE: usize = 26;
/// A spooled entry's header: subxid, change LSN, message length (`_ENTRY`, `>IQI`, in
/// `capture/stream/streamed_transactions.py`).
pub const ENTRY_HEADER: usize = 16;
/// Bytes read from the file at once.
const READ_SIZE: usize = 256 * 1024;

pyo3::create_exception!(
    capture_native,
    SpoolDamagedError,
    pyo3::exceptions::PyException,
    "A streamed transaction's spool holds an entry cut short or running past its range."
);

/// Why a spool could not be read.
#[derive(Debug)]
pub enum SpoolError {
    /// The bytes are not the entries the spool wrote: what is wrong, where.
    Damaged(String),
    /// The file could not be read.
    Io(io::Error),
}

impl From<io::Error> for SpoolError {
    fn from(error: io::Error) -> SpoolError {
        SpoolError::Io(error)
    }
}

/// Reading at a position: a file, or bytes in memory (the unit tests).
pub trait ReadAt {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buffer, offset)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        let count = buffer.len().min(self.len() - start);
        buffer[..count].copy_from_slice(&self[start..start + count]);
        Ok(count)
    }
}

/// One spooled entry at the reader's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub subxid: u32,
    pub change_lsn: u64,
    /// Where the entry starts in the file, and where the next one does.
    pub at: u64,
    pub end: u64,
}

/// The entries of a spool's live ranges, in file order (see the module's text).
pub struct SpoolReader<S> {
    source: S,
    /// `(start, end)` byte ranges, ascending, not overlapping.
    ranges: Vec<(u64, u64)>,
    /// Subxids whose entries are skipped.
    void: HashSet<u32>,
    /// The range being read, and the position of the next entry.
    range: usize,
    at: u64,
    /// Bytes of the file from `buffer_at`.
    buffer: Vec<u8>,
    buffer_at: u64,
}

impl<S: ReadAt> SpoolReader<S> {
    /// A reader of `ranges` of `source`, skipping the entries of `void` subxids; refuses
    /// ranges that are reversed, overlap or are out of order (the caller's bookkeeping is
    /// wrong then, not the file).
    pub fn new(source: S, ranges: Vec<(u64, u64)>, void: HashSet<u32>) -> Result<SpoolReader<S>, String> {
        let mut previous_end = 0;
        for &(start, end) in &ranges {
            if start > end || start < previous_end {
                return Err(format!(
                    "the spool's live ranges must be ascending and apart: ({start}, {end}) follows one ending at {previous_end}"
                ));
            }
            previous_end = end;
        }
        let at = ranges.first().map_or(0, |range| range.0);
        Ok(SpoolReader { source, ranges, void, range: 0, at, buffer: Vec::new(), buffer_at: 0 })
    }

    /// Where the next entry starts in the file (the end of the last range once all are
    /// read).
    pub fn position(&self) -> u64 {
        self.at
    }

    /// The entry at the reader's position, not moved past (`advance`), past the entries of
    /// void subxids; None once every range is read.
    pub fn peek(&mut self) -> Result<Option<Entry>, SpoolError> {
        loop {
            match self.entry()? {
                Some(entry) if self.void.contains(&entry.subxid) => self.advance(&entry),
                next => return Ok(next),
            }
        }
    }

    /// The entry at the reader's position, whichever its subxid.
    fn entry(&mut self) -> Result<Option<Entry>, SpoolError> {
        let end = loop {
            let Some(&(start, end)) = self.ranges.get(self.range) else {
                return Ok(None);
            };
            self.at = self.at.max(start);
            if self.at < end {
                break end;
            }
            self.range += 1;
        };
        let at = self.at;
        let room = end - at;
        if room < ENTRY_HEADER as u64 {
            return Err(SpoolError::Damaged(format!(
                "the entry at byte {at} has {room} bytes of its {ENTRY_HEADER}-byte header before its range ends at byte {end}"
            )));
        }
        self.fill(at, ENTRY_HEADER, end)?;
        let header = &self.buffer[(at - self.buffer_at) as usize..][..ENTRY_HEADER];
        let subxid = u32::from_be_bytes(header[0..4].try_into().expect("four bytes"));
        let change_lsn = u64::from_be_bytes(header[4..12].try_into().expect("eight bytes"));
        let length = u32::from_be_bytes(header[12..16].try_into().expect("four bytes"));
        let entry_end = at + ENTRY_HEADER as u64 + u64::from(length);
        if entry_end > end {
            return Err(SpoolError::Damaged(format!(
                "the entry at byte {at} holds a {length}-byte message, past its range's end at byte {end}"
            )));
        }
        self.fill(at, (entry_end - at) as usize, end)?;
        Ok(Some(Entry { subxid, change_lsn, at, end: entry_end }))
    }

    /// The message of `entry`, the last `peek`'s.
    pub fn message(&self, entry: &Entry) -> &[u8] {
        let start = (entry.at - self.buffer_at) as usize + ENTRY_HEADER;
        &self.buffer[start..(entry.end - self.buffer_at) as usize]
    }

    /// Past `entry`, the last `peek`'s.
    pub fn advance(&mut self, entry: &Entry) {
        self.at = entry.end;
    }

    /// The buffer holds `size` bytes from `at`; reads up to [`READ_SIZE`] of the range
    /// ending at `end` when it does not.
    fn fill(&mut self, at: u64, size: usize, end: u64) -> Result<(), SpoolError> {
        let held_end = self.buffer_at + self.buffer.len() as u64;
        if at >= self.buffer_at && at + size as u64 <= held_end {
            return Ok(());
        }
        let want = size.max(READ_SIZE.min(usize::try_from(end - at).unwrap_or(usize::MAX)));
        self.buffer.clear();
        self.buffer.resize(want, 0);
        self.buffer_at = at;
        let mut filled = 0;
        while filled < want {
            match self.source.read_at(&mut self.buffer[filled..], at + filled as u64) {
                Ok(0) => break,
                Ok(count) => filled += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.buffer.clear();
                    return Err(error.into());
                }
            }
        }
        self.buffer.truncate(filled);
        if filled < size {
            return Err(SpoolError::Damaged(format!(
                "the file ends at byte {}, inside the entry at byte {at} ({size} bytes wanted from there)",
                at + filled as u64
            )));
        }
        Ok(())
    }
}

/// Where a replay is: its Begin, its changes, its Commit, or done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Begin,
    Changes,
    Commit,
    Done,
}

/// A committed transaction as the unstreamed one: Begin, the entries of its spool's live
/// ranges, Commit, each with the change LSN its XLogData frame would carry.
pub struct Replay<S> {
    reader: Option<SpoolReader<S>>,
    begin: [u8; BEGIN_SIZE],
    commit: [u8; COMMIT_SIZE],
    commit_lsn: u64,
    end_lsn: u64,
    phase: Phase,
    /// The entry the last `next_message` handed out, until `advance`.
    peeked: Option<Entry>,
}

impl<S: ReadAt> Replay<S> {
    /// The replay of the transaction `xid`, committed at `commit_lsn` (its end at
    /// `end_lsn`) at `commit_time` (microseconds since 2000-01-01, as Stream Commit
    /// carries it); `reader` None when it spooled no change.
    pub fn new(reader: Option<SpoolReader<S>>, xid: u32, commit_lsn: u64, end_lsn: u64, commit_time: i64) -> Replay<S> {
        let mut begin = [0; BEGIN_SIZE];
        begin[0] = BEGIN;
        begin[1..9].copy_from_slice(&commit_lsn.to_be_bytes());
        begin[9..17].copy_from_slice(&commit_time.to_be_bytes());
        begin[17..21].copy_from_slice(&xid.to_be_bytes());
        let mut commit = [0; COMMIT_SIZE];
        commit[0] = COMMIT;
        // commit[1]: the flags, 0.
        commit[2..10].copy_from_slice(&commit_lsn.to_be_bytes());
        commit[10..18].copy_from_slice(&end_lsn.to_be_bytes());
        commit[18..26].copy_from_slice(&commit_time.to_be_bytes());
        Replay { reader, begin, commit, commit_lsn, end_lsn, phase: Phase::Begin, peeked: None }
    }

    /// The message at the replay's position and its change LSN, not moved past
    /// (`advance`); None once the Commit is past.
    pub fn next_message(&mut self) -> Result<Option<(u64, &[u8])>, SpoolError> {
        if self.phase == Phase::Changes {
            self.peeked = match self.reader.as_mut() {
                Some(reader) => reader.peek()?,
                None => None,
            };
            if self.peeked.is_none() {
                self.phase = Phase::Commit;
            }
        }
        Ok(match self.phase {
            Phase::Begin => Some((self.commit_lsn, &self.begin[..])),
            Phase::Changes => {
                let entry = self.peeked.as_ref().expect("peeked above");
                let reader = self.reader.as_ref().expect("an entry was read");
                Some((entry.change_lsn, reader.message(entry)))
            }
            Phase::Commit => Some((self.end_lsn, &self.commit[..])),
            Phase::Done => None,
        })
    }

    /// Past the message the last `next_message` handed out.
    pub fn advance(&mut self) {
        self.phase = match self.phase {
            Phase::Begin => Phase::Changes,
            Phase::Changes => {
                if let (Some(reader), Some(entry)) = (self.reader.as_mut(), self.peeked.take()) {
                    reader.advance(&entry);
                }
                Phase::Changes
            }
            Phase::Commit | Phase::Done => Phase::Done,
        };
    }

    /// Where the next entry starts in the spool file.
    pub fn position(&self) -> u64 {
        self.reader.as_ref().map_or(0, SpoolReader::position)
    }

    pub fn done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Releases the file; the replay is done.
    pub fn close(&mut self) {
        self.reader = None;
        self.peeked = None;
        self.phase = Phase::Done;
    }
}

/// The replay of one committed streamed transaction from its spool, for
/// `CompiledStream.take_spool` (`capture/stream/compiled_stream.py` makes it at the
/// Stream Commit).
#[pyclass(module = "capture_native")]
pub struct SpoolReplay {
    pub(crate) replay: Replay<File>,
    xid: u32,
}

impl SpoolReplay {
    /// The error a [`SpoolError`] of this replay raises in Python.
    pub(crate) fn error(&self, error: SpoolError) -> PyErr {
        let xid = self.xid;
        match error {
            SpoolError::Damaged(what) => {
                SpoolDamagedError::new_err(format!("the spool of streamed transaction {xid} is damaged: {what}"))
            }
            SpoolError::Io(error) => {
                PyOSError::new_err(format!("cannot read the spool of streamed transaction {xid}: {error}"))
            }
        }
    }
}

#[pymethods]
impl SpoolReplay {
    /// The replay of transaction `xid` from the spool open as descriptor `fd` (None:
    /// it spooled no change), reading the byte `ranges` of it but the entries of `void`
    /// subxids; the commit's fields as
    /// Stream Commit carries them. The descriptor is duplicated: the caller's stays
    /// its own, and must have been flushed.
    #[new]
    #[pyo3(signature = (fd, ranges, void, xid, commit_lsn, end_lsn, commit_time, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        fd: Option<RawFd>,
        ranges: Vec<(u64, u64)>,
        void: HashSet<u32>,
        xid: u32,
        commit_lsn: u64,
        end_lsn: u64,
        commit_time: i64,
    ) -> PyResult<Self> {
        let reader = match fd {
            None => None,
            Some(fd) => {
                if fd < 0 {
                    return Err(PyValueError::new_err(format!("{fd} is not a file descriptor")));
                }
                // SAFETY: the caller holds `fd` open for this call (the spool's file
                // object); the duplicate is ours from here on.
                let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().map_err(|e| {
                    PyOSError::new_err(format!("cannot open the spool of streamed transaction {xid} again: {e}"))
                })?;
                Some(SpoolReader::new(File::from(owned), ranges, void).map_err(PyValueError::new_err)?)
            }
        };
        Ok(SpoolReplay { replay: Replay::new(reader, xid, commit_lsn, end_lsn, commit_time), xid })
    }

    /// Where the next spooled entry starts in the file.
    #[getter]
    fn position(&self) -> u64 {
        self.replay.position()
    }

    /// Whether the Commit is handed out and taken: nothing is left.
    #[getter]
    fn done(&self) -> bool {
        self.replay.done()
    }

    /// Release the file (the replay is done, or abandoned with its attempt).
    fn close(&mut self) {
        self.replay.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(subxid: u32, change_lsn: u64, message: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&subxid.to_be_bytes());
        bytes.extend_from_slice(&change_lsn.to_be_bytes());
        bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
        bytes.extend_from_slice(message);
        bytes
    }

    /// Every entry a reader hands out, advancing past each: (subxid, change LSN, message).
    fn read_all<S: ReadAt>(reader: &mut SpoolReader<S>) -> Result<Vec<(u32, u64, Vec<u8>)>, SpoolError> {
        let mut out = Vec::new();
        while let Some(entry) = reader.peek()? {
            out.push((entry.subxid, entry.change_lsn, reader.message(&entry).to_vec()));
            reader.advance(&entry);
        }
        Ok(out)
    }

    fn damaged<T: std::fmt::Debug>(result: Result<T, SpoolError>) -> String {
        match result {
            Err(SpoolError::Damaged(what)) => what,
            other => panic!("not refused as damaged: {other:?}"),
        }
    }

    #[test]
    fn the_entries_of_every_range_come_back_in_file_order() {
        let mut file = entry(1, 0x100, b"I one");
        let second = file.len() as u64;
        file.extend(entry(1, 0x200, b""));
        file.extend(entry(2, 0x300, b"I three"));
        let size = file.len() as u64;
        // One range, and the same file cut into two adjacent ones.
        for ranges in [vec![(0, size)], vec![(0, second), (second, size)]] {
            let mut reader = SpoolReader::new(file.clone(), ranges, HashSet::new()).unwrap();
            assert_eq!(
                read_all(&mut reader).unwrap(),
                [(1, 0x100, b"I one".to_vec()), (1, 0x200, vec![]), (2, 0x300, b"I three".to_vec())]
            );
            assert_eq!(reader.position(), size);
        }
        // No range, or empty ones: nothing.
        assert!(read_all(&mut SpoolReader::new(file.clone(), vec![], HashSet::new()).unwrap()).unwrap().is_empty());
        assert!(read_all(&mut SpoolReader::new(file, vec![(3, 3)], HashSet::new()).unwrap()).unwrap().is_empty());
    }

    #[test]
    fn a_void_range_is_skipped_unread() {
        let mut file = entry(1, 0x100, b"kept");
        let void_start = file.len() as u64;
        file.extend(entry(2, 0x200, b"rolled back"));
        file.extend(entry(3, 0x300, b"begun inside it"));
        let void_end = file.len() as u64;
        file.extend(entry(1, 0x400, b"kept too"));
        let size = file.len() as u64;
        // The void bytes are garbage: never read, so never refused.
        for byte in &mut file[void_start as usize..void_end as usize] {
            *byte = 0xFF;
        }
        let mut reader = SpoolReader::new(file, vec![(0, void_start), (void_end, size)], HashSet::new()).unwrap();
        assert_eq!(read_all(&mut reader).unwrap(), [(1, 0x100, b"kept".to_vec()), (1, 0x400, b"kept too".to_vec())]);
    }

    #[test]
    fn a_short_entry_is_refused_as_damaged() {
        let whole = entry(1, 0x100, b"a message");
        let size = whole.len() as u64;
        // The file ends inside the message, inside the header, or right after it.
        for cut in [size - 1, 7, ENTRY_HEADER as u64] {
            let file = whole[..cut as usize].to_vec();
            let what = damaged(SpoolReader::new(file, vec![(0, size)], HashSet::new()).unwrap().peek());
            assert!(what.contains("the file ends at byte"), "{what}");
        }
        // A range that ends inside the header, or inside the message.
        let what = damaged(SpoolReader::new(whole.clone(), vec![(0, 10)], HashSet::new()).unwrap().peek());
        assert!(what.contains("10 bytes of its 16-byte header"), "{what}");
        let what = damaged(SpoolReader::new(whole.clone(), vec![(0, size - 1)], HashSet::new()).unwrap().peek());
        assert!(what.contains("9-byte message, past its range's end"), "{what}");
        // A length past everything (a damaged header) is refused before any read of it.
        let mut huge = whole;
        huge[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        let what = damaged(SpoolReader::new(huge, vec![(0, size)], HashSet::new()).unwrap().peek());
        assert!(what.contains("past its range's end"), "{what}");
    }

    #[test]
    fn an_entry_of_a_void_subxid_in_a_range_is_skipped() {
        // a, b, a again; b rolled back: its entry sits between two live ones.
        let mut file = entry(1, 0x100, b"a");
        file.extend(entry(2, 0x200, b"b"));
        file.extend(entry(1, 0x300, b"a again"));
        let size = file.len() as u64;
        let mut reader = SpoolReader::new(file, vec![(0, size)], HashSet::from([2])).unwrap();
        assert_eq!(read_all(&mut reader).unwrap(), [(1, 0x100, b"a".to_vec()), (1, 0x300, b"a again".to_vec())]);
        assert_eq!(reader.position(), size);
    }

    #[test]
    fn ranges_out_of_order_are_refused() {
        assert!(SpoolReader::new(Vec::new(), vec![(5, 3)], HashSet::new()).is_err());
        assert!(SpoolReader::new(Vec::new(), vec![(0, 10), (5, 20)], HashSet::new()).is_err());
        assert!(SpoolReader::new(Vec::new(), vec![(0, 10), (10, 20)], HashSet::new()).is_ok());
    }

    #[test]
    fn entries_larger_than_a_read_and_across_reads_come_back_whole() {
        let big = vec![b'x'; READ_SIZE + 10];
        let mut file = Vec::new();
        let mut expected = Vec::new();
        // Small entries until one straddles the first read's end, then one larger than a read.
        let mut lsn = 0;
        while file.len() < READ_SIZE + 100 {
            lsn += 1;
            let message = format!("row {lsn}").into_bytes();
            file.extend(entry(1, lsn, &message));
            expected.push((1, lsn, message));
        }
        file.extend(entry(1, lsn + 1, &big));
        expected.push((1, lsn + 1, big));
        let size = file.len() as u64;
        assert_eq!(read_all(&mut SpoolReader::new(file, vec![(0, size)], HashSet::new()).unwrap()).unwrap(), expected);
    }

    fn replayed(replay: &mut Replay<Vec<u8>>) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((lsn, message)) = replay.next_message().unwrap() {
            out.push((lsn, message.to_vec()));
            replay.advance();
        }
        out
    }

    #[test]
    fn a_replay_is_begin_the_changes_and_commit() {
        let mut file = entry(1, 0x100, b"first");
        file.extend(entry(1, 0x200, b"second"));
        let size = file.len() as u64;
        let reader = SpoolReader::new(file, vec![(0, size)], HashSet::new()).unwrap();
        let mut replay = Replay::new(Some(reader), 7001, 0x5000, 0x5038, 777);
        let out = replayed(&mut replay);
        let mut begin = vec![BEGIN];
        begin.extend_from_slice(&0x5000u64.to_be_bytes());
        begin.extend_from_slice(&777i64.to_be_bytes());
        begin.extend_from_slice(&7001u32.to_be_bytes());
        let mut commit = vec![COMMIT, 0];
        commit.extend_from_slice(&0x5000u64.to_be_bytes());
        commit.extend_from_slice(&0x5038u64.to_be_bytes());
        commit.extend_from_slice(&777i64.to_be_bytes());
        assert_eq!(
            out,
            [(0x5000, begin.clone()), (0x100, b"first".to_vec()), (0x200, b"second".to_vec()), (0x5038, commit.clone())]
        );
        assert!(replay.done());
        // A transaction that spooled nothing: Begin and Commit.
        let mut empty: Replay<Vec<u8>> = Replay::new(None, 7001, 0x5000, 0x5038, 777);
        assert_eq!(replayed(&mut empty), [(0x5000, begin), (0x5038, commit)]);
    }

    #[test]
    fn a_replay_stopped_mid_range_resumes_where_it_stopped() {
        let mut file = Vec::new();
        for lsn in 1..=5u64 {
            file.extend(entry(1, lsn, format!("row {lsn}").as_bytes()));
        }
        let size = file.len() as u64;
        let reader = SpoolReader::new(file, vec![(0, size)], HashSet::new()).unwrap();
        let mut replay = Replay::new(Some(reader), 1, 0x10, 0x20, 0);
        let mut seen = Vec::new();
        // Take the Begin and two rows, then stop at the third without taking it (a full
        // queue): the next call hands the same one out again.
        for _ in 0..3 {
            seen.push(replay.next_message().unwrap().unwrap().0);
            replay.advance();
        }
        let held_back = replay.next_message().unwrap().unwrap().0;
        let position = replay.position();
        assert_eq!(replay.next_message().unwrap().unwrap().0, held_back);
        assert_eq!(replay.position(), position);
        seen.extend(replayed(&mut replay).into_iter().map(|(lsn, _)| lsn));
        assert_eq!(seen, [0x10, 1, 2, 3, 4, 5, 0x20]);
        assert_eq!(replay.position(), size);
    }

    #[test]
    fn a_closed_replay_hands_out_nothing() {
        let file = entry(1, 1, b"row");
        let size = file.len() as u64;
        let mut replay = Replay::new(Some(SpoolReader::new(file, vec![(0, size)], HashSet::new()).unwrap()), 1, 0x10, 0x20, 0);
        replay.next_message().unwrap();
        replay.close();
        assert!(replay.next_message().unwrap().is_none());
        assert!(replay.done());
    }

    #[test]
    fn a_spool_file_is_read_by_its_descriptor_without_moving_its_position() {
        use std::io::{Seek, Write};
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("spool-replay-test-{}", std::process::id()));
        let mut file = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all(&entry(4, 0x44, b"spooled")).unwrap();
        let size = file.stream_position().unwrap();
        let owned = unsafe { BorrowedFd::borrow_raw(file.as_raw_fd()) }.try_clone_to_owned().unwrap();
        let mut reader = SpoolReader::new(File::from(owned), vec![(0, size)], HashSet::new()).unwrap();
        assert_eq!(read_all(&mut reader).unwrap(), [(4, 0x44, b"spooled".to_vec())]);
        assert_eq!(file.stream_position().unwrap(), size);
    }
}
