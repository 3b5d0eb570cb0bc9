//! The socket side of live ingest: a connection to one Jetstream instance at a time, resumed
//! from a cursor, with backoff, instance switching and compression dictionaries.
//!
//! Invariants:
//! - The follower never gives up: every failure reconnects after a capped, jittered exponential
//!   backoff (randomness from an injected seed); repeated failures move to the next instance.
//! - It only waits on the engine's bounded queue: nothing is dropped between socket and index.
//! - Seq cursors (exact, instance-local) resume only on the same instance within this process;
//!   otherwise a connection resumes from a `time_us`, rewound (see the module above).
//! - A refused dictionary is refetched once, after which that instance is followed uncompressed.

use super::{IngestStatus, LiveError, LiveOptions};
use crate::base::redact::redact_url;
use crate::base::rng::splitmix64;
use crate::ingest::frames::{
    Frame, FrameDecoder, LEGACY_DICTIONARY, Protocol, StreamEvent, V2_DICTIONARY, XrpcError, dictionary_id,
    parse_xrpc_error,
};
use crate::net::guard::AddressPolicy;
use crate::net::http::{HttpClient, Limits};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The v2 stream's path.
pub const V2_PATH: &str = "/xrpc/network.bsky.jetstream.subscribeEvents";
/// The v1 stream's path.
pub const V1_PATH: &str = "/subscribe";
/// Largest websocket message accepted (compressed bytes; decoded size is capped in `frames`).
const MAX_MESSAGE_BYTES: usize = 32 << 20;
/// Cursors at or above this are timestamps (`time_us`), below it v2 seqs (the server's split).
const TIMESTAMP_CURSOR_FLOOR: i64 = 1_000_000_000_000_000;
/// Decode errors logged per connection before going quiet (they are still counted).
const LOGGED_DECODE_ERRORS: u64 = 10;
/// The v2 dictionary endpoint.
pub const DICTIONARY_PATH: &str = "/xrpc/network.bsky.jetstream.getZstdDictionary";
/// Largest dictionary accepted from `getZstdDictionary` (the current one is 64 KiB).
const MAX_DICTIONARY_BYTES: usize = 1 << 20;
/// How long a dictionary fetch may take before compression falls back.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One Jetstream instance: a websocket URL and the protocol its path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `ws[s]://host[:port]/path`, without a query.
    pub url: String,
    pub protocol: Protocol,
}

impl Instance {
    /// `/subscribe` is v1; the v2 path or no path at all is v2.
    pub fn parse(url: &str) -> Result<Self, LiveError> {
        let bad = |reason| LiveError::Url { url: url.to_string(), reason };
        let rest =
            url.strip_prefix("wss://").or_else(|| url.strip_prefix("ws://")).ok_or(bad("not ws:// or wss://"))?;
        if url.contains(['?', '#']) {
            return Err(bad("has a query or fragment; filters and cursors are chosen here"));
        }
        let (host, path) = rest.split_once('/').map_or((rest, ""), |(host, path)| (host, path));
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let base = &url[..url.len() - path.len()];
        let base = base.trim_end_matches('/');
        let (path, protocol) = match format!("/{}", path.trim_end_matches('/')).as_str() {
            "/" => (V2_PATH, Protocol::V2),
            V2_PATH => (V2_PATH, Protocol::V2),
            V1_PATH => (V1_PATH, Protocol::V1),
            _ => return Err(bad("path is neither /subscribe (v1) nor /xrpc/network.bsky.jetstream.subscribeEvents")),
        };
        Ok(Instance { url: format!("{base}{path}"), protocol })
    }
}

/// Where a connection starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// The live tip (a fresh index).
    Tip,
    /// The first event witnessed at or after this `time_us` (any instance, either protocol).
    Time(i64),
    /// This seq, inclusive (v2, the same instance only).
    Seq(i64),
}

