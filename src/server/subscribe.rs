//! Live push over websockets: `subscribeBacklinks` (our events, with a cursor) and spacedust's
//! `/subscribe` (its parameters and event shape).
//!
//! A connection parses its filter (else a 400 before the upgrade), is admitted under
//! `push_max_subscribers` (else a 503 before the upgrade), then: with a `cursor`, an `info` frame and a
//! replay read from the change log in batches, until it has caught up with the hub and joins
//! it; without one, it joins the hub at once. Live, it sends what the hub queues for it, answers
//! filter updates (`{"type": "options_update", "payload": {...}}`), and pings often enough that
//! the connection's idle limit never cuts a quiet subscriber.
//!
//! Invariants:
//! - Events go out in cursor order, each once: the replay sends what it reads up to the cursor it
//!   joins the hub with, and the hub sends only what comes after it.
//! - A subscriber cut off by the hub (its queue full) gets an `error` frame and a close, without
//!   the events still queued; the hub never waits for it.
//! - Memory per subscriber is bounded: its queue (`push_buffer_events` events, or one log entry's
//!   when that is more), the batch it is writing, one replay batch,
//!   and for spacedust's delayed mode at most `MAX_HELD` held links.

use super::{AppState, XrpcError, query_pairs};
use crate::constellation::parse_source;
use crate::constellation::rest::constellation_path;
use crate::model::syntax::{LinkTarget, parse_target};
use crate::push::entry::{LinkOp, PushEvent};
use crate::push::filter::{Filter, update_pairs};
use crate::push::hub::{Admission, Delivery, Hub, Join, Subscription};
use crate::push::log::LogReader;
use crate::push::{PushCounters, PushError};
use axum::extract::Request;
use axum::http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

pub const SUBSCRIBE_BACKLINKS: &str = "/xrpc/blue.cerulea.backlinks.subscribeBacklinks";
pub const SPACEDUST_SUBSCRIBE: &str = "/subscribe";
/// Largest message a client may send (a filter update with every cap filled fits).
const MAX_CLIENT_MESSAGE: usize = 10 << 20;
/// The websocket's read buffer, and how much it gathers before writing (tungstenite's defaults,
/// 128 KiB each, would make them most of a subscriber's memory).
const SOCKET_BUFFER_BYTES: usize = 8 << 10;
/// The most a subscriber's socket may hold unwritten (one replay batch fits).
const MAX_WRITE_BUFFER_BYTES: usize = 4 << 20;
/// Entries a replay reads from the log before it sends what matched and looks at the client
/// again (reads happen on the connection's thread, so a narrow filter must not read on and on).
const REPLAY_BATCH: usize = 512;
/// How long spacedust's default mode holds a link before sending it, to drop it if it is deleted.
pub const SPACEDUST_DELAY: Duration = Duration::from_secs(21);
/// Links spacedust's delayed mode holds for one subscriber; past it, the oldest go out early.
pub const MAX_HELD: usize = 65_536;
/// How long a cut-off subscriber has to read the rest of its socket, the error frame and the
/// close (the connection's idle limit may end it sooner).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Which endpoint's language a subscriber speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Backlinks,
    /// Spacedust's `/subscribe`; `delayed` holds links `SPACEDUST_DELAY` (its default).
    Spacedust {
        delayed: bool,
    },
}

struct Start {
    filter: Filter,
    cursor: Option<i64>,
    flavor: Flavor,
}

pub async fn subscribe_backlinks_handler(state: axum::extract::State<AppState>, request: Request) -> Response {
    subscribe(state.0, request, Flavor::Backlinks).await
}

pub async fn spacedust_subscribe_handler(state: axum::extract::State<AppState>, request: Request) -> Response {
    subscribe(state.0, request, Flavor::Spacedust { delayed: true }).await
}

