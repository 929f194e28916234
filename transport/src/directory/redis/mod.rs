//! The Redis directory, for real clusters: every daemon talks to one Redis server.
//!
//! Keys, all under `skyriver:{CLUSTER}:` (the braces make the cluster name a Redis Cluster hash
//! tag, so one cluster's keys share a slot):
//!
//! | key / channel                  | type    | holds                                           |
//! |--------------------------------|---------|-------------------------------------------------|
//! | `token`                        | string  | the token's record (`token_record`), with a TTL |
//! | `nodes`                        | set     | node ids that registered (an index; pruned)     |
//! | `node:<ID>`                    | string  | the node's [`MemberInfo`] as JSON, with a TTL   |
//! | `deadlines`                    | zset    | node id → when its `node:` key expires (ms, by  |
//! |                                |         | the Redis server's clock)                       |
//! | `obj:<HEX>`                    | hash    | node id → `"<incarnation> <data> <metadata>"`   |
//! | `held:<ID>:<INC>`              | set     | objects node ID published in incarnation INC    |
//! | `held`                         | set     | `"<ID>:<INC>"` of every `held:` set (an index)  |
//! | `published:<HEX>` (channel)    | pub/sub | `"<node> <incarnation> <data> <metadata>"`, or  |
//! |                                |         | a lookup marker `"mark <NONCE> <SEQ>"`          |
//! | `members` (channel)            | pub/sub | `"join <ID>"` / `"leave <ID>"`                  |
//!
//! Liveness: a node is alive while its `node:<ID>` key exists; it refreshes the key's TTL every
//! heartbeat, so a dead or cut-off node expires after the TTL. The first node of a cluster sets
//! `token`; every live node refreshes its TTL too, so the token outlives the cluster by at most
//! `token_ttl` once no node is alive, and the name can then be started with another token. A
//! node that stops cleanly ([`Directory::leave`](super::Directory::leave)) deletes its node key and its holder entries at
//! once; the last one to leave deletes the token. [`reset`] removes a cluster's keys by hand. A holder entry counts only while
//! its node is alive with the same incarnation; stale entries are deleted when a lookup meets
//! them, and all of a gone incarnation's entries are deleted (through its `held:` set) by the
//! live node that notices its node key expired, and by every node as it joins (so a restarted
//! daemon drops its previous incarnation's, and the first node of a restarted cluster those of
//! nodes that died while none ran); an `obj:` hash goes with its last holder. Each node keeps a view of the members: a `join` message on the `members` channel
//! makes it read that node's entry, a `leave` drops it. Every heartbeat writes, with the node
//! key's TTL, its deadline into `deadlines` (scored by Redis's own `TIME`, so the nodes' clocks
//! do not matter); every member refresh interval each node asks only for the overdue ids
//! (`EXPIRE_OVERDUE`), so noticing expiries costs O(expired), not O(members). Each node re-reads
//! every member as it connects, after a members message it did not understand, while some
//! registered node has no deadline (an earlier version's, which writes none: then as before, at
//! every interval), and every [`FULL_REREAD_EVERY`]th interval as a safety net.
//!
//! Waiting for an object uses pub/sub, never polling: a `Lookup` with `subscribe` first
//! SUBSCRIBEs to the object's channel (confirmed by Redis), then reads the holders and, in the
//! same script, announces a lookup marker on the channel; a publication message fires the
//! subscription only if it arrives after that marker (was published after the lookup), so a
//! stale message cannot fire a newer subscription. A node's own publication fires its own
//! subscription before the publish is answered, as the core registry does (its message, arriving
//! later, is ignored). Publish is `HSET` +
//! `PUBLISH` in one script; requests queued together go in one pipeline.
//!
//! The node side is the same reconnecting client and sans-IO session as the built-in
//! directory's (`directory::client`); what differs is the link: an adapter task
//! (`redis::adapter`) that answers the registry protocol from Redis. So when Redis is unreachable,
//! requests are answered `Unavailable` within the request timeout, the driver gets
//! `Health(Err)`, and the session reconnects with backoff; then it registers the node again,
//! re-publishes what the node holds, re-subscribes and re-checks what it waits for, and sends
//! `Health(Ok)`. A restarted daemon (same fabric address, higher incarnation) takes over its
//! node id at once; another daemon with a live node id is refused until that one expires.
//!
//! The rules are the core registry's (`skyriver_core::registry`), re-implemented here in Lua
//! scripts and the adapter. They are checked against it, not against a model of Redis: the
//! conformance suite (`transport/tests/directory_conformance.rs`) and a seeded differential
//! test (`transport/tests/directory_differential.rs`) run the same requests through the core
//! registry and through a real Redis and Redis Cluster, and compare every reply and event.

