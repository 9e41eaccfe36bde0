//! `felix._felix`: the native half of the Python client, over `felix-client`.
//!
//! Every operation exists twice: as a method returning an asyncio awaitable (run on
//! pyo3-async-runtimes' tokio runtime, the GIL free while it waits) and as a `*_blocking`
//! method that blocks the calling thread with the GIL released. The pure-Python package
//! (`python/python/felix/`) wraps both into `felix.Client` and `felix.blocking.Client`.
//! Errors reach Python as the exception classes of `felix._errors`, by code name.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    AckMode, CertFingerprint, Client, ClientConfig, ClientError, Offset, Publisher, ReceivedRecord,
    Record, Retention, ShardId, StartAt, StreamDescription, SubscribeOptions, Subscriber, Trust,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};

/// The tokio runtime every client runs on (pyo3-async-runtimes' own: one per process).
fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Async operations whose Rust future has not finished (see [`at_exit`]).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Whether any async operation ran in this process.
static USED_ASYNC: AtomicBool = AtomicBool::new(false);

/// Counts an async operation in [`IN_FLIGHT`] until its future finishes or is dropped.
struct InFlight;

impl InFlight {
    fn new() -> Self {
        USED_ASYNC.store(true, Ordering::Relaxed);
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `fut` as an asyncio awaitable (pyo3-async-runtimes), counted in [`IN_FLIGHT`].
fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let guard = InFlight::new();
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let _guard = guard;
        fut.await
    })
}

/// Registered with `atexit` by `felix/__init__.py`. A finished Rust future hands its result
/// to the event loop from a tokio thread (`call_soon_threadsafe`, which releases the GIL to
/// write the loop's wake-up socket and takes it again): if the interpreter starts finalizing
/// in that moment, CPython ends the thread with `pthread_exit`, which aborts the process
/// (seen at the end of short benchmark processes). So at exit, with the GIL released: wait
/// (at most 200 ms) for the futures still running, then 20 ms for those handing over.
#[pyfunction]
fn _at_exit(py: Python<'_>) {
    if !USED_ASYNC.load(Ordering::Relaxed) {
        return;
    }
    py.allow_threads(|| {
        let deadline = std::time::Instant::now() + Duration::from_millis(200);
        while IN_FLIGHT.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
    });
}

/// Runs `fut` on the runtime and waits for it with the GIL released.
fn block<T: Send>(py: Python<'_>, fut: impl Future<Output = PyResult<T>> + Send) -> PyResult<T> {
    py.allow_threads(|| runtime().block_on(fut))
}

/// The exception of `felix._errors` for `code` (an error code's name), built with `message`.
fn felix_error(code: &str, message: String) -> PyErr {
    Python::with_gil(|py| {
        let made = py
            .import("felix._errors")
            .and_then(|m| m.getattr("_make"))
            .and_then(|make| make.call1((code, message)));
        match made {
            Ok(exception) => PyErr::from_value(exception),
            Err(e) => e,
        }
    })
}

/// A client error as the Python exception for its code.
fn to_py(e: ClientError) -> PyErr {
    let message = e.to_string();
    let code = match &e {
        ClientError::Broker { code, .. } | ClientError::Refused { code, .. } => format!("{code:?}"),
        ClientError::Config(_) => "Config".into(),
        ClientError::Resolve { .. } => "Resolve".into(),
        ClientError::Connect(_) => "Connect".into(),
        ClientError::PortUnreachable { .. } => "PortUnreachable".into(),
        ClientError::CertificateRejected(_) => "CertificateRejected".into(),
        ClientError::Timeout { .. } => "Timeout".into(),
        ClientError::ConnectionLost(_) => "ConnectionLost".into(),
        ClientError::Unsupported(_) => "Unsupported".into(),
        ClientError::Protocol(_) => "Protocol".into(),
        ClientError::KeyTooLong { .. } => "KeyTooLong".into(),
        ClientError::RecordTooLarge { .. } => "RecordTooLarge".into(),
        ClientError::InvalidName(_) => "InvalidName".into(),
        ClientError::InvalidArgument(_) => "InvalidArgument".into(),
        ClientError::Closed => "Closed".into(),
        ClientError::NotOwner { .. } => "NotOwner".into(),
        ClientError::ShardUnavailable { .. } => "ShardUnavailable".into(),
    };
    felix_error(&code, message)
}

