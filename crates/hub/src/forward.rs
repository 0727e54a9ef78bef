//! Calls of the JSON API across a cluster (docs/DESIGN.md §10): a call that reaches a
//! hub which is not its list's authority is sent to the hub that is, over NATS, and
//! decided there as if it had arrived there — a write checked and repaired by the
//! authority, a claim decided by it in turn — and its answer comes back to the caller.
//!
//! The caller was admitted by the hub it reached (its token checked there); the hub it
//! is forwarded to takes who it is on that hub's word: the hubs of one cluster trust one
//! another, as they trust NATS (docs/DESIGN.md §7). A forwarded call is not forwarded
//! again: a hub that no longer holds the list when it arrives decides nothing and says
//! so, and the hub that sent it decides it itself, once (taking the list if it is free).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use swarmtodo_cluster::limits::FORWARD_WAIT_MAX;
use swarmtodo_cluster::{ClusterError, ForwardedCall};
use swarmtodo_core::hub::{list_id, Answer, Call, Caller};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{ApiError, ErrorCode};

use crate::channel::ToHub;
use crate::cluster::{until_moved, ClusterSide};
use crate::http::error;
use crate::limits::FORWARD_ANSWER_WAIT;

/// A call as one hub forwards it to another.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Forward {
    /// Who calls (admitted by the hub that forwards).
    pub(crate) caller: Caller,
    /// The list's name.
    pub(crate) list: String,
    /// What it asks.
    pub(crate) call: Call,
}

/// What a call gets.
type Reply = Result<Answer, ApiError>;

/// What the hub a call was forwarded to sends back.
#[derive(Debug, Serialize, Deserialize)]
enum Back {
    /// What it decided.
    Decided(Box<Reply>),
    /// It does not hold the list (any more): it decided nothing.
    NotHeld,
}

/// How long the forwarding hub waits for the answer to `call`: a wait's own time, and
/// [`FORWARD_ANSWER_WAIT`] more.
fn answer_wait(call: &Call) -> Duration {
    let own = match call {
        Call::Wait(_, ms) => Duration::from_millis(u64::try_from(*ms).unwrap_or(0)),
        _ => Duration::ZERO,
    };
    (own + FORWARD_ANSWER_WAIT).min(FORWARD_WAIT_MAX)
}

/// Sends `forward` to hub `holder` and answers `reply` with what it decided; a failure
/// (the holder stopped, did not answer in time) is answered `list_elsewhere`, naming it.
pub(crate) fn forward_in_background(
    side: ClusterSide,
    to_hub: mpsc::WeakSender<ToHub>,
    doc: DocumentId,
    holder: String,
    forward: Forward,
    reply: oneshot::Sender<Reply>,
) {
    tokio::spawn(async move {
        let cluster = side.cluster();
        let list = forward.list.clone();
        let back = match serde_json::to_vec(&forward) {
            Ok(body) => tokio::select! {
                got = cluster.forward(&holder, &body, answer_wait(&forward.call)) => got
                    .map_err(|e| elsewhere(&list, &holder, &e.to_string(), e.code()))
                    .and_then(|bytes| {
                        serde_json::from_slice::<Back>(&bytes).map_err(|e| {
                            let e = ClusterError::BadForward { hub: holder.clone(), why: e.to_string() };
                            elsewhere(&list, &holder, &e.to_string(), e.code())
                        })
                    })
                    .unwrap_or_else(|e| Back::Decided(Box::new(Err(e)))),
                () = until_moved(cluster, doc, &holder) => Back::Decided(Box::new(Err(elsewhere(
                    &list,
                    &holder,
                    "its lease ended before it answered (the call may have taken effect: read \
                     the list before retrying)",
                    "cluster_lease_lost",
                )))),
            },
            Err(e) => Back::Decided(Box::new(Err(error(
                ErrorCode::Internal,
                None,
                format!("the call could not be forwarded: {e}"),
            )))),
        };
        let answer = match back {
            Back::Decided(answer) => *answer,
            // That hub gave the list back: decided here, once, not forwarded again.
            Back::NotHeld => {
                side.forget_holder(&doc);
                tracing::debug!(
                    list,
                    holder,
                    "the hub a call went to no longer holds the list"
                );
                if let Some(to_hub) = to_hub.upgrade() {
                    let again = ToHub::Call {
                        caller: forward.caller,
                        list: forward.list,
                        call: forward.call,
                        reply,
                        forwarded: true,
                    };
                    let _ = to_hub.send(again).await;
                    return;
                }
                Err(elsewhere(
                    &list,
                    &holder,
                    "it no longer holds the list",
                    "list_elsewhere",
                ))
            }
        };
        tracing::debug!(list, holder, ok = answer.is_ok(), "call forwarded");
        if answer
            .as_ref()
            .is_err_and(|e| e.code == ErrorCode::ListElsewhere)
        {
            side.forget_holder(&doc);
        }
        // The caller may have gone away.
        let _ = reply.send(answer);
    });
}