mod adapter;
pub mod cluster;
mod connection;
mod reset;
mod token_record;

use std::sync::Arc;
use std::time::Duration;

use std::path::{Path, PathBuf};

use ::redis::{Client, IntoConnectionInfo, TlsCertificates};
use skyriver_core::directory::MemberInfo;
use skyriver_core::registry::session::{DirectorySession, SessionConfig};
use skyriver_core::{ContentDigest, NodeId, ObjectId, ObjectSizes};

pub use reset::{reset, ResetError, ResetFailure, ResetOutcome};
pub use token_record::KdfCost;

use super::client::{self, ClientTiming, DirectoryClient};
use super::{DirectoryError, LinkError, NoticeSender};

/// Most pending one-shot subscriptions of one node.
pub const MAX_SUBSCRIPTIONS_PER_NODE: usize = 65_536;
/// Most requests queued for Redis; more are answered `Unavailable` at once.
pub const MAX_QUEUED_REQUESTS: usize = 65_536;
/// Most requests in one pipeline.
const MAX_BATCH: usize = 512;
/// Most commands in one re-registration pipeline.
const RESYNC_CHUNK: usize = 512;

/// Deletes a holder entry only if it still holds the stale value (the node may have
/// re-published meanwhile).
const DELETE_IF_UNCHANGED: &str =
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0";
/// One id names one content: sets this node's holder entry (`ARGV[1]` → `ARGV[2]`) in the
/// object's hash (`KEYS[1]`) and announces it on the object's channel (`KEYS[2]`, message
/// `ARGV[4]`) unless another node's entry names another content than `ARGV[3]` (see
/// `content_value`); then it returns those entries (field, value, ...), which the adapter
/// checks for liveness (a dead node's entry is deleted and the publish run again), and sets
/// nothing — but drops this node's own entry if it has one: listed with the id's content, it
/// now holds another, so its copy of that content is gone (a withdrawal lost while it was cut
/// off) and lookups must not send requesters to it (the core registry's rule).
macro_rules! publish_same_content {
    ($publish:literal) => {
        concat!(
            "local entries = redis.call('HGETALL', KEYS[1]) \
     local conflicts = {} \
     local listed = false \
     for i = 1, #entries, 2 do \
       if entries[i] == ARGV[1] then \
         listed = true \
       elseif string.match(entries[i + 1], '^%S+ (.*)$') ~= ARGV[3] then \
         table.insert(conflicts, entries[i]) table.insert(conflicts, entries[i + 1]) \
       end \
     end \
     if #conflicts > 0 then \
       if listed then redis.call('HDEL', KEYS[1], ARGV[1]) end \
       return conflicts \
     end \
     redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) \
     redis.call('",
            $publish,
            "', KEYS[2], ARGV[4]) \
     return conflicts"
        )
    };
}
/// A lookup that starts a subscription: reads the object's holder entries (`KEYS[1]`, as
/// `HGETALL` returns them) and, in the same atomic step, announces `ARGV[1]` (a lookup marker,
/// `"mark <NONCE> <SEQ>"`) on the object's channel (`KEYS[2]`). The subscriber's connection
/// delivers a channel's messages in the order they were published, so a publication message
/// that arrives before the marker was published before the lookup read the holders: it is
/// stale for the subscription the lookup starts (see `adapter::Subscription`). Other
/// subscribers ignore markers that are not theirs.
macro_rules! lookup_and_mark {
    ($publish:literal) => {
        concat!(
            "local entries = redis.call('HGETALL', KEYS[1]) \
     redis.call('",
            $publish,
            "', KEYS[2], ARGV[1]) \
     return entries"
        )
    };
}
/// The subscribing lookup for one Redis server (see `lookup_and_mark`).
const LOOKUP_AND_MARK: &str = lookup_and_mark!("PUBLISH");
/// [`LOOKUP_AND_MARK`] for Redis Cluster: the marker on the object's sharded channel.
const SLOOKUP_AND_MARK: &str = lookup_and_mark!("SPUBLISH");
/// What a lookup marker's message starts with (a publication's starts with a node id).
const MARKER_PREFIX: &str = "mark ";