/// Polls `fut` once: its output if it is ready at once. Only for cancel-safe futures.
fn poll_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

fn parse_ack(ack: &str) -> PyResult<AckMode> {
    match ack {
        "durable" => Ok(AckMode::Durable),
        "written" => Ok(AckMode::Written),
        "none" => Ok(AckMode::None),
        other => Err(PyValueError::new_err(format!(
            "ack must be \"durable\", \"written\" or \"none\", not {other:?}"
        ))),
    }
}

/// A record's bytes from Python: `bytes` (one copy), `bytearray`, `memoryview`-free `str`
/// (UTF-8).
fn bytes_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Bytes> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(b.as_bytes()));
    }
    if let Ok(b) = obj.downcast::<PyByteArray>() {
        return Ok(Bytes::from(b.to_vec()));
    }
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok(Bytes::copy_from_slice(s.to_str()?.as_bytes()));
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be bytes, bytearray or str, not {}",
        obj.get_type().name()?
    )))
}

fn optional_bytes(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Bytes>> {
    match obj {
        Some(o) if !o.is_none() => Ok(Some(bytes_of(o, what)?)),
        _ => Ok(None),
    }
}

/// `start=`: "earliest", "latest", an offset (int) or a `datetime` (anything with
/// `.timestamp()`).
fn parse_start(start: &Bound<'_, PyAny>) -> PyResult<StartAt> {
    if let Ok(s) = start.downcast::<PyString>() {
        return match s.to_str()? {
            "earliest" => Ok(StartAt::Earliest),
            "latest" => Ok(StartAt::Latest),
            other => Err(PyValueError::new_err(format!(
                "start must be \"earliest\", \"latest\", an offset or a datetime, not {other:?}"
            ))),
        };
    }
    if start.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("start must not be a bool"));
    }
    if let Ok(offset) = start.extract::<u64>() {
        return Ok(StartAt::Offset(Offset(offset)));
    }
    if start.hasattr("timestamp")? {
        let secs: f64 = start.call_method0("timestamp")?.extract()?;
        if secs.is_nan() || secs < 0.0 {
            return Err(PyValueError::new_err("start: a datetime before 1970"));
        }
        return Ok(StartAt::Timestamp((secs * 1000.0).round() as u64));
    }
    Err(PyTypeError::new_err(
        "start must be \"earliest\", \"latest\", an offset (int >= 0) or a datetime",
    ))
}

/// One record of a subscription.
#[pyclass(name = "Record", module = "felix._felix", frozen, get_all)]
struct PyRecord {
    /// The stream.
    stream: Py<PyString>,
    /// The shard it was stored in.
    shard: u32,
    /// Its offset in the shard.
    offset: u64,
    /// When its batch was stored, Unix milliseconds.
    timestamp_ms: u64,
    /// Its key, or None.
    key: Option<Py<PyBytes>>,
    /// Its payload.
    value: Py<PyBytes>,
}

#[pymethods]
impl PyRecord {
    /// When its batch was stored, as an aware UTC `datetime`.
    #[getter]
    fn timestamp<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let datetime = py.import("datetime")?;
        let utc = datetime.getattr("timezone")?.getattr("utc")?;
        datetime
            .getattr("datetime")?
            .call_method1("fromtimestamp", (self.timestamp_ms as f64 / 1000.0, utc))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let key = match &self.key {
            Some(k) => k.bind(py).repr()?.to_string(),
            None => "None".into(),
        };
        Ok(format!(
            "Record(stream={:?}, shard={}, offset={}, timestamp_ms={}, key={}, value=<{} bytes>)",
            self.stream.bind(py).to_str()?,
            self.shard,
            self.offset,
            self.timestamp_ms,
            key,
            self.value.bind(py).as_bytes().len()
        ))
    }
}

/// Records received in one wait, turned into a list of `Record`s (each value copied once
/// into a Python `bytes`) when they reach Python.
struct Batch {
    stream: Arc<str>,
    records: Vec<ReceivedRecord>,
}

