//! The JSON API of a hub over plain HTTP/1.1, for programs that hold no replica (the
//! CLI, scripts, agents without Automerge): read, create, `todo_write`, claim, and the
//! event stream. One connection per call; the hub decides every call (a write answered
//! once durable).
//!
//! ```no_run
//! # async fn f() -> Result<(), swarmtodo_client::http::HttpError> {
//! use swarmtodo_client::http::Api;
//! let api = Api::new("http://127.0.0.1:7700")?.agent("worker-1");
//! let claimed = api.claim("sprint", None).await?;
//! println!("working on {}", claimed.task.content);
//! # Ok(()) }
//! ```

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::limits::{HTTP_ANSWER_BYTES_MAX, HTTP_TIMEOUT};
use swarmtodo_proto::{
    ApiError, ClaimAnswer, ClaimRequest, DelegateAnswer, DelegateRequest, Event, ListsPage,
    Snapshot, TaskHistory, WaitAnswer, WriteAnswer,
};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The hub refused the call: its stable code, and what to do.
    #[error("{0}")]
    Api(ApiError),
    /// The hub could not be reached, or answered something that is not the API.
    #[error("hub: {0}")]
    Transport(String),
}

impl From<std::io::Error> for HttpError {
    fn from(e: std::io::Error) -> Self {
        HttpError::Transport(e.to_string())
    }
}

/// What an event stream brings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    /// The list when the stream started.
    Snapshot(Snapshot),
    /// One event, in `seq` order.
    Event(Box<Event>),
}

/// A hub's JSON API, as one agent (or none, to read).
#[derive(Debug, Clone)]
pub struct Api {
    /// `host:port`.
    addr: String,
    token: Option<String>,
    agent: Option<String>,
}

