//! `S3Store`: the object store on S3 or any S3-compatible service (Garage, MinIO, R2), through
//! `aws-sdk-s3`, behind the one retry policy (`store::retry`).
//!
//! Invariants:
//! - Key `k` is the object `<prefix>/k` of the bucket (`k` itself when the prefix is empty). Every
//!   key is validated (`validate_key`) before any request, so a hostile key never reaches the wire.
//! - One retry policy: the SDK's own retries are disabled; every request goes through
//!   `retry::with_retries`.
//! - Every attempt is bounded in time: `timeout` for the request and its response headers, plus a
//!   transfer allowance proportional to the body size (`MIN_TRANSFER_BYTES_PER_SEC`).
//! - `put_file` streams the file (`UPLOAD_BUFFER_BYTES` at a time) after checking its length;
//!   each attempt reads it again from the start. Every PUT's body is checked by the server: an
//!   in-memory body against the request's signature, a streamed one against the SHA-256 its
//!   caller took when it checked the file (`x-amz-checksum-sha256`).
//! - `get_range` returns exactly the requested bytes, or `ShortRead` when the object is shorter;
//!   a body is never read past the length the response declared, and never past `MAX_OBJECT_LEN`.
//! - `list` pages through ListObjectsV2 and stops with an error past `MAX_LIST_OBJECTS` objects or
//!   `MAX_LIST_PAGES` pages, so a misbehaving server cannot make it loop or grow without bound.
//! - The secret key is only ever held in a `Secret`, whose `Debug` prints no part of it.

use super::object::{
    LocalFile, MAX_KEY_LEN, MAX_LIST_OBJECTS, MAX_OBJECT_LEN, ObjectInfo, Store, StoreError, check_file_len,
    check_object_len, validate_key, validate_prefix,
};
use super::retry::{Jitter, RetryPolicy, with_retries};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Region used when neither the config file nor the environment names one.
pub const DEFAULT_REGION: &str = "us-east-1";
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// Slowest transfer an attempt tolerates: a body of n bytes gets `n / MIN_TRANSFER_BYTES_PER_SEC`
/// seconds on top of the request timeout.
pub const MIN_TRANSFER_BYTES_PER_SEC: u64 = 1 << 20;
/// Keys per ListObjectsV2 page (the S3 maximum).
const LIST_PAGE_KEYS: i32 = 1000;
/// Most pages one `list` reads; a conforming server needs `MAX_LIST_OBJECTS / 1000`.
const MAX_LIST_PAGES: usize = MAX_LIST_OBJECTS / 100;
/// Initial buffer for a body; larger bodies grow it as bytes actually arrive, so a hostile
/// Content-Length costs nothing up front.
const MAX_PREALLOCATED_BODY: u64 = 64 << 20;
/// Bytes of a file read at a time while `put_file` sends it.
const UPLOAD_BUFFER_BYTES: usize = 256 << 10;
const MAX_ENDPOINT_LEN: usize = 2048;
const MAX_REGION_LEN: usize = 64;
const MAX_BUCKET_LEN: usize = 255;

/// A secret string (the S3 secret key). `Debug` never prints it, and there is no `Display`.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The S3 keys of the config file; `S3Settings::resolve` fills what they leave out from the
/// environment.
#[derive(Debug, Clone, Default)]
pub struct S3ConfigKeys {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    pub force_path_style: Option<bool>,
}

/// Everything `S3Store::new` needs, resolved.
#[derive(Debug, Clone)]
pub struct S3Settings {
    pub bucket: String,
    /// Key prefix inside the bucket, without a trailing `/`; may be empty.
    pub prefix: String,
    /// A custom endpoint (`http://127.0.0.1:3900`); `None` is AWS itself.
    pub endpoint: Option<String>,
    pub region: String,
    pub force_path_style: bool,
    /// Access key id and secret; `None` uses the AWS default chain (environment, profile, web
    /// identity, container, instance metadata).
    pub credentials: Option<(String, Secret)>,
    pub retry: RetryPolicy,
    /// Per-attempt limit for a request and its response headers (bodies get more, see module).
    pub timeout: Duration,
}

