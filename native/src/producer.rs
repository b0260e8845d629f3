//! capture's record producer: the librdkafka that confluent-kafka ships, driven from here.
//!
//! Producing through confluent-kafka costs a Python call per record with keyword
//! parsing, a headers list converted per call, a per-record state object, and per
//! delivery report a `Message` and a `KafkaError` object plus a Python callback. For
//! capture that is about a third of a streamed change's CPU and most of a snapshot row's
//! in the loop. This producer calls the same library's public C API
//! (<https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html>):
//!
//! - **The same library.** The caller passes the path of the librdkafka confluent-kafka
//!   loaded (`capture/publish/native_producer.py` reads it from the process's maps), so the
//!   version, the build options (TLS, SASL mechanisms, compression codecs) and therefore
//!   every client property behave exactly as they do for confluent-kafka's clients. The
//!   functions are looked up by name at run time; nothing is linked at build time.
//! - **Reports served as confluent-kafka serves them.** A record that asks for a report
//!   carries its callback and topic as the message's opaque ([`Pending`], boxed).
//!   librdkafka calls [`delivered`] from `rd_kafka_poll` or `rd_kafka_flush`, in the
//!   calling thread, with the GIL released: it only appends the opaque, error code,
//!   partition and offset to a list. Once the GIL is back, `poll` calls each callback
//!   with `(error or None, Delivered)`, where [`Delivered`] has the accessors of
//!   confluent-kafka's `Message` the callbacks read. A record without a report is
//!   reported only if it failed ([`Deliveries::unreported_failures`]), so a lost record
//!   can never go unseen.
//! - **Client errors** (`error_cb`: a refused login, a failed TLS handshake, all brokers
//!   down) are kept as [`ClientError`]s for the caller, as confluent-kafka's `error_cb`
//!   would receive them.
//! - **Batches.** `produce_batch` produces a snapshot batch's records (one topic, shared
//!   headers, explicit partitions) in one call; it stops at the first refused record and
//!   says where, so the caller can serve reports (a full queue) and go on.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard};

use libloading::Library;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// `rd_kafka_type_t`.
const PRODUCER: c_int = 0;
/// `rd_kafka_conf_res_t`: the property was set.
const CONF_OK: c_int = 0;
/// `rd_kafka_vtype_t`, the argument kinds of `rd_kafka_produceva`.
const VTYPE_END: c_int = 0;
const VTYPE_TOPIC: c_int = 1;
const VTYPE_PARTITION: c_int = 3;
const VTYPE_VALUE: c_int = 4;
const VTYPE_KEY: c_int = 5;
const VTYPE_OPAQUE: c_int = 6;
const VTYPE_MSGFLAGS: c_int = 7;
const VTYPE_HEADERS: c_int = 10;
/// `RD_KAFKA_MSG_F_COPY`: librdkafka copies key and value, so Python's bytes may go.
const MSG_F_COPY: c_int = 0x2;
/// `RD_KAFKA_RESP_ERR_NO_ERROR`.
const NO_ERROR: c_int = 0;
/// The size of the buffers librdkafka writes error texts into.
const ERRSTR_SIZE: usize = 512;

type Rk = c_void;
type Conf = c_void;
type Headers = c_void;
type DeliveredCallback = unsafe extern "C" fn(*mut Rk, *const Message, *mut c_void);
type ErrorCallback = unsafe extern "C" fn(*mut Rk, c_int, *const c_char, *mut c_void);

/// `rd_kafka_message_t`, as a delivery report sees it.
#[repr(C)]
struct Message {
    err: c_int,
    rkt: *mut c_void,
    partition: i32,
    payload: *mut c_void,
    len: usize,
    key: *mut c_void,
    key_len: usize,
    offset: i64,
    private: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Memory {
    ptr: *const c_void,
    size: usize,
}

/// The value union of `rd_kafka_vu_t`, padded to its 64 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
union Argument {
    cstr: *const c_char,
    i: c_int,
    i32: i32,
    mem: Memory,
    ptr: *mut c_void,
    pad: [u8; 64],
}

/// `rd_kafka_vu_t`: one argument of `rd_kafka_produceva`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Vu {
    vtype: c_int,
    u: Argument,
}