impl<'py> IntoPyObject<'py> for Batch {
    type Target = PyList;
    type Output = Bound<'py, PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let stream = PyString::new(py, &self.stream).unbind();
        let mut items = Vec::with_capacity(self.records.len());
        for r in self.records {
            let record = PyRecord {
                stream: stream.clone_ref(py),
                shard: r.shard.0,
                offset: r.offset.0,
                timestamp_ms: r.timestamp_ms,
                key: r.key.map(|k| PyBytes::new(py, &k).unbind()),
                value: PyBytes::new(py, &r.value).unbind(),
            };
            items.push(Bound::new(py, record)?);
        }
        PyList::new(py, items)
    }
}

/// A stream's settings.
#[pyclass(module = "felix._felix", frozen, get_all)]
struct StreamInfo {
    /// `tenant/namespace/stream`.
    name: String,
    /// Shard count.
    shards: u32,
    /// Bytes kept per shard, or None (unlimited).
    retention_bytes: Option<u64>,
    /// Age in milliseconds after which records are deleted, or None (unlimited).
    retention_ms: Option<u64>,
}

#[pymethods]
impl StreamInfo {
    fn __repr__(&self) -> String {
        format!(
            "StreamInfo(name={:?}, shards={}, retention_bytes={:?}, retention_ms={:?})",
            self.name, self.shards, self.retention_bytes, self.retention_ms
        )
    }
}

impl From<StreamDescription> for StreamInfo {
    fn from(d: StreamDescription) -> Self {
        Self {
            name: d.name,
            shards: d.shards,
            retention_bytes: d.retention.bytes_max,
            retention_ms: d.retention.age_max_ms,
        }
    }
}

/// The publishers a client made, one per (stream, ack mode), shared by every call.
type Publishers = Arc<Mutex<HashMap<(String, u8), Publisher>>>;

/// A connected client (see `felix.Client`).
#[pyclass(module = "felix._felix", frozen)]
struct NativeClient {
    client: Client,
    publishers: Publishers,
}

async fn publisher(
    client: &Client,
    publishers: &Publishers,
    stream: &str,
    ack: AckMode,
) -> Result<Publisher, ClientError> {
    let key = (stream.to_owned(), ack as u8);
    if let Some(p) = publishers.lock().unwrap().get(&key) {
        return Ok(p.clone());
    }
    let mut settings = client.config().publish.clone();
    settings.ack_mode = ack;
    let p = client.publisher_with(stream, settings).await?;
    Ok(publishers.lock().unwrap().entry(key).or_insert(p).clone())
}

/// A publish's outcome as Python sees it: the offset, or None with `ack="none"`.
fn offset_of(result: felix_client::PublishResult) -> Result<Option<u64>, ClientError> {
    Ok(result?.map(|receipt| receipt.offset.0))
}

#[allow(clippy::too_many_arguments)]
fn config(
    addrs: &Bound<'_, PyAny>,
    ca_file: Option<String>,
    fingerprint: Option<String>,
    insecure: bool,
    token: Option<String>,
    server_name: Option<String>,
    connect_timeout_ms: Option<u64>,
    connections: Option<usize>,
) -> PyResult<ClientConfig> {
    let addr = if let Ok(s) = addrs.downcast::<PyString>() {
        s.to_str()?.to_owned()
    } else {
        let list: Vec<String> = addrs.extract()?;
        list.join(",")
    };
    let mut c = ClientConfig::parse_env().map_err(|e| to_py(e.into()))?;
    c.addr = addr;
    let chosen = [ca_file.is_some(), fingerprint.is_some(), insecure];
    if chosen.iter().filter(|b| **b).count() > 1 {
        return Err(PyValueError::new_err("choose one of ca_file, fingerprint, insecure"));
    }
    if let Some(path) = ca_file {
        c.trust = Some(Trust::CaFile(path.into()));
    } else if let Some(f) = fingerprint {
        let f: CertFingerprint = f.parse().map_err(|e| to_py(ClientError::Config(e)))?;
        c.trust = Some(Trust::Fingerprint(f));
    } else if insecure {
        c.trust = Some(Trust::DangerAcceptAnyCertificate);
    }
    if token.is_some() {
        c.token = token;
    }
    if let Some(name) = server_name {
        c.server_name = name;
    }
    if let Some(ms) = connect_timeout_ms {
        c.connect_timeout_ms = ms;
    }
    if connections.is_some() {
        c.connections = connections;
    }
    c.validate().map_err(|e| to_py(e.into()))?;
    Ok(c)
}