impl S3Settings {
    /// Settings for `s3://BUCKET/PREFIX`. Each value comes from the config file if it names it,
    /// else from the usual AWS variable (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_REGION`,
    /// `AWS_DEFAULT_REGION`; credentials through the default chain). With a custom endpoint,
    /// path-style addressing is the default. `env` is injected so tests control it.
    pub fn resolve(url: &str, keys: &S3ConfigKeys, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, StoreError> {
        let (bucket, prefix) = parse_s3_url(url)?;
        let endpoint = keys.endpoint.clone().or_else(|| env("AWS_ENDPOINT_URL_S3")).or_else(|| env("AWS_ENDPOINT_URL"));
        let region = keys
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| DEFAULT_REGION.to_owned());
        let credentials = match (&keys.access_key_id, &keys.secret_access_key) {
            (Some(id), Some(secret)) => Some((id.clone(), secret.clone())),
            (None, None) => None,
            _ => return Err(config_error("s3_access_key_id and s3_secret_access_key must be given together")),
        };
        let settings = S3Settings {
            bucket,
            prefix,
            force_path_style: keys.force_path_style.unwrap_or(endpoint.is_some()),
            endpoint,
            region,
            credentials,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
        };
        settings.validate()?;
        Ok(settings)
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        validate_bucket(&self.bucket)?;
        if !self.prefix.is_empty() {
            validate_key(&self.prefix)?;
        }
        if self.prefix.len() + 1 + MAX_KEY_LEN > 1024 {
            return Err(config_error("prefix too long: prefix/key must fit S3's 1024-byte key limit"));
        }
        if let Some(endpoint) = &self.endpoint {
            validate_endpoint(endpoint)?;
        }
        validate_region(&self.region)?;
        self.retry.validate()?;
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(config_error("timeout must be between 0 and 600 s"));
        }
        Ok(())
    }
}

fn config_error(message: &str) -> StoreError {
    StoreError::Other(format!("S3 configuration: {message}"))
}

/// `s3://BUCKET/PRE/FIX/` -> (`BUCKET`, `PRE/FIX`).
fn parse_s3_url(url: &str) -> Result<(String, String), StoreError> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| config_error("store URL must start with s3://"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    Ok((bucket.to_owned(), prefix.trim_end_matches('/').to_owned()))
}

/// Bucket names: 1..=255 of `[A-Za-z0-9._-]` (the legacy rule, a superset of today's).
fn validate_bucket(bucket: &str) -> Result<(), StoreError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if bucket.is_empty() || bucket.len() > MAX_BUCKET_LEN || !bucket.bytes().all(allowed) {
        return Err(config_error("bucket name must be 1..=255 of [A-Za-z0-9._-]"));
    }
    Ok(())
}

fn validate_endpoint(endpoint: &str) -> Result<(), StoreError> {
    let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
    if !scheme_ok || endpoint.len() > MAX_ENDPOINT_LEN || endpoint.chars().any(char::is_whitespace) {
        return Err(config_error("endpoint must be an http:// or https:// URL"));
    }
    Ok(())
}

fn validate_region(region: &str) -> Result<(), StoreError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_');
    if region.is_empty() || region.len() > MAX_REGION_LEN || !region.bytes().all(allowed) {
        return Err(config_error("region must be 1..=64 of [A-Za-z0-9_-]"));
    }
    Ok(())
}

/// An S3 bucket (or a prefix of one).
pub struct S3Store {
    client: aws_sdk_s3::Client,
    settings: S3Settings,
    jitter: Jitter,
    /// Requests sent, retries included.
    attempts: AtomicU64,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store").field("settings", &self.settings).field("attempts", &self.attempts).finish()
    }
}

impl S3Store {
    /// A store on `settings.bucket`. Sends nothing yet: the first operation connects.
    pub fn new(settings: S3Settings) -> Result<Self, StoreError> {
        settings.validate()?;
        let client = build_client(&settings);
        Ok(S3Store { client, jitter: Jitter::new(settings.retry.seed), settings, attempts: AtomicU64::new(0) })
    }

    pub fn settings(&self) -> &S3Settings {
        &self.settings
    }

