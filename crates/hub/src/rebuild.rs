//! Rebuilds of lists' documents from their snapshots (`Compaction::rebuild`), on one
//! thread of their own at the lowest priority the system has (`SCHED_IDLE` on Linux): a
//! load costs the list's size (200 ms at 60,000 changes), lists that grow together ask
//! for theirs together, and none of it may take the core from the hub's task — a
//! rebuild only gives memory back, and it may wait. Each rebuilt document goes back to
//! the hub task as [`ToHub::Rebuilt`]; the hub task applies the changes made meanwhile.

use std::sync::mpsc as std_mpsc;

use tokio::sync::mpsc;

use crate::channel::ToHub;
use crate::limits::REBUILDS_QUEUED_MAX;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::persist;

/// The rebuilding thread's queue.
#[derive(Debug)]
pub(crate) struct Rebuilder {
    queue: std_mpsc::SyncSender<(DocumentId, Vec<u8>)>,
}

impl Rebuilder {
    /// Starts the thread; its documents go to `to_hub` (it ends with the hub).
    pub(crate) fn start(to_hub: mpsc::WeakSender<ToHub>) -> std::io::Result<Rebuilder> {
        let (queue, jobs) = std_mpsc::sync_channel::<(DocumentId, Vec<u8>)>(REBUILDS_QUEUED_MAX);
        std::thread::Builder::new()
            .name("swarmtodo-rebuild".to_owned())
            .spawn(move || {
                lowest_priority();
                for (doc, snapshot) in jobs {
                    let Some(rebuilt) = persist::rebuild(&doc, &snapshot) else {
                        continue;
                    };
                    drop(snapshot);
                    let Some(to_hub) = to_hub.upgrade() else {
                        return;
                    };
                    if to_hub
                        .blocking_send(ToHub::Rebuilt(doc, Box::new(rebuilt)))
                        .is_err()
                    {
                        return;
                    }
                }
            })?;
        Ok(Rebuilder { queue })
    }

    /// Queues a rebuild of list `doc` from `snapshot`; false when it is skipped (past
    /// [`REBUILDS_QUEUED_MAX`] waiting, or the thread gone).
    pub(crate) fn rebuild(&self, doc: DocumentId, snapshot: Vec<u8>) -> bool {
        match self.queue.try_send((doc, snapshot)) {
            Ok(()) => true,
            Err(std_mpsc::TrySendError::Full(_)) => {
                tracing::info!(%doc, "rebuilds queued past REBUILDS_QUEUED_MAX: this one skipped");
                false
            }
            Err(std_mpsc::TrySendError::Disconnected(_)) => {
                tracing::warn!(%doc, "the rebuilding thread is gone; the list keeps its document");
                false
            }
        }
    }
}

/// Puts the calling thread at the lowest scheduling priority: it runs when nothing else
/// on its core wants to.
fn lowest_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid param;
        // lowering one's own priority needs no privilege.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if r != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "rebuilds run at normal priority");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

    use super::*;

    /// Rebuilds come back in order; while the hub task does not take them, past
    /// `REBUILDS_QUEUED_MAX` waiting the next is skipped, and none is lost before.
    #[tokio::test]
    async fn rebuilds_wait_up_to_rebuilds_queued_max_then_are_skipped() {
        let (to_hub, mut rx) = mpsc::channel::<ToHub>(1);
        let rebuilder = Rebuilder::start(to_hub.downgrade()).unwrap();
        let snapshot = automerge::Automerge::new().save();
        let doc = |n: u8| DocumentId::from_bytes([n; 16]);
        // One taken by the thread and sent, one taken and blocked on the full channel,
        // then the queue: all accepted up to the bound.
        assert!(rebuilder.rebuild(doc(0), snapshot.clone()));
        let first = rx.recv().await.unwrap();
        assert!(matches!(first, ToHub::Rebuilt(d, _) if d == doc(0)));
        let mut accepted = 0;
        let mut n = 1u8;
        while rebuilder.rebuild(doc(n), snapshot.clone()) {
            accepted += 1;
            n += 1;
            assert!(accepted <= REBUILDS_QUEUED_MAX + 2, "never skipped");
            // Let the thread take what it can before the next.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert!(accepted >= REBUILDS_QUEUED_MAX, "{accepted} accepted");
        // Every accepted one comes back, in order.
        for k in 1..=accepted {
            match rx.recv().await.unwrap() {
                ToHub::Rebuilt(d, _) => assert_eq!(d, doc(k as u8)),
                other => panic!("{other:?}"),
            }
        }
        drop(to_hub);
    }
}