async fn connect(config: ClientConfig) -> PyResult<NativeClient> {
    let client = Client::connect(config).await.map_err(to_py)?;
    Ok(NativeClient { client, publishers: Arc::default() })
}

/// A record's parts, taken from Python before the GIL is released.
fn records_of(records: &Bound<'_, PyAny>, key: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Record>> {
    let common_key = optional_bytes(key, "key")?;
    let mut out = Vec::with_capacity(records.len().unwrap_or(0));
    for item in records.try_iter()? {
        let item = item?;
        if let Ok(t) = item.downcast::<PyTuple>() {
            if t.len() != 2 {
                return Err(PyTypeError::new_err("a record tuple is (key, value)"));
            }
            let k = optional_bytes(Some(&t.get_item(0)?), "key")?;
            let v = bytes_of(&t.get_item(1)?, "value")?;
            out.push(Record { key: k.or_else(|| common_key.clone()), value: v.into() });
        } else {
            let v = bytes_of(&item, "value")?;
            out.push(Record { key: common_key.clone(), value: v.into() });
        }
    }
    Ok(out)
}

impl NativeClient {
    fn publish_fut(
        &self,
        stream: String,
        record: Record,
        ack: AckMode,
    ) -> impl Future<Output = PyResult<Option<u64>>> + Send + 'static {
        let client = self.client.clone();
        let publishers = self.publishers.clone();
        async move {
            let p = publisher(&client, &publishers, &stream, ack).await.map_err(to_py)?;
            offset_of(p.publish(record).await).map_err(to_py)
        }
    }

    fn publish_many_fut(
        &self,
        stream: String,
        records: Vec<Record>,
        ack: AckMode,
    ) -> impl Future<Output = PyResult<Option<Vec<u64>>>> + Send + 'static {
        let client = self.client.clone();
        let publishers = self.publishers.clone();
        async move {
            let p = publisher(&client, &publishers, &stream, ack).await.map_err(to_py)?;
            let mut tickets = Vec::with_capacity(records.len());
            for r in records {
                tickets.push(p.send(r).await.map_err(to_py)?);
            }
            let mut offsets = Vec::with_capacity(tickets.len());
            let mut first_error = None;
            for t in tickets {
                match offset_of(t.await) {
                    Ok(Some(o)) => offsets.push(o),
                    Ok(None) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(to_py(e));
            }
            Ok(if ack == AckMode::None { None } else { Some(offsets) })
        }
    }

    fn subscribe_fut(
        &self,
        options: SubscribeOptions,
    ) -> impl Future<Output = PyResult<NativeSubscription>> + Send + 'static {
        let client = self.client.clone();
        async move {
            let stream: Arc<str> = options.stream.as_str().into();
            let sub = client.subscribe(options).await.map_err(to_py)?;
            Ok(NativeSubscription {
                stream,
                state: Arc::new(tokio::sync::Mutex::new(SubState {
                    sub: Some(sub),
                    pending: None,
                    ended: false,
                })),
            })
        }
    }

    fn close_fut(&self) -> impl Future<Output = PyResult<()>> + Send + 'static {
        let client = self.client.clone();
        let publishers: Vec<Publisher> =
            self.publishers.lock().unwrap().drain().map(|(_, p)| p).collect();
        async move {
            let mut first_error = None;
            for p in publishers {
                if let Err(e) = p.close().await {
                    first_error.get_or_insert(e);
                }
            }
            client.close();
            match first_error {
                Some(e) => Err(to_py(e)),
                None => Ok(()),
            }
        }
    }

    fn flush_fut(&self) -> impl Future<Output = PyResult<()>> + Send + 'static {
        let publishers: Vec<Publisher> =
            self.publishers.lock().unwrap().values().cloned().collect();
        async move {
            for p in publishers {
                p.flush().await.map_err(to_py)?;
            }
            Ok(())
        }
    }
}

fn subscribe_options(
    stream: String,
    start: &Bound<'_, PyAny>,
    group: Option<String>,
    shards: Option<Vec<u32>>,
) -> PyResult<SubscribeOptions> {
    let mut o = SubscribeOptions::new(stream).start(parse_start(start)?);
    if let Some(g) = group {
        o = o.group(g);
    }
    if let Some(s) = shards {
        o = o.shards(s.into_iter().map(ShardId).collect());
    }
    Ok(o)
}

