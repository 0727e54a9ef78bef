//! automerge-repo wire messages (being written).