/// Percent-encodes a path segment or query value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// The API of the hub at `hub`: `http://host:port`, `ws://host:port` (the sync
    /// URL) or `host:port`.
    pub fn new(hub: &str) -> Result<Api, HttpError> {
        let addr = hub
            .trim_start_matches("http://")
            .trim_start_matches("ws://")
            .split(['/', '?'])
            .next()
            .unwrap_or("")
            .to_owned();
        if addr.is_empty() || hub.starts_with("https://") || hub.starts_with("wss://") {
            return Err(HttpError::Transport(format!(
                "{hub:?} is not a hub address: give http://HOST:PORT"
            )));
        }
        Ok(Api {
            addr,
            token: None,
            agent: None,
        })
    }

    /// Calls with this token (`Authorization: Bearer`).
    pub fn token(mut self, token: impl Into<String>) -> Api {
        self.token = Some(token.into());
        self
    }

    /// Calls as this agent (on a hub without tokens; with one, the token says who).
    pub fn agent(mut self, agent: impl Into<String>) -> Api {
        self.agent = Some(agent.into());
        self
    }

    /// One page of the hub's lists, from the start or after key `after` (a page's
    /// `next`).
    pub async fn lists(&self, after: Option<&str>) -> Result<ListsPage, HttpError> {
        let mut path = "/v1/lists".to_owned();
        if let Some(a) = after {
            path.push_str(&format!("?after={}", encode(a)));
        }
        self.json("GET", &path, "").await
    }

    /// The changes that touched task `task` of the list: the latest `limit`, oldest
    /// first.
    pub async fn history(
        &self,
        list: &str,
        task: &str,
        limit: Option<usize>,
    ) -> Result<TaskHistory, HttpError> {
        let mut path = format!("/v1/lists/{}/tasks/{}/history", encode(list), encode(task));
        if let Some(l) = limit {
            path.push_str(&format!("?limit={l}"));
        }
        self.json("GET", &path, "").await
    }

    /// The list now, or at `version`.
    pub async fn read(&self, list: &str, version: Option<&str>) -> Result<Snapshot, HttpError> {
        let mut path = format!("/v1/lists/{}", encode(list));
        if let Some(v) = version {
            path.push_str(&format!("?version={}", encode(v)));
        }
        self.json("GET", &path, "").await
    }

    /// Creates the list (nothing happens if it exists) and reads it.
    pub async fn create(&self, list: &str) -> Result<Snapshot, HttpError> {
        self.json("PUT", &format!("/v1/lists/{}", encode(list)), "")
            .await
    }

    /// `todo_write` with a JSON request (`{"mode": "patch", "ops": […]}` or
    /// `{"mode": "replace", "tasks": […]}`); answered once durable.
    pub async fn write(&self, list: &str, request: &str) -> Result<WriteAnswer, HttpError> {
        let path = format!("/v1/lists/{}/todo_write", encode(list));
        self.json("POST", &path, request).await
    }

    /// Claims the task named, or the first ready one.
    pub async fn claim(&self, list: &str, task: Option<&str>) -> Result<ClaimAnswer, HttpError> {
        let body = ClaimRequest {
            agent: if self.token.is_some() {
                None
            } else {
                self.agent.clone()
            },
            task: task.map(str::to_owned),
        };
        let body = serde_json::to_string(&body).map_err(|e| HttpError::Transport(e.to_string()))?;
        self.json("POST", &format!("/v1/lists/{}/claim", encode(list)), &body)
            .await
    }

    /// Hands task `task` to agent `agent`, who works it as list `as_list` (default
    /// `{list}/{task}`): the task's status follows that list's. On a hub with tokens the
    /// answer carries a new worker token for the agent.
    pub async fn delegate(
        &self,
        list: &str,
        task: &str,
        agent: &str,
        as_list: Option<&str>,
    ) -> Result<DelegateAnswer, HttpError> {
        let body = DelegateRequest {
            task: task.to_owned(),
            agent: agent.to_owned(),
            list: as_list.map(str::to_owned),
        };
        let body = serde_json::to_string(&body).map_err(|e| HttpError::Transport(e.to_string()))?;
        self.json(
            "POST",
            &format!("/v1/lists/{}/delegate", encode(list)),
            &body,
        )
        .await
    }

    /// Waits until every agent syncing the list holds `version`, or `timeout_ms` (then
    /// the answer names those that do not).
    pub async fn wait(
        &self,
        list: &str,
        version: &str,
        timeout_ms: u64,
    ) -> Result<WaitAnswer, HttpError> {
        let path = format!(
            "/v1/lists/{}/wait?version={}&timeout_ms={timeout_ms}",
            encode(list),
            encode(version)
        );
        self.json("GET", &path, "").await
    }

    /// Follows the list's events after `from` (0: all of them): the snapshot first,
    /// then each event, handed to `each` until it returns false, the stream ends, or
    /// (with `idle`) nothing came for that long.
    pub async fn events(
        &self,
        list: &str,
        from: u64,
        idle: Option<std::time::Duration>,
        mut each: impl FnMut(StreamItem) -> bool,
    ) -> Result<(), HttpError> {
        let path = format!("/v1/lists/{}/events?from={from}", encode(list));
        // HTTP/1.0: the stream is the body until the connection closes (no chunks).
        let mut stream = self.send("GET", &path, "", "HTTP/1.0").await?;
        let (status, _) = read_head(&mut stream).await?;
        if status != 200 {
            let mut body = Vec::new();
            stream
                .take(HTTP_ANSWER_BYTES_MAX as u64)
                .read_to_end(&mut body)
                .await?;
            return Err(refusal(status, &body));
        }
        let mut kind = String::new();
        let mut line = String::new();
        // Idle counts from the last message: the hub's keep-alive comments do not count.
        let mut quiet_until = idle.map(|idle| tokio::time::Instant::now() + idle);
        loop {
            line.clear();
            let read = match quiet_until {
                Some(at) => {
                    match tokio::time::timeout_at(at, read_line(&mut stream, &mut line)).await {
                        Ok(read) => read?,
                        Err(_) => return Ok(()),
                    }
                }
                None => read_line(&mut stream, &mut line).await?,
            };
            if read == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if let Some(k) = line.strip_prefix("event: ") {
                kind = k.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ") {
                let item = if kind == "snapshot" {
                    serde_json::from_str(data).map(StreamItem::Snapshot)
                } else {
                    serde_json::from_str(data).map(|e| StreamItem::Event(Box::new(e)))
                };
                let item = item.map_err(|e| {
                    HttpError::Transport(format!("an event the client cannot read ({e})"))
                })?;
                if !each(item) {
                    return Ok(());
                }
                quiet_until = idle.map(|idle| tokio::time::Instant::now() + idle);
            }
        }
    }

    /// Opens a connection and sends one request.
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: &str,
        version: &str,
    ) -> Result<BufReader<TcpStream>, HttpError> {
        let stream = tokio::time::timeout(HTTP_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| HttpError::Transport(format!("{} did not answer", self.addr)))??;
        let mut head = format!(
            "{method} {path} {version}\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(a) = &self.agent {
            head.push_str(&format!("X-Swarmtodo-Agent: {a}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = BufReader::new(stream);
        stream.get_mut().write_all(head.as_bytes()).await?;
        stream.get_mut().write_all(body.as_bytes()).await?;
        Ok(stream)
    }

    /// One call whose answer is JSON of type `T` (or an [`ApiError`]).
    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<T, HttpError> {
        let call = async {
            let mut stream = self.send(method, path, body, "HTTP/1.1").await?;
            let (status, _) = read_head(&mut stream).await?;
            let mut answer = Vec::new();
            stream
                .take(HTTP_ANSWER_BYTES_MAX as u64)
                .read_to_end(&mut answer)
                .await?;
            Ok::<_, HttpError>((status, answer))
        };
        let (status, answer) = tokio::time::timeout(HTTP_TIMEOUT, call)
            .await
            .map_err(|_| HttpError::Transport(format!("no answer within {HTTP_TIMEOUT:?}")))??;
        if status != 200 {
            return Err(refusal(status, &answer));
        }
        serde_json::from_slice(&answer)
            .map_err(|e| HttpError::Transport(format!("an answer the client cannot read ({e})")))
    }
}

/// One line of an answer, at most [`HTTP_ANSWER_BYTES_MAX`] bytes (a longer one is an
/// error, not a buffer that grows with whatever the other end sends).
async fn read_line(
    stream: &mut BufReader<TcpStream>,
    line: &mut String,
) -> Result<usize, HttpError> {
    let read = (&mut *stream)
        .take(HTTP_ANSWER_BYTES_MAX as u64)
        .read_line(line)
        .await?;
    if read == HTTP_ANSWER_BYTES_MAX && !line.ends_with('\n') {
        return Err(HttpError::Transport(format!(
            "a line of the answer is over {HTTP_ANSWER_BYTES_MAX} bytes"
        )));
    }
    Ok(read)
}

/// The status line and headers of an answer.
async fn read_head(stream: &mut BufReader<TcpStream>) -> Result<(u16, Vec<String>), HttpError> {
    let mut line = String::new();
    read_line(stream, &mut line).await?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HttpError::Transport(format!("not an HTTP answer: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if read_line(stream, &mut line).await? == 0 || line.trim_end().is_empty() {
            return Ok((status, headers));
        }
        headers.push(line.trim_end().to_owned());
    }
}

fn refusal(status: u16, body: &[u8]) -> HttpError {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => HttpError::Api(e),
        Err(_) => HttpError::Transport(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    }
}