/// The publish script for one Redis server (see `publish_same_content`).
const PUBLISH_SAME_CONTENT: &str = publish_same_content!("PUBLISH");
/// [`PUBLISH_SAME_CONTENT`] for Redis Cluster: the announcement on the object's sharded channel.
const SPUBLISH_SAME_CONTENT: &str = publish_same_content!("SPUBLISH");
/// Drops a node id (`ARGV[1]`) from the index (`KEYS[2]`) and the deadlines (`KEYS[3]`) only if
/// its node key (`KEYS[1]`) is gone; returns whether the index held it.
const PRUNE_IF_EXPIRED: &str = "if redis.call('EXISTS', KEYS[1]) == 0 then \
       redis.call('ZREM', KEYS[3], ARGV[1]) \
       return redis.call('SREM', KEYS[2], ARGV[1]) \
     end return 0";

/// A heartbeat's liveness write: sets the node key (`KEYS[1]`) to `ARGV[1]` with a TTL of
/// `ARGV[2]` ms and scores node `ARGV[3]` in the deadlines (`KEYS[2]`) with when that TTL runs
/// out by the Redis server's clock (`TIME`; scripts replicate their effects, so this is
/// deterministic for replicas).
const HEARTBEAT: &str = "local t = redis.call('TIME') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
     redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[3]) \
     return 0";

/// The periodic expiry check: up to `ARGV[2]` ids whose deadline (`KEYS[2]`) passed by the
/// Redis server's clock. One whose node key (`ARGV[1]` + id) is alive after all (an earlier
/// version's daemon took the id over, and writes no deadline) gets its key's remaining TTL as
/// deadline; a key without TTL loses its deadline. A gone one loses its deadline and its index
/// entry (`KEYS[1]`), as [`PRUNE_IF_EXPIRED`]. Returns how many registered nodes have no
/// deadline (index size minus deadlines; positive only while an earlier version's nodes run,
/// which the caller then re-reads whole), then the ids this call dropped from the index.
const EXPIRE_OVERDUE: &str = "local t = redis.call('TIME') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     local gone = {} \
     for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. now, 'LIMIT', 0, ARGV[2])) do \
       local left = redis.call('PTTL', ARGV[1] .. id) \
       if left > 0 then redis.call('ZADD', KEYS[2], now + left, id) \
       else \
         redis.call('ZREM', KEYS[2], id) \
         if left == -2 and redis.call('SREM', KEYS[1], id) == 1 then table.insert(gone, id) end \
       end \
     end \
     table.insert(gone, 1, redis.call('SCARD', KEYS[1]) - redis.call('ZCARD', KEYS[2])) \
     return gone";

/// Every this many member refresh intervals a node re-reads every member (index and node keys)
/// instead of asking only for the overdue ones: a safety net for what the members channel may
/// have lost (pub/sub delivers at most once) while the connection stayed up. Counted in
/// intervals, not seconds, so its share of the cost stays 1/15 of the old every-interval
/// re-read whatever the interval (30 s at the default 2 s).
pub const FULL_REREAD_EVERY: u32 = 15;

/// Drops up to `ARGV[4]` holder entries of node `ARGV[2]`'s incarnation `ARGV[3]` (its
/// `held:` set; keys are `ARGV[1]` + name) unless that incarnation is alive (its node key holds
/// it): pops them from the set and deletes each object's entry if the entry is of that
/// incarnation (a hash left without holders goes with its last field). Once the set is empty
/// its index entry goes too. Returns -1 if the incarnation is alive, else how many are left.
const DROP_STALE_HOLDERS: &str = "local p = ARGV[1] \
     local record = redis.call('GET', p .. 'node:' .. ARGV[2]) \
     if record then \
       local ok, member = pcall(cjson.decode, record) \
       if ok and type(member) == 'table' and tostring(member.incarnation) == ARGV[3] then return -1 end \
     end \
     local set = p .. 'held:' .. ARGV[2] .. ':' .. ARGV[3] \
     for _, id in ipairs(redis.call('SPOP', set, ARGV[4])) do \
       local key = p .. 'obj:' .. id \
       local entry = redis.call('HGET', key, ARGV[2]) \
       if entry and string.match(entry, '^%d+') == ARGV[3] then redis.call('HDEL', key, ARGV[2]) end \
     end \
     local left = redis.call('SCARD', set) \
     if left == 0 then redis.call('SREM', p .. 'held', ARGV[2] .. ':' .. ARGV[3]) end \
     return left";