impl Resume {
    /// Where to start after a restart: the durable cursor, rewound by the margin.
    pub fn from_durable(cursor: Option<i64>, rewind_us: i64) -> Self {
        match cursor {
            Some(time_us) if time_us >= TIMESTAMP_CURSOR_FLOOR => {
                Resume::Time((time_us - rewind_us).max(TIMESTAMP_CURSOR_FLOOR))
            }
            // A seq cursor (not written by this module) names no instance: rather than guess,
            // replay all the instance has (on v1, cursor 1 is a time that clamps to the oldest).
            Some(_) => Resume::Seq(1),
            None => Resume::Tip,
        }
    }

    fn query_value(self) -> Option<i64> {
        match self {
            Resume::Tip => None,
            Resume::Time(time_us) => Some(time_us),
            Resume::Seq(seq) => Some(seq),
        }
    }
}

/// Why a connection ended.
#[derive(Debug)]
enum Ended {
    /// The engine is gone; stop.
    QueueClosed,
    /// Refused before the upgrade, with an XRPC error when the body was one.
    Rejected(Option<XrpcError>, String),
    /// A terminal error frame (`ConsumerTooSlow`).
    ServerError(XrpcError),
    /// Network error, close, idle timeout.
    Dropped(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::QueueClosed => write!(f, "the engine stopped"),
            Ended::Rejected(_, detail) => write!(f, "refused: {detail}"),
            Ended::ServerError(error) => write!(f, "server error {}: {}", error.error, error.message),
            Ended::Dropped(reason) => write!(f, "dropped: {reason}"),
        }
    }
}

/// A v2 instance's compression dictionary.
#[derive(Debug, Clone, PartialEq)]
enum Dictionary {
    /// To fetch before the next connection; `refused` is the id the instance just refused.
    Fetch { refused: Option<u32> },
    /// In use: the dictionary and its id.
    Ready(Arc<[u8]>, u32),
    /// Uncompressed from now on (a refusal that a refetch could not cure).
    Off,
}

/// Where the socket side stands: what it delivered last, on which instance.
struct Follower {
    options: Arc<LiveOptions>,
    status: Arc<IngestStatus>,
    instance: usize,
    resume: Resume,
    /// Seq of the last event delivered from `instance` (v2), for exact same-instance resumes.
    last_seq: Option<i64>,
    last_time_us: Option<i64>,
    dictionaries: Vec<Dictionary>,
    /// Failed connections in a row to the current instance (decides switching).
    failures: u32,
    /// Failed connections in a row across instances (decides the backoff, so a total outage
    /// backs off to the cap instead of restarting at the minimum with each switch).
    outage: u32,
    entropy: u64,
}

/// The socket task: connect, read, queue; reconnect forever.
pub(super) async fn follow(
    options: Arc<LiveOptions>,
    resume: Resume,
    queue: mpsc::Sender<StreamEvent>,
    status: Arc<IngestStatus>,
) {
    let count = options.instances.len();
    let mut follower = Follower {
        entropy: options.seed,
        options,
        status,
        instance: 0,
        resume,
        last_seq: None,
        last_time_us: None,
        dictionaries: vec![Dictionary::Fetch { refused: None }; count],
        failures: 0,
        outage: 0,
    };
    loop {
        let (delivered, ended) = follower.connection(&queue).await;
        follower.status.connected.store(false, Ordering::Relaxed);
        if matches!(ended, Ended::QueueClosed) {
            return;
        }
        let delay = follower.after_connection(delivered, ended);
        tokio::time::sleep(delay).await;
    }
}

impl Follower {
    fn current(&self) -> &Instance {
        &self.options.instances[self.instance]
    }

    /// The subscription URL; `dictionary` is the id to ask for (v2) or any id for v1's `compress`.
    fn url(&self, dictionary: Option<u32>) -> String {
        let instance = self.current();
        let mut params = Vec::new();
        if let Some(cursor) = self.resume.query_value() {
            params.push(format!("cursor={cursor}"));
        }
        if let Some(id) = dictionary {
            params.push(match instance.protocol {
                Protocol::V1 => "compress=true".to_string(),
                Protocol::V2 => format!("zstdDictionary={id}"),
            });
        }
        if params.is_empty() { instance.url.clone() } else { format!("{}?{}", instance.url, params.join("&")) }
    }

