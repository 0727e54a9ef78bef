//! The JSON API over HTTP/1.1 on the hub's port (docs/DESIGN.md §5): every call goes to
//! the hub task ([`ToHub::Call`]) and is decided by the core in turn, a write answered
//! only once durable. Tokens as on the sync path, in `Authorization: Bearer TOKEN`;
//! without tokens a caller says who it is in `X-Swarmtodo-Agent`.
//!
//! - `GET /healthz`; `GET /metrics` (Prometheus text)
//! - `GET /` — the board, a page for people (`board.rs`)
//! - `GET /v1/lists[?after=KEY]` — every list: name, version, tasks by status
//! - `PUT /v1/lists/{name}` — create (idempotent); `GET /v1/lists/{name}[?version=V]`
//! - `POST /v1/lists/{name}/todo_write` — a `todo_write` request
//! - `POST /v1/lists/{name}/claim` — `{agent?, task?}`
//! - `POST /v1/lists/{name}/delegate` — `{task, agent, list?}`: the task is the agent's,
//!   worked as a list of its own (on a hub with tokens, the answer carries a new worker
//!   token for it)
//! - `GET /v1/lists/{name}/wait?version=V&timeout_ms=T` — a barrier on a version
//! - `GET /v1/lists/{name}/tasks/{id}/history[?limit=N]` — the changes to a task
//! - `GET /v1/lists/{name}/events?from=SEQ` — Server-Sent Events (`Last-Event-ID`
//!   resumes; `?tail=N` starts N events back), see `stream.rs`

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::access::Access;
use crate::channel::ToHub;
use crate::limits::{
    HANDSHAKE_TIMEOUT, HTTP_BODY_BYTES_MAX, HTTP_BODY_TIMEOUT, HTTP_HEAD_BYTES_MAX,
};
use swarmtodo_core::hub::{Answer, Call, Caller};
use swarmtodo_proto::{
    parse_write_request, ApiError, ClaimRequest, DelegateRequest, ErrorCode, TaskHistory, Version,
    AGENT_ID_BYTES_MAX, HISTORY_ENTRIES_MAX, LISTS_PAGE_MAX,
};

/// How long a wait waits when the call does not say (ms).
pub const WAIT_MS_DEFAULT: i64 = 10_000;

/// The header that names the calling agent on a hub without tokens.
pub const AGENT_HEADER: &str = "x-swarmtodo-agent";

/// What one HTTP connection needs of the server.
#[derive(Debug)]
pub(crate) struct Api {
    pub(crate) to_hub: mpsc::Sender<ToHub>,
    pub(crate) access: Arc<Access>,
    pub(crate) address: IpAddr,
    /// False when the connection is over its address's bound: every call is refused.
    pub(crate) admitted: bool,
    /// The store: the index of lists, the tokens made.
    pub(crate) store: swarmtodo_store::Store,
    /// Where event streams and task histories read a list's past.
    pub(crate) past: crate::past::Past,
    /// In a cluster: the index of every list, and where made tokens are shared.
    pub(crate) directory: Option<crate::directory::Directory>,
    /// What `/metrics` shows.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Turns for history reads, shared by every connection (see
    /// [`HISTORY_READS_MAX`](crate::limits::HISTORY_READS_MAX)).
    pub(crate) history_reads: Arc<tokio::sync::Semaphore>,
}