/// [`DROP_STALE_HOLDERS`] for Redis Cluster, where objects live in other slots than the
/// membership: the same liveness check and pop on the `held:` set (`KEYS[1]`, named as there),
/// but the popped object ids are returned (after how many are left, or -1 alone if the
/// incarnation is alive) for the adapter to drop their entries with [`DROP_ENTRY_OF_INCARNATION`].
const POP_STALE_HOLDERS: &str = "local p = ARGV[1] \
     local record = redis.call('GET', p .. 'node:' .. ARGV[2]) \
     if record then \
       local ok, member = pcall(cjson.decode, record) \
       if ok and type(member) == 'table' and tostring(member.incarnation) == ARGV[3] then return {-1} end \
     end \
     local ids = redis.call('SPOP', KEYS[1], ARGV[4]) \
     local left = redis.call('SCARD', KEYS[1]) \
     if left == 0 then redis.call('SREM', p .. 'held', ARGV[2] .. ':' .. ARGV[3]) end \
     table.insert(ids, 1, left) \
     return ids";
/// Deletes node `ARGV[1]`'s holder entry in the object hash `KEYS[1]` if it is of incarnation
/// `ARGV[2]`.
const DROP_ENTRY_OF_INCARNATION: &str = "local entry = redis.call('HGET', KEYS[1], ARGV[1]) \
     if entry and string.match(entry, '^%d+') == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end \
     return 0";

/// Sets the token record (`ARGV[1]`) with a TTL of `ARGV[2]` ms if `KEYS[1]` is absent,
/// refreshes the TTL if it holds the same record, and returns what the key holds.
const CLAIM_TOKEN: &str = "local v = redis.call('GET', KEYS[1]) \
     if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return ARGV[1] end \
     if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
     return v";
/// A clean leave: deletes the node key (`KEYS[1]`) if it still holds this daemon's record
/// (`ARGV[1]`), drops its id (`ARGV[2]`) from the index (`KEYS[2]`) and the deadlines
/// (`KEYS[4]`), and when no registered node is alive any more (node keys are `ARGV[3]` + id)
/// deletes the index, the deadlines and the token (`KEYS[3]`) if it holds this cluster's token
/// record (`ARGV[4]`). Returns the nodes still alive.
const LEAVE: &str = "local mine = redis.call('GET', KEYS[1]) \
     if mine == ARGV[1] then redis.call('DEL', KEYS[1]) end \
     if mine == ARGV[1] or not mine then \
       redis.call('SREM', KEYS[2], ARGV[2]) \
       redis.call('ZREM', KEYS[4], ARGV[2]) \
     end \
     local alive = 0 \
     for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do \
       if redis.call('EXISTS', ARGV[3] .. id) == 1 then alive = alive + 1 end \
     end \
     if alive == 0 then \
       redis.call('DEL', KEYS[2], KEYS[4]) \
       if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end \
     end \
     return alive";

/// Default TTL of a cluster's token key once no node refreshes it.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(30);

