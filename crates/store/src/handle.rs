//! The async handle: a [`Db`] on its own thread, fed by a bounded queue.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use automerge::ChangeHash;
use tokio::sync::{mpsc, oneshot};

use super::{
    Batch, ChangeRecord, Commit, Db, DocId, ListInfo, Loaded, NewEvent, StoreError, StoredEvent,
    STORE_QUEUE_MAX,
};

/// A request run on the store thread; it answers on the oneshot channel it captured.
type Job = Box<dyn FnOnce(&mut Db) + Send>;

enum Msg {
    Job(Job),
    /// Close the connection, then say so.
    Close(oneshot::Sender<()>),
}

/// The store for async code: cheap to clone, every clone talks to one thread that owns
/// the SQLite connection. No method blocks the runtime.
///
/// - **Backpressure**: at most [`STORE_QUEUE_MAX`] requests wait for the thread; when
///   the queue is full a caller awaits a free slot, so a writer faster than the disk is
///   slowed down rather than buffered without bound.
/// - **Order**: requests from one task run in the order they were made (one FIFO queue,
///   one thread).
/// - **Cancellation**: a request that entered the queue runs even when the caller's
///   future is dropped (a write still commits); only its answer is lost.
/// - **Shutdown**: the thread ends when every clone is dropped (after the queued
///   requests) or at [`Store::close`]; afterwards calls fail with [`StoreError::Closed`].
#[derive(Clone)]
pub struct Store {
    /// Requests to the store thread; bounded so that a burst waits instead of growing.
    queue: mpsc::Sender<Msg>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("queued", &self.queued())
            .field("closed", &self.queue.is_closed())
            .finish()
    }
}