async fn subscribe(state: AppState, mut request: Request, flavor: Flavor) -> Response {
    let Some(push) = state.options.push.clone() else {
        return XrpcError {
            status: StatusCode::NOT_IMPLEMENTED,
            error: "MethodNotImplemented",
            message: "live push runs where live ingest runs; this server does not ingest (or push is off)".into(),
        }
        .into_response();
    };
    let start = match parse_start(request.uri().query(), flavor) {
        Ok(start) => start,
        Err(message) => return XrpcError::invalid_request(message).into_response(),
    };
    let accept = match websocket_key(&request) {
        Ok(key) => derive_accept_key(key.as_bytes()),
        Err(message) => return XrpcError::invalid_request(message).into_response(),
    };
    let Some(admission) = push.hub.admit() else {
        return XrpcError::service_unavailable("too many subscribers; retry later").into_response();
    };
    let upgrade = hyper::upgrade::on(&mut request);
    let hub = push.hub;
    push.delivery.spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(MAX_CLIENT_MESSAGE))
                    .read_buffer_size(SOCKET_BUFFER_BYTES)
                    .write_buffer_size(SOCKET_BUFFER_BYTES)
                    .max_write_buffer_size(MAX_WRITE_BUFFER_BYTES);
                let socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
                let idle = state.options.idle_timeout();
                Connection::new(socket, hub, admission, start, idle).run().await;
            }
            Err(error) => tracing::debug!(%error, "websocket upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(SEC_WEBSOCKET_ACCEPT, HeaderValue::from_str(&accept).expect("base64 is a header value"));
    response
}

fn websocket_key(request: &Request) -> Result<String, String> {
    let header = |name| request.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok()).unwrap_or("");
    let upgrading = header(UPGRADE).eq_ignore_ascii_case("websocket")
        && header(CONNECTION).split(',').any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    if !upgrading {
        return Err("this endpoint is a websocket: connect with Upgrade: websocket".into());
    }
    if header(SEC_WEBSOCKET_VERSION) != "13" {
        return Err("only websocket version 13 is spoken".into());
    }
    match header(SEC_WEBSOCKET_KEY) {
        "" => Err("missing Sec-WebSocket-Key".into()),
        key => Ok(key.to_string()),
    }
}

fn parse_start(raw: Option<&str>, flavor: Flavor) -> Result<Start, String> {
    let pairs = query_pairs(raw).map_err(|e| e.to_string())?;
    let mut cursor = None;
    let mut flavor = flavor;
    for (name, value) in &pairs {
        match (name.as_str(), flavor) {
            ("cursor", Flavor::Backlinks) => cursor = Some(parse_cursor(value)?),
            ("instant", Flavor::Spacedust { .. }) => flavor = Flavor::Spacedust { delayed: !parse_flag(value)? },
            _ => {}
        }
    }
    let filter = filter_of(&pairs, flavor)?;
    Ok(Start { filter, cursor, flavor })
}

fn parse_cursor(value: &str) -> Result<i64, String> {
    value
        .parse::<i64>()
        .ok()
        .filter(|c| *c >= 0)
        .ok_or_else(|| format!("cursor must be a time in microseconds, got {value:?}"))
}

fn parse_flag(value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err(format!("expected true or false, got {value:?}")),
    }
}

/// The filter of a subscription's parameters (or of an update's), in the endpoint's language.
fn filter_of(pairs: &[(String, String)], flavor: Flavor) -> Result<Filter, String> {
    match flavor {
        Flavor::Backlinks => Filter::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        Flavor::Spacedust { .. } => spacedust_filter(pairs),
    }
}