/// How a node uses Redis.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[USER:PASSWORD@]HOST:PORT[/DB]`, or `rediss://…` for TLS; for Redis Cluster
    /// `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]` (seed nodes), or
    /// `rediss-cluster://…` for TLS.
    pub url: String,
    /// For `rediss://`: trust this CA (PEM) instead of the system's roots. Defaults to
    /// `$SKYRIVER_REDIS_CA`.
    pub tls_ca_file: Option<PathBuf>,
    /// The cluster's name: keys live under `skyriver:{cluster}:`.
    pub cluster: String,
    /// Bound on every command or pipeline; past it Redis counts as unreachable.
    pub request_timeout: Duration,
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// The node key's TTL is refreshed this often.
    pub heartbeat_interval: Duration,
    /// TTL of the node key: a node not heard from for this long is gone.
    pub node_ttl: Duration,
    /// TTL of the token key, refreshed by every live node's heartbeat: once no node is alive,
    /// the cluster's name can be taken with another token after at most this long.
    pub token_ttl: Duration,
    /// Cost of the token record (Argon2id) when this node is the first of its cluster; later
    /// nodes use the cost stored in the record.
    pub token_kdf: KdfCost,
    /// Expired nodes are looked for this often (only the overdue ones are read); every
    /// [`FULL_REREAD_EVERY`]th time the whole member list is re-read.
    pub member_refresh_interval: Duration,
    /// How long the first connection waits for a previous daemon's key with this node id to
    /// expire.
    pub join_timeout: Duration,
    /// First delay between reconnection attempts; doubles up to `reconnect_backoff_max`.
    pub reconnect_backoff_min: Duration,
    /// Longest delay between reconnection attempts.
    pub reconnect_backoff_max: Duration,
}

impl RedisConfig {
    /// Defaults: 1 s request and connect timeouts, 1 s heartbeat, 5 s node TTL, 30 s token
    /// TTL, token record at [`KdfCost::default`], expiries looked for every 2 s, reconnect backoff 100 ms to 5 s.
    pub fn new(url: impl Into<String>, cluster: &str) -> Self {
        Self {
            url: url.into(),
            tls_ca_file: std::env::var_os(REDIS_CA_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            cluster: cluster.to_string(),
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(1),
            node_ttl: Duration::from_secs(5),
            token_ttl: DEFAULT_TOKEN_TTL,
            token_kdf: KdfCost::default(),
            member_refresh_interval: Duration::from_secs(2),
            join_timeout: Duration::from_secs(8),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
        }
    }
}

/// Names the CA file (PEM) a `rediss://` connection trusts instead of the system's roots.
pub const REDIS_CA_ENV: &str = "SKYRIVER_REDIS_CA";

/// Why [`open_client`] made no client. Never holds the URL (it may carry a password).
#[derive(Debug)]
pub(super) enum OpenClientError {
    /// The URL is not one Redis understands.
    BadUrl,
    /// The CA file cannot be read or used.
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: super::CaFileError,
    },
}

impl OpenClientError {
    fn ca_file(path: std::path::PathBuf, source: super::CaFileError) -> Self {
        OpenClientError::CaFile { path, source }
    }
}

/// A Redis client for `url`: plain for `redis://`; for `rediss://`, TLS with rustls (ring),
/// verifying the server against `ca_file` if given, else the system's roots.
pub(super) fn open_client(url: &str, ca_file: Option<&Path>) -> Result<Client, OpenClientError> {
    if url.starts_with("rediss://") {
        // One process-wide TLS provider; a second install (already done) is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let Some(path) = ca_file.filter(|_| url.starts_with("rediss://")) else {
        return Client::open(url).map_err(|_| OpenClientError::BadUrl);
    };
    let root_cert = std::fs::read(path)
        .map_err(|e| OpenClientError::ca_file(path.to_path_buf(), super::CaFileError::Read(e)))?;
    let info = url
        .into_connection_info()
        .map_err(|_| OpenClientError::BadUrl)?;
    Client::build_with_tls(
        info,
        TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        },
    )
    .map_err(|e| OpenClientError::ca_file(path.to_path_buf(), super::CaFileError::Use(e)))
}

/// Longest Redis password file read.
const MAX_PASSWORD_FILE_BYTES: u64 = 4096;

/// Why [`url_with_password_file`] made no URL.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    /// The URL is not a Redis one.
    #[error("--directory-password-file is for a Redis directory (redis://HOST:PORT)")]
    NotRedis,
    /// The URL carries credentials already.
    #[error(
        "the directory URL already has credentials: give the password either in the URL or \
         with --directory-password-file, not both"
    )]
    CredentialsInUrl,
    /// The file could not be opened or read.
    #[error("cannot read the Redis password file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Others than its owner may read the file.
    #[error(
        "the Redis password file {} has mode {mode:04o}: others than its owner may read it; \
         `chmod 600 {}` and start again", path.display(), path.display()
    )]
    Readable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is larger than a password.
    #[error("the Redis password file {} is over {MAX_PASSWORD_FILE_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file holds no password.
    #[error("the Redis password file {} is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// `url` (`redis://HOST:PORT…` or `rediss://…`, without credentials) with the password in the