/// `list_elsewhere`: the call forwarded to `holder` got no answer, and why.
fn elsewhere(list: &str, holder: &str, why: &str, code: &str) -> ApiError {
    error(
        ErrorCode::ListElsewhere,
        None,
        format!("list {list:?} is held by hub {holder}, which this hub forwarded the call to: {why} ({code}); retry"),
    )
}

/// Decides the calls other hubs forward to this one, each as a call of its own, until
/// the hub task is gone or NATS is for good (on the cluster's runtime, where the
/// calls are decoded and their answers encoded).
pub(crate) fn serve_forwarded(side: ClusterSide, to_hub: mpsc::WeakSender<ToHub>) {
    side.cluster().clone().spawn(async move {
        let mut calls = match side.cluster().forwarded().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "calls forwarded by other hubs cannot be received");
                return;
            }
        };
        while let Some(call) = calls.next().await {
            let Some(to_hub) = to_hub.upgrade() else {
                return;
            };
            tokio::spawn(decide(call, side.clone(), to_hub));
        }
    });
}

/// Hands one forwarded call to the hub task and sends its answer back.
async fn decide(call: ForwardedCall, side: ClusterSide, to_hub: mpsc::Sender<ToHub>) {
    let back = match serde_json::from_slice::<Forward>(&call.body) {
        // Sent here as the holder: a hub that no longer is does not take the list for it.
        Ok(f) if list_id(&f.list).is_ok_and(|doc| !side.holds(&doc)) => Back::NotHeld,
        Ok(f) => {
            let (reply, answer) = oneshot::channel();
            let asked = ToHub::Call {
                caller: f.caller,
                list: f.list,
                call: f.call,
                reply,
                forwarded: true,
            };
            drop(to_hub.send(asked).await);
            drop(to_hub);
            Back::Decided(Box::new(answer.await.unwrap_or_else(|_| {
                Err(error(
                    ErrorCode::Internal,
                    None,
                    "the hub stopped before it answered the forwarded call".to_owned(),
                ))
            })))
        }
        Err(e) => Back::Decided(Box::new(Err(error(
            ErrorCode::Internal,
            None,
            format!("a forwarded call that does not decode: {e}"),
        )))),
    };
    let body = serde_json::to_vec(&back).unwrap_or_default();
    let sent = match call.answer(&body).await {
        // Too large to go back whole: the caller is told so.
        Err(e @ ClusterError::TooLarge { .. }) => {
            let refused = Back::Decided(Box::new(Err(error(
                ErrorCode::LimitExceeded,
                None,
                format!("the answer cannot be forwarded between hubs: {e}; call the hub that holds the list"),
            ))));
            call.answer(&serde_json::to_vec(&refused).unwrap_or_default())
                .await
        }
        other => other,
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "the answer to a forwarded call was not sent");
    }
}
