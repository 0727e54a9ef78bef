//! What hubs send one another over NATS (docs/DESIGN.md §10), beside the log:
//!
//! - calls: a hub that is not a list's authority sends the call to the hub that is, on
//!   that hub's subject (`swarmtodo.call.<hub>`), and waits for its answer on an inbox
//!   of its own;
//! - sessions: a sync peer of a list held by another hub is carried there, its frames
//!   and the authority's answers each way on the receiving hub's subject
//!   (`swarmtodo.session.<hub>`), named by the session they belong to.
//!
//! Every message goes in parts of at most [`FORWARD_PART_BYTES_MAX`] (a stock server
//! takes 1 MiB a message; a read of a full list is larger), each numbered `i/n`, up to
//! [`FORWARD_BYTES_MAX`]. What they say is the hub's business: here they are bytes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap, Message, StatusCode, Subject, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::limits::{
    FORWARDS_PARTIAL_MAX, FORWARD_BYTES_MAX, FORWARD_PARTS_MAX, FORWARD_PART_BYTES_MAX,
    FORWARD_WAIT_MAX,
};
use crate::nats::log::PART;
use crate::{ClusterError, SessionMessage};

/// The subjects hubs receive forwarded calls on: this, then the hub's id.
pub const CALL_SUBJECT_PREFIX: &str = "swarmtodo.call.";

/// The subjects hubs receive their sessions' messages on: this, then the hub's id.
pub const SESSION_SUBJECT_PREFIX: &str = "swarmtodo.session.";

/// The header naming the session a message belongs to.
pub const SESSION: &str = "Swarmtodo-Session";

/// The header saying what a session's message is (the hub's words: open, frame, close).
pub const OP: &str = "Swarmtodo-Op";

/// The header numbering a session's messages in the direction they go (absent: 0).
pub const SEQ: &str = "Swarmtodo-Seq";

/// The subject hub `hub` receives forwarded calls on.
pub fn call_subject(hub: &str) -> String {
    format!("{CALL_SUBJECT_PREFIX}{hub}")
}

/// Subscribes to `subject`, the subscription on its way to the server when this returns.
async fn subscribe(client: &Client, subject: String) -> Result<Subscriber, ClusterError> {
    let subscribed = client
        .subscribe(subject)
        .await
        .map_err(|e| ClusterError::JetStream(e.to_string()))?;
    client
        .flush()
        .await
        .map_err(|e| ClusterError::JetStream(e.to_string()))?;
    Ok(subscribed)
}

/// Sends `body` to hub `to` and waits up to `wait` for its whole answer.
pub(crate) async fn forward(
    client: &Client,
    to: &str,
    body: &[u8],
    wait: Duration,
) -> Result<Vec<u8>, ClusterError> {
    let inbox = client.new_inbox();
    let mut answers = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| ClusterError::JetStream(e.to_string()))?;
    publish_parts(client, call_subject(to), Some(inbox), &[], body).await?;
    let collect = async {
        let mut whole = Whole::default();
        while let Some(m) = answers.next().await {
            if m.status == Some(StatusCode::NO_RESPONDERS) {
                return Err(ClusterError::NoResponder { hub: to.to_owned() });
            }
            match whole.take(&m) {
                Ok(Some(body)) => return Ok(body),
                Ok(None) => {}
                Err(why) => {
                    return Err(ClusterError::BadForward {
                        hub: to.to_owned(),
                        why,
                    })
                }
            }
        }
        Err(ClusterError::JetStream(
            "the connection to NATS closed".to_owned(),
        ))
    };
    let wait = wait.min(FORWARD_WAIT_MAX);
    tokio::time::timeout(wait, collect)
        .await
        .unwrap_or_else(|_| {
            Err(ClusterError::ForwardTimeout {
                hub: to.to_owned(),
                wait,
            })
        })
}