/// file at `path` (its content without the trailing line break; only its owner may read it,
/// mode 0600 or stricter), so the password stays out of command lines and the environment.
pub fn url_with_password_file(url: &str, path: &Path) -> Result<String, PasswordFileError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let read_failed = |source| PasswordFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let (scheme, rest) = url
        .split_once("://")
        .filter(|(scheme, _)| {
            matches!(
                *scheme,
                "redis" | "rediss" | "redis-cluster" | "rediss-cluster"
            )
        })
        .ok_or(PasswordFileError::NotRedis)?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err(PasswordFileError::CredentialsInUrl);
    }
    let file = std::fs::File::open(path).map_err(read_failed)?;
    let mode = file.metadata().map_err(read_failed)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PasswordFileError::Readable {
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(MAX_PASSWORD_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_failed)?;
    if text.len() as u64 > MAX_PASSWORD_FILE_BYTES {
        return Err(PasswordFileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(PasswordFileError::Empty {
            path: path.to_path_buf(),
        });
    }
    // Percent-encoded: the URL's password is decoded again when it is parsed.
    let mut encoded = String::with_capacity(password.len());
    for byte in password.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(format!("{scheme}://:{encoded}@{rest}"))
}

/// Whether `name` may be a cluster name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn valid_cluster_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Key and channel names of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    /// For Redis Cluster: objects' keys and channels start with this and carry the object id
    /// as their hash tag; `None` on one server (everything under `prefix`).
    sharded_prefix: Option<String>,
}

impl Keys {
    /// Names for cluster `cluster` (checked with [`valid_cluster_name`]) on one Redis server.
    pub fn new(cluster: &str) -> Self {
        Self {
            prefix: format!("skyriver:{{{cluster}}}:"),
            sharded_prefix: None,
        }
    }
    /// Names for cluster `cluster` on Redis Cluster: membership as [`Keys::new`] (one slot,
    /// the cluster name's), each object's hash and channel in the object's own slot
    /// (`skyriver:CLUSTER:obj:{HEX}`, `skyriver:CLUSTER:published:{HEX}`).
    pub fn sharded(cluster: &str) -> Self {
        Self {
            prefix: format!("skyriver:{{{cluster}}}:"),
            sharded_prefix: Some(format!("skyriver:{cluster}:")),
        }
    }
    /// Whether objects are spread over slots (Redis Cluster).
    pub(crate) fn is_sharded(&self) -> bool {
        self.sharded_prefix.is_some()
    }
    /// The command that announces on this layout's channels: `SPUBLISH` (sharded pub/sub) on
    /// Redis Cluster, else `PUBLISH`.
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.is_sharded() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }
    /// What every key name of the cluster starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The token record key.
    pub fn token(&self) -> String {
        format!("{}token", self.prefix)
    }
    /// The set of registered node ids.
    pub fn nodes(&self) -> String {
        format!("{}nodes", self.prefix)
    }
    /// When each node's liveness key expires (a sorted set: node id scored by the deadline in
    /// ms of the Redis server's clock), so expiries are found without reading every member.
    pub fn deadlines(&self) -> String {
        format!("{}deadlines", self.prefix)
    }
    /// A node's liveness key.
    pub fn node(&self, node: NodeId) -> String {
        format!("{}node:{}", self.prefix, node.0)
    }
    /// The prefix of every node key (the node id follows).
    pub(crate) fn node_prefix(&self) -> String {
        format!("{}node:", self.prefix)
    }
    /// A `SCAN MATCH` pattern for every key of the cluster (cluster names hold no glob
    /// characters).
    pub(crate) fn all_pattern(&self) -> String {
        format!("{}*", self.prefix)
    }
    /// The objects node `node` published in incarnation `incarnation` (so they can be found
    /// and dropped once that incarnation is gone).
    pub fn held(&self, node: NodeId, incarnation: u32) -> String {
        format!("{}held:{}:{incarnation}", self.prefix, node.0)
    }
    /// The index of [`Keys::held`] sets: `"<ID>:<INCARNATION>"` entries.
    pub fn held_index(&self) -> String {
        format!("{}held", self.prefix)
    }
    /// An object's holders.
    pub fn object(&self, id: &ObjectId) -> String {
        match &self.sharded_prefix {
            Some(sharded) => format!("{sharded}obj:{{{id}}}"),
            None => format!("{}obj:{id}", self.prefix),
        }
    }
    /// An object's publication channel.
    pub fn published(&self, id: &ObjectId) -> String {
        match &self.sharded_prefix {
            Some(sharded) => format!("{sharded}published:{{{id}}}"),
            None => format!("{}published:{id}", self.prefix),
        }
    }
    /// The membership channel.
    pub fn members(&self) -> String {
        format!("{}members", self.prefix)
    }
    pub(crate) fn object_of_channel(&self, channel: &str) -> Option<ObjectId> {
        match &self.sharded_prefix {
            Some(sharded) => channel
                .strip_prefix(sharded.as_str())?
                .strip_prefix("published:{")?
                .strip_suffix('}')?
                .parse()
                .ok(),
            None => channel
                .strip_prefix(&self.prefix)?
                .strip_prefix("published:")?
                .parse()
                .ok(),
        }
    }
}