    /// Requests sent so far, retries included.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    fn object_key(&self, key: &str) -> String {
        debug_assert!(validate_key(key).is_ok());
        match self.settings.prefix.as_str() {
            "" => key.to_owned(),
            prefix => format!("{prefix}/{key}"),
        }
    }

    /// Runs one operation under the retry policy, counting every attempt.
    async fn run<T, F, Fut>(&self, mut once: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        with_retries(&self.settings.retry, &self.jitter, || {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            once()
        })
        .await
    }

    /// Time allowed for an attempt that moves `bytes` of body.
    fn transfer_limit(&self, bytes: u64) -> Duration {
        self.settings.timeout + Duration::from_secs(bytes / MIN_TRANSFER_BYTES_PER_SEC)
    }

    async fn put_once(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        self.send_put(key, body.len() as u64, ByteStream::from(body), None).await
    }

    /// One attempt at `put_file`: the body is read from the file while it is sent, a buffer at a
    /// time, with the SHA-256 its caller checked (`sha256`, base64), which the server checks the
    /// body against. The file's length is checked first (the SDK would send a longer file's first
    /// `len` bytes); one that shrinks while sent fails the attempt.
    async fn put_file_once(&self, key: &str, file: &LocalFile, sha256: &str) -> Result<(), StoreError> {
        let found = tokio::fs::metadata(&file.path).await.map_err(|e| StoreError::io(key, e))?.len();
        check_file_len(file.len, found).map_err(|e| StoreError::io(key, e))?;
        let len = file.len;
        let body = ByteStream::read_from()
            .path(&file.path)
            .length(Length::Exact(len))
            .buffer_size(UPLOAD_BUFFER_BYTES)
            .build()
            .await
            .map_err(|e| StoreError::io(key, std::io::Error::other(e)))?;
        self.send_put(key, len, body, Some(sha256)).await
    }

    /// A PutObject of `body` (`len` bytes). An in-memory body is signed whole by the SDK (the
    /// server checks it against the signature); a streamed one carries its `sha256` instead
    /// (`x-amz-checksum-sha256`, itself signed), since the SDK would otherwise send it with a
    /// chunked signature that S3-compatible servers do not all accept (Garage refuses it).
    async fn send_put(&self, key: &str, len: u64, body: ByteStream, sha256: Option<&str>) -> Result<(), StoreError> {
        let request = self
            .client
            .put_object()
            .bucket(&self.settings.bucket)
            .key(self.object_key(key))
            .content_length(len as i64)
            .set_checksum_sha256(sha256.map(str::to_owned))
            .body(body)
            .send();
        within(key, self.transfer_limit(len), request).await?.map_err(|e| map_sdk_error(key, e))?;
        Ok(())
    }

    /// The whole object (`range` `None`) or exactly `len` bytes at `offset` (`len` > 0, in u64).
    async fn get_once(&self, key: &str, range: Option<(u64, u64)>) -> Result<Bytes, StoreError> {
        let mut request = self.client.get_object().bucket(&self.settings.bucket).key(self.object_key(key));
        if let Some((offset, len)) = range {
            assert!(len > 0 && offset.checked_add(len).is_some());
            request = request.range(format!("bytes={}-{}", offset, offset + len - 1));
        }
        let output = match within(key, self.settings.timeout, request.send()).await? {
            Ok(output) => output,
            Err(error) => return Err(map_get_error(key, range, error)),
        };
        let declared = declared_length(key, output.content_length())?;
        let expected = match range {
            Some((_, len)) if declared < len => {
                return Err(StoreError::ShortRead { key: key.to_owned(), expected: len, got: declared });
            }
            Some((_, len)) if declared > len => {
                return Err(StoreError::Other(format!("{key}: server sent {declared} bytes for a {len}-byte range")));
            }
            Some((_, len)) => len,
            None => declared,
        };
        let body = read_body(key, output.body, expected, self.transfer_limit(expected)).await?;
        assert_eq!(body.len() as u64, expected);
        Ok(body)
    }

    /// The object's size (HeadObject).
    async fn size_once(&self, key: &str) -> Result<u64, StoreError> {
        let request = self.client.head_object().bucket(&self.settings.bucket).key(self.object_key(key)).send();
        let output = within(key, self.settings.timeout, request).await?.map_err(|e| map_sdk_error(key, e))?;
        declared_length(key, output.content_length())
    }

    /// A range that no ranged GET can express (empty, past `u64::MAX`, or over the object limit):
    /// answered from the object's size alone, with the same outcome a file would give.
    async fn degenerate_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let size = self.run(|| self.size_once(key)).await?;
        if len == 0 && offset <= size {
            return Ok(Bytes::new());
        }
        Err(StoreError::ShortRead { key: key.to_owned(), expected: len, got: size.saturating_sub(offset).min(len) })
    }

    /// One ListObjectsV2 page: the objects on it and the token of the next page.
    async fn list_page_once(
        &self,
        full_prefix: &str,
        token: Option<&str>,
    ) -> Result<(Vec<ObjectInfo>, Option<String>), StoreError> {
        let request = self
            .client
            .list_objects_v2()
            .bucket(&self.settings.bucket)
            .prefix(full_prefix)
            .max_keys(LIST_PAGE_KEYS)
            .set_continuation_token(token.map(str::to_owned))
            .send();
        let page =
            within(full_prefix, self.settings.timeout, request).await?.map_err(|e| map_sdk_error(full_prefix, e))?;
        let mut objects = Vec::with_capacity(page.contents().len());
        for object in page.contents() {
            let Some(key) = object.key().and_then(|full| self.strip_prefix(full)) else { continue };
            let size = object.size().and_then(|size| u64::try_from(size).ok());
            let size = size.ok_or_else(|| StoreError::Other(format!("listing gave {key} without a valid size")))?;
            objects.push(ObjectInfo { key: key.to_owned(), size });
        }
        let next = match page.is_truncated() {
            Some(true) => Some(page.next_continuation_token().map(str::to_owned).ok_or_else(|| {
                StoreError::Other(format!("listing of {full_prefix:?} is truncated but has no continuation token"))
            })?),
            _ => None,
        };
        Ok((objects, next))
    }

    /// The store key of a bucket key, if it is under the prefix and obeys the key grammar (a
    /// foreign object that does not is invisible, as it could never be read through the store).
    fn strip_prefix<'a>(&self, full: &'a str) -> Option<&'a str> {
        let key = match self.settings.prefix.as_str() {
            "" => full,
            prefix => full.strip_prefix(prefix)?.strip_prefix('/')?,
        };
        validate_key(key).is_ok().then_some(key)
    }

    async fn delete_once(&self, key: &str) -> Result<(), StoreError> {
        let request = self.client.delete_object().bucket(&self.settings.bucket).key(self.object_key(key)).send();
        match within(key, self.settings.timeout, request).await?.map_err(|e| map_sdk_error(key, e)) {
            Err(StoreError::NotFound { .. }) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

#[async_trait::async_trait]
impl Store for S3Store {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        validate_key(key)?;
        check_object_len(key, body.len() as u64)?;
        self.run(|| self.put_once(key, body.clone())).await
    }

    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        validate_key(key)?;
        check_object_len(key, file.len)?;
        let sha256 = data_encoding::BASE64.encode(&file.sha256);
        self.run(|| self.put_file_once(key, file, &sha256)).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        validate_key(key)?;
        self.run(|| self.get_once(key, None)).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        validate_key(key)?;
        if len == 0 || len > MAX_OBJECT_LEN || offset.checked_add(len).is_none() {
            return self.degenerate_range(key, offset, len).await;
        }
        self.run(|| self.get_once(key, Some((offset, len)))).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        validate_prefix(prefix)?;
        let full_prefix = match self.settings.prefix.as_str() {
            "" => prefix.to_owned(),
            store_prefix => format!("{store_prefix}/{prefix}"),
        };
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        for _page in 0..MAX_LIST_PAGES {
            let (objects, next) = self.run(|| self.list_page_once(&full_prefix, token.as_deref())).await?;
            found.extend(objects);
            if found.len() > MAX_LIST_OBJECTS {
                return Err(StoreError::Other(format!("more than {MAX_LIST_OBJECTS} objects under {prefix:?}")));
            }
            let Some(next) = next else {
                // S3 lists in key order already; sorting keeps the contract even if a server does not.
                found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                return Ok(found);
            };
            if token.as_ref() == Some(&next) {
                return Err(StoreError::Other(format!("listing {prefix:?}: the continuation token did not advance")));
            }
            token = Some(next);
        }
        Err(StoreError::Other(format!("listing {prefix:?} took more than {MAX_LIST_PAGES} pages")))
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        validate_key(key)?;
        self.run(|| self.delete_once(key)).await
    }
}