    /// One connection, read until it ends; returns how many events it delivered and why it ended.
    async fn connection(&mut self, queue: &mpsc::Sender<StreamEvent>) -> (u64, Ended) {
        let protocol = self.current().protocol;
        let dictionary = self.dictionary().await;
        let url = self.url(dictionary.as_ref().map(|(_, id)| *id));
        tracing::debug!(url = %redact_url(&url), "connecting");
        let mut socket = match connect(&url).await {
            Ok(socket) => socket,
            Err(ended) => return (0, ended),
        };
        self.status.connected.store(true, Ordering::Relaxed);
        self.status.instance.store(self.instance, Ordering::Relaxed);
        let mut decoder = match FrameDecoder::new(protocol, dictionary.as_ref().map(|(bytes, _)| &bytes[..])) {
            Ok(decoder) => decoder,
            Err(e) => return (0, Ended::Dropped(format!("zstd decoder: {e}"))),
        };
        let dedup_through = match self.resume {
            Resume::Seq(_) => self.last_seq,
            _ => None,
        };
        let mut delivered = 0;
        let mut decode_errors = 0;
        loop {
            let message = match tokio::time::timeout(self.options.idle_timeout, socket.next()).await {
                Err(_) => return (delivered, Ended::Dropped("idle timeout".into())),
                Ok(None) => return (delivered, Ended::Dropped("stream ended".into())),
                Ok(Some(Err(e))) => return (delivered, Ended::Dropped(e.to_string())),
                Ok(Some(Ok(message))) => message,
            };
            let frame = match message {
                tungstenite::Message::Text(text) => decoder.decode_text(text.as_bytes()),
                tungstenite::Message::Binary(bytes) => decoder.decode_binary(&bytes),
                tungstenite::Message::Close(close) => {
                    return (delivered, Ended::Dropped(format!("closed by the server: {close:?}")));
                }
                _ => continue,
            };
            match frame {
                Ok(Frame::Event(event)) => {
                    if protocol == Protocol::V2 && dedup_through.is_some_and(|seq| event.cursor <= seq) {
                        continue;
                    }
                    let (seq, time_us) = (event.cursor, event.time_us);
                    if queue.send(event).await.is_err() {
                        return (delivered, Ended::QueueClosed);
                    }
                    delivered += 1;
                    self.last_seq = (protocol == Protocol::V2).then_some(seq);
                    self.last_time_us = Some(time_us);
                }
                Ok(Frame::Info { name, message }) => tracing::info!(%name, %message, "jetstream advisory"),
                Ok(Frame::Unknown(kind)) => tracing::debug!(%kind, "skipped a message of an unknown type"),
                Ok(Frame::Error(error)) => return (delivered, Ended::ServerError(error)),
                Err(e) => {
                    self.status.decode_errors.fetch_add(1, Ordering::Relaxed);
                    decode_errors += 1;
                    if decode_errors <= LOGGED_DECODE_ERRORS {
                        tracing::warn!(error = %e, "skipped an undecodable frame");
                    }
                }
            }
        }
    }

    /// The dictionary for the next connection, if compressed: v1 the legacy one; v2 the
    /// instance's current one (fetched; the embedded one when the fetch fails).
    async fn dictionary(&mut self) -> Option<(Arc<[u8]>, u32)> {
        let embedded = |bytes: &'static [u8]| Some((Arc::from(bytes), dictionary_id(bytes).ok()?));
        let slot = self.instance;
        match (self.options.compress, self.current().protocol, &self.dictionaries[slot]) {
            (false, _, _) | (_, _, Dictionary::Off) => None,
            (true, Protocol::V1, _) => embedded(LEGACY_DICTIONARY),
            (true, Protocol::V2, Dictionary::Ready(bytes, id)) => Some((bytes.clone(), *id)),
            (true, Protocol::V2, Dictionary::Fetch { refused }) => {
                let refused = *refused;
                let url = self.current().url.clone();
                self.dictionaries[slot] = match fetch_dictionary(&url).await {
                    Ok((bytes, id)) if Some(id) != refused => Dictionary::Ready(bytes, id),
                    Ok((_, id)) => {
                        tracing::warn!(url = %redact_url(&url), id, "the instance serves the dictionary it refuses; going uncompressed");
                        Dictionary::Off
                    }
                    Err(e) if refused.is_none() => {
                        tracing::warn!(url = %redact_url(&url), error = %e, "no dictionary fetched; using the embedded one");
                        embedded(V2_DICTIONARY).map_or(Dictionary::Off, |(bytes, id)| Dictionary::Ready(bytes, id))
                    }
                    Err(e) => {
                        tracing::warn!(url = %redact_url(&url), error = %e, "no new dictionary after a refusal; going uncompressed");
                        Dictionary::Off
                    }
                };
                Box::pin(self.dictionary()).await
            }
        }
    }