/// A holder entry of an `obj:` hash: `"<incarnation> <content>"`, the content as
/// [`content_value`] writes it.
fn holder_value(incarnation: u32, sizes: &ObjectSizes, digest: ContentDigest) -> String {
    format!("{incarnation} {}", content_value(sizes, digest))
}

/// The content an id names, as holder entries and [`PUBLISH_SAME_CONTENT`] compare it:
/// `"<data size> <metadata size> <digest in hex>"`.
fn content_value(sizes: &ObjectSizes, digest: ContentDigest) -> String {
    format!("{} {} {digest}", sizes.data_size, sizes.metadata_size)
}

fn parse_holder_value(text: &str) -> Option<(u32, ObjectSizes, ContentDigest)> {
    let mut parts = text.split(' ');
    let incarnation = parts.next()?.parse().ok()?;
    let data_size = parts.next()?.parse().ok()?;
    let metadata_size = parts.next()?.parse().ok()?;
    let digest = ContentDigest(u64::from_str_radix(parts.next()?, 16).ok()?);
    parts.next().is_none().then_some((
        incarnation,
        ObjectSizes {
            data_size,
            metadata_size,
        },
        digest,
    ))
}

/// Why a node was refused for a token mismatch, and how to get past it.
fn wrong_token_reason(shown_url: &str, cluster: &str, token_ttl_ms: i64) -> String {
    let expiry = if token_ttl_ms >= 0 {
        format!(
            "if that cluster is gone, its token expires in {} s",
            (token_ttl_ms + 999) / 1000
        )
    } else {
        "its token has no expiry (written by an older version)".to_string()
    };
    format!(
        "wrong cluster token: cluster {cluster:?} in this Redis was started with a different \
         token. If it is still running, give this daemon its token (--token or \
         SKYRIVER_CLUSTER_TOKEN); {expiry}; or remove its records now with `skyriver cluster \
         reset --directory {shown_url} --cluster {cluster}` (or use another --cluster name)"
    )
}

/// Why a node was refused for a token record this version does not read.
fn old_token_record_reason(shown_url: &str, cluster: &str) -> String {
    format!(
        "cluster {cluster:?} in this Redis has a token record this version does not accept \
         (an unsalted fingerprint written by an earlier version, or a damaged one): stop that \
         cluster's daemons and remove its records with `skyriver cluster reset --directory \
         {shown_url} --cluster {cluster}`, then start it again (or use another --cluster name)"
    )
}

/// A node's connection to the Redis directory. Dropping it leaves the cluster.
pub type RedisDirectory = DirectoryClient;