/// Publishes `body` in numbered parts to `subject` (with `reply` as each one's reply
/// subject, and the `extra` headers), refusing it whole when it is larger than
/// [`FORWARD_BYTES_MAX`].
async fn publish_parts(
    client: &Client,
    subject: String,
    reply: Option<String>,
    extra: &[(&str, &str)],
    body: &[u8],
) -> Result<(), ClusterError> {
    if body.len() > FORWARD_BYTES_MAX {
        return Err(ClusterError::TooLarge {
            what: "a forwarded call or answer",
            bytes: body.len(),
            max: FORWARD_BYTES_MAX,
        });
    }
    let body = Bytes::copy_from_slice(body);
    let n = body.len().div_ceil(FORWARD_PART_BYTES_MAX).max(1);
    for i in 0..n {
        let part = body
            .slice(i * FORWARD_PART_BYTES_MAX..((i + 1) * FORWARD_PART_BYTES_MAX).min(body.len()));
        let mut headers = HeaderMap::new();
        headers.insert(PART, format!("{}/{n}", i + 1).as_str());
        for (name, value) in extra {
            headers.insert(*name, *value);
        }
        let sent = match &reply {
            Some(r) => {
                client
                    .publish_with_reply_and_headers(subject.clone(), r.clone(), headers, part)
                    .await
            }
            None => {
                client
                    .publish_with_headers(subject.clone(), headers, part)
                    .await
            }
        };
        sent.map_err(|e| ClusterError::JetStream(e.to_string()))?;
    }
    client
        .flush()
        .await
        .map_err(|e| ClusterError::JetStream(e.to_string()))
}

/// One message made whole from its parts, which one sender sends in order.
#[derive(Debug, Default)]
struct Whole {
    parts: usize,
    body: Vec<u8>,
}

impl Whole {
    /// Takes part `m`: the whole body once it was the last part, an error when it is
    /// not the part expected next or the body grows past [`FORWARD_BYTES_MAX`].
    fn take(&mut self, m: &Message) -> Result<Option<Vec<u8>>, String> {
        let (i, n) = m
            .headers
            .as_ref()
            .and_then(|h| h.get(PART))
            .and_then(|v| {
                v.as_str()
                    .split_once('/')
                    .map(|(i, n)| (i.parse(), n.parse()))
            })
            .and_then(|(i, n)| Some((i.ok()?, n.ok()?)))
            .filter(|&(i, n): &(usize, usize)| (1..=n).contains(&i) && n <= FORWARD_PARTS_MAX)
            .ok_or_else(|| format!("a part without a valid {PART} header"))?;
        if i != self.parts + 1 {
            return Err(format!("part {i} of {n} came after part {}", self.parts));
        }
        if self.body.len() + m.payload.len() > FORWARD_BYTES_MAX {
            return Err(format!("more than the {FORWARD_BYTES_MAX} bytes allowed"));
        }
        self.parts = i;
        self.body.extend_from_slice(&m.payload);
        Ok((i == n).then(|| std::mem::take(&mut self.body)))
    }
}

/// Messages made whole from their parts, by what they are sent under (a call's answer
/// inbox, a session), at most [`FORWARDS_PARTIAL_MAX`] half received at once.
#[derive(Debug, Default)]
struct Wholes {
    partial: BTreeMap<String, (Whole, Instant)>,
}

impl Wholes {
    /// Takes part `m` of the message sent under `key`: the message once whole. A part
    /// that does not fit (out of order, too large, too many messages half received)
    /// drops its message, whose sender times out.
    fn take(&mut self, key: &str, m: &Message) -> Option<Vec<u8>> {
        // Messages whose sender gave up on them long ago are dropped.
        self.partial
            .retain(|_, (_, started)| started.elapsed() < FORWARD_WAIT_MAX);
        if !self.partial.contains_key(key) && self.partial.len() >= FORWARDS_PARTIAL_MAX {
            tracing::warn!(key, "too many messages half received: one more dropped");
            return None;
        }
        let (whole, _) = self
            .partial
            .entry(key.to_owned())
            .or_insert_with(|| (Whole::default(), Instant::now()));
        match whole.take(m) {
            Ok(Some(body)) => {
                self.partial.remove(key);
                Some(body)
            }
            Ok(None) => None,
            Err(why) => {
                tracing::warn!(key, why, "a message dropped");
                self.partial.remove(key);
                None
            }
        }
    }
}

/// The calls other hubs forward to this one, each made whole from its parts.
#[derive(Debug)]
pub struct Forwarded {
    client: Client,
    calls: Subscriber,
    /// Calls whose first parts came, by the inbox their answer goes to.
    partial: Wholes,
}

/// One call forwarded by another hub: answer it with [`ForwardedCall::answer`].
#[derive(Debug)]
pub struct ForwardedCall {
    /// What the other hub sent.
    pub body: Vec<u8>,
    client: Client,
    answer_to: Subject,
}

impl Forwarded {
    pub(crate) async fn subscribe(client: Client, hub: &str) -> Result<Forwarded, ClusterError> {
        let calls = subscribe(&client, call_subject(hub)).await?;
        Ok(Forwarded {
            client,
            calls,
            partial: Wholes::default(),
        })
    }