    /// Decides where and when to connect next; returns the delay.
    fn after_connection(&mut self, delivered: u64, ended: Ended) -> Duration {
        self.status.reconnects.fetch_add(1, Ordering::Relaxed);
        let url = self.current().url.clone();
        tracing::warn!(url = %redact_url(&url), delivered, reason = %ended, "jetstream connection ended; reconnecting");
        if delivered > 0 {
            self.failures = 0;
            self.outage = 0;
        } else {
            self.failures += 1;
            self.outage += 1;
        }
        if matches!(ended, Ended::ServerError(_) | Ended::Rejected(Some(_), _)) {
            self.status.server_errors.fetch_add(1, Ordering::Relaxed);
        }
        match &ended {
            Ended::Rejected(Some(error), _) if error.error == "UnknownZstdDictionary" => {
                // A rotation: refetch once; compression is an optimization, never a reason to stop.
                tracing::warn!(url = %redact_url(&url), message = %error.message, "dictionary refused; refetching");
                let slot = &mut self.dictionaries[self.instance];
                *slot = match slot {
                    Dictionary::Ready(_, id) => Dictionary::Fetch { refused: Some(*id) },
                    _ => Dictionary::Off,
                };
                self.failures = self.failures.saturating_sub(1);
                self.outage = self.outage.saturating_sub(1);
            }
            Ended::Rejected(Some(error), _) if error.error == "CursorTooOld" => {
                // A timestamp cursor is clamped to the floor instead of refused: resume by time and
                // lose only what the instance no longer has.
                tracing::error!(url = %redact_url(&url), message = %error.message, "seq cursor below the retention floor; resuming by time");
                self.last_seq = None;
            }
            _ => {}
        }
        let switch = self.failures >= self.options.failures_before_switch && self.options.instances.len() > 1;
        if switch {
            self.instance = (self.instance + 1) % self.options.instances.len();
            self.failures = 0;
            self.last_seq = None;
            self.status.instance_switches.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(to = %redact_url(&self.current().url), "switching jetstream instance");
        }
        self.resume = self.next_resume();
        self.backoff()
    }

    /// Same instance, v2, something delivered: the exact seq. Otherwise the last event's time,
    /// rewound (time_us is not unique, and another instance witnessed it at another instant).
    fn next_resume(&self) -> Resume {
        match (self.last_seq, self.last_time_us) {
            (Some(seq), _) => Resume::Seq(seq),
            (None, Some(time_us)) => Resume::Time((time_us - self.options.rewind_us).max(TIMESTAMP_CURSOR_FLOOR)),
            // Nothing delivered yet: start where we meant to (a `Seq(1)` means "all you have" anywhere).
            (None, None) => self.resume,
        }
    }