/// Joins the directory in Redis as `me`. Fails if Redis cannot be reached, the cluster was
/// started with another token, or another live daemon has this node id; afterwards the
/// connection is kept up in the background and reported through `notices`.
pub async fn connect(
    config: RedisConfig,
    me: MemberInfo,
    token: &crate::token::ClusterToken,
    notices: NoticeSender,
) -> Result<RedisDirectory, DirectoryError> {
    let shown = super::DirectorySpec::Redis {
        url: config.url.clone(),
    }
    .to_string();
    if !valid_cluster_name(&config.cluster) {
        return Err(DirectoryError::BadClusterName(config.cluster.clone()));
    }
    let sharded = cluster::is_cluster_url(&config.url);
    let backend = if sharded {
        cluster::ClusterSeeds::new(&config.url, config.tls_ca_file.as_deref())
            .map(connection::Backend::Cluster)
    } else {
        open_client(&config.url, config.tls_ca_file.as_deref()).map(connection::Backend::Single)
    }
    .map_err(|error| match error {
        OpenClientError::BadUrl => DirectoryError::BadAddress(shown.clone()),
        OpenClientError::CaFile { path, source } => DirectoryError::Unreachable {
            addr: shown.clone(),
            source: LinkError::CaFile {
                path,
                source: Arc::new(source),
            },
        },
    })?;
    // Serialising a struct of plain fields to JSON cannot fail.
    let member_json = serde_json::to_string(&me).expect("MemberInfo serialises to JSON");
    let session_config = SessionConfig {
        heartbeat_interval: config.heartbeat_interval,
        // Every command is bounded by the request timeout, so a ping is answered by then or
        // the adapter reports Redis lost.
        heartbeat_timeout: config.heartbeat_interval + config.request_timeout * 2,
        reconnect_backoff_min: config.reconnect_backoff_min,
        reconnect_backoff_max: config.reconnect_backoff_max,
        max_publications: usize::MAX,
        max_subscriptions: MAX_SUBSCRIPTIONS_PER_NODE,
        max_in_flight: MAX_QUEUED_REQUESTS,
        member_lists: true,
        // Redis pushes no locations (the daemon refuses --learn-locations with it).
        learn_locations: false,
    };
    let description = format!(
        "Redis directory at {shown}, cluster {} ({})",
        config.cluster, me.node
    );
    let timing = ClientTiming {
        connect_timeout: config.connect_timeout + config.request_timeout * 4,
        join_timeout: config.join_timeout,
        max_queued_requests: MAX_QUEUED_REQUESTS,
    };
    let session = DirectorySession::new(
        session_config,
        me.clone(),
        adapter::SESSION_TOKEN.into(),
        crate::token::fresh_nonce(),
        skyriver_core::Instant::ZERO,
    );
    let connector = adapter::RedisConnector {
        params: Arc::new(adapter::Params {
            keys: if sharded {
                Keys::sharded(&config.cluster)
            } else {
                Keys::new(&config.cluster)
            },
            token: token.clone(),
            verified_record: std::sync::Mutex::new(None),
            config,
            me,
            member_json,
            backend,
            shown_url: shown.clone(),
        }),
    };
    // A refusal for credentials says where they go (`DirectoryError`'s message).
    client::start(session, connector, timing, notices, shown, description).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn password_file(mode: u32, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn a_password_file_goes_into_the_url_encoded() {
        let (_dir, path) = password_file(0o600, "p@ss:w/rd\n");
        let url = url_with_password_file("redis://10.0.0.1:6379/2", &path).unwrap();
        assert_eq!(url, "redis://:p%40ss%3Aw%2Frd@10.0.0.1:6379/2");
        let info = url.as_str().into_connection_info().unwrap();
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/rd"));
        let url = url_with_password_file("rediss://h:1", &path).unwrap();
        assert!(url.starts_with("rediss://:p%40ss"), "{url}");
    }

    #[test]
    fn a_password_file_others_can_read_or_a_url_with_credentials_is_refused() {
        let (_dir, open) = password_file(0o640, "secret");
        let error = url_with_password_file("redis://h:1", &open).unwrap_err();
        assert!(
            matches!(error, PasswordFileError::Readable { mode: 0o640, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("chmod 600"), "{error}");
        let (_dir, path) = password_file(0o600, "secret");
        let error = url_with_password_file("redis://:other@h:1", &path).unwrap_err();
        assert!(
            matches!(error, PasswordFileError::CredentialsInUrl),
            "{error:?}"
        );
        assert!(matches!(
            url_with_password_file("10.0.0.1:7390", &path),
            Err(PasswordFileError::NotRedis)
        ));
        let (_dir, empty) = password_file(0o600, "\n");
        assert!(matches!(
            url_with_password_file("redis://h:1", &empty),
            Err(PasswordFileError::Empty { .. })
        ));
        let error = url_with_password_file("redis://h:1", &_dir.path().join("absent")).unwrap_err();
        assert!(
            matches!(&error, PasswordFileError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{error:?}"
        );
    }
}
