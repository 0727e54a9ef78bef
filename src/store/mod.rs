//! Durable storage of lists and events in SQLite (being written).