/// Spacedust's names, repeated or with `[]`/`[N]` suffixes as its query parser takes them.
fn spacedust_filter(pairs: &[(String, String)]) -> Result<Filter, String> {
    let ours = |name: &str| match name.split('[').next().unwrap_or(name) {
        "wantedSubjects" => Some("target"),
        "wantedSubjectPrefixes" => Some("targetPrefix"),
        "wantedSubjectDids" => Some("targetDid"),
        "wantedSources" => Some("source"),
        _ => None,
    };
    let mut translated = vec![];
    let mut sources = vec![];
    for (name, value) in pairs {
        match ours(name) {
            Some("source") => sources.push(value.as_str()),
            Some(ours) => translated.push((ours, value.as_str())),
            None => {}
        }
    }
    let mut filter = Filter::from_pairs(translated)?;
    for text in sources {
        let source = parse_source(text).map_err(|e| e.to_string())?;
        for location in source.locations {
            filter.add_source(&source.collection, location);
        }
    }
    filter.check_caps()?;
    Ok(filter)
}

/// Where a connection is: reading the log toward the hub, or fed by the hub.
enum Phase {
    Replay { reader: LogReader, last: i64 },
    Live(Subscription),
}

/// A link held back by spacedust's delayed mode, and when it may go.
struct Held {
    due: tokio::time::Instant,
    key: (String, String, String),
    frame: String,
}

struct Connection {
    socket: Socket,
    hub: Arc<Hub>,
    _admission: Admission,
    filter: Filter,
    flavor: Flavor,
    phase: Option<Phase>,
    held: VecDeque<Held>,
    ping_every: Duration,
    /// A frame to send before the next event (the replay's `info`, a refused update's `error`).
    pending_info: Option<String>,
}

impl Connection {
    fn new(socket: Socket, hub: Arc<Hub>, admission: Admission, start: Start, idle: Duration) -> Self {
        let ping_every = (idle / 3).clamp(Duration::from_millis(200), Duration::from_secs(30));
        let phase = None;
        let Start { filter, cursor, flavor } = start;
        let mut connection = Connection {
            socket,
            hub,
            _admission: admission,
            filter,
            flavor,
            phase,
            held: VecDeque::new(),
            ping_every,
            pending_info: None,
        };
        connection.phase = Some(match cursor {
            Some(cursor) => connection.replay_from(cursor),
            None => Phase::Live(connection.hub.join_live(connection.filter.clone())),
        });
        connection
    }

    fn counters(&self) -> &PushCounters {
        self.hub.counters()
    }

    fn replay_from(&mut self, cursor: i64) -> Phase {
        // A cursor past the log's end means now.
        let cursor = cursor.min(self.hub.log().end().last_cursor);
        let start = LogReader::start_of(self.hub.log(), cursor);
        let reader = LogReader::after(self.hub.log().clone(), cursor);
        let info = serde_json::json!({
            "op": "info",
            "name": if start.from_log_start { "OutdatedCursor" } else { "Replay" },
            "message": if start.from_log_start {
                "the cursor is older than the change log: replaying from the log's start"
            } else {
                "replaying from the cursor, then live"
            },
            "cursor": cursor,
            "oldest_cursor": start.oldest_cursor,
        });
        self.pending_info = Some(info.to_string());
        Phase::Replay { reader, last: cursor }
    }

    async fn run(mut self) {
        let outcome = self.serve().await;
        if let Err(reason) = outcome {
            tracing::debug!(reason, "subscriber gone");
        }
    }