async fn create_fut(
    client: Client,
    name: String,
    shards: u32,
    replicas: Option<u8>,
    retention: Retention,
) -> PyResult<StreamInfo> {
    let d = client.create_stream_with(&name, shards, retention, replicas).await.map_err(to_py)?;
    Ok(d.into())
}

#[pymethods]
impl NativeClient {
    /// Connects (awaitable); see `felix.Client.connect`.
    #[staticmethod]
    #[pyo3(signature = (addrs, ca_file=None, fingerprint=None, insecure=false, token=None, server_name=None, connect_timeout_ms=None, connections=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect<'py>(
        py: Python<'py>,
        addrs: &Bound<'py, PyAny>,
        ca_file: Option<String>,
        fingerprint: Option<String>,
        insecure: bool,
        token: Option<String>,
        server_name: Option<String>,
        connect_timeout_ms: Option<u64>,
        connections: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = config(
            addrs,
            ca_file,
            fingerprint,
            insecure,
            token,
            server_name,
            connect_timeout_ms,
            connections,
        )?;
        spawn(py, connect(c))
    }

    /// Connects, blocking; see `felix.blocking.Client.connect`.
    #[staticmethod]
    #[pyo3(signature = (addrs, ca_file=None, fingerprint=None, insecure=false, token=None, server_name=None, connect_timeout_ms=None, connections=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect_blocking(
        py: Python<'_>,
        addrs: &Bound<'_, PyAny>,
        ca_file: Option<String>,
        fingerprint: Option<String>,
        insecure: bool,
        token: Option<String>,
        server_name: Option<String>,
        connect_timeout_ms: Option<u64>,
        connections: Option<usize>,
    ) -> PyResult<NativeClient> {
        let c = config(
            addrs,
            ca_file,
            fingerprint,
            insecure,
            token,
            server_name,
            connect_timeout_ms,
            connections,
        )?;
        block(py, connect(c))
    }

    /// The brokers the client holds connections to (`host:port`), the first one first.
    fn brokers(&self) -> Vec<String> {
        self.client.brokers()
    }

    /// Whether the broker is part of a cluster.
    fn is_cluster(&self) -> bool {
        self.client.is_cluster()
    }

    #[pyo3(signature = (stream, value, key=None, ack="durable"))]
    fn publish<'py>(
        &self,
        py: Python<'py>,
        stream: String,
        value: &Bound<'py, PyAny>,
        key: Option<&Bound<'py, PyAny>>,
        ack: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let record =
            Record { key: optional_bytes(key, "key")?, value: bytes_of(value, "value")?.into() };
        let fut = self.publish_fut(stream, record, parse_ack(ack)?);
        spawn(py, fut)
    }

    #[pyo3(signature = (stream, value, key=None, ack="durable"))]
    fn publish_blocking(
        &self,
        py: Python<'_>,
        stream: String,
        value: &Bound<'_, PyAny>,
        key: Option<&Bound<'_, PyAny>>,
        ack: &str,
    ) -> PyResult<Option<u64>> {
        let record =
            Record { key: optional_bytes(key, "key")?, value: bytes_of(value, "value")?.into() };
        block(py, self.publish_fut(stream, record, parse_ack(ack)?))
    }

    #[pyo3(signature = (stream, records, key=None, ack="durable"))]
    fn publish_many<'py>(
        &self,
        py: Python<'py>,
        stream: String,
        records: &Bound<'py, PyAny>,
        key: Option<&Bound<'py, PyAny>>,
        ack: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.publish_many_fut(stream, records_of(records, key)?, parse_ack(ack)?);
        spawn(py, fut)
    }

    #[pyo3(signature = (stream, records, key=None, ack="durable"))]
    fn publish_many_blocking(
        &self,
        py: Python<'_>,
        stream: String,
        records: &Bound<'_, PyAny>,
        key: Option<&Bound<'_, PyAny>>,
        ack: &str,
    ) -> PyResult<Option<Vec<u64>>> {
        let records = records_of(records, key)?;
        block(py, self.publish_many_fut(stream, records, parse_ack(ack)?))
    }

    /// Waits until every record published so far is acked (or written, with ack="none").
    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.flush_fut())
    }

    fn flush_blocking(&self, py: Python<'_>) -> PyResult<()> {
        block(py, self.flush_fut())
    }

    #[pyo3(signature = (stream, start, group=None, shards=None))]
    fn subscribe<'py>(
        &self,
        py: Python<'py>,
        stream: String,
        start: &Bound<'py, PyAny>,
        group: Option<String>,
        shards: Option<Vec<u32>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.subscribe_fut(subscribe_options(stream, start, group, shards)?);
        spawn(py, fut)
    }

    #[pyo3(signature = (stream, start, group=None, shards=None))]
    fn subscribe_blocking(
        &self,
        py: Python<'_>,
        stream: String,
        start: &Bound<'_, PyAny>,
        group: Option<String>,
        shards: Option<Vec<u32>>,
    ) -> PyResult<NativeSubscription> {
        let options = subscribe_options(stream, start, group, shards)?;
        block(py, self.subscribe_fut(options))
    }

    #[pyo3(signature = (name, shards=1, replicas=None, retention_bytes=None, retention_ms=None))]
    fn create_stream<'py>(
        &self,
        py: Python<'py>,
        name: String,
        shards: u32,
        replicas: Option<u8>,
        retention_bytes: Option<u64>,
        retention_ms: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let retention = Retention { bytes_max: retention_bytes, age_max_ms: retention_ms };
        let fut = create_fut(self.client.clone(), name, shards, replicas, retention);
        spawn(py, fut)
    }

    #[pyo3(signature = (name, shards=1, replicas=None, retention_bytes=None, retention_ms=None))]
    fn create_stream_blocking(
        &self,
        py: Python<'_>,
        name: String,
        shards: u32,
        replicas: Option<u8>,
        retention_bytes: Option<u64>,
        retention_ms: Option<u64>,
    ) -> PyResult<StreamInfo> {
        let retention = Retention { bytes_max: retention_bytes, age_max_ms: retention_ms };
        block(py, create_fut(self.client.clone(), name, shards, replicas, retention))
    }

    fn describe_stream<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        spawn(py, async move {
            Ok(StreamInfo::from(client.describe_stream(&name).await.map_err(to_py)?))
        })
    }

    fn describe_stream_blocking(&self, py: Python<'_>, name: String) -> PyResult<StreamInfo> {
        let client = self.client.clone();
        block(py, async move {
            Ok(StreamInfo::from(client.describe_stream(&name).await.map_err(to_py)?))
        })
    }

    #[pyo3(signature = (prefix=String::new()))]
    fn list_streams<'py>(&self, py: Python<'py>, prefix: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        spawn(py, async move { client.list_streams(&prefix).await.map_err(to_py) })
    }

    #[pyo3(signature = (prefix=String::new()))]
    fn list_streams_blocking(&self, py: Python<'_>, prefix: String) -> PyResult<Vec<String>> {
        let client = self.client.clone();
        block(py, async move { client.list_streams(&prefix).await.map_err(to_py) })
    }

    /// Flushes every publisher, then closes the connections.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.close_fut())
    }

    fn close_blocking(&self, py: Python<'_>) -> PyResult<()> {
        block(py, self.close_fut())
    }
}

