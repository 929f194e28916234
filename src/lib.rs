//! Skyriver: node daemon, client library and CLI.