    /// Capped exponential backoff with jitter in [half, full]; quick after a productive connection.
    fn backoff(&mut self) -> Duration {
        let (min, max) = (self.options.backoff_min, self.options.backoff_max);
        let full = min.saturating_mul(1u32 << self.outage.min(16)).min(max);
        let half = full / 2;
        let jitter = splitmix64(&mut self.entropy) % (half.as_micros() as u64 + 1);
        half + Duration::from_micros(jitter)
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the websocket. The v2 `xrpc.v1.json` subprotocol is not offered: it is the lexicon's
/// default (identical framing without it), and tungstenite fails a handshake whose answer does not
/// echo an offered subprotocol, which the reference allows servers to do.
async fn connect(url: &str) -> Result<Socket, Ended> {
    let request = url.into_client_request().map_err(|e| Ended::Dropped(format!("bad request: {e}")))?;
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    match tokio_tungstenite::connect_async_with_config(request, Some(config), true).await {
        Ok((socket, _response)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            Err(Ended::Rejected(parse_xrpc_error(body), format!("HTTP {}: {text}", response.status())))
        }
        Err(e) => Err(Ended::Dropped(e.to_string())),
    }
}

/// GETs an instance's current v2 dictionary (`getZstdDictionary` on the websocket's host) and
/// checks it: bounded size, a zstd dictionary header, loadable by a decoder.
async fn fetch_dictionary(socket_url: &str) -> Result<(Arc<[u8]>, u32), String> {
    let (scheme, rest) = match socket_url.strip_prefix("wss://") {
        Some(rest) => ("https", rest),
        None => ("http", socket_url.strip_prefix("ws://").ok_or("not a websocket URL")?),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let url = format!("{scheme}://{authority}{DICTIONARY_PATH}");
    // The operator named this instance: it is trusted, wherever it is.
    let response = HttpClient::new(AddressPolicy::any())
        .get(&url, Limits::new(MAX_DICTIONARY_BYTES, FETCH_TIMEOUT))
        .await
        .map_err(|e| format!("dictionary: {e}"))?;
    if !response.is_success() {
        return Err(format!("dictionary: answered HTTP {}", response.status));
    }
    let body = response.body.to_vec();
    let id = dictionary_id(&body).map_err(|e| e.to_string())?;
    FrameDecoder::new(Protocol::V2, Some(&body)).map_err(|e| e.to_string())?;
    Ok((Arc::from(body), id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_urls_name_their_protocol() {
        let v2 = Instance::parse("wss://jetstream1.us-east.bsky.network").unwrap();
        assert_eq!(
            v2,
            Instance { url: format!("wss://jetstream1.us-east.bsky.network{V2_PATH}"), protocol: Protocol::V2 }
        );
        assert_eq!(Instance::parse(&format!("ws://h:1{V2_PATH}")).unwrap().protocol, Protocol::V2);
        let v1 = Instance::parse("ws://127.0.0.1:9/subscribe").unwrap();
        assert_eq!(v1, Instance { url: "ws://127.0.0.1:9/subscribe".into(), protocol: Protocol::V1 });
        for bad in ["http://h/subscribe", "ws:///subscribe", "ws://h/other", "ws://h/subscribe?cursor=1"] {
            assert!(Instance::parse(bad).is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn durable_cursors_resume_rewound() {
        let t = 1_725_911_162_329_308;
        assert_eq!(Resume::from_durable(Some(t), 10_000_000), Resume::Time(t - 10_000_000));
        assert_eq!(Resume::from_durable(None, 10_000_000), Resume::Tip);
        assert_eq!(Resume::from_durable(Some(TIMESTAMP_CURSOR_FLOOR + 5), 10), Resume::Time(TIMESTAMP_CURSOR_FLOOR));
        assert_eq!(Resume::from_durable(Some(42), 10), Resume::Seq(1));
    }

    fn follower(instances: usize) -> Follower {
        let list = (0..instances).map(|i| Instance::parse(&format!("ws://h{i}")).unwrap()).collect();
        let mut options = LiveOptions::new(list, 7);
        options.backoff_max = Duration::from_secs(8);
        Follower {
            options: Arc::new(options),
            status: Arc::default(),
            instance: 0,
            resume: Resume::Tip,
            last_seq: None,
            last_time_us: None,
            dictionaries: vec![Dictionary::Fetch { refused: None }; instances],
            failures: 0,
            outage: 0,
            entropy: 7,
        }
    }

    #[test]
    fn backoff_grows_capped_with_jitter_and_switches_instances() {
        let mut f = follower(2);
        f.last_seq = Some(50);
        f.last_time_us = Some(TIMESTAMP_CURSOR_FLOOR + 20_000_000);
        let mut delays = Vec::new();
        for _ in 0..2 {
            delays.push(f.after_connection(0, Ended::Dropped("refused".into())));
            assert_eq!((f.instance, f.resume), (0, Resume::Seq(50)), "same instance resumes by seq");
        }
        delays.push(f.after_connection(0, Ended::Dropped("refused".into())));
        assert_eq!(f.instance, 1, "three failures move to the next instance");
        assert_eq!(f.resume, Resume::Time(TIMESTAMP_CURSOR_FLOOR + 10_000_000), "a switch rewinds by time");
        assert_eq!(f.status.instance_switches.load(Ordering::Relaxed), 1);
        for (failures, delay) in [(1u32, delays[0]), (2, delays[1])] {
            let full = Duration::from_millis(250) * (1 << failures);
            assert!(delay >= full / 2 && delay <= full, "{delay:?} outside [{:?}, {full:?}]", full / 2);
        }
        let mut delays = Vec::new();
        for _ in 0..30 {
            delays.push(f.after_connection(0, Ended::Dropped("refused".into())));
        }
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(8)), "uncapped {delays:?}");
        assert!(delays[6..].iter().all(|d| *d >= Duration::from_secs(4)), "switching reset the backoff: {delays:?}");
        assert_eq!(f.status.instance_switches.load(Ordering::Relaxed), 11, "still switching every three failures");
        // A productive connection resets the failures: the next delay is short.
        assert!(f.after_connection(5, Ended::Dropped("reset".into())) <= Duration::from_millis(250));
    }

    #[test]
    fn a_refused_dictionary_is_refetched_once_then_dropped() {
        let mut f = follower(1);
        assert!(f.url(Some(20_260_811)).ends_with("?zstdDictionary=20260811"), "{}", f.url(Some(20_260_811)));
        let refusal = || XrpcError { error: "UnknownZstdDictionary".into(), message: "current is 9".into() };
        f.dictionaries[0] = Dictionary::Ready(Arc::from(V2_DICTIONARY), 20_260_811);
        f.after_connection(0, Ended::Rejected(Some(refusal()), "HTTP 400".into()));
        assert_eq!(f.dictionaries[0], Dictionary::Fetch { refused: Some(20_260_811) });
        f.dictionaries[0] = Dictionary::Ready(Arc::from(V2_DICTIONARY), 9);
        f.after_connection(0, Ended::Rejected(Some(refusal()), "HTTP 400".into()));
        f.after_connection(0, Ended::Rejected(Some(refusal()), "HTTP 400".into()));
        assert_eq!(f.dictionaries[0], Dictionary::Off, "a second refusal in a row goes uncompressed");
        f.resume = Resume::Time(TIMESTAMP_CURSOR_FLOOR + 1);
        assert_eq!(f.url(None), format!("ws://h0{V2_PATH}?cursor={}", TIMESTAMP_CURSOR_FLOOR + 1));
    }

    #[tokio::test]
    async fn dictionaries_are_fetched_over_http_and_checked() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies: [&[u8]; 3] = [V2_DICTIONARY, b"not a dictionary", V2_DICTIONARY];
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            for (i, body) in bodies.into_iter().enumerate() {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 512];
                let n = stream.read(&mut request).await.unwrap();
                assert!(request[..n].starts_with(format!("GET {DICTIONARY_PATH} HTTP/1.1").as_bytes()));
                let status = if i == 2 { "404 Not Found" } else { "200 OK" };
                stream.write_all(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes()).await.unwrap();
                stream.write_all(body).await.unwrap();
            }
        });
        let url = format!("ws://{addr}{V2_PATH}");
        let (bytes, id) = fetch_dictionary(&url).await.unwrap();
        assert_eq!((&bytes[..], id), (V2_DICTIONARY, 20_260_811));
        assert!(fetch_dictionary(&url).await.unwrap_err().contains("dictionary"));
        assert!(fetch_dictionary(&url).await.unwrap_err().contains("404"));
        server.await.unwrap();
    }
}