/// The functions of librdkafka's C API this producer calls, looked up once per library.
struct Api {
    conf_new: unsafe extern "C" fn() -> *mut Conf,
    conf_set: unsafe extern "C" fn(*mut Conf, *const c_char, *const c_char, *mut c_char, usize) -> c_int,
    conf_destroy: unsafe extern "C" fn(*mut Conf),
    conf_set_opaque: unsafe extern "C" fn(*mut Conf, *mut c_void),
    conf_set_dr_msg_cb: unsafe extern "C" fn(*mut Conf, DeliveredCallback),
    conf_set_error_cb: unsafe extern "C" fn(*mut Conf, ErrorCallback),
    new: unsafe extern "C" fn(c_int, *mut Conf, *mut c_char, usize) -> *mut Rk,
    destroy: unsafe extern "C" fn(*mut Rk),
    produceva: unsafe extern "C" fn(*mut Rk, *const Vu, usize) -> *mut c_void,
    error_code: unsafe extern "C" fn(*const c_void) -> c_int,
    error_destroy: unsafe extern "C" fn(*mut c_void),
    headers_new: unsafe extern "C" fn(usize) -> *mut Headers,
    headers_destroy: unsafe extern "C" fn(*mut Headers),
    header_add: unsafe extern "C" fn(*mut Headers, *const c_char, isize, *const c_void, isize) -> c_int,
    poll: unsafe extern "C" fn(*mut Rk, c_int) -> c_int,
    flush: unsafe extern "C" fn(*mut Rk, c_int) -> c_int,
    outq_len: unsafe extern "C" fn(*mut Rk) -> c_int,
    err2str: unsafe extern "C" fn(c_int) -> *const c_char,
    topic_name: unsafe extern "C" fn(*const c_void) -> *const c_char,
    version_str: unsafe extern "C" fn() -> *const c_char,
    /// Kept last: the functions above are valid while the library stays loaded.
    _library: Library,
}

impl Api {
    fn load(path: &str) -> Result<Api, libloading::Error> {
        // SAFETY: the library is librdkafka (the caller found it loaded by
        // confluent-kafka), and each symbol is given its type from rdkafka.h.
        unsafe {
            let library = Library::new(path)?;
            macro_rules! function {
                ($name:literal) => {
                    *library.get(concat!($name, "\0").as_bytes())?
                };
            }
            Ok(Api {
                conf_new: function!("rd_kafka_conf_new"),
                conf_set: function!("rd_kafka_conf_set"),
                conf_destroy: function!("rd_kafka_conf_destroy"),
                conf_set_opaque: function!("rd_kafka_conf_set_opaque"),
                conf_set_dr_msg_cb: function!("rd_kafka_conf_set_dr_msg_cb"),
                conf_set_error_cb: function!("rd_kafka_conf_set_error_cb"),
                new: function!("rd_kafka_new"),
                destroy: function!("rd_kafka_destroy"),
                produceva: function!("rd_kafka_produceva"),
                error_code: function!("rd_kafka_error_code"),
                error_destroy: function!("rd_kafka_error_destroy"),
                headers_new: function!("rd_kafka_headers_new"),
                headers_destroy: function!("rd_kafka_headers_destroy"),
                header_add: function!("rd_kafka_header_add"),
                poll: function!("rd_kafka_poll"),
                flush: function!("rd_kafka_flush"),
                outq_len: function!("rd_kafka_outq_len"),
                err2str: function!("rd_kafka_err2str"),
                topic_name: function!("rd_kafka_topic_name"),
                version_str: function!("rd_kafka_version_str"),
                _library: library,
            })
        }
    }

    fn error_text(&self, code: c_int) -> String {
        // SAFETY: err2str returns a static string for any code.
        unsafe { text((self.err2str)(code)) }
    }
}

/// A C string librdkafka owns, copied; empty for NULL.
unsafe fn text(value: *const c_char) -> String {
    if value.is_null() {
        String::new()
    } else {
        CStr::from_ptr(value).to_string_lossy().into_owned()
    }
}

/// What librdkafka's callbacks handed over since the caller last took it.
#[derive(Default)]
struct Deliveries {
    /// `(Pending, error code, partition, offset)` of every record that asked for a
    /// report, the [`Pending`] as the raw pointer given to librdkafka.
    reports: Vec<(usize, i32, i32, i64)>,
    /// Records without a report that failed.
    unreported_failures: Vec<UnreportedFailure>,
    /// What the client's error callback said.
    errors: VecDeque<ClientError>,
    /// `(transaction, error code, topic handle, partition, offset, bytes)` of every
    /// record a compiled stream produced (`src/compiled_stream.rs`): its opaque is a
    /// transaction id, not a [`Pending`].
    streamed: Vec<(u64, i32, usize, i32, i64, usize)>,
}