fn build_client(settings: &S3Settings) -> aws_sdk_s3::Client {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let http = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    let mut config = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(settings.region.clone()))
        .http_client(http.clone())
        // One retry policy: ours (`with_retries`).
        .retry_config(RetryConfig::disabled())
        .timeout_config(TimeoutConfig::builder().connect_timeout(settings.timeout).build())
        .force_path_style(settings.force_path_style);
    if let Some(endpoint) = &settings.endpoint {
        config = config.endpoint_url(endpoint);
    }
    config = match &settings.credentials {
        Some((id, secret)) => config.credentials_provider(Credentials::new(id, secret.expose(), None, None, "config")),
        None => config.credentials_provider(default_credentials_chain(&settings.region, http)),
    };
    aws_sdk_s3::Client::from_conf(config.build())
}

/// The usual AWS credential sources, in the usual order, built without any request.
fn default_credentials_chain(
    region: &str,
    http: SharedHttpClient,
) -> aws_config::meta::credentials::CredentialsProviderChain {
    use aws_config::{ecs, environment, imds, profile, provider_config::ProviderConfig, web_identity_token};
    let conf =
        ProviderConfig::without_region().with_region(Some(Region::new(region.to_owned()))).with_http_client(http);
    aws_config::meta::credentials::CredentialsProviderChain::first_try(
        "Environment",
        environment::EnvironmentVariableCredentialsProvider::new(),
    )
    .or_else("Profile", profile::ProfileFileCredentialsProvider::builder().configure(&conf).build())
    .or_else(
        "WebIdentityToken",
        web_identity_token::WebIdentityTokenCredentialsProvider::builder().configure(&conf).build(),
    )
    .or_else("EcsContainer", ecs::EcsCredentialsProvider::builder().configure(&conf).build())
    .or_else("Ec2InstanceMetadata", imds::credentials::ImdsCredentialsProvider::builder().configure(&conf).build())
}