struct SubState {
    /// None once closed.
    sub: Option<Subscriber>,
    /// An error met after some records of a batch: returned by the next call.
    pending: Option<ClientError>,
    /// The broker finished every part's stream.
    ended: bool,
}

/// A running subscription (see `felix.Subscription`).
#[pyclass(module = "felix._felix", frozen)]
struct NativeSubscription {
    stream: Arc<str>,
    state: Arc<tokio::sync::Mutex<SubState>>,
}

/// Up to `max` records: waits for the first, then takes those already received. Empty once
/// the subscription has ended.
async fn next_batch(
    state: &tokio::sync::Mutex<SubState>,
    max: usize,
) -> Result<Vec<ReceivedRecord>, ClientError> {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    if let Some(e) = st.pending.take() {
        return Err(e);
    }
    if st.ended {
        return Ok(Vec::new());
    }
    let sub = st.sub.as_mut().ok_or(ClientError::Closed)?;
    let mut out = Vec::new();
    match sub.next().await? {
        Some(r) => out.push(r),
        None => {
            st.ended = true;
            return Ok(out);
        }
    }
    while out.len() < max {
        // `Subscriber::next` is cancel-safe: a poll that is not ready loses nothing.
        match poll_once(sub.next()) {
            Some(Ok(Some(r))) => out.push(r),
            Some(Ok(None)) => {
                st.ended = true;
                break;
            }
            Some(Err(e)) => {
                st.pending = Some(e);
                break;
            }
            None => break,
        }
    }
    Ok(out)
}