/// The callbacks' state: the conf opaque, boxed so its address stays put.
struct Shared {
    deliveries: Mutex<Deliveries>,
    topic_name: unsafe extern "C" fn(*const c_void) -> *const c_char,
}

/// How many client errors are kept between two takes: a broker down for hours must not
/// grow this without bound; the latest are the ones that say what is wrong now.
const ERRORS_KEPT: usize = 100;

impl Shared {
    fn deliveries(&self) -> MutexGuard<'_, Deliveries> {
        // A poisoned lock only means a panic elsewhere; the lists are still whole.
        self.deliveries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

unsafe extern "C" fn delivered(_rk: *mut Rk, message: *const Message, opaque: *mut c_void) {
    if message.is_null() || opaque.is_null() {
        return;
    }
    let shared = &*(opaque as *const Shared);
    let message = &*message;
    let pending = message.private as usize;
    if pending & STREAMED != 0 {
        let size = message.len + message.key_len;
        let transaction = (pending >> 1) as u64;
        shared.deliveries().streamed.push((transaction, message.err, message.rkt as usize, message.partition, message.offset, size));
        return;
    }
    if pending == 0 {
        if message.err != NO_ERROR {
            let topic = if message.rkt.is_null() { String::new() } else { text((shared.topic_name)(message.rkt)) };
            let failure = UnreportedFailure { code: message.err, topic, partition: message.partition };
            shared.deliveries().unreported_failures.push(failure);
        }
        return;
    }
    shared.deliveries().reports.push((pending, message.err, message.partition, message.offset));
}

unsafe extern "C" fn client_error(_rk: *mut Rk, err: c_int, reason: *const c_char, opaque: *mut c_void) {
    if opaque.is_null() {
        return;
    }
    let shared = &*(opaque as *const Shared);
    let mut deliveries = shared.deliveries();
    if deliveries.errors.len() >= ERRORS_KEPT {
        deliveries.errors.pop_front();
    }
    deliveries.errors.push_back(ClientError { code: err, reason: text(reason) });
}

/// The low bit of a streamed record's opaque: a [`Pending`] is a boxed pointer, aligned,
/// so its low bit is 0; a record of the compiled stream carries
/// `transaction id << 1 | STREAMED`.
pub(crate) const STREAMED: usize = 1;

/// The opaque of a record a compiled stream produces for `transaction`.
pub(crate) fn streamed_opaque(transaction: u64) -> usize {
    ((transaction as usize) << 1) | STREAMED
}

/// What a record that asked for a report carries through librdkafka (its opaque): the
/// callback and the topic, for the report.
struct Pending {
    callback: Py<PyAny>,
    topic: Py<PyString>,
}

impl Pending {
    fn into_opaque(self) -> usize {
        Box::into_raw(Box::new(self)) as usize
    }

    /// SAFETY: `opaque` came from `into_opaque` and is taken back once.
    unsafe fn from_opaque(opaque: usize) -> Pending {
        *Box::from_raw(opaque as *mut Pending)
    }
}

/// Where a reported record went, with the accessors of `confluent_kafka.Message` that
/// delivery callbacks read.
#[pyclass(module = "capture_native", frozen)]
pub struct Delivered {
    topic: Py<PyString>,
    partition: i32,
    offset: i64,
}

#[pymethods]
impl Delivered {
    #[new]
    fn new(topic: Py<PyString>, partition: i32, offset: i64) -> Self {
        Delivered { topic, partition, offset }
    }

    fn topic(&self, py: Python<'_>) -> Py<PyString> {
        self.topic.clone_ref(py)
    }

    fn partition(&self) -> i32 {
        self.partition
    }

    /// None when librdkafka has no offset for the record (a failed delivery).
    fn offset(&self) -> Option<i64> {
        (self.offset >= 0).then_some(self.offset)
    }
}

/// A record produced without a report that failed: it is reported anyway, so that no
/// record is lost unseen.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct UnreportedFailure {
    /// librdkafka's error code (`error_text` words it).
    code: i32,
    topic: String,
    partition: i32,
}

/// An error the client reported (`error_cb`): a refused login, a failed TLS handshake,
/// all brokers down. What confluent-kafka's `KafkaError(code, reason)` would hold.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct ClientError {
    /// librdkafka's error code.
    code: i32,
    reason: String,
}