/// `future` within `limit`, or a retryable `TimedOut`.
async fn within<T>(key: &str, limit: Duration, future: impl Future<Output = T>) -> Result<T, StoreError> {
    tokio::time::timeout(limit, future).await.map_err(|_| {
        StoreError::io(key, std::io::Error::new(ErrorKind::TimedOut, format!("no answer within {limit:?}")))
    })
}

fn declared_length(key: &str, content_length: Option<i64>) -> Result<u64, StoreError> {
    match content_length.map(u64::try_from) {
        Some(Ok(len)) if len <= MAX_OBJECT_LEN => Ok(len),
        Some(_) => Err(StoreError::Other(format!("{key}: invalid Content-Length {content_length:?}"))),
        None => Err(StoreError::Other(format!("{key}: response without Content-Length"))),
    }
}

/// Reads exactly `expected` bytes of `body` within `limit`. A body that ends early is a transfer
/// cut short (retryable); one that runs long is a broken server (not retryable).
async fn read_body(key: &str, mut body: ByteStream, expected: u64, limit: Duration) -> Result<Bytes, StoreError> {
    let read = async {
        let mut buffer = BytesMut::with_capacity(expected.min(MAX_PREALLOCATED_BODY) as usize);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| transport_error(key, ErrorKind::ConnectionReset, &e))?;
            if buffer.len() as u64 + chunk.len() as u64 > expected {
                return Err(StoreError::Other(format!("{key}: body longer than its Content-Length {expected}")));
            }
            buffer.extend_from_slice(&chunk);
        }
        if (buffer.len() as u64) < expected {
            let message = format!("body ended after {} of {expected} bytes", buffer.len());
            return Err(StoreError::io(key, std::io::Error::new(ErrorKind::UnexpectedEof, message)));
        }
        Ok(buffer.freeze())
    };
    within(key, limit, read).await?
}

/// What an S3 error response means to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResponseClass {
    NotFound,
    RangeNotSatisfiable,
    Throttled,
    ServerError,
    AccessDenied,
    NoSuchBucket,
    ClientError,
}

fn classify(status: u16, code: Option<&str>) -> ResponseClass {
    const THROTTLING_CODES: &[&str] =
        &["SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"];
    match (status, code) {
        (_, Some(code)) if THROTTLING_CODES.contains(&code) => ResponseClass::Throttled,
        (429, _) => ResponseClass::Throttled,
        (_, Some("NoSuchBucket")) => ResponseClass::NoSuchBucket,
        (404, _) | (_, Some("NoSuchKey")) => ResponseClass::NotFound,
        (416, _) | (_, Some("InvalidRange")) => ResponseClass::RangeNotSatisfiable,
        (403, _) => ResponseClass::AccessDenied,
        (500..=599, _) => ResponseClass::ServerError,
        _ => ResponseClass::ClientError,
    }
}

