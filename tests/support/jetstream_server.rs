//! A test-only Jetstream server on tokio-tungstenite: replays Jetstream v1 JSON lines on the v1
//! (`/subscribe`) and v2 (`/xrpc/network.bsky.jetstream.subscribeEvents`) wires, plain or
//! dict-zstd compressed, from a cursor, with injected faults.
//!
//! Invariants:
//! - Event i (0-based) has seq i + 1 on this server, and the line's `time_us` as its time.
//! - The stream is a replay whose events are witnessed as they are sent: a connection without a
//!   cursor starts at the first event (the "tip" when the client arrived), and stays open and
//!   idle after the last one, as a quiet live stream would.
//! - Every fault fires once: each `disconnect_after` threshold and the slow-consumer error fire at
//!   the first moment the total of events sent reaches them.
//! - Cursors follow the reference: v1 cursors are timestamps (clamped); v2 cursors below 1e15 are
//!   seqs (inclusive; below `floor_seq` a pre-upgrade 400 `CursorTooOld`), at or above it timestamps.
//! - It stands for a server on another machine, so it costs the shared cores little: each frame is
//!   rendered once for every connection, and without faults to time, frames go out in batches
//!   (a write per `BATCH_FRAMES`); with faults, each frame is written before the next is looked at.
// tungstenite's handshake callback returns its `ErrorResponse` (an http::Response) by value.
#![allow(clippy::result_large_err)]

use backlinks::base::dates::format_rfc3339_us;
use backlinks::ingest::frames::{LEGACY_DICTIONARY, V2_DICTIONARY, dictionary_id};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

const V2_PATH: &str = "/xrpc/network.bsky.jetstream.subscribeEvents";
const TIMESTAMP_CURSOR_FLOOR: i64 = 1_000_000_000_000_000;
/// Frames handed to the socket between writes when no fault needs each one on the wire at once.
const BATCH_FRAMES: usize = 64;

/// Faults to inject; the default injects none.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Drop the TCP connection (no close frame) when the total of events sent reaches each of these.
    pub disconnect_after: Vec<u64>,
    /// Send a `ConsumerTooSlow` error frame (v2; v1 just closes) when the total reaches this.
    pub slow_consumer_after: Option<u64>,
    /// Seq cursors below this are refused with `CursorTooOld`.
    pub floor_seq: i64,
    /// Refuse every connection after this many were accepted (HTTP 503): the instance "dies".
    pub refuse_after_connections: Option<u64>,
    /// The dictionary id this server accepts (default: the embedded v2 dictionary's).
    pub dictionary_id: Option<u32>,
    /// `getZstdDictionary` answers 404 (a fetch failure).
    pub dictionary_unavailable: bool,
    /// Pace the stream: after every `n` events of a connection, pause this long.
    pub pause_every: Option<(u64, std::time::Duration)>,
    /// Hold every stream until this flag is raised (a client connects, then waits).
    pub hold_until: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Stop every stream once it has sent this many events, until the flag is raised.
    pub hold_at: Option<(u64, Arc<std::sync::atomic::AtomicBool>)>,
}

#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub sent: AtomicU64,
    pub dictionary_fetches: AtomicU64,
    /// The query string of every connection attempt, in order.
    pub queries: Mutex<Vec<String>>,
}

struct Shared {
    lines: Vec<Utf8Bytes>,
    /// The v2 frames of `lines`, rendered when a v2 client first asks.
    v2_frames: OnceLock<Vec<Utf8Bytes>>,
    times: Vec<i64>,
    faults: Mutex<Faults>,
    stats: Arc<ServerStats>,
}

pub struct JetstreamServer {
    pub addr: SocketAddr,
    pub stats: Arc<ServerStats>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for JetstreamServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Where a connection asked to start, and how it wants frames.
struct Subscription {
    v2: bool,
    start: usize,
    compressed: bool,
}

impl JetstreamServer {
    /// Serves `lines` (Jetstream v1 JSON events; each must have a `time_us`) on a free port.
    pub async fn start(lines: Vec<String>, faults: Faults) -> Self {
        let times = lines
            .iter()
            .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line")["time_us"].as_i64().expect("time_us"))
            .collect();
        let stats = Arc::new(ServerStats::default());
        let lines = lines.into_iter().map(Utf8Bytes::from).collect();
        let faults = Mutex::new(faults);
        let shared = Arc::new(Shared { lines, v2_frames: OnceLock::new(), times, faults, stats: stats.clone() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the test server");
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_connection(shared.clone(), stream));
            }
        });
        JetstreamServer { addr, stats, accept }
    }

    pub fn v1_url(&self) -> String {
        format!("ws://{}/subscribe", self.addr)
    }

    pub fn v2_url(&self) -> String {
        format!("ws://{}{V2_PATH}", self.addr)
    }

    pub fn sent(&self) -> u64 {
        self.stats.sent.load(Ordering::Relaxed)
    }
}