    /// The next whole call; `None` once the connection to NATS is gone for good. A
    /// part that does not fit (no answer inbox, out of order, too large, too many calls
    /// half sent) drops its call, whose sender times out.
    pub async fn next(&mut self) -> Option<ForwardedCall> {
        while let Some(m) = self.calls.next().await {
            let Some(answer_to) = m.reply.clone() else {
                tracing::warn!("a forwarded call without an inbox for its answer: dropped");
                continue;
            };
            if let Some(body) = self.partial.take(answer_to.as_str(), &m) {
                return Some(ForwardedCall {
                    body,
                    client: self.client.clone(),
                    answer_to,
                });
            }
        }
        None
    }
}

impl ForwardedCall {
    /// Sends the answer back to the hub that forwarded the call.
    pub async fn answer(&self, body: &[u8]) -> Result<(), ClusterError> {
        publish_parts(&self.client, self.answer_to.to_string(), None, &[], body).await
    }
}

/// Sends `body` to hub `to` as message `seq`, `op`, of session `session`.
pub(crate) async fn session_send(
    client: &Client,
    to: &str,
    session: &str,
    op: &str,
    seq: u64,
    body: &[u8],
) -> Result<(), ClusterError> {
    let subject = format!("{SESSION_SUBJECT_PREFIX}{to}");
    let seq = seq.to_string();
    let headers = [(SESSION, session), (OP, op), (SEQ, seq.as_str())];
    publish_parts(client, subject, None, &headers, body).await
}

/// The messages of the sessions other hubs hold with this one, each made whole.
#[derive(Debug)]
pub struct SessionMessages {
    messages: Subscriber,
    /// Messages whose first parts came, by session.
    partial: Wholes,
}

impl SessionMessages {
    pub(crate) async fn subscribe(
        client: &Client,
        hub: &str,
    ) -> Result<SessionMessages, ClusterError> {
        let messages = subscribe(client, format!("{SESSION_SUBJECT_PREFIX}{hub}")).await?;
        Ok(SessionMessages {
            messages,
            partial: Wholes::default(),
        })
    }

    /// The next whole message; `None` once the connection to NATS is gone for good. A
    /// part that does not fit (no session, out of order, too large, too many messages
    /// half sent) drops its message.
    pub async fn next(&mut self) -> Option<SessionMessage> {
        while let Some(m) = self.messages.next().await {
            let header = |name: &str| {
                m.headers
                    .as_ref()
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str().to_owned())
            };
            let (Some(session), Some(op)) = (header(SESSION), header(OP)) else {
                tracing::warn!("a session message without its session or op: dropped");
                continue;
            };
            let seq = header(SEQ).and_then(|s| s.parse().ok()).unwrap_or(0);
            if let Some(body) = self.partial.take(&session, &m) {
                return Some(SessionMessage {
                    session,
                    op,
                    seq,
                    body,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests a panic is the failure report.

    use super::*;

    fn part(i: usize, n: usize, payload: &[u8]) -> Message {
        let mut headers = HeaderMap::new();
        headers.insert(PART, format!("{i}/{n}").as_str());
        Message {
            subject: Subject::from("swarmtodo.call.hub-a"),
            reply: None,
            payload: Bytes::copy_from_slice(payload),
            headers: Some(headers),
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    #[test]
    fn past_forwards_partial_max_half_received_one_more_is_dropped_until_one_ends() {
        let mut wholes = Wholes::default();
        for k in 0..FORWARDS_PARTIAL_MAX {
            assert_eq!(wholes.take(&format!("inbox-{k}"), &part(1, 2, b"ab")), None);
        }
        // Full: another message is dropped, even one in a single part.
        assert_eq!(wholes.take("late", &part(1, 1, b"x")), None);
        assert_eq!(wholes.partial.len(), FORWARDS_PARTIAL_MAX);
        // One of those half received ends; then a new one goes through.
        assert_eq!(
            wholes.take("inbox-3", &part(2, 2, b"cd")),
            Some(b"abcd".to_vec())
        );
        assert_eq!(wholes.take("late", &part(1, 1, b"x")), Some(b"x".to_vec()));
        // A part out of order drops its message.
        assert_eq!(wholes.take("inbox-4", &part(1, 2, b"ab")), None);
        assert!(!wholes.partial.contains_key("inbox-4"));
    }
}