/// How long a blocking wait for records runs before it checks for signals (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

#[pymethods]
impl NativeSubscription {
    /// Awaitable: a list of up to `max` records, the first waited for; empty at the end.
    #[pyo3(signature = (max=1024))]
    fn next_batch<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyAny>> {
        let state = self.state.clone();
        let stream = self.stream.clone();
        spawn(py, async move {
            let records = next_batch(&state, max.max(1)).await.map_err(to_py)?;
            Ok(Batch { stream, records })
        })
    }

    /// Blocking: a list of up to `max` records, the first waited for (at most `timeout` seconds
    /// when given: then possibly empty); empty at the end. Ctrl-C interrupts the wait.
    #[pyo3(signature = (max=1024, timeout=None))]
    fn next_batch_blocking<'py>(
        &self,
        py: Python<'py>,
        max: usize,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let deadline =
            timeout.map(|t| std::time::Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        loop {
            let step = match deadline {
                Some(d) => d.saturating_duration_since(std::time::Instant::now()).min(SIGNAL_CHECK),
                None => SIGNAL_CHECK,
            };
            let state = self.state.clone();
            let got = py.allow_threads(|| {
                runtime().block_on(async move {
                    tokio::time::timeout(step, next_batch(&state, max.max(1))).await.ok()
                })
            });
            match got {
                Some(result) => {
                    let records = result.map_err(to_py)?;
                    return Batch { stream: self.stream.clone(), records }.into_pyobject(py);
                }
                None => {
                    py.check_signals()?;
                    if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                        return PyList::new(py, Vec::<PyObject>::new());
                    }
                }
            }
        }
    }

    /// Awaitable commit: of `offset` (the next offset to read) for `shard`, or with neither,
    /// of every shard's position after the last record returned.
    #[pyo3(signature = (shard=None, offset=None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        shard: Option<u32>,
        offset: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = commit_fut(self.state.clone(), shard, offset)?;
        spawn(py, fut)
    }

    #[pyo3(signature = (shard=None, offset=None))]
    fn commit_blocking(
        &self,
        py: Python<'_>,
        shard: Option<u32>,
        offset: Option<u64>,
    ) -> PyResult<()> {
        let fut = commit_fut(self.state.clone(), shard, offset)?;
        block(py, fut)
    }

    /// Per shard, the offset of the next record to be returned.
    fn positions_blocking(&self, py: Python<'_>) -> PyResult<HashMap<u32, u64>> {
        let state = self.state.clone();
        block(py, async move {
            let st = state.lock().await;
            let sub = st.sub.as_ref().ok_or_else(|| to_py(ClientError::Closed))?;
            Ok(sub.positions().iter().map(|(s, o)| (s.0, o.0)).collect())
        })
    }

    /// Ends the subscription (its streams are reset).
    fn close_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let state = self.state.clone();
        block(py, async move {
            state.lock().await.sub = None;
            Ok(())
        })
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.state.clone();
        spawn(py, async move {
            state.lock().await.sub = None;
            Ok(())
        })
    }
}

fn commit_fut(
    state: Arc<tokio::sync::Mutex<SubState>>,
    shard: Option<u32>,
    offset: Option<u64>,
) -> PyResult<impl Future<Output = PyResult<()>> + Send + 'static> {
    if shard.is_some() != offset.is_some() {
        return Err(PyValueError::new_err("commit: give both shard and offset, or neither"));
    }
    Ok(async move {
        let mut st = state.lock().await;
        let sub = st.sub.as_mut().ok_or_else(|| to_py(ClientError::Closed))?;
        match (shard, offset) {
            (Some(s), Some(o)) => sub.commit(ShardId(s), Offset(o)).await,
            _ => sub.commit_consumed().await,
        }
        .map_err(to_py)
    })
}

/// The native module.
#[pymodule]
fn _felix(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_at_exit, m)?)?;
    m.add_class::<NativeClient>()?;
    m.add_class::<NativeSubscription>()?;
    m.add_class::<PyRecord>()?;
    m.add_class::<StreamInfo>()?;
    Ok(())
}