fn error_response(status: StatusCode, error: &str, message: &str) -> ErrorResponse {
    let body = json!({"error": error, "message": message}).to_string();
    let mut response = ErrorResponse::new(Some(body));
    *response.status_mut() = status;
    response
}

/// Reads the request (path, cursor, compression), or the pre-upgrade refusal.
fn subscribe(shared: &Shared, request: &Request) -> Result<Subscription, ErrorResponse> {
    let query = request.uri().query().unwrap_or("").to_string();
    shared.stats.queries.lock().unwrap().push(query.clone());
    let faults = shared.faults.lock().unwrap().clone();
    let accepted = shared.stats.connections.load(Ordering::Relaxed);
    if faults.refuse_after_connections.is_some_and(|limit| accepted >= limit) {
        shared.stats.refused.fetch_add(1, Ordering::Relaxed);
        return Err(error_response(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", "instance is down"));
    }
    let v2 = match request.uri().path() {
        "/subscribe" => false,
        V2_PATH => true,
        _ => return Err(error_response(StatusCode::NOT_FOUND, "NotFound", "no such endpoint")),
    };
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes()).find(|(key, _)| key == name).map(|(_, value)| value.into_owned())
    };
    let cursor = param("cursor").and_then(|c| c.parse::<i64>().ok());
    let by_time = |time_us: i64| shared.times.partition_point(|t| *t < time_us);
    let start = match cursor {
        None => 0,
        Some(time_us) if !v2 || time_us >= TIMESTAMP_CURSOR_FLOOR => by_time(time_us),
        Some(seq) if seq < faults.floor_seq => {
            let message = format!("cursor {seq} is below the floor {}", faults.floor_seq);
            return Err(error_response(StatusCode::BAD_REQUEST, "CursorTooOld", &message));
        }
        Some(seq) => (seq.max(1) - 1) as usize,
    };
    let compressed = if v2 {
        let accepted_id = faults.dictionary_id.unwrap_or_else(|| dictionary_id(V2_DICTIONARY).unwrap());
        match param("zstdDictionary") {
            None => false,
            Some(id) if id == accepted_id.to_string() => true,
            Some(_) => {
                let message = format!("unknown dictionary; current is {accepted_id}");
                return Err(error_response(StatusCode::BAD_REQUEST, "UnknownZstdDictionary", &message));
            }
        }
    } else {
        param("compress").as_deref() == Some("true")
    };
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    Ok(Subscription { v2, start: start.min(shared.lines.len()), compressed })
}

/// The current dictionary: the embedded v2 one, its id patched when the server "rotated" to
/// another id (frames then name that id; a decoder loaded with it accepts them).
pub fn served_dictionary(id: Option<u32>) -> Vec<u8> {
    let mut dictionary = V2_DICTIONARY.to_vec();
    if let Some(id) = id {
        dictionary[4..8].copy_from_slice(&id.to_le_bytes());
    }
    dictionary
}

