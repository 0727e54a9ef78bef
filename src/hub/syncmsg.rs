//! Validation of Automerge sync messages (being written).