/// A GET error; a range that starts at or past the end of the object (416) is a `ShortRead` of
/// nothing, as in every other store.
fn map_get_error<E>(key: &str, range: Option<(u64, u64)>, error: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let class = match &error {
        SdkError::ServiceError(service) => Some(classify(service.raw().status().as_u16(), service.err().code())),
        _ => None,
    };
    match (class, range) {
        (Some(ResponseClass::RangeNotSatisfiable), Some((_, len))) => {
            StoreError::ShortRead { key: key.to_owned(), expected: len, got: 0 }
        }
        _ => map_sdk_error(key, error),
    }
}

/// Maps an SDK error onto the store's errors so that `is_retryable` is right: transient conditions
/// become `Io` errors of a transient kind, everything else is not retryable.
fn map_sdk_error<E>(key: &str, error: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let detail = DisplayErrorContext(&error).to_string();
    match &error {
        SdkError::TimeoutError(_) => StoreError::io(key, std::io::Error::new(ErrorKind::TimedOut, detail)),
        SdkError::DispatchFailure(failure) if failure.is_timeout() => {
            StoreError::io(key, std::io::Error::new(ErrorKind::TimedOut, detail))
        }
        SdkError::DispatchFailure(failure) if failure.is_io() => {
            transport_error(key, ErrorKind::ConnectionReset, &error)
        }
        // A response that could not be read whole: the connection broke mid-answer.
        SdkError::ResponseError(_) => transport_error(key, ErrorKind::ConnectionAborted, &error),
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            from_status(key, status, service.err().code(), detail)
        }
        _ => StoreError::Other(format!("S3 request for {key} failed: {detail}")),
    }
}

fn from_status(key: &str, status: u16, code: Option<&str>, detail: String) -> StoreError {
    let io = |kind| StoreError::io(key, std::io::Error::new(kind, format!("HTTP {status}: {detail}")));
    match classify(status, code) {
        ResponseClass::NotFound => StoreError::NotFound { key: key.to_owned() },
        ResponseClass::RangeNotSatisfiable => StoreError::Other(format!("range not satisfiable: {detail}")),
        // `Interrupted`: the request did not happen, and the same request may succeed later.
        ResponseClass::Throttled | ResponseClass::ServerError => io(ErrorKind::Interrupted),
        ResponseClass::AccessDenied => io(ErrorKind::PermissionDenied),
        ResponseClass::NoSuchBucket => StoreError::Other(format!("the bucket does not exist: {detail}")),
        ResponseClass::ClientError => {
            StoreError::Other(format!("S3 refused the request for {key}: HTTP {status}: {detail}"))
        }
    }
}