/// A response body: JSON, or an event stream.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// Whether a connection's first request is for HTTP (the JSON API: its path starts with
/// `/v1/`, or is `/healthz` or `/metrics`; the board: `/board.*`, or `/` without an
/// `Upgrade` header) rather than a WebSocket upgrade, read without consuming it. `None`
/// when the connection closed or sent nothing recognisable in time.
pub(crate) async fn is_http(stream: &TcpStream) -> Option<bool> {
    /// What the request line says.
    enum Target {
        Http(bool),
        /// `/`: the board, or a WebSocket peer (which connects to `/`).
        Root,
    }
    // "OPTIONS /healthz" is the longest prefix that decides.
    const DECIDES: usize = 24;
    let mut buf = [0u8; DECIDES];
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let target = peek_until(stream, &mut buf, deadline, |head| {
        let Some(space) = head.iter().position(|b| *b == b' ') else {
            return (head.len() == DECIDES || head.contains(&b'\n')).then_some(Target::Http(false));
        };
        let target = &head[space + 1..];
        if target.starts_with(b"/ ") || target.starts_with(b"/?") {
            return Some(Target::Root);
        }
        let api = target.starts_with(b"/v1/")
            || target.starts_with(b"/healthz")
            || target.starts_with(b"/metrics")
            || target.starts_with(crate::board::PREFIX.as_bytes());
        (api || target.len() >= 8 || head.contains(&b'\n')).then_some(Target::Http(api))
    })
    .await?;
    match target {
        Target::Http(api) => Some(api),
        Target::Root => upgrade_asked(stream, deadline)
            .await
            .map(|upgrade| !upgrade),
    }
}

/// Whether a request's head (read without consuming it, up to `HTTP_HEAD_BYTES_MAX`)
/// has an `Upgrade` header. A head that does not end within the bound goes to the
/// WebSocket handshake, which refuses it as before.
async fn upgrade_asked(stream: &TcpStream, deadline: tokio::time::Instant) -> Option<bool> {
    let mut buf = vec![0u8; HTTP_HEAD_BYTES_MAX];
    peek_until(stream, &mut buf, deadline, |head| {
        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
            return (head.len() == HTTP_HEAD_BYTES_MAX).then_some(true);
        };
        Some(
            head[..end]
                .split(|b| *b == b'\n')
                .skip(1)
                .any(|line| line.len() > 8 && line[..8].eq_ignore_ascii_case(b"upgrade:")),
        )
    })
    .await
}

/// Peeks at what `stream` has received (without consuming it) into `buf` until
/// `decide` says something of it; `None` when the peer closes or `deadline` passes.
async fn peek_until<R>(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: tokio::time::Instant,
    mut decide: impl FnMut(&[u8]) -> Option<R>,
) -> Option<R> {
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        if let Some(decided) = decide(&buf[..n]) {
            return Some(decided);
        }
        // What decides came in pieces: wait for the rest.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
    }
}

