//! Deterministic simulator of a Skyriver cluster.
