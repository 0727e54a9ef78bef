//! Rebuilds of lists' documents from their snapshots (`Compaction::rebuild`), on one
//! thread of their own at the lowest priority the system has (`SCHED_IDLE` on Linux): a
//! load costs the list's size (200 ms at 60,000 changes), lists that grow together ask
//! for theirs together, and none of it may take the core from the hub's task — a
//! rebuild only gives memory back, and it may wait. Each rebuilt document goes back to
//! the hub task as [`ToHub::Rebuilt`]; the hub task applies the changes made meanwhile.

use std::sync::mpsc as std_mpsc;

use tokio::sync::mpsc;

use crate::channel::ToHub;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::persist;

/// The rebuilding thread's queue.
#[derive(Debug)]
pub(crate) struct Rebuilder {
    queue: std_mpsc::Sender<(DocumentId, Vec<u8>)>,
}

impl Rebuilder {
    /// Starts the thread; its documents go to `to_hub` (it ends with the hub).
    pub(crate) fn start(to_hub: mpsc::WeakSender<ToHub>) -> std::io::Result<Rebuilder> {
        let (queue, jobs) = std_mpsc::channel::<(DocumentId, Vec<u8>)>();
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

    /// Queues a rebuild of list `doc` from `snapshot`.
    pub(crate) fn rebuild(&self, doc: DocumentId, snapshot: Vec<u8>) {
        if self.queue.send((doc, snapshot)).is_err() {
            tracing::warn!(%doc, "the rebuilding thread is gone; the list keeps its document");
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