/// A compiled stream's records of one transaction delivered to one partition since the
/// last poll, summed: the caller's book takes them as one report.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct StreamedRun {
    /// The transaction's id in the in-flight book (the records' opaque).
    transaction: u64,
    topic: Py<PyString>,
    partition: i32,
    /// The highest offset among them.
    offset: i64,
    records: u64,
    /// Their key and value bytes.
    bytes: u64,
}

/// What one `poll` served and collected.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct Polled {
    /// How many delivery callbacks were called.
    served: usize,
    /// Records without a report that failed, a compiled stream's included (list of
    /// [`UnreportedFailure`]).
    unreported_failures: Py<PyList>,
    /// The client's errors since the last poll, the latest [`ERRORS_KEPT`] at most
    /// (list of [`ClientError`]).
    client_errors: Py<PyList>,
    /// The compiled stream's delivered records, one [`StreamedRun`] per transaction and
    /// partition, in the order each first appeared (so, per partition, in offset order).
    streamed: Py<PyList>,
}

/// The result of `produce_batch`: how far it got.
#[pyclass(module = "capture_native", frozen, get_all)]
pub struct BatchProduced {
    /// The index of the first record not queued: the batch's length when all were.
    next: usize,
    /// librdkafka's error code for that record (e.g. a full queue); 0 when all were
    /// queued.
    code: i32,
}

/// The client handle, passed into code that runs without the GIL.
#[derive(Clone, Copy)]
struct Handle(*mut Rk);
// SAFETY: librdkafka's client handles are thread-safe.
unsafe impl Send for Handle {}

/// One header of a record, borrowed from the caller's objects for the call.
pub(crate) struct HeaderField<'a> {
    pub(crate) name: &'a str,
    pub(crate) value: Option<&'a [u8]>,
}

/// A record's headers as the caller passes them: `(name, value)` pairs, a value
/// `bytes`, `str` or None. Held here so the fields can borrow from them.
fn header_items<'py>(headers: &Bound<'py, PyList>) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let mut items = Vec::with_capacity(headers.len());
    for item in headers.iter() {
        let pair = item.cast_into::<PyTuple>()?;
        if pair.len() != 2 {
            return Err(PyValueError::new_err("a header is a (name, value) pair"));
        }
        items.push((pair.get_item(0)?, pair.get_item(1)?));
    }
    Ok(items)
}

fn header_fields<'a>(items: &'a [(Bound<'_, PyAny>, Bound<'_, PyAny>)]) -> PyResult<Vec<HeaderField<'a>>> {
    let mut fields = Vec::with_capacity(items.len());
    for (name, value) in items {
        let name = name.cast::<PyString>()?.to_str()?;
        let value = if value.is_none() {
            None
        } else if let Ok(bytes) = value.cast::<PyBytes>() {
            Some(bytes.as_bytes())
        } else {
            Some(value.cast::<PyString>()?.to_str()?.as_bytes())
        };
        fields.push(HeaderField { name, value });
    }
    Ok(fields)
}

/// librdkafka's producer, with capture's delivery bookkeeping (see the module's text).
#[pyclass(module = "capture_native", frozen)]
pub struct KafkaProducer {
    api: Arc<Api>,
    rk: *mut Rk,
    shared: Box<Shared>,
}

// SAFETY: librdkafka's client handles are thread-safe, and `shared` is behind a lock.
unsafe impl Send for KafkaProducer {}
unsafe impl Sync for KafkaProducer {}