impl Store {
    /// Opens (creating when missing) the store file on a new store thread.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Store, StoreError> {
        let path = path.into();
        let (opened, opened_rx) = oneshot::channel();
        let (queue, requests) = mpsc::channel(STORE_QUEUE_MAX);
        spawn(move || match Db::open(&path) {
            Ok(db) => {
                let _ = opened.send(Ok(()));
                serve(db, requests);
            }
            Err(e) => {
                let _ = opened.send(Err(e));
            }
        })?;
        opened_rx.await.map_err(|_| StoreError::Closed)??;
        Ok(Store { queue })
    }

    /// Moves an open [`Db`] to a new store thread.
    pub fn spawn(db: Db) -> Result<Store, StoreError> {
        let (queue, requests) = mpsc::channel(STORE_QUEUE_MAX);
        spawn(move || serve(db, requests))?;
        Ok(Store { queue })
    }

    /// Requests waiting in the queue (at most [`STORE_QUEUE_MAX`]; a gauge for metrics).
    pub fn queued(&self) -> usize {
        STORE_QUEUE_MAX - self.queue.capacity()
    }

    /// [`Db::create_or_get_list`].
    pub async fn create_or_get_list(
        &self,
        name: impl Into<String>,
        doc_if_new: DocId,
    ) -> Result<(DocId, bool), StoreError> {
        let name = name.into();
        self.call(move |db| db.create_or_get_list(&name, doc_if_new))
            .await
    }

    /// [`Db::list_by_name`].
    pub async fn list_by_name(
        &self,
        name: impl Into<String>,
    ) -> Result<Option<ListInfo>, StoreError> {
        let name = name.into();
        self.call(move |db| db.list_by_name(&name)).await
    }

    /// [`Db::list_docs`].
    pub async fn list_docs(&self) -> Result<Vec<DocId>, StoreError> {
        self.call(|db| db.list_docs()).await
    }

    /// [`Db::list_by_doc`].
    pub async fn list_by_doc(&self, doc: DocId) -> Result<Option<ListInfo>, StoreError> {
        self.call(move |db| db.list_by_doc(doc)).await
    }

    /// [`Db::append_changes`].
    pub async fn append_changes(
        &self,
        doc: DocId,
        changes: Vec<ChangeRecord>,
    ) -> Result<usize, StoreError> {
        let batch = Batch {
            changes,
            ..Batch::default()
        };
        Ok(self.commit_merge(doc, batch).await?.changes_added)
    }

    /// [`Db::append_events`].
    pub async fn append_events(
        &self,
        doc: DocId,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        let batch = Batch {
            events,
            ..Batch::default()
        };
        Ok(self.commit_merge(doc, batch).await?.seqs)
    }

    /// [`Db::add_reported`].
    pub async fn add_reported(&self, doc: DocId, keys: Vec<String>) -> Result<(), StoreError> {
        let batch = Batch {
            reported: keys,
            ..Batch::default()
        };
        self.commit_merge(doc, batch).await.map(|_| ())
    }

    /// [`Db::commit_merge`]: returns once the batch is durable.
    pub async fn commit_merge(&self, doc: DocId, batch: Batch) -> Result<Commit, StoreError> {
        // Refused before it takes a place in the queue.
        batch.check()?;
        self.call(move |db| db.commit_merge(doc, &batch)).await
    }

    /// [`Db::commit_merges`].
    pub async fn commit_merges(
        &self,
        merges: Vec<(DocId, Batch)>,
    ) -> Result<Vec<Commit>, StoreError> {
        for (_, batch) in &merges {
            batch.check()?;
        }
        self.call(move |db| db.commit_merges(&merges)).await
    }

    /// [`Db::compact`].
    pub async fn compact(
        &self,
        doc: DocId,
        snapshot: Vec<u8>,
        heads: Vec<ChangeHash>,
    ) -> Result<ListInfo, StoreError> {
        self.call(move |db| db.compact(doc, &snapshot, &heads))
            .await
    }

    /// [`Db::load`]. Rebuilding the document ([`Loaded::rebuild`]) is left to the
    /// caller, off the runtime, so a large load does not hold the store thread.
    pub async fn load(&self, doc: DocId) -> Result<Option<Loaded>, StoreError> {
        self.call(move |db| db.load(doc)).await
    }

    /// [`Db::events_since`].
    pub async fn events_since(
        &self,
        doc: DocId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.call(move |db| db.events_since(doc, after_seq, limit))
            .await
    }

    /// [`Db::last_event_seq`].
    pub async fn last_event_seq(&self, doc: DocId) -> Result<u64, StoreError> {
        self.call(move |db| db.last_event_seq(doc)).await
    }

    /// [`Db::lists`].
    pub async fn lists(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<swarmtodo_proto::ListsPage, StoreError> {
        self.call(move |db| db.lists(after.as_deref(), limit)).await
    }

    /// [`Db::reported`].
    pub async fn reported(&self, doc: DocId) -> Result<Vec<String>, StoreError> {
        self.call(move |db| db.reported(doc)).await
    }

    /// [`Db::add_token`].
    pub async fn add_token(
        &self,
        token_sha256: [u8; 32],
        agent: String,
        list: String,
        parent: String,
    ) -> Result<(), StoreError> {
        self.call(move |db| db.add_token(token_sha256, &agent, &list, &parent))
            .await
    }

    /// [`Db::tokens`].
    pub async fn tokens(&self) -> Result<Vec<crate::db::MadeToken>, StoreError> {
        self.call(|db| db.tokens()).await
    }

    /// Runs the requests queued before this call, closes the connection and ends the
    /// thread. Other clones then fail with [`StoreError::Closed`].
    pub async fn close(self) -> Result<(), StoreError> {
        let (done, done_rx) = oneshot::channel();
        self.queue
            .send(Msg::Close(done))
            .await
            .map_err(|_| StoreError::Closed)?;
        done_rx.await.map_err(|_| StoreError::Closed)
    }

    /// Runs `f` on the store's thread, after what is queued before it: for work that
    /// spans several of [`Db`]'s calls (a cluster hub replaying a list's log into its
    /// store).
    pub async fn with_db<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    {
        self.call(f).await
    }

    /// Queues `f` (waiting for a slot when the queue is full) and awaits its answer.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    {
        let (answer, answer_rx) = oneshot::channel();
        let job: Job = Box::new(move |db| {
            // The caller may have gone away; the work is done all the same.
            let _ = answer.send(f(db));
        });
        self.queue
            .send(Msg::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer_rx.await.map_err(|_| StoreError::Closed)?
    }
}

fn spawn(f: impl FnOnce() + Send + 'static) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name("swarmtodo-store".into())
        .spawn(f)
        .map(|_| ())
        .map_err(StoreError::Thread)
}

/// The store thread: runs requests one at a time until every sender is gone or a
/// close request arrives.
fn serve(mut db: Db, mut requests: mpsc::Receiver<Msg>) {
    while let Some(msg) = requests.blocking_recv() {
        match msg {
            Msg::Job(job) => {
                // A panic is a bug; an open transaction rolls back as it unwinds. The
                // store stops rather than serve from a state nobody reasoned about.
                if std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut db))).is_err() {
                    tracing::error!(path = %db.path().display(), "a store request panicked: the store stops");
                    return;
                }
            }
            Msg::Close(done) => {
                let path = db.path().to_path_buf();
                drop(db);
                // Queued requests are dropped with their answer channels: their callers
                // see `Closed`.
                drop(requests);
                tracing::debug!(path = %path.display(), "store closed");
                let _ = done.send(());
                return;
            }
        }
    }
    tracing::debug!(path = %db.path().display(), "store thread ends: no handle left");
}