/// Answers `getZstdDictionary` (plain HTTP on the websocket port), when that is the request.
async fn answer_dictionary_request(shared: &Shared, stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncWriteExt;
    let mut head = [0u8; 96];
    let n = stream.peek(&mut head).await.unwrap_or(0);
    if !head[..n].starts_with(b"GET /xrpc/network.bsky.jetstream.getZstdDictionary") {
        return false;
    }
    shared.stats.dictionary_fetches.fetch_add(1, Ordering::Relaxed);
    let faults = shared.faults.lock().unwrap().clone();
    let response = if faults.dictionary_unavailable {
        b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n{\"error\":\"DictionaryNotFound\"}".to_vec()
    } else {
        let mut ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n".to_vec();
        ok.extend(served_dictionary(faults.dictionary_id));
        ok
    };
    let _ = stream.write_all(&response).await;
    let _ = stream.shutdown().await;
    true
}

async fn serve_connection(shared: Arc<Shared>, mut stream: tokio::net::TcpStream) {
    if answer_dictionary_request(&shared, &mut stream).await {
        return;
    }
    let mut subscription = None;
    let callback = |request: &Request, mut response: Response| {
        subscription = Some(subscribe(&shared, request)?);
        if request.headers().get("Sec-WebSocket-Protocol").is_some() {
            response.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static("xrpc.v1.json"));
        }
        Ok(response)
    };
    let Ok(mut socket) = tokio_tungstenite::accept_hdr_async(stream, callback).await else { return };
    let Some(subscription) = subscription else { return };
    let mut compressor = subscription.compressed.then(|| {
        let accepted = shared.faults.lock().unwrap().dictionary_id;
        let dictionary = if subscription.v2 { served_dictionary(accepted) } else { LEGACY_DICTIONARY.to_vec() };
        zstd::bulk::Compressor::with_dictionary(3, &dictionary).expect("a zstd compressor")
    });
    let (pause_every, hold, hold_at, timed) = {
        let faults = shared.faults.lock().unwrap();
        let timed = faults.pause_every.is_some()
            || faults.hold_at.is_some()
            || !faults.disconnect_after.is_empty()
            || faults.slow_consumer_after.is_some();
        (faults.pause_every, faults.hold_until.clone(), faults.hold_at.clone(), timed)
    };
    let frames = match subscription.v2 {
        true => shared.v2_frames.get_or_init(|| v2_frames(&shared.lines)),
        false => &shared.lines,
    };
    if let Some(flag) = &hold {
        wait_for_flag(flag).await;
    }
    for (count, index) in (subscription.start..shared.lines.len()).enumerate() {
        if let Some((at, flag)) = &hold_at
            && count as u64 == *at
        {
            wait_for_flag(flag).await;
        }
        if let Some((every, pause)) = pause_every
            && (count as u64).is_multiple_of(every.max(1))
        {
            tokio::time::sleep(pause).await;
        }
        let message = match &mut compressor {
            Some(compressor) => {
                Message::Binary(compressor.compress(frames[index].as_bytes()).expect("compress").into())
            }
            None => Message::Text(frames[index].clone()),
        };
        let write_now = timed || (count + 1).is_multiple_of(BATCH_FRAMES) || index + 1 == shared.lines.len();
        let written = match write_now {
            true => socket.send(message).await,
            false => socket.feed(message).await,
        };
        if written.is_err() {
            return;
        }
        let sent = shared.stats.sent.fetch_add(1, Ordering::Relaxed) + 1;
        if take_fault(&shared, sent, |f| &mut f.disconnect_after) {
            return; // dropping the socket drops the TCP connection without a close frame
        }
        if take_slow_consumer(&shared, sent) {
            if subscription.v2 {
                let error = json!({"$type": "error", "error": "ConsumerTooSlow", "message": "reading too slowly"});
                let _ = socket.send(Message::Text(error.to_string().into())).await;
            }
            let _ = socket.close(None).await;
            return;
        }
    }
    // Idle like a quiet live stream; answer pings until the client leaves.
    while let Some(Ok(_)) = socket.next().await {}
}

async fn wait_for_flag(flag: &std::sync::atomic::AtomicBool) {
    while !flag.load(Ordering::Relaxed) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// True (once) when `sent` reaches one of the listed thresholds.
fn take_fault(shared: &Shared, sent: u64, list: impl Fn(&mut Faults) -> &mut Vec<u64>) -> bool {
    let mut faults = shared.faults.lock().unwrap();
    let thresholds = list(&mut faults);
    match thresholds.iter().position(|t| sent >= *t) {
        Some(i) => {
            thresholds.remove(i);
            true
        }
        None => false,
    }
}

fn take_slow_consumer(shared: &Shared, sent: u64) -> bool {
    let mut faults = shared.faults.lock().unwrap();
    if faults.slow_consumer_after.is_some_and(|t| sent >= t) {
        faults.slow_consumer_after = None;
        return true;
    }
    false
}

/// The v2 frames of v1 event lines: line i with seq i + 1.
fn v2_frames(lines: &[Utf8Bytes]) -> Vec<Utf8Bytes> {
    lines.iter().enumerate().map(|(index, line)| v2_frame(line, index as i64 + 1).into()).collect()
}

/// The v2 message frame of a v1 event line, with `seq`.
pub fn v2_frame(line: &str, seq: i64) -> String {
    let event: Value = serde_json::from_str(line).expect("a JSON line");
    let kind = event["kind"].as_str().unwrap_or("unknown");
    let mut payload = json!({
        "$type": format!("network.bsky.jetstream.subscribeEvents#{kind}"),
        "seq": seq,
        "did": event["did"],
        "time": format_rfc3339_us(event["time_us"].as_i64().unwrap_or(0)),
    });
    match kind {
        "commit" => {
            for (key, value) in event["commit"].as_object().into_iter().flatten() {
                payload[key] = value.clone();
            }
        }
        other => payload[other] = event[other].clone(),
    }
    json!({"$type": "message", "payload": payload}).to_string()
}