impl KafkaProducer {
    /// Produce one record; librdkafka's error code, `NO_ERROR` when it was queued.
    pub(crate) fn produce_one(
        &self,
        topic: &CStr,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
        headers: &[HeaderField<'_>],
        report: usize,
    ) -> c_int {
        let api = &*self.api;
        // SAFETY: every pointer below is valid for the call; librdkafka copies key and
        // value (MSG_F_COPY) and takes the headers list when it queues the record.
        unsafe {
            let list = (api.headers_new)(headers.len());
            for header in headers {
                let (pointer, size) = match header.value {
                    Some(bytes) => (bytes.as_ptr() as *const c_void, bytes.len() as isize),
                    None => (ptr::null(), 0),
                };
                (api.header_add)(list, header.name.as_ptr() as *const c_char, header.name.len() as isize, pointer, size);
            }
            let (value_pointer, value_size) = match value {
                Some(bytes) => (bytes.as_ptr() as *const c_void, bytes.len()),
                None => (ptr::null(), 0),
            };
            let arguments = [
                Vu { vtype: VTYPE_TOPIC, u: Argument { cstr: topic.as_ptr() } },
                Vu { vtype: VTYPE_PARTITION, u: Argument { i32: partition } },
                Vu { vtype: VTYPE_MSGFLAGS, u: Argument { i: MSG_F_COPY } },
                Vu { vtype: VTYPE_KEY, u: Argument { mem: Memory { ptr: key.as_ptr() as *const c_void, size: key.len() } } },
                Vu { vtype: VTYPE_VALUE, u: Argument { mem: Memory { ptr: value_pointer, size: value_size } } },
                Vu { vtype: VTYPE_OPAQUE, u: Argument { ptr: report as *mut c_void } },
                Vu { vtype: VTYPE_HEADERS, u: Argument { ptr: list } },
                Vu { vtype: VTYPE_END, u: Argument { pad: [0; 64] } },
            ];
            let error = (api.produceva)(self.rk, arguments.as_ptr(), arguments.len() - 1);
            if error.is_null() {
                return NO_ERROR;
            }
            let code = (api.error_code)(error);
            (api.error_destroy)(error);
            // Not queued: the headers list is still ours.
            (api.headers_destroy)(list);
            code
        }
    }
}

impl KafkaProducer {
    /// The compiled stream's reports summed by transaction and partition; failed records
    /// go to `failures` as unreported ones do.
    fn streamed_runs(
        &self,
        py: Python<'_>,
        streamed: Vec<(u64, i32, usize, i32, i64, usize)>,
        failures: &mut Vec<UnreportedFailure>,
    ) -> Vec<StreamedRun> {
        let mut runs: Vec<StreamedRun> = Vec::new();
        let mut index: HashMap<(u64, usize, i32), usize> = HashMap::new();
        let mut topics: HashMap<usize, Py<PyString>> = HashMap::new();
        for (transaction, code, rkt, partition, offset, size) in streamed {
            let topic = topics.entry(rkt).or_insert_with(|| {
                // SAFETY: a delivered message's topic handle is valid while the client is.
                let name = if rkt == 0 { String::new() } else { unsafe { text((self.api.topic_name)(rkt as *const c_void)) } };
                PyString::new(py, &name).unbind()
            });
            if code != NO_ERROR {
                failures.push(UnreportedFailure { code, topic: topic.bind(py).to_string(), partition });
                continue;
            }
            match index.get(&(transaction, rkt, partition)) {
                Some(&at) => {
                    let run = &mut runs[at];
                    run.offset = run.offset.max(offset);
                    run.records += 1;
                    run.bytes += size as u64;
                }
                None => {
                    index.insert((transaction, rkt, partition), runs.len());
                    let topic = topic.clone_ref(py);
                    runs.push(StreamedRun { transaction, topic, partition, offset, records: 1, bytes: size as u64 });
                }
            }
        }
        runs
    }

    /// confluent-kafka's `KafkaError` for a librdkafka error code, as its callbacks get.
    fn kafka_error(&self, py: Python<'_>, code: c_int) -> PyResult<Py<PyAny>> {
        let class = py.import("confluent_kafka")?.getattr("KafkaError")?;
        Ok(class.call1((code, self.api.error_text(code)))?.unbind())
    }
}

fn topic_name(topic: &str) -> PyResult<CString> {
    CString::new(topic).map_err(|_| PyValueError::new_err("a topic name has no NUL character"))
}

#[pymethods]
impl KafkaProducer {
    /// A producer of the librdkafka at `library`, with `config`'s properties in order.
    /// Raises OSError when the library cannot be loaded and ValueError for a property
    /// librdkafka refuses (its message names the property).
    #[new]
    #[pyo3(signature = (library, config, /))]
    fn new(library: &str, config: Vec<(String, String)>) -> PyResult<Self> {
        let api = Api::load(library).map_err(|e| PyOSError::new_err(format!("cannot load librdkafka from {library}: {e}")))?;
        let api = Arc::new(api);
        let shared = Box::new(Shared { deliveries: Mutex::new(Deliveries::default()), topic_name: api.topic_name });
        let mut errstr = vec![0 as c_char; ERRSTR_SIZE];
        // SAFETY: a conf is ours until rd_kafka_new takes it (on success only).
        unsafe {
            let conf = (api.conf_new)();
            for (name, value) in &config {
                let (c_name, c_value) = match (CString::new(name.as_str()), CString::new(value.as_str())) {
                    (Ok(n), Ok(v)) => (n, v),
                    _ => {
                        (api.conf_destroy)(conf);
                        return Err(PyValueError::new_err(format!("Kafka property {name}: no NUL characters allowed")));
                    }
                };
                if (api.conf_set)(conf, c_name.as_ptr(), c_value.as_ptr(), errstr.as_mut_ptr(), ERRSTR_SIZE) != CONF_OK {
                    (api.conf_destroy)(conf);
                    return Err(PyValueError::new_err(text(errstr.as_ptr())));
                }
            }
            (api.conf_set_opaque)(conf, &*shared as *const Shared as *mut c_void);
            (api.conf_set_dr_msg_cb)(conf, delivered);
            (api.conf_set_error_cb)(conf, client_error);
            let rk = (api.new)(PRODUCER, conf, errstr.as_mut_ptr(), ERRSTR_SIZE);
            if rk.is_null() {
                (api.conf_destroy)(conf);
                return Err(PyValueError::new_err(text(errstr.as_ptr())));
            }
            Ok(KafkaProducer { api, rk, shared })
        }
    }

