//! The file's settings and its versioned schema.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};

use super::{StoreError, STORE_BUSY_TIMEOUT_MS};

/// `PRAGMA application_id` of a swarmtodo store ("SWTD"): tells our files from other
/// SQLite databases.
pub const APPLICATION_ID: i32 = 0x5357_5444;

/// The schema version this build writes (`PRAGMA user_version`). Opening a file with a
/// newer version fails with [`StoreError::SchemaTooNew`]; an older one is migrated.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `MIGRATIONS[n]` takes a file from version `n` to `n + 1`, in one transaction.
///
/// Counters in `lists` (`changes`, `change_bytes`, `last_seq`) are kept by the same
/// transactions that change the rows they count, so reading them is O(1).
const MIGRATIONS: &[&str] = &[
    // 0 → 1: lists, snapshots, incremental changes, events, reported keys.
    "
    CREATE TABLE lists (
        id           INTEGER PRIMARY KEY,
        name         TEXT    NOT NULL UNIQUE CHECK (length(name) > 0),
        doc_id       BLOB    NOT NULL UNIQUE CHECK (length(doc_id) = 16),
        last_seq     INTEGER NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
        changes      INTEGER NOT NULL DEFAULT 0 CHECK (changes >= 0),
        change_bytes INTEGER NOT NULL DEFAULT 0 CHECK (change_bytes >= 0)
    ) STRICT;

    -- At most one per list: the last compaction. `heads` are 32-byte hashes, concatenated.
    CREATE TABLE snapshots (
        list_id INTEGER PRIMARY KEY REFERENCES lists (id),
        heads   BLOB    NOT NULL CHECK (length(heads) % 32 = 0),
        bytes   BLOB    NOT NULL
    ) STRICT;

    -- Changes since the snapshot, in append order (`id`). `deps` are 32-byte hashes,
    -- concatenated: compaction walks them from the snapshot's heads.
    CREATE TABLE changes (
        id      INTEGER PRIMARY KEY,
        list_id INTEGER NOT NULL REFERENCES lists (id),
        hash    BLOB    NOT NULL CHECK (length(hash) = 32),
        deps    BLOB    NOT NULL CHECK (length(deps) % 32 = 0),
        bytes   BLOB    NOT NULL,
        UNIQUE (list_id, hash)
    ) STRICT;

    CREATE TABLE events (
        list_id INTEGER NOT NULL REFERENCES lists (id),
        seq     INTEGER NOT NULL CHECK (seq > 0),
        kind    TEXT    NOT NULL CHECK (length(kind) > 0),
        json    TEXT    NOT NULL,
        PRIMARY KEY (list_id, seq)
    ) STRICT;

    CREATE TABLE reported (
        list_id INTEGER NOT NULL REFERENCES lists (id),
        key     TEXT    NOT NULL,
        PRIMARY KEY (list_id, key)
    ) STRICT, WITHOUT ROWID;
    ",
    // 1 → 2: what `GET /v1/lists` shows of each list, kept by the commits that change
    // it (a list stored before has no version and zero counts until its next change).
    "
    ALTER TABLE lists ADD COLUMN version TEXT;
    ALTER TABLE lists ADD COLUMN pending     INTEGER NOT NULL DEFAULT 0 CHECK (pending >= 0);
    ALTER TABLE lists ADD COLUMN in_progress INTEGER NOT NULL DEFAULT 0 CHECK (in_progress >= 0);
    ALTER TABLE lists ADD COLUMN completed   INTEGER NOT NULL DEFAULT 0 CHECK (completed >= 0);
    ALTER TABLE lists ADD COLUMN cancelled   INTEGER NOT NULL DEFAULT 0 CHECK (cancelled >= 0);
    ALTER TABLE lists ADD COLUMN blocked     INTEGER NOT NULL DEFAULT 0 CHECK (blocked >= 0);
    ",
    // 2 → 3: delegated tasks' lists and their links to the task (the hub's, not the
    // documents'); tokens the hub made for the agents they were handed to (a SHA-256 of
    // each, never the token).
    "
    CREATE TABLE links (
        list_id INTEGER PRIMARY KEY REFERENCES lists (id),
        parent  TEXT NOT NULL CHECK (length(parent) > 0),
        task    TEXT NOT NULL CHECK (length(task) > 0),
        agent   TEXT NOT NULL CHECK (length(agent) > 0),
        name    TEXT NOT NULL CHECK (length(name) > 0)
    ) STRICT;

    CREATE TABLE tokens (
        token_sha256 BLOB NOT NULL PRIMARY KEY CHECK (length(token_sha256) = 32),
        agent        TEXT NOT NULL CHECK (length(agent) > 0),
        list         TEXT NOT NULL CHECK (length(list) > 0),
        parent       TEXT NOT NULL CHECK (length(parent) > 0)
    ) STRICT;
    ",
];

/// Opens (creating when missing) the file and brings it to [`SCHEMA_VERSION`].
///
/// Durability: `journal_mode=WAL` with `synchronous=FULL`. In WAL mode `NORMAL` syncs
/// only at checkpoints, so a commit survives a crash of the process but may be rolled
/// back by a power loss or an OS crash; the hub acknowledges a write only once it is
/// durable (docs/DESIGN.md §8), so every commit syncs the WAL (`FULL`). `fullfsync` makes
/// that sync reach the disk on macOS too (a no-op elsewhere).
pub(crate) fn open(path: &Path) -> Result<Connection, StoreError> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_millis(STORE_BUSY_TIMEOUT_MS))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    let mode = set_wal(&conn)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotAStore {
            path: path.display().to_string(),
            reason: format!("journal mode stays {mode:?}, WAL is needed"),
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "fullfsync", true)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    migrate(&mut conn, path)?;
    Ok(conn)
}

/// Prepared statements kept per connection: more than the store uses (about 25), so
/// that none is prepared again on the commit path (rusqlite's default keeps 16, and a
/// profile of the hub under load showed ≈7 % of its time re-preparing them).
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// Pause between attempts to switch a new file to WAL while another connection holds it.
const WAL_RETRY_INTERVAL_MS: u64 = 10;

const _: () = assert!(WAL_RETRY_INTERVAL_MS < STORE_BUSY_TIMEOUT_MS);

/// Switches the file to WAL (persistent: done once per file) and returns the mode.
///
/// Changing the journal mode needs the file to itself, and SQLite answers `SQLITE_BUSY`
/// at once, without its busy handler, when several connections open a new file
/// together; so this retries for up to [`STORE_BUSY_TIMEOUT_MS`].
fn set_wal(conn: &Connection) -> Result<String, StoreError> {
    let mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
    if mode.eq_ignore_ascii_case("wal") {
        return Ok(mode);
    }
    let deadline = Instant::now() + Duration::from_millis(STORE_BUSY_TIMEOUT_MS);
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(WAL_RETRY_INTERVAL_MS));
            }
            other => return Ok(other?),
        }
    }
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let not_ours = |reason: String| StoreError::NotAStore {
        path: path.display().to_string(),
        reason,
    };
    // IMMEDIATE: two processes opening a new file at once create the schema once.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let app: i32 = tx.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if app != APPLICATION_ID {
        let tables: i64 = tx.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))?;
        if app != 0 || tables > 0 || version != 0 {
            return Err(not_ours(format!(
                "application_id {app:#x}, user_version {version}, {tables} schema objects"
            )));
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < 0 {
        return Err(not_ours(format!("user_version {version}")));
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tracing::info!(path = %path.display(), from, to = from + 1, "store schema migrated");
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}