    async fn serve(&mut self) -> Result<(), &'static str> {
        if let Some(info) = self.pending_info.take() {
            self.send_text(info).await?;
        }
        let mut ping = tokio::time::interval(self.ping_every);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            match self.phase.take().expect("a connection is in a phase") {
                Phase::Replay { reader, last } => {
                    let next = self.replay_step(reader, last).await?;
                    self.phase = Some(next);
                    self.read_client_now()?;
                    tokio::task::yield_now().await;
                }
                Phase::Live(subscription) => {
                    let subscription = self.live_step(subscription, &mut ping).await?;
                    self.phase = Some(Phase::Live(subscription));
                }
            }
        }
    }

    /// Sends one batch of the replay; joins the hub once the log has nothing more.
    async fn replay_step(&mut self, mut reader: LogReader, mut last: i64) -> Result<Phase, &'static str> {
        let mut frames = vec![];
        let mut at_end = false;
        for _ in 0..REPLAY_BATCH {
            let entry = match reader.next_entry() {
                Ok(Some(entry)) => entry,
                Ok(None) => {
                    at_end = true;
                    break;
                }
                Err(error) => {
                    let counter = match error {
                        PushError::Behind => &self.counters().cut_behind,
                        _ => &self.counters().cut_error,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%error, "a replay cannot go on");
                    return Err(self.close_with_error("ReplayFailed", &error.to_string()).await);
                }
            };
            for event in entry.events() {
                if event.cursor() <= last {
                    continue;
                }
                last = event.cursor();
                if self.filter.matches(&event) {
                    frames.extend(self.render(&event));
                }
            }
        }
        for frame in frames {
            self.feed_text(frame).await?;
        }
        self.socket.flush().await.map_err(|_| "send failed")?;
        if !at_end {
            return Ok(Phase::Replay { reader, last });
        }
        Ok(match self.hub.join(self.filter.clone(), last) {
            Join::Joined(subscription) => Phase::Live(subscription),
            Join::Behind => Phase::Replay { reader, last },
        })
    }

    /// Waits for the next thing to do while live: events, a cut, a client message, a ping.
    async fn live_step(
        &mut self,
        mut subscription: Subscription,
        ping: &mut tokio::time::Interval,
    ) -> Result<Subscription, &'static str> {
        let next_due = self.held.front().map(|held| held.due);
        let release = async move {
            match next_due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        let cut = subscription.cut.clone();
        tokio::select! {
            biased;
            _ = cut.wait() => {
                let (error, message) = match cut.reason() {
                    Some("too_slow") => ("ConsumerTooSlow", "this subscriber did not read its events fast enough; reconnect with the last cursor"),
                    _ => ("ReplayFailed", "the server could not follow its change log; reconnect with the last cursor"),
                };
                return Err(self.close_with_error(error, message).await);
            }
            deliveries = subscription.next_batch() => {
                let Some(deliveries) = deliveries else { return Err("hub gone") };
                for delivery in &deliveries {
                    self.deliver_live(delivery).await?;
                }
                self.socket.flush().await.map_err(|_| "send failed")?;
            }
            message = self.socket.next() => self.on_client_message(message, Some(&subscription))?,
            _ = release => self.release_due().await?,
            _ = ping.tick() => self.send(Message::Ping(Vec::new().into())).await?,
        }
        Ok(subscription)
    }

    /// Handles client messages already received, without waiting (during a replay).
    fn read_client_now(&mut self) -> Result<(), &'static str> {
        while let Some(message) = self.socket.next().now_or_never() {
            self.on_client_message(message, None)?;
        }
        Ok(())
    }

    fn on_client_message(
        &mut self,
        message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
        subscription: Option<&Subscription>,
    ) -> Result<(), &'static str> {
        match message {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => Err("client closed"),
            Some(Ok(Message::Text(text))) => {
                match update_pairs(&text).and_then(|pairs| filter_of(&pairs, self.flavor)) {
                    Ok(filter) => {
                        self.counters().filter_updates.fetch_add(1, Ordering::Relaxed);
                        if let Some(subscription) = subscription {
                            subscription.update(filter.clone());
                        }
                        self.filter = filter;
                    }
                    Err(message) => {
                        let frame = serde_json::json!({ "op": "error", "error": "InvalidRequest", "message": message });
                        // Told on the next send; the old filter stays.
                        self.pending_info = Some(frame.to_string());
                    }
                }
                Ok(())
            }
            Some(Ok(_)) => Ok(()),
        }
    }

    async fn deliver_live(&mut self, delivery: &Delivery) -> Result<(), &'static str> {
        if let Some(info) = self.pending_info.take() {
            self.feed_text(info).await?;
        }
        match self.flavor {
            // Rendered once by the hub for every subscriber it goes to.
            Flavor::Backlinks => self.feed_frame(delivery.frame.clone()).await,
            Flavor::Spacedust { delayed: true } => {
                self.hold_or_unhold(&delivery.event());
                if self.held.len() > MAX_HELD {
                    // Too many held: the oldest go out early rather than grow the queue.
                    self.release_due().await?;
                }
                Ok(())
            }
            Flavor::Spacedust { delayed: false } => match self.render(&delivery.event()) {
                Some(frame) => self.feed_text(frame).await,
                None => Ok(()),
            },
        }
    }

    /// Spacedust's delayed mode: a create waits `SPACEDUST_DELAY`; a delete of a held link drops it.
    fn hold_or_unhold(&mut self, event: &PushEvent<'_>) {
        let PushEvent::Link { op, link, source, .. } = *event else { return };
        let key = (link.target.clone(), source.to_string(), link.location.clone());
        match op {
            LinkOp::Delete => self.held.retain(|held| held.key != key),
            LinkOp::Create => {
                let Some(frame) = self.render(event) else { return };
                let due = tokio::time::Instant::now() + SPACEDUST_DELAY;
                self.held.push_back(Held { due, key, frame });
            }
        }
    }

    /// Sends the held links that are due (and the oldest early when too many are held).
    async fn release_due(&mut self) -> Result<(), &'static str> {
        let now = tokio::time::Instant::now();
        while let Some(held) = self.held.front() {
            if held.due > now && self.held.len() <= MAX_HELD {
                break;
            }
            let held = self.held.pop_front().expect("front exists");
            self.feed_text(held.frame).await?;
        }
        self.socket.flush().await.map_err(|_| "send failed")
    }

    /// The frames of one event in this subscriber's language.
    fn render(&self, event: &PushEvent<'_>) -> Option<String> {
        match (self.flavor, event) {
            (Flavor::Backlinks, _) => Some(event.to_json()),
            // Spacedust sends creates only (its deletes never reach clients).
            (Flavor::Spacedust { .. }, PushEvent::Link { op: LinkOp::Create, link, .. }) => {
                let target_is_record = matches!(parse_target(&link.target), Ok(LinkTarget::Record { .. }));
                let path = constellation_path(&link.location, target_is_record).unwrap_or_default();
                event.to_spacedust_json(&path)
            }
            (Flavor::Spacedust { .. }, _) => None,
        }
    }

    async fn feed_text(&mut self, text: String) -> Result<(), &'static str> {
        self.feed_frame(text.into()).await
    }

    async fn feed_frame(&mut self, frame: Utf8Bytes) -> Result<(), &'static str> {
        self.counters().events_sent.fetch_add(1, Ordering::Relaxed);
        self.socket.feed(Message::Text(frame)).await.map_err(|_| "send failed")
    }

    async fn send_text(&mut self, text: String) -> Result<(), &'static str> {
        self.send(Message::Text(text.into())).await
    }

    async fn send(&mut self, message: Message) -> Result<(), &'static str> {
        self.socket.send(message).await.map_err(|_| "send failed")
    }

    /// Sends an error frame and closes; returns why the connection ends.
    async fn close_with_error(&mut self, error: &'static str, message: &str) -> &'static str {
        let frame = serde_json::json!({ "op": "error", "error": error, "message": message }).to_string();
        let close = CloseFrame { code: CloseCode::Policy, reason: error.into() };
        // The closing handshake: reading until the client's close leaves nothing unread here,
        // so the kernel ends the connection with a FIN, not a reset that would lose the frames
        // still on their way to the client.
        let goodbye = async {
            self.socket.send(Message::Text(frame.into())).await?;
            self.socket.send(Message::Close(Some(close))).await?;
            while let Some(Ok(message)) = self.socket.next().await {
                if let Message::Close(_) = message {
                    break;
                }
            }
            Ok::<(), tokio_tungstenite::tungstenite::Error>(())
        };
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, goodbye).await;
        error
    }
}