    /// Queue one record for `partition` (-1: the configured partitioner); `on_delivery`,
    /// if given, is called by a later `poll` as confluent-kafka calls it. librdkafka's
    /// error code: 0 when queued.
    #[pyo3(signature = (topic, partition, key, value, headers, on_delivery, /))]
    fn produce(
        &self,
        topic: &Bound<'_, PyString>,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
        headers: &Bound<'_, PyList>,
        on_delivery: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        let name = topic_name(topic.to_str()?)?;
        let items = header_items(headers)?;
        let fields = header_fields(&items)?;
        let report = match on_delivery {
            Some(callback) => Pending { callback: callback.clone().unbind(), topic: topic.clone().unbind() }.into_opaque(),
            None => 0,
        };
        let code = self.produce_one(&name, partition, key, value, &fields, report);
        if code != NO_ERROR && report != 0 {
            // SAFETY: not queued, so librdkafka never saw it.
            drop(unsafe { Pending::from_opaque(report) });
        }
        Ok(code)
    }

    /// Queue `keys[i]`/`values[i]` for `partitions[i]`, from `start` on, all on `topic`
    /// with `headers`; the records at the indexes of `reports` (index and callback
    /// pairs, by index) ask for reports. Stops at the first record librdkafka refuses
    /// (e.g. its queue is full): [`BatchProduced`] says which, and why.
    #[pyo3(signature = (topic, partitions, keys, values, headers, reports, start, /))]
    #[allow(clippy::too_many_arguments)]
    fn produce_batch(
        &self,
        topic: &Bound<'_, PyString>,
        partitions: Vec<i32>,
        keys: &Bound<'_, PyList>,
        values: &Bound<'_, PyList>,
        headers: &Bound<'_, PyList>,
        reports: Vec<(usize, Bound<'_, PyAny>)>,
        start: usize,
    ) -> PyResult<BatchProduced> {
        let count = keys.len();
        if values.len() != count || partitions.len() != count {
            return Err(PyValueError::new_err("a batch has one value and one partition per key"));
        }
        let name = topic_name(topic.to_str()?)?;
        let items = header_items(headers)?;
        let fields = header_fields(&items)?;
        let mut next_report = reports.iter().position(|(index, _)| *index >= start).unwrap_or(reports.len());
        for (index, &partition) in partitions.iter().enumerate().skip(start) {
            let key = keys.get_item(index)?;
            let value = values.get_item(index)?;
            let key = key.cast::<PyBytes>()?.as_bytes();
            let value = value.cast::<PyBytes>()?.as_bytes();
            let mut report = 0;
            while next_report < reports.len() && reports[next_report].0 <= index {
                if reports[next_report].0 == index {
                    let callback = reports[next_report].1.clone().unbind();
                    report = Pending { callback, topic: topic.clone().unbind() }.into_opaque();
                }
                next_report += 1;
            }
            let code = self.produce_one(&name, partition, key, Some(value), &fields, report);
            if code != NO_ERROR {
                if report != 0 {
                    // SAFETY: not queued, so librdkafka never saw it.
                    drop(unsafe { Pending::from_opaque(report) });
                }
                return Ok(BatchProduced { next: index, code });
            }
        }
        Ok(BatchProduced { next: count, code: NO_ERROR })
    }

    /// Serve librdkafka's callbacks for up to `timeout_ms` (without the GIL), then call
    /// the delivery callbacks of the reports that came, in order, as confluent-kafka
    /// does: `(None, Delivered)`, or `(KafkaError, Delivered)` for a failed record.
    /// Returns what it served and collected ([`Polled`]: a compiled stream's record that
    /// failed is an unreported failure); raises the first exception a callback raised,
    /// after serving every report.
    fn poll(&self, py: Python<'_>, timeout_ms: i32) -> PyResult<Polled> {
        let handle = Handle(self.rk);
        let poll = self.api.poll;
        // SAFETY: the handle lives as long as self, which the caller holds.
        py.detach(move || unsafe {
            let handle = handle;
            poll(handle.0, timeout_ms)
        });
        let (reports, mut failures, errors, streamed) = {
            let mut deliveries = self.shared.deliveries();
            (
                std::mem::take(&mut deliveries.reports),
                std::mem::take(&mut deliveries.unreported_failures),
                deliveries.errors.drain(..).collect::<Vec<_>>(),
                std::mem::take(&mut deliveries.streamed),
            )
        };
        let runs = self.streamed_runs(py, streamed, &mut failures);
        let served = reports.len();
        let mut raised: Option<PyErr> = None;
        for (opaque, code, partition, offset) in reports {
            // SAFETY: each opaque is reported once, by librdkafka, for a queued record.
            let pending = unsafe { Pending::from_opaque(opaque) };
            let delivered = Delivered { topic: pending.topic, partition, offset };
            let error = if code == NO_ERROR { Ok(py.None()) } else { self.kafka_error(py, code) };
            let called = error.and_then(|error| pending.callback.call1(py, (error, delivered)));
            if let Err(exc) = called {
                raised.get_or_insert(exc);
            }
        }
        if let Some(exc) = raised {
            return Err(exc);
        }
        Ok(Polled {
            served,
            unreported_failures: PyList::new(py, failures)?.unbind(),
            client_errors: PyList::new(py, errors)?.unbind(),
            streamed: PyList::new(py, runs)?.unbind(),
        })
    }

    /// Wait up to `timeout_ms` (without the GIL) for every queued record to be delivered
    /// or failed; their reports wait for the next `poll`. The records still queued.
    fn flush(&self, py: Python<'_>, timeout_ms: i32) -> i32 {
        let handle = Handle(self.rk);
        let (flush, outq_len) = (self.api.flush, self.api.outq_len);
        // SAFETY: as in poll.
        py.detach(move || unsafe {
            let handle = handle;
            flush(handle.0, timeout_ms);
            outq_len(handle.0)
        })
    }

    /// librdkafka's text for an error code.
    fn error_text(&self, code: i32) -> String {
        self.api.error_text(code)
    }

    /// The version of the librdkafka in use.
    fn library_version(&self) -> String {
        // SAFETY: a static string.
        unsafe { text((self.api.version_str)()) }
    }

    /// Records queued or in flight (and reports not served yet).
    fn __len__(&self) -> usize {
        // SAFETY: the handle is valid until drop.
        unsafe { (self.api.outq_len)(self.rk).max(0) as usize }
    }
}

impl Drop for KafkaProducer {
    fn drop(&mut self) {
        // SAFETY: the handle is destroyed once, before the state its callbacks use.
        unsafe { (self.api.destroy)(self.rk) };
        self.rk = ptr::null_mut();
        // Reports taken from librdkafka but never served: their callbacks are dropped.
        let reports = std::mem::take(&mut self.shared.deliveries().reports);
        for (opaque, _, _, _) in reports {
            // SAFETY: as in poll; librdkafka is gone, so nothing else holds them.
            drop(unsafe { Pending::from_opaque(opaque) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_opaque_carries_its_transaction_and_never_looks_like_a_pointer() {
        for transaction in [0, 1, 41, u64::from(u32::MAX), (1 << 62) - 1] {
            let opaque = streamed_opaque(transaction);
            // `delivered` tells the two kinds apart by the low bit: a boxed Pending is
            // aligned, so its low bit is 0.
            assert_ne!(opaque & STREAMED, 0);
            assert_eq!((opaque >> 1) as u64, transaction);
        }
        assert!(std::mem::align_of::<Pending>() > 1);
    }
}