/// A transport failure, keeping the kind of the underlying `io::Error` when it is transient.
fn transport_error(key: &str, fallback: ErrorKind, error: &(dyn std::error::Error + 'static)) -> StoreError {
    let found = std::iter::successors(Some(error), |e| e.source())
        .take(32)
        .find_map(|e| e.downcast_ref::<std::io::Error>().map(std::io::Error::kind));
    let probe = |kind| StoreError::io(key, std::io::Error::from(kind)).is_retryable();
    let kind = found.filter(|kind| probe(*kind)).unwrap_or(fallback);
    StoreError::io(key, std::io::Error::new(kind, DisplayErrorContext(error).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn secret_is_never_printed() {
        let secret = Secret::new("hunter2-very-secret");
        let settings = S3Settings {
            credentials: Some(("AKID".into(), secret.clone())),
            ..S3Settings::resolve("s3://b", &S3ConfigKeys::default(), &env_of(&[])).unwrap()
        };
        let shown = format!(
            "{settings:?} {secret:?} {:?}",
            S3ConfigKeys { secret_access_key: Some(secret.clone()), ..Default::default() }
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("Secret(<redacted>)"));
        assert_eq!(secret.expose(), "hunter2-very-secret");
    }

    #[test]
    fn resolve_prefers_config_then_environment_then_defaults() {
        let env = env_of(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:3900"), ("AWS_REGION", "garage")]);
        let settings = S3Settings::resolve("s3://bucket/pre/fix/", &S3ConfigKeys::default(), &env).unwrap();
        assert_eq!((settings.bucket.as_str(), settings.prefix.as_str()), ("bucket", "pre/fix"));
        assert_eq!(settings.endpoint.as_deref(), Some("http://127.0.0.1:3900"));
        assert_eq!(settings.region, "garage");
        assert!(settings.force_path_style, "a custom endpoint defaults to path style");
        assert!(settings.credentials.is_none());

        let keys = S3ConfigKeys {
            endpoint: Some("https://s3.example.net".into()),
            region: Some("eu-west-3".into()),
            access_key_id: Some("id".into()),
            secret_access_key: Some(Secret::new("s")),
            force_path_style: Some(false),
        };
        let settings = S3Settings::resolve("s3://bucket", &keys, &env).unwrap();
        assert_eq!(settings.endpoint.as_deref(), Some("https://s3.example.net"));
        assert_eq!((settings.region.as_str(), settings.prefix.as_str()), ("eu-west-3", ""));
        assert!(!settings.force_path_style);
        assert_eq!(settings.credentials, Some(("id".into(), Secret::new("s"))));

        let plain = S3Settings::resolve("s3://bucket/p", &S3ConfigKeys::default(), &env_of(&[])).unwrap();
        assert_eq!((plain.region.as_str(), plain.endpoint, plain.force_path_style), (DEFAULT_REGION, None, false));
        let s3_specific = env_of(&[("AWS_ENDPOINT_URL_S3", "http://a:1"), ("AWS_ENDPOINT_URL", "http://b:2")]);
        let settings = S3Settings::resolve("s3://bucket", &S3ConfigKeys::default(), &s3_specific).unwrap();
        assert_eq!(settings.endpoint.as_deref(), Some("http://a:1"));
    }

    #[test]
    fn resolve_rejects_bad_settings() {
        let none = S3ConfigKeys::default();
        let env = env_of(&[]);
        for url in ["file:///x", "s3://", "s3:///prefix", "s3://bad bucket/x", "s3://b/../x", "s3://b/a//c"] {
            assert!(S3Settings::resolve(url, &none, &env).is_err(), "{url}");
        }
        let half = S3ConfigKeys { access_key_id: Some("id".into()), ..Default::default() };
        assert!(S3Settings::resolve("s3://b", &half, &env).is_err());
        let bad_endpoint = S3ConfigKeys { endpoint: Some("ftp://x".into()), ..Default::default() };
        assert!(S3Settings::resolve("s3://b", &bad_endpoint, &env).is_err());
        let bad_region = S3ConfigKeys { region: Some("us east".into()), ..Default::default() };
        assert!(S3Settings::resolve("s3://b", &bad_region, &env).is_err());
        let long_prefix = format!("s3://b/{}", "p".repeat(600));
        assert!(S3Settings::resolve(&long_prefix, &none, &env).is_err());
    }

    #[test]
    fn responses_are_classified_for_retries() {
        let error = |status, code| from_status("k", status, code, String::new());
        assert!(matches!(error(404, Some("NoSuchKey")), StoreError::NotFound { .. }));
        assert!(matches!(error(404, None), StoreError::NotFound { .. }));
        assert!(!error(404, Some("NoSuchBucket")).is_retryable());
        assert!(matches!(error(404, Some("NoSuchBucket")), StoreError::Other(_)));
        for (status, code) in
            [(500, None), (502, None), (503, Some("SlowDown")), (429, None), (400, Some("Throttling"))]
        {
            assert!(error(status, code).is_retryable(), "{status} {code:?}");
        }
        for (status, code) in [(400, None), (403, Some("AccessDenied")), (409, None), (416, None), (411, None)] {
            assert!(!error(status, code).is_retryable(), "{status} {code:?}");
        }
        assert_eq!(classify(416, None), ResponseClass::RangeNotSatisfiable);
        assert_eq!(classify(200, Some("InvalidRange")), ResponseClass::RangeNotSatisfiable);
    }

    #[test]
    fn transport_errors_keep_transient_io_kinds() {
        let refused = std::io::Error::from(ErrorKind::ConnectionRefused);
        let mapped = transport_error("k", ErrorKind::ConnectionReset, &refused);
        assert!(matches!(&mapped, StoreError::Io { source, .. } if source.kind() == ErrorKind::ConnectionRefused));
        let denied = std::io::Error::from(ErrorKind::PermissionDenied);
        let mapped = transport_error("k", ErrorKind::ConnectionReset, &denied);
        assert!(matches!(&mapped, StoreError::Io { source, .. } if source.kind() == ErrorKind::ConnectionReset));
        assert!(mapped.is_retryable());
    }
}