/// Serves one HTTP/1.1 call on a connection (an event stream for as long as its reader
/// follows it).
pub(crate) async fn serve(stream: TcpStream, api: Api) {
    let api = Arc::new(api);
    let service = hyper::service::service_fn(move |req| {
        let api = api.clone();
        async move { Ok::<_, Infallible>(api.handle(req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        // One call per connection: an idle connection never holds a slot.
        .keep_alive(false)
        .max_buf_size(HTTP_HEAD_BYTES_MAX)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "http connection ended");
    }
}

/// An error a caller gets: its code, the field it is about, what to do.
pub(crate) fn error(code: ErrorCode, field: Option<&str>, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        field: field.map(str::to_owned),
        allowed: Vec::new(),
        message: message.into(),
        current: None,
    }
}

/// The HTTP status of an error.
pub fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode::*;
    match code {
        InvalidValue | MissingField | DuplicateId | InvalidDependency => StatusCode::BAD_REQUEST,
        SecondInProgress | StaleVersion | NothingReady | Conflict => StatusCode::CONFLICT,
        UnknownVersion | UnknownTask | UnknownList | NotFound => StatusCode::NOT_FOUND,
        LimitExceeded => StatusCode::PAYLOAD_TOO_LARGE,
        Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Forbidden => StatusCode::FORBIDDEN,
        Unauthorized => StatusCode::UNAUTHORIZED,
        MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ListElsewhere => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn refusal(e: &ApiError) -> Response<Body> {
    let mut r = json(status_of(e.code), serde_json::to_vec(e).unwrap_or_default());
    if e.code == ErrorCode::MethodNotAllowed {
        if let Ok(v) = HeaderValue::from_str(&e.allowed.join(", ")) {
            r.headers_mut().insert(ALLOW, v);
        }
    }
    r
}

/// Decodes `%XX` escapes of a path segment or query value (`+` stays `+`).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The value of `key` in a query string, decoded.
fn query_value(query: Option<&str>, key: &str) -> Result<Option<String>, ApiError> {
    let Some(query) = query else {
        return Ok(None);
    };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == key {
            return percent_decode(v).map(Some).ok_or_else(|| {
                error(
                    ErrorCode::InvalidValue,
                    Some(key),
                    "not a valid percent-encoded value",
                )
            });
        }
    }
    Ok(None)
}

/// The hub task is gone: the hub is stopping.
fn stopping() -> ApiError {
    error(
        ErrorCode::Internal,
        None,
        "the hub is stopping: retry on its next start",
    )
}

fn method_not_allowed(allowed: &[&str]) -> ApiError {
    ApiError {
        code: ErrorCode::MethodNotAllowed,
        field: None,
        allowed: allowed.iter().map(|m| (*m).to_owned()).collect(),
        message: format!("this path takes {}", allowed.join(" or ")),
        current: None,
    }
}

/// What a path asks, before the method is checked.
enum Route {
    Board(&'static crate::board::Asset),
    Health,
    Metrics,
    Lists,
    List(String),
    Write(String),
    Claim(String),
    Delegate(String),
    Events(String),
    Wait(String),
    History(String, String),
}

fn route(path: &str) -> Result<Route, ApiError> {
    if let Some(asset) = crate::board::asset(path) {
        return Ok(Route::Board(asset));
    }
    if path == "/healthz" {
        return Ok(Route::Health);
    }
    if path == "/metrics" {
        return Ok(Route::Metrics);
    }
    if path == "/v1/lists" || path == "/v1/lists/" {
        return Ok(Route::Lists);
    }
    let not_found = || {
        error(
            ErrorCode::NotFound,
            None,
            format!("no such path {path:?}: the hub serves its board at /, and the API has /healthz, /metrics, /v1/lists, /v1/lists/{{name}}, and under it /todo_write, /claim, /delegate, /wait, /events and /tasks/{{id}}/history"),
        )
    };
    let rest = path.strip_prefix("/v1/lists/").ok_or_else(not_found)?;
    let mut parts = rest.split('/');
    let name = parts
        .next()
        .filter(|n| !n.is_empty())
        .ok_or_else(not_found)?;
    let name = percent_decode(name).ok_or_else(|| {
        error(
            ErrorCode::InvalidValue,
            Some("list"),
            "the list name is not valid percent-encoded UTF-8",
        )
    })?;
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (None, ..) => Ok(Route::List(name)),
        (Some("todo_write"), None, ..) => Ok(Route::Write(name)),
        (Some("claim"), None, ..) => Ok(Route::Claim(name)),
        (Some("delegate"), None, ..) => Ok(Route::Delegate(name)),
        (Some("events"), None, ..) => Ok(Route::Events(name)),
        (Some("wait"), None, ..) => Ok(Route::Wait(name)),
        (Some("tasks"), Some(task), Some("history"), None) if !task.is_empty() => {
            let task = percent_decode(task).ok_or_else(|| {
                error(
                    ErrorCode::InvalidValue,
                    Some("task"),
                    "the task id is not valid percent-encoded UTF-8",
                )
            })?;
            Ok(Route::History(name, task))
        }
        _ => Err(not_found()),
    }
}

fn check_agent(agent: &str, field: &str) -> Result<(), ApiError> {
    if agent.is_empty() || agent.len() > AGENT_ID_BYTES_MAX || agent.chars().any(char::is_control) {
        return Err(error(
            ErrorCode::InvalidValue,
            Some(field),
            format!(
                "an agent id is 1 to {AGENT_ID_BYTES_MAX} bytes of text without control characters"
            ),
        ));
    }
    Ok(())
}

impl Api {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let answered = match route(&path) {
            Ok(Route::Board(asset)) if method == Method::GET || method == Method::HEAD => Ok(
                crate::board::response(asset, method == Method::HEAD).map(BodyExt::boxed_unsync),
            ),
            Ok(Route::Events(name)) if method == Method::GET && self.admitted => {
                self.events(&req, name).await
            }
            Ok(Route::Metrics) if method == Method::GET => {
                let mut r =
                    Response::new(Full::new(Bytes::from(self.metrics.render())).boxed_unsync());
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                Ok(r)
            }
            _ => self
                .call(req)
                .await
                .map(|(status, body)| json(status, body)),
        };
        match answered {
            Ok(response) => {
                tracing::debug!(%method, path, status = response.status().as_u16(), "api call");
                response
            }
            Err(e) => {
                tracing::debug!(%method, path, code = ?e.code, "api call refused");
                refusal(&e)
            }
        }
    }

    async fn call(&self, req: Request<Incoming>) -> Result<(StatusCode, Vec<u8>), ApiError> {
        if !self.admitted {
            return Err(error(
                ErrorCode::LimitExceeded,
                None,
                "your address has as many connections open as the hub allows: close one, or retry later",
            ));
        }
        let method = req.method().clone();
        let route = route(req.uri().path())?;
        let (list, call) = match (route, &method) {
            (Route::Health, &Method::GET) => {
                return Ok((StatusCode::OK, br#"{"status":"ok"}"#.to_vec()));
            }
            (Route::Lists, &Method::GET) => {
                self.reader(&req)?;
                let after = query_value(req.uri().query(), "after")?;
                let page = match &self.directory {
                    // Every list of the cluster, as this hub last heard of it.
                    Some(d) => d.index.page(after.as_deref(), LISTS_PAGE_MAX),
                    None => self.store.lists(after, LISTS_PAGE_MAX).await.map_err(|e| {
                        error(
                            ErrorCode::Internal,
                            None,
                            format!("the store could not list the lists ({e}): retry"),
                        )
                    })?,
                };
                let body = serde_json::to_vec(&page)
                    .map_err(|e| error(ErrorCode::Internal, None, e.to_string()))?;
                return Ok((StatusCode::OK, body));
            }
            (Route::Health | Route::Metrics | Route::Lists, _) => {
                return Err(method_not_allowed(&["GET"]))
            }
            (Route::Board(_), _) => return Err(method_not_allowed(&["GET", "HEAD"])),
            (Route::List(name), &Method::GET) => {
                let version = query_value(req.uri().query(), "version")?.map(Version);
                (name, Call::Read(version))
            }
            (Route::List(name), &Method::PUT) => (name, Call::Create),
            (Route::List(_), _) => return Err(method_not_allowed(&["GET", "PUT"])),
            (Route::Write(name), &Method::POST) => {
                let caller = self.caller(&req, None)?;
                let body = body_text(req.into_body()).await?;
                let request = parse_write_request(&body)?;
                return self.ask(caller, name, Call::Write(request)).await;
            }
            (Route::Claim(name), &Method::POST) => {
                let (head, body) = req.into_parts();
                let req = Request::from_parts(head, ());
                let body = body_text(body).await?;
                let claim: ClaimRequest = if body.trim().is_empty() {
                    ClaimRequest::default()
                } else {
                    serde_json::from_str(&body).map_err(|e| {
                        error(
                            ErrorCode::InvalidValue,
                            None,
                            format!("not a claim ({e}): send {{\"agent\": \"…\", \"task\": \"…\"}}, both optional with a token"),
                        )
                    })?
                };
                let caller = self.caller(&req, claim.agent.as_deref())?;
                return self.ask(caller, name, Call::Claim(claim.task)).await;
            }
            (Route::Delegate(name), &Method::POST) => {
                let caller = self.caller(&req, None)?;
                let body = body_text(req.into_body()).await?;
                let d: DelegateRequest = serde_json::from_str(&body).map_err(|e| {
                    error(
                        ErrorCode::InvalidValue,
                        None,
                        format!("not a delegation ({e}): send {{\"task\": \"…\", \"agent\": \"…\", \"list\": \"…\"}} (list optional)"),
                    )
                })?;
                check_agent(&d.agent, "agent")?;
                let call = Call::Delegate {
                    task: d.task,
                    agent: d.agent,
                    list: d.list,
                };
                let Answer::Delegated(mut answer) = self.answer(caller, name, call).await? else {
                    return Err(error(
                        ErrorCode::Internal,
                        None,
                        "the hub answered a delegation with something else: retry",
                    ));
                };
                answer.token = self
                    .token_for(&answer.agent, &answer.list, &answer.parent)
                    .await?;
                let body = serde_json::to_vec(&answer)
                    .map_err(|e| error(ErrorCode::Internal, None, e.to_string()))?;
                return Ok((StatusCode::OK, body));
            }
            (Route::Write(_) | Route::Claim(_) | Route::Delegate(_), _) => {
                return Err(method_not_allowed(&["POST"]))
            }
            (Route::Wait(name), &Method::GET) => {
                let query = req.uri().query();
                let version = query_value(query, "version")?.ok_or_else(|| {
                    error(
                        ErrorCode::MissingField,
                        Some("version"),
                        "say which version to wait for: ?version=V (from a write's answer)",
                    )
                })?;
                let timeout_ms = match query_value(query, "timeout_ms")? {
                    None => WAIT_MS_DEFAULT,
                    Some(t) => t.parse().map_err(|_| {
                        error(
                            ErrorCode::InvalidValue,
                            Some("timeout_ms"),
                            format!("{t:?} is not a number of milliseconds"),
                        )
                    })?,
                };
                (name, Call::Wait(Version(version), timeout_ms))
            }
            (Route::History(name, task), &Method::GET) => {
                let limit = match query_value(req.uri().query(), "limit")? {
                    None => HISTORY_ENTRIES_MAX,
                    Some(l) => l
                        .parse::<usize>()
                        .ok()
                        .filter(|l| (1..=HISTORY_ENTRIES_MAX).contains(l))
                        .ok_or_else(|| {
                            error(
                                ErrorCode::InvalidValue,
                                Some("limit"),
                                format!("{l:?}: give a number of changes from 1 to {HISTORY_ENTRIES_MAX}"),
                            )
                        })?,
                };
                self.reader(&req)?;
                let history = self.history(&name, task, limit).await?;
                let body = serde_json::to_vec(&history)
                    .map_err(|e| error(ErrorCode::Internal, None, e.to_string()))?;
                return Ok((StatusCode::OK, body));
            }
            (Route::Events(_) | Route::Wait(_) | Route::History(..), _) => {
                return Err(method_not_allowed(&["GET"]))
            }
        };
        let caller = match call {
            Call::Read(_) | Call::Wait(..) => self.reader(&req)?,
            _ => self.caller(&req, None)?,
        };
        self.ask(caller, list, call).await
    }

    /// An event stream: subscribed to the list's live events first, then its snapshot
    /// read, then the store's events from where the reader resumes (`Last-Event-ID`,
    /// else `?from=`, else the last `?tail=` events, else the beginning).
    async fn events(
        &self,
        req: &Request<Incoming>,
        name: String,
    ) -> Result<Response<Body>, ApiError> {
        let caller = self.reader(req)?;
        let doc = swarmtodo_core::hub::list_id(&name)?;
        let from = match header(req, "last-event-id") {
            Some(id) => Some(id),
            None => query_value(req.uri().query(), "from")?,
        };
        let from: Option<u64> = match from {
            None => None,
            Some(s) => Some(s.trim().parse().map_err(|_| {
                error(
                    ErrorCode::InvalidValue,
                    Some("from"),
                    format!(
                        "{s:?} is not an event seq: use the `id` of the last event you received"
                    ),
                )
            })?),
        };
        let tail: Option<u64> = match query_value(req.uri().query(), "tail")? {
            None => None,
            Some(s) => Some(s.trim().parse().map_err(|_| {
                error(
                    ErrorCode::InvalidValue,
                    Some("tail"),
                    format!("{s:?} is not a number of events"),
                )
            })?),
        };
        let (reply, live) = oneshot::channel();
        self.to_hub
            .send(ToHub::Subscribe { list: doc, reply })
            .await
            .map_err(|_| stopping())?;
        let live = live.await.map_err(|_| stopping())?;
        let Answer::Snapshot(snapshot) = self.answer(caller, name, Call::Read(None)).await? else {
            return Err(error(
                ErrorCode::Internal,
                None,
                "a read answered with a write",
            ));
        };
        let from = match (from, tail) {
            (Some(from), _) => from,
            (None, None) => 0,
            // Read after the subscription: what is committed meanwhile comes both ways,
            // and the stream sends each event once.
            (None, Some(tail)) => live
                .last_seq(&self.past, doc)
                .await
                .map_err(|e| error(ErrorCode::Internal, None, format!("{e}: retry")))?
                .saturating_sub(tail),
        };
        let body = crate::stream::sse(self.past.clone(), doc, from, snapshot, live);
        let mut r = Response::new(body.boxed_unsync());
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        r.headers_mut().insert(
            hyper::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
        Ok(r)
    }

    /// A task's history, read from the list's past (the store, or in a cluster the
    /// list's log) and computed off the hub's task (a pass over the list's whole history
    /// costs tens of ms: no other list waits for it), at most
    /// [`HISTORY_READS_MAX`](crate::limits::HISTORY_READS_MAX) at once. What the past
    /// holds is everything the hub (the cluster) acknowledged.
    async fn history(
        &self,
        name: &str,
        task: String,
        limit: usize,
    ) -> Result<TaskHistory, ApiError> {
        let doc = swarmtodo_core::hub::list_id(name)?;
        let _turn = self.history_reads.acquire().await.map_err(|_| stopping())?;
        let unknown = || {
            error(
                ErrorCode::UnknownList,
                Some("list"),
                format!(
                    "no list is called {name:?}: create it (PUT /v1/lists/{{name}}) or write to it"
                ),
            )
        };
        let loaded = match self.past.document(doc).await {
            Ok(Some(l)) => l,
            Ok(None) => return Err(unknown()),
            Err(e) => return Err(error(ErrorCode::Internal, None, format!("{e}: retry"))),
        };
        tokio::task::spawn_blocking(move || {
            let doc = loaded.rebuild().map_err(|e| {
                error(
                    ErrorCode::Internal,
                    None,
                    format!("the stored list could not be read: {e}"),
                )
            })?;
            swarmtodo_core::model::task_history(&doc, &task, limit)
        })
        .await
        .map_err(|_| {
            error(
                ErrorCode::Internal,
                None,
                "reading the history failed: retry",
            )
        })?
    }

    /// A call answered as the JSON body of a 200.
    async fn ask(
        &self,
        caller: Caller,
        list: String,
        call: Call,
    ) -> Result<(StatusCode, Vec<u8>), ApiError> {
        let body = match self.answer(caller, list, call).await? {
            Answer::Snapshot(s) => serde_json::to_vec(&s),
            Answer::Written(w) => serde_json::to_vec(&w),
            Answer::Claimed(c) => serde_json::to_vec(&c),
            Answer::Waited(w) => serde_json::to_vec(&w),
            Answer::Delegated(d) => serde_json::to_vec(&d),
        };
        let body = body.map_err(|e| error(ErrorCode::Internal, None, e.to_string()))?;
        Ok((StatusCode::OK, body))
    }

    /// Hands a call to the hub task and waits for the core's answer.
    async fn answer(&self, caller: Caller, list: String, call: Call) -> Result<Answer, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.to_hub
            .send(ToHub::Call {
                caller,
                list,
                call,
                reply,
                forwarded: false,
            })
            .await
            .map_err(|_| stopping())?;
        answer.await.map_err(|_| stopping())?
    }

    /// On a hub with tokens, a new worker token for `agent` on list `list` (kept in the
    /// store by its SHA-256 before it is given out, and in a cluster shared with every
    /// hub); none on an open hub.
    async fn token_for(
        &self,
        agent: &str,
        list: &str,
        parent: &str,
    ) -> Result<Option<String>, ApiError> {
        let Access::Tokens(tokens) = &*self.access else {
            return Ok(None);
        };
        let failed = |e: String| {
            error(
                ErrorCode::Internal,
                None,
                format!("the task is delegated, but making its token failed ({e}): delegate it again for a token"),
            )
        };
        let token = crate::access::new_token().map_err(|e| failed(e.to_string()))?;
        let hash = crate::access::sha256(&token);
        self.store
            .add_token(hash, agent.to_owned(), list.to_owned(), parent.to_owned())
            .await
            .map_err(|e| failed(e.to_string()))?;
        tokens.add_made(hash, crate::access::delegated_identity(agent, list));
        // In a cluster, every hub admits it.
        if let Some(d) = &self.directory {
            crate::directory::share_token(&d.cluster, hash, agent, list, parent)
                .await
                .map_err(failed)?;
        }
        Ok(Some(token))
    }

    /// Who reads: the token's identity (required on a hub with tokens), else anyone.
    fn reader<B>(&self, req: &Request<B>) -> Result<Caller, ApiError> {
        match &*self.access {
            Access::Open => Ok(Caller {
                agent: header(req, AGENT_HEADER).unwrap_or_default(),
                identity: None,
                address: Some(self.address),
            }),
            Access::Tokens(_) => self.caller(req, None),
        }
    }

    /// Who writes: the token's identity (an agent `named` must be its own), or on a hub
    /// without tokens the agent the caller names (`named`, else `X-Swarmtodo-Agent`).
    fn caller<B>(&self, req: &Request<B>, named: Option<&str>) -> Result<Caller, ApiError> {
        match &*self.access {
            Access::Open => {
                let agent = named
                    .map(str::to_owned)
                    .or_else(|| header(req, AGENT_HEADER));
                let Some(agent) = agent else {
                    return Err(error(
                        ErrorCode::MissingField,
                        Some("agent"),
                        format!("say which agent you are: the {AGENT_HEADER} header (or `agent` in a claim)"),
                    ));
                };
                check_agent(&agent, "agent")?;
                Ok(Caller {
                    agent,
                    identity: None,
                    address: Some(self.address),
                })
            }
            Access::Tokens(tokens) => {
                let token = header(req, AUTHORIZATION.as_str())
                    .and_then(|h| h.strip_prefix("Bearer ").map(str::to_owned))
                    .ok_or_else(|| {
                        error(
                            ErrorCode::Unauthorized,
                            None,
                            "this hub needs a token: send `Authorization: Bearer YOUR_TOKEN`",
                        )
                    })?;
                let who = tokens.get(&token).ok_or_else(|| {
                    error(
                        ErrorCode::Unauthorized,
                        None,
                        "unknown token: ask the hub's operator for yours",
                    )
                })?;
                if let Some(named) = named.filter(|n| *n != who.agent) {
                    return Err(error(
                        ErrorCode::Forbidden,
                        Some("agent"),
                        format!(
                            "your token is {:?}'s: you may not act as {named:?}",
                            who.agent
                        ),
                    ));
                }
                Ok(Caller {
                    agent: who.agent.clone(),
                    identity: Some(who),
                    address: Some(self.address),
                })
            }
        }
    }
}

fn header<B>(req: &Request<B>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A request body as text, at most [`HTTP_BODY_BYTES_MAX`] bytes, arrived
/// within [`HTTP_BODY_TIMEOUT`] (a peer that sends its body slowly does not hold its
/// connection longer).
async fn body_text(body: Incoming) -> Result<String, ApiError> {
    let read = tokio::time::timeout(
        HTTP_BODY_TIMEOUT,
        Limited::new(body, HTTP_BODY_BYTES_MAX).collect(),
    )
    .await
    .map_err(|_| {
        error(
            ErrorCode::InvalidValue,
            None,
            format!("the body did not arrive within {HTTP_BODY_TIMEOUT:?}: send it whole, at once"),
        )
    })?;
    let bytes = read
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                error(
                    ErrorCode::LimitExceeded,
                    None,
                    format!("the body is over {HTTP_BODY_BYTES_MAX} bytes: split the write"),
                )
            } else {
                error(
                    ErrorCode::InvalidValue,
                    None,
                    format!("the body could not be read: {e}"),
                )
            }
        })?
        .to_bytes();
    String::from_utf8(bytes.to_vec())
        .map_err(|_| error(ErrorCode::InvalidValue, None, "the body is not UTF-8 JSON"))
}
