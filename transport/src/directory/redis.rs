//! The Redis directory, for real clusters: every daemon talks to one Redis server.
//!
//! Keys, all under `skyriver:{CLUSTER}:` (the braces make the cluster name a Redis Cluster hash
//! tag, so one cluster's keys share a slot):
//!
//! | key / channel                  | type    | holds                                           |
//! |--------------------------------|---------|-------------------------------------------------|
//! | `token`                        | string  | fingerprint of the cluster token, with a TTL    |
//! | `nodes`                        | set     | node ids that registered (an index; pruned)     |
//! | `node:<ID>`                    | string  | the node's [`MemberInfo`] as JSON, with a TTL   |
//! | `obj:<HEX>`                    | hash    | node id → `"<incarnation> <data> <metadata>"`   |
//! | `published:<HEX>` (channel)    | pub/sub | `"<node> <incarnation> <data> <metadata>"`      |
//! | `members` (channel)            | pub/sub | `"join <ID>"` / `"leave <ID>"`                  |
//!
//! Liveness: a node is alive while its `node:<ID>` key exists; it refreshes the key's TTL every
//! heartbeat, so a dead or cut-off node expires after the TTL. The first node of a cluster sets
//! `token`; every live node refreshes its TTL too, so the token outlives the cluster by at most
//! `token_ttl` once no node is alive, and the name can then be started with another token. A
//! node that stops cleanly ([`Directory::leave`]) deletes its node key and its holder entries at
//! once; the last one to leave deletes the token. [`reset`] removes a cluster's keys by hand. A holder entry counts only while
//! its node is alive with the same incarnation; stale entries are deleted when a lookup meets
//! them. Each node keeps a view of the members, refreshed when someone joins or leaves (the
//! `members` channel) and periodically (to notice expiries).
//!
//! Waiting for an object uses pub/sub, never polling: a `Lookup` with `subscribe` first
//! SUBSCRIBEs to the object's channel (confirmed by Redis), then reads the holders, so a
//! publication in between is delivered on the channel. Publish is `HSET` + `PUBLISH` in one
//! pipeline; requests queued together go in one pipeline.
//!
//! When Redis is unreachable, requests are answered `Unavailable` within the request timeout,
//! the driver gets `Health(Err)`, and the backend reconnects with backoff; then it re-registers
//! the node, re-publishes what the node holds, re-subscribes and re-checks what it waits for,
//! and sends `Health(Ok)`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use ::redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use ::redis::{AsyncConnectionConfig, Client, Msg, RedisError, RedisResult, Value};
use futures_util::StreamExt;
use skyriver_core::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::{NodeId, ObjectId, ObjectSizes};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};

use super::{
    remember_while_down, Directory, DirectoryError, DirectoryNotice, MemberInfo, RequestQueue,
};

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
/// Drops a node id from the index only if its node key is gone.
const PRUNE_IF_EXPIRED: &str =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return redis.call('SREM', KEYS[2], ARGV[1]) end return 0";

/// Sets the token fingerprint (`ARGV[1]`) with a TTL of `ARGV[2]` ms if `KEYS[1]` is absent,
/// refreshes the TTL if it holds the same fingerprint, and returns what the key holds.
const CLAIM_TOKEN: &str = "local v = redis.call('GET', KEYS[1]) \
     if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return ARGV[1] end \
     if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
     return v";
/// A clean leave: deletes the node key (`KEYS[1]`) if it still holds this daemon's record
/// (`ARGV[1]`), drops its id (`ARGV[2]`) from the index (`KEYS[2]`), and when no registered
/// node is alive any more (node keys are `ARGV[3]` + id) deletes the index and the token
/// (`KEYS[3]`) if it holds this cluster's fingerprint (`ARGV[4]`). Returns the nodes still alive.
const LEAVE: &str = "local mine = redis.call('GET', KEYS[1]) \
     if mine == ARGV[1] then redis.call('DEL', KEYS[1]) end \
     if mine == ARGV[1] or not mine then redis.call('SREM', KEYS[2], ARGV[2]) end \
     local alive = 0 \
     for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do \
       if redis.call('EXISTS', ARGV[3] .. id) == 1 then alive = alive + 1 end \
     end \
     if alive == 0 then \
       redis.call('DEL', KEYS[2]) \
       if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end \
     end \
     return alive";

/// Default TTL of a cluster's token key once no node refreshes it.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(30);

/// How a node uses Redis.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[USER:PASSWORD@]HOST:PORT[/DB]`.
    pub url: String,
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
    /// The member list is re-read at least this often (to notice expired nodes).
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
    /// TTL, member list re-read every 2 s, reconnect backoff 100 ms to 5 s.
    pub fn new(url: impl Into<String>, cluster: &str) -> Self {
        Self {
            url: url.into(),
            cluster: cluster.to_string(),
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(1),
            node_ttl: Duration::from_secs(5),
            token_ttl: DEFAULT_TOKEN_TTL,
            member_refresh_interval: Duration::from_secs(2),
            join_timeout: Duration::from_secs(8),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
        }
    }
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
}

impl Keys {
    /// Names for cluster `cluster` (checked with [`valid_cluster_name`]).
    pub fn new(cluster: &str) -> Self {
        Self {
            prefix: format!("skyriver:{{{cluster}}}:"),
        }
    }
    /// The token fingerprint key.
    pub fn token(&self) -> String {
        format!("{}token", self.prefix)
    }
    /// The set of registered node ids.
    pub fn nodes(&self) -> String {
        format!("{}nodes", self.prefix)
    }
    /// A node's liveness key.
    pub fn node(&self, node: NodeId) -> String {
        format!("{}node:{}", self.prefix, node.0)
    }
    /// The prefix of every node key (the node id follows).
    fn node_prefix(&self) -> String {
        format!("{}node:", self.prefix)
    }
    /// A `SCAN MATCH` pattern for every key of the cluster (cluster names hold no glob
    /// characters).
    fn all_pattern(&self) -> String {
        format!("{}*", self.prefix)
    }
    /// An object's holders.
    pub fn object(&self, id: &ObjectId) -> String {
        format!("{}obj:{id}", self.prefix)
    }
    /// An object's publication channel.
    pub fn published(&self, id: &ObjectId) -> String {
        format!("{}published:{id}", self.prefix)
    }
    /// The membership channel.
    pub fn members(&self) -> String {
        format!("{}members", self.prefix)
    }
    fn object_of_channel(&self, channel: &str) -> Option<ObjectId> {
        channel
            .strip_prefix(&self.prefix)?
            .strip_prefix("published:")?
            .parse()
            .ok()
    }
}

/// A stable, non-reversible fingerprint of the token (FNV-1a), so Redis never stores the token.
fn token_fingerprint(token: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"skyriver cluster token\0".iter().chain(token.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("fnv1a64:{hash:016x}")
}

fn holder_value(incarnation: u32, sizes: &ObjectSizes) -> String {
    format!("{incarnation} {} {}", sizes.data_size, sizes.metadata_size)
}

fn parse_holder_value(text: &str) -> Option<(u32, ObjectSizes)> {
    let mut parts = text.split(' ');
    let incarnation = parts.next()?.parse().ok()?;
    let data_size = parts.next()?.parse().ok()?;
    let metadata_size = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((
        incarnation,
        ObjectSizes {
            data_size,
            metadata_size,
        },
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

/// A node's connection to the Redis directory. Dropping it leaves the cluster.
#[derive(Debug)]
pub struct RedisDirectory {
    queue: RequestQueue,
    /// Asks the worker to leave the cluster; it answers on the enclosed channel when done.
    leave: mpsc::Sender<oneshot::Sender<()>>,
    description: String,
}

/// Bound on a clean leave (one pipeline to Redis).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

impl Directory for RedisDirectory {
    fn submit(&self, op: DirectoryOpId, request: DirectoryRequest) {
        self.queue.submit(op, request);
    }

    fn leave(&self) -> super::LeaveFuture {
        let (done, left) = oneshot::channel();
        let asked = self.leave.try_send(done).is_ok();
        Box::pin(async move {
            if asked {
                // Bounded: Redis may be unreachable, and then the keys expire by their TTLs.
                let _ = timeout(LEAVE_TIMEOUT + Duration::from_millis(500), left).await;
            }
        })
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

/// Joins the directory in Redis as `me`. Fails if Redis cannot be reached, the cluster was
/// started with another token, or another live daemon has this node id; afterwards the
/// connection is kept up in the background and reported through `notices`.
pub async fn connect(
    config: RedisConfig,
    me: MemberInfo,
    token: &str,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
) -> Result<RedisDirectory, DirectoryError> {
    let shown = super::DirectorySpec::Redis {
        url: config.url.clone(),
    }
    .to_string();
    if !valid_cluster_name(&config.cluster) {
        return Err(DirectoryError::BadClusterName(config.cluster.clone()));
    }
    let client =
        Client::open(config.url.as_str()).map_err(|_| DirectoryError::BadAddress(shown.clone()))?;
    let member_json = serde_json::to_string(&me).expect("MemberInfo serialises to JSON");
    let mut worker = Worker {
        keys: Keys::new(&config.cluster),
        token_fingerprint: token_fingerprint(token),
        config,
        me,
        member_json,
        client,
        shown_url: shown.clone(),
        notices: notices.clone(),
        publications: HashMap::new(),
        subscriptions: HashSet::new(),
        members: BTreeMap::new(),
        members_sent: false,
    };
    let deadline = Instant::now() + worker.config.join_timeout;
    let mut waiting_logged = false;
    let live = loop {
        match worker.establish().await {
            Ok(live) => break live,
            Err(Establish::Unreachable(reason)) => {
                return Err(DirectoryError::Unreachable {
                    addr: shown,
                    reason,
                })
            }
            Err(Establish::Refused { reason, retryable }) => {
                if !retryable || Instant::now() >= deadline {
                    return Err(DirectoryError::Refused(reason));
                }
                // Once, not at every retry: the outcome comes when the wait ends.
                if !waiting_logged {
                    waiting_logged = true;
                    tracing::info!(
                        %reason,
                        "waiting up to {} ms for the previous registration to expire",
                        worker.config.join_timeout.as_millis()
                    );
                }
                tokio::time::sleep(worker.config.reconnect_backoff_min).await;
            }
        }
    };
    worker.notice(DirectoryNotice::Health(Ok(())));
    let description = format!(
        "Redis directory at {shown}, cluster {} ({})",
        worker.config.cluster, worker.me.node
    );
    let (commands, command_rx) = mpsc::channel(MAX_QUEUED_REQUESTS);
    let (leave, leave_rx) = mpsc::channel(1);
    tokio::spawn(worker.run(live, command_rx, leave_rx));
    Ok(RedisDirectory {
        queue: RequestQueue { commands, notices },
        leave,
        description,
    })
}

/// Open connections to Redis.
struct Live {
    conn: MultiplexedConnection,
    sink: PubSubSink,
    stream: PubSubStream,
}

/// Why connecting failed.
enum Establish {
    Unreachable(String),
    Refused { reason: String, retryable: bool },
}

/// How serving a live connection ended.
enum Served {
    /// The driver left (answer on the channel once the node's keys are gone) or went away.
    Stopped(Option<oneshot::Sender<()>>),
    /// Redis was lost, for this reason: reconnect.
    Lost(String),
}

/// Why a command failed.
enum Failure {
    /// The connection is gone or Redis does not answer: reconnect.
    Lost(String),
    /// Redis answered with an error: this request fails, the connection stays.
    Failed(String),
}

impl Failure {
    fn reason(&self) -> &str {
        match self {
            Failure::Lost(reason) | Failure::Failed(reason) => reason,
        }
    }
}

fn classify(error: RedisError) -> Failure {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
    {
        Failure::Lost(format!("Redis connection failed: {error}"))
    } else {
        Failure::Failed(format!("Redis error: {error}"))
    }
}

/// One item of a batch, waiting for its pipeline results.
enum Pending {
    Lookup {
        op: DirectoryOpId,
        id: ObjectId,
        subscribe: bool,
        index: usize,
    },
    Write {
        op: DirectoryOpId,
    },
}

/// The background task of one node's Redis directory.
struct Worker {
    config: RedisConfig,
    keys: Keys,
    me: MemberInfo,
    member_json: String,
    token_fingerprint: String,
    client: Client,
    /// The Redis URL with any password masked, for messages.
    shown_url: String,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
    /// What this node holds, as the driver last said: re-published after reconnecting.
    publications: HashMap<ObjectId, ObjectSizes>,
    /// Objects this node waits for (subscribed on the pub/sub connection).
    subscriptions: HashSet<ObjectId>,
    /// Live members as last read.
    members: BTreeMap<NodeId, MemberInfo>,
    members_sent: bool,
}

impl Worker {
    fn notice(&self, notice: DirectoryNotice) {
        let _ = self.notices.send(notice);
    }

    fn reply(&self, op: DirectoryOpId, reply: DirectoryReply) {
        self.notice(DirectoryNotice::Reply { op, reply });
    }

    /// Runs `future` under the request timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        future: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, Failure> {
        match timeout(self.config.request_timeout, future).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(classify(error)),
            Err(_) => Err(Failure::Lost(format!(
                "Redis did not answer {what} within {} ms",
                self.config.request_timeout.as_millis()
            ))),
        }
    }

    /// Opens both connections, checks the token and node id, registers the node and restores
    /// its publications and subscriptions.
    async fn establish(&mut self) -> Result<Live, Establish> {
        let unreachable = |f: Failure| Establish::Unreachable(f.reason().to_string());
        let connect_timeout = self.config.connect_timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(self.config.request_timeout));
        let conn = match timeout(
            connect_timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => return Err(Establish::Unreachable(error.to_string())),
            Err(_) => {
                return Err(Establish::Unreachable(format!(
                    "no connection within {} ms",
                    connect_timeout.as_millis()
                )))
            }
        };
        let pubsub = match timeout(connect_timeout, self.client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(error)) => return Err(Establish::Unreachable(error.to_string())),
            Err(_) => {
                return Err(Establish::Unreachable(format!(
                    "no pub/sub connection within {} ms",
                    connect_timeout.as_millis()
                )))
            }
        };
        let (sink, stream) = pubsub.split();
        let mut live = Live { conn, sink, stream };

        // The first node of a cluster sets the token; later ones must match it.
        let mut pipe = ::redis::pipe();
        self.add_claim_token(&mut pipe);
        pipe.cmd("GET").arg(self.keys.node(self.me.node));
        pipe.cmd("PTTL").arg(self.keys.token());
        let (stored, existing, token_ttl_ms): (Option<String>, Option<String>, i64) = self
            .bounded("the token check", pipe.query_async(&mut live.conn))
            .await
            .map_err(unreachable)?;
        if stored.as_deref() != Some(self.token_fingerprint.as_str()) {
            return Err(Establish::Refused {
                reason: wrong_token_reason(&self.shown_url, &self.config.cluster, token_ttl_ms),
                retryable: false,
            });
        }
        if let Some(existing) = existing {
            if let Ok(other) = serde_json::from_str::<MemberInfo>(&existing) {
                if other.incarnation != self.me.incarnation
                    || other.fabric_addr != self.me.fabric_addr
                {
                    return Err(Establish::Refused {
                        reason: format!(
                            "{} is already a member (incarnation {}, fabric at {}); a restarted \
                             daemon is accepted once the old registration expires ({} ms)",
                            self.me.node,
                            other.incarnation,
                            other.fabric_addr,
                            self.config.node_ttl.as_millis()
                        ),
                        retryable: true,
                    });
                }
            }
        }

        self.bounded("SUBSCRIBE", live.sink.subscribe(self.keys.members()))
            .await
            .map_err(unreachable)?;
        let waiting: Vec<ObjectId> = self.subscriptions.iter().copied().collect();
        for id in &waiting {
            self.bounded("SUBSCRIBE", live.sink.subscribe(self.keys.published(id)))
                .await
                .map_err(unreachable)?;
        }

        self.register(&mut live, true).await.map_err(unreachable)?;
        let held: Vec<(ObjectId, ObjectSizes)> =
            self.publications.iter().map(|(i, s)| (*i, *s)).collect();
        for chunk in held.chunks(RESYNC_CHUNK) {
            let mut pipe = ::redis::pipe();
            for (id, sizes) in chunk {
                self.add_publish(&mut pipe, id, sizes);
            }
            self.bounded("re-publishing", pipe.query_async::<()>(&mut live.conn))
                .await
                .map_err(unreachable)?;
        }
        self.refresh_members(&mut live).await.map_err(unreachable)?;

        // Objects published while this node could not hear: their subscriptions fire now.
        for chunk in waiting.chunks(RESYNC_CHUNK) {
            let mut pipe = ::redis::pipe();
            for id in chunk {
                pipe.cmd("HGETALL").arg(self.keys.object(id));
            }
            let values: Vec<Value> = self
                .bounded(
                    "re-checking subscriptions",
                    pipe.query_async(&mut live.conn),
                )
                .await
                .map_err(unreachable)?;
            for (id, value) in chunk.iter().zip(values) {
                let (holders, sizes) = self
                    .live_holders(&mut live, id, value)
                    .await
                    .map_err(unreachable)?;
                if let (Some(holder), Some(sizes)) = (holders.first(), sizes) {
                    self.fire(&mut live, *id, *holder, sizes)
                        .await
                        .map_err(unreachable)?;
                }
            }
        }
        Ok(live)
    }

    /// Writes this node's key (with its TTL) and index entry and refreshes the token's TTL;
    /// announces a join if `announce`.
    async fn register(&self, live: &mut Live, announce: bool) -> Result<(), Failure> {
        let mut pipe = ::redis::pipe();
        self.add_claim_token(&mut pipe);
        pipe.ignore();
        pipe.cmd("SET")
            .arg(self.keys.node(self.me.node))
            .arg(&self.member_json)
            .arg("PX")
            .arg(self.config.node_ttl.as_millis() as u64)
            .ignore();
        pipe.cmd("SADD")
            .arg(self.keys.nodes())
            .arg(self.me.node.0)
            .ignore();
        if announce {
            pipe.cmd("PUBLISH")
                .arg(self.keys.members())
                .arg(format!("join {}", self.me.node.0))
                .ignore();
        }
        self.bounded("the heartbeat", pipe.query_async::<()>(&mut live.conn))
            .await
    }

    /// Claims the token key for this cluster's fingerprint or refreshes its TTL; its result is
    /// what the key holds.
    fn add_claim_token(&self, pipe: &mut ::redis::Pipeline) {
        pipe.cmd("EVAL")
            .arg(CLAIM_TOKEN)
            .arg(1)
            .arg(self.keys.token())
            .arg(&self.token_fingerprint)
            .arg(self.config.token_ttl.as_millis().max(1) as u64);
    }

    fn add_publish(&self, pipe: &mut ::redis::Pipeline, id: &ObjectId, sizes: &ObjectSizes) {
        pipe.cmd("HSET")
            .arg(self.keys.object(id))
            .arg(self.me.node.0)
            .arg(holder_value(self.me.incarnation, sizes))
            .ignore();
        pipe.cmd("PUBLISH")
            .arg(self.keys.published(id))
            .arg(format!(
                "{} {} {} {}",
                self.me.node.0, self.me.incarnation, sizes.data_size, sizes.metadata_size
            ))
            .ignore();
    }

    /// Re-reads the live members and tells the driver when they changed.
    async fn refresh_members(&mut self, live: &mut Live) -> Result<(), Failure> {
        let ids: Vec<u32> = self
            .bounded(
                "SMEMBERS",
                ::redis::cmd("SMEMBERS")
                    .arg(self.keys.nodes())
                    .query_async(&mut live.conn),
            )
            .await?;
        let mut members = BTreeMap::new();
        if !ids.is_empty() {
            let keys: Vec<String> = ids.iter().map(|n| self.keys.node(NodeId(*n))).collect();
            let found: Vec<Option<String>> = self
                .bounded(
                    "MGET",
                    ::redis::cmd("MGET").arg(&keys).query_async(&mut live.conn),
                )
                .await?;
            let mut prune = ::redis::pipe();
            let mut expired = Vec::new();
            for ((id, key), json) in ids.iter().zip(&keys).zip(found) {
                match json.map(|j| serde_json::from_str::<MemberInfo>(&j)) {
                    Some(Ok(member)) if member.node.0 == *id => {
                        members.insert(member.node, member);
                    }
                    Some(_) => tracing::warn!(key, "ignoring a malformed node entry in Redis"),
                    None => {
                        expired.push(*id);
                        prune
                            .cmd("EVAL")
                            .arg(PRUNE_IF_EXPIRED)
                            .arg(2)
                            .arg(key)
                            .arg(self.keys.nodes())
                            .arg(*id);
                    }
                }
            }
            if !expired.is_empty() {
                let pruned: Vec<i64> = self
                    .bounded("pruning expired nodes", prune.query_async(&mut live.conn))
                    .await?;
                let mut announce = ::redis::pipe();
                for (id, pruned) in expired.iter().zip(pruned) {
                    if pruned == 1 {
                        tracing::info!(node = %NodeId(*id), "node expired");
                        announce
                            .cmd("PUBLISH")
                            .arg(self.keys.members())
                            .arg(format!("leave {id}"))
                            .ignore();
                    }
                }
                self.bounded("PUBLISH", announce.query_async::<()>(&mut live.conn))
                    .await?;
            }
        }
        if members != self.members || !self.members_sent {
            self.members = members;
            self.members_sent = true;
            self.notice(DirectoryNotice::Members(
                self.members.values().cloned().collect(),
            ));
        }
        Ok(())
    }

    /// The holders in an `obj:` hash that are alive with the incarnation that published, and
    /// the sizes. Refreshes the member view when it meets an unknown node, and deletes entries
    /// of nodes that are gone or restarted.
    async fn live_holders(
        &mut self,
        live: &mut Live,
        id: &ObjectId,
        value: Value,
    ) -> Result<(Vec<NodeId>, Option<ObjectSizes>), Failure> {
        let raw: HashMap<String, String> = ::redis::from_redis_value(value)
            .map_err(|e| Failure::Failed(format!("unexpected holder entry: {e}")))?;
        let entries: Vec<(String, NodeId, u32, ObjectSizes, String)> = raw
            .into_iter()
            .filter_map(|(field, value)| {
                let node = NodeId(field.parse().ok()?);
                let (incarnation, sizes) = parse_holder_value(&value)?;
                Some((field, node, incarnation, sizes, value))
            })
            .collect();
        let is_live = |members: &BTreeMap<NodeId, MemberInfo>, node: &NodeId, inc: u32| {
            members.get(node).is_some_and(|m| m.incarnation == inc)
        };
        if entries
            .iter()
            .any(|(_, node, inc, _, _)| !is_live(&self.members, node, *inc))
        {
            self.refresh_members(live).await?;
        }
        let mut holders = Vec::new();
        let mut sizes = None;
        let mut stale = ::redis::pipe();
        let mut any_stale = false;
        for (field, node, incarnation, s, value) in entries {
            if is_live(&self.members, &node, incarnation) {
                holders.push(node);
                sizes.get_or_insert(s);
            } else {
                any_stale = true;
                stale
                    .cmd("EVAL")
                    .arg(DELETE_IF_UNCHANGED)
                    .arg(1)
                    .arg(self.keys.object(id))
                    .arg(field)
                    .arg(value)
                    .ignore();
            }
        }
        if any_stale {
            self.bounded(
                "deleting stale holders",
                stale.query_async::<()>(&mut live.conn),
            )
            .await?;
        }
        holders.sort();
        Ok((holders, sizes))
    }

    /// A subscription fired: tell the driver and stop listening on the object's channel.
    async fn fire(
        &mut self,
        live: &mut Live,
        id: ObjectId,
        holder: NodeId,
        sizes: ObjectSizes,
    ) -> Result<(), Failure> {
        if !self.subscriptions.remove(&id) {
            return Ok(());
        }
        self.notice(DirectoryNotice::Event(DirectoryEvent::Published {
            id,
            holder,
            sizes,
        }));
        self.bounded(
            "UNSUBSCRIBE",
            live.sink.unsubscribe(self.keys.published(&id)),
        )
        .await
    }

    async fn run(
        mut self,
        live: Live,
        mut commands: mpsc::Receiver<(DirectoryOpId, DirectoryRequest)>,
        mut leave: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        let mut live = Some(live);
        let mut backoff = self.config.reconnect_backoff_min;
        let mut down_reason = String::new();
        loop {
            if let Some(mut connected) = live.take() {
                match self.serve(&mut connected, &mut commands, &mut leave).await {
                    Served::Stopped(done) => {
                        self.leave(&mut connected).await;
                        if let Some(done) = done {
                            let _ = done.send(());
                        }
                        return;
                    }
                    Served::Lost(reason) => {
                        tracing::warn!(%reason, "lost the Redis directory");
                        down_reason = reason;
                        self.notice(DirectoryNotice::Health(Err(down_reason.clone())));
                        backoff = self.config.reconnect_backoff_min;
                    }
                }
            }
            let wake = Instant::now() + backoff;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(wake) => break,
                    command = commands.recv() => match command {
                        None => return,
                        Some((op, request)) => self.submit_while_down(op, request, &down_reason),
                    },
                    // Redis cannot be told: the node's keys expire by their TTLs.
                    done = leave.recv() => {
                        if let Some(done) = done {
                            let _ = done.send(());
                        }
                        return;
                    }
                }
            }
            match self.establish().await {
                Ok(connected) => {
                    tracing::info!("reconnected to the Redis directory");
                    self.notice(DirectoryNotice::Health(Ok(())));
                    live = Some(connected);
                }
                Err(Establish::Unreachable(reason)) | Err(Establish::Refused { reason, .. }) => {
                    tracing::debug!(%reason, "Redis reconnection failed");
                    down_reason = format!("Redis directory unreachable: {reason}");
                    backoff = (backoff * 2).min(self.config.reconnect_backoff_max);
                }
            }
        }
    }

    fn submit_while_down(&mut self, op: DirectoryOpId, request: DirectoryRequest, reason: &str) {
        let needs_reply = remember_while_down(
            &mut self.publications,
            &mut self.subscriptions,
            request,
            usize::MAX,
        );
        if needs_reply {
            self.reply(
                op,
                DirectoryReply::Unavailable {
                    reason: reason.to_string(),
                },
            );
        }
    }

    /// Serves while connected, until the driver leaves or goes away, or Redis is lost.
    async fn serve(
        &mut self,
        live: &mut Live,
        commands: &mut mpsc::Receiver<(DirectoryOpId, DirectoryRequest)>,
        leave: &mut mpsc::Receiver<oneshot::Sender<()>>,
    ) -> Served {
        let mut heartbeat = tokio::time::interval(self.config.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.tick().await;
        let refresh = tokio::time::sleep(self.config.member_refresh_interval);
        tokio::pin!(refresh);
        loop {
            let result = tokio::select! {
                done = leave.recv() => return Served::Stopped(done),
                command = commands.recv() => match command {
                    None => return Served::Stopped(None),
                    Some(first) => {
                        let mut batch = vec![first];
                        while batch.len() < MAX_BATCH {
                            match commands.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                        self.serve_batch(live, batch).await
                    }
                },
                message = live.stream.next() => match message {
                    None => Err(Failure::Lost("the Redis pub/sub connection closed".into())),
                    Some(message) => {
                        let members_changed = self.on_message(live, message).await;
                        if matches!(members_changed, Ok(true)) {
                            // Coalesce a burst of joins into one re-read.
                            let soon = Instant::now() + Duration::from_millis(50);
                            if refresh.deadline() > soon {
                                refresh.as_mut().reset(soon);
                            }
                        }
                        members_changed.map(|_| ())
                    }
                },
                _ = heartbeat.tick() => self.register(live, false).await,
                _ = &mut refresh => {
                    refresh.as_mut().reset(Instant::now() + self.config.member_refresh_interval);
                    self.refresh_members(live).await
                }
            };
            match result {
                Ok(()) => {}
                Err(Failure::Lost(reason)) => return Served::Lost(reason),
                Err(Failure::Failed(reason)) => {
                    tracing::warn!(%reason, "Redis directory command failed");
                }
            }
        }
    }

    /// Handles one pub/sub message; `Ok(true)` when the members may have changed.
    async fn on_message(&mut self, live: &mut Live, message: Msg) -> Result<bool, Failure> {
        let channel = message.get_channel_name();
        if channel == self.keys.members() {
            return Ok(true);
        }
        let Some(id) = self.keys.object_of_channel(channel) else {
            return Ok(false);
        };
        let payload = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
        let parsed = (|| {
            let mut parts = payload.split(' ');
            let node = NodeId(parts.next()?.parse().ok()?);
            let (_, sizes) = parse_holder_value(&parts.collect::<Vec<_>>().join(" "))?;
            Some((node, sizes))
        })();
        match parsed {
            Some((holder, sizes)) => self.fire(live, id, holder, sizes).await?,
            None => tracing::warn!(%id, %payload, "ignoring a malformed publication message"),
        }
        Ok(false)
    }

    /// Serves requests queued together: subscriptions first (confirmed by Redis), then one
    /// pipeline for everything else.
    async fn serve_batch(
        &mut self,
        live: &mut Live,
        batch: Vec<(DirectoryOpId, DirectoryRequest)>,
    ) -> Result<(), Failure> {
        let mut pipe = ::redis::pipe();
        let mut commands = 0;
        let mut pending = Vec::new();
        let mut touched = HashSet::new();
        let mut result = Ok(());
        for (op, request) in batch {
            match request {
                DirectoryRequest::Unsubscribe { id } => {
                    for p in &mut pending {
                        if let Pending::Lookup {
                            id: i, subscribe, ..
                        } = p
                        {
                            if *i == id {
                                *subscribe = false;
                            }
                        }
                    }
                    if self.subscriptions.remove(&id) {
                        touched.insert(id);
                    }
                }
                DirectoryRequest::Lookup { id, subscribe } => {
                    if subscribe && !self.subscriptions.contains(&id) && touched.insert(id) {
                        if let Err(failure) = self
                            .bounded("SUBSCRIBE", live.sink.subscribe(self.keys.published(&id)))
                            .await
                        {
                            result = Err(failure);
                        }
                    }
                    pipe.cmd("HGETALL").arg(self.keys.object(&id));
                    pending.push(Pending::Lookup {
                        op,
                        id,
                        subscribe,
                        index: commands,
                    });
                    commands += 1;
                }
                DirectoryRequest::Publish { id, sizes } => {
                    self.publications.insert(id, sizes);
                    pipe.cmd("HSET")
                        .arg(self.keys.object(&id))
                        .arg(self.me.node.0)
                        .arg(holder_value(self.me.incarnation, &sizes));
                    pipe.cmd("PUBLISH")
                        .arg(self.keys.published(&id))
                        .arg(format!(
                            "{} {} {} {}",
                            self.me.node.0,
                            self.me.incarnation,
                            sizes.data_size,
                            sizes.metadata_size
                        ));
                    pending.push(Pending::Write { op });
                    commands += 2;
                }
                DirectoryRequest::Withdraw { id } => {
                    self.publications.remove(&id);
                    pipe.cmd("HDEL")
                        .arg(self.keys.object(&id))
                        .arg(self.me.node.0);
                    pending.push(Pending::Write { op });
                    commands += 1;
                }
            }
        }
        let values: Vec<Value> = match result {
            Ok(()) if commands > 0 => {
                match self
                    .bounded("a request pipeline", pipe.query_async(&mut live.conn))
                    .await
                {
                    Ok(values) => values,
                    Err(failure) => {
                        result = Err(failure);
                        Vec::new()
                    }
                }
            }
            _ => Vec::new(),
        };
        if let Err(failure) = &result {
            for p in pending {
                let (Pending::Lookup { op, .. } | Pending::Write { op, .. }) = p;
                self.reply(
                    op,
                    DirectoryReply::Unavailable {
                        reason: failure.reason().to_string(),
                    },
                );
            }
            return result;
        }
        let mut values: Vec<Option<Value>> = values.into_iter().map(Some).collect();
        let mut failure = None;
        for p in pending {
            match p {
                Pending::Write { op } => self.reply(op, DirectoryReply::Done),
                Pending::Lookup {
                    op,
                    id,
                    subscribe,
                    index,
                } => {
                    let value = values.get_mut(index).and_then(Option::take);
                    let found = match (value, &failure) {
                        (Some(value), None) => self.live_holders(live, &id, value).await,
                        (_, Some(Failure::Lost(reason))) => Err(Failure::Lost(reason.clone())),
                        _ => Err(Failure::Failed("missing pipeline result".into())),
                    };
                    match found {
                        Ok((holders, sizes)) => {
                            if subscribe && holders.is_empty() {
                                if self.subscriptions.len() >= MAX_SUBSCRIPTIONS_PER_NODE {
                                    self.reply(
                                        op,
                                        DirectoryReply::Unavailable {
                                            reason: format!(
                                                "{MAX_SUBSCRIPTIONS_PER_NODE} pending subscriptions, the most a node keeps"
                                            ),
                                        },
                                    );
                                    continue;
                                }
                                self.subscriptions.insert(id);
                            }
                            self.reply(op, DirectoryReply::Located { holders, sizes });
                        }
                        Err(f) => {
                            self.reply(
                                op,
                                DirectoryReply::Unavailable {
                                    reason: f.reason().to_string(),
                                },
                            );
                            if matches!(f, Failure::Lost(_)) {
                                failure = Some(f);
                            }
                        }
                    }
                }
            }
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        // Channels subscribed or kept for requests that no longer need them.
        for id in touched {
            if !self.subscriptions.contains(&id) {
                self.bounded(
                    "UNSUBSCRIBE",
                    live.sink.unsubscribe(self.keys.published(&id)),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Best effort on the way out: drop the node key, its index entry and its holder entries,
    /// announce it; the last live node also drops the token.
    async fn leave(&mut self, live: &mut Live) {
        let mut pipe = ::redis::pipe();
        pipe.cmd("EVAL")
            .arg(LEAVE)
            .arg(3)
            .arg(self.keys.node(self.me.node))
            .arg(self.keys.nodes())
            .arg(self.keys.token())
            .arg(&self.member_json)
            .arg(self.me.node.0)
            .arg(self.keys.node_prefix())
            .arg(&self.token_fingerprint)
            .ignore();
        pipe.cmd("PUBLISH")
            .arg(self.keys.members())
            .arg(format!("leave {}", self.me.node.0))
            .ignore();
        for id in self.publications.keys() {
            pipe.cmd("HDEL")
                .arg(self.keys.object(id))
                .arg(self.me.node.0)
                .ignore();
        }
        match timeout(LEAVE_TIMEOUT, pipe.query_async::<()>(&mut live.conn)).await {
            Ok(Ok(())) => tracing::debug!("left the Redis directory"),
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not leave the Redis directory: its keys expire by their TTLs")
            }
            Err(_) => tracing::warn!(
                "Redis did not answer the leave within {} ms: this node's keys expire by their TTLs",
                LEAVE_TIMEOUT.as_millis()
            ),
        }
    }
}

/// Why [`reset`] did not reset a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// The URL could not be parsed.
    #[error("bad Redis address {0}: use redis://HOST:PORT")]
    BadAddress(String),
    /// The cluster name cannot name Redis keys.
    #[error("bad cluster name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ -")]
    BadClusterName(String),
    /// Redis did not answer.
    #[error("cannot reach Redis at {addr}: {reason}")]
    Unreachable {
        /// The address, password masked.
        addr: String,
        /// Why.
        reason: String,
    },
    /// Nodes of the cluster are alive and `force` was not given.
    #[error(
        "cluster {cluster:?} has live nodes registered ({}): stop them first, or pass --force \
         to remove the records anyway (live nodes register again at their next heartbeat)",
        nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
    )]
    LiveNodes {
        /// The cluster.
        cluster: String,
        /// Its live nodes.
        nodes: Vec<NodeId>,
    },
}

/// What [`reset`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetOutcome {
    /// Nodes that were alive (only with `force`).
    pub live_nodes: Vec<NodeId>,
    /// Keys deleted (token, node records, index, holder entries).
    pub keys_removed: u64,
}

/// Bound on each command of [`reset`].
const RESET_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Removes every key of cluster `cluster` from the Redis at `url` (its token, node records and
/// object locations), so the name can be started afresh with any token. Refuses while nodes of
/// the cluster are alive unless `force`.
pub async fn reset(url: &str, cluster: &str, force: bool) -> Result<ResetOutcome, ResetError> {
    let shown = super::DirectorySpec::Redis {
        url: url.to_string(),
    }
    .to_string();
    if !valid_cluster_name(cluster) {
        return Err(ResetError::BadClusterName(cluster.to_string()));
    }
    let client = Client::open(url).map_err(|_| ResetError::BadAddress(shown.clone()))?;
    let unreachable = |reason: String| ResetError::Unreachable {
        addr: shown.clone(),
        reason,
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(RESET_COMMAND_TIMEOUT))
        .set_response_timeout(Some(RESET_COMMAND_TIMEOUT));
    let mut conn = match timeout(
        RESET_COMMAND_TIMEOUT,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => return Err(unreachable(error.to_string())),
        Err(_) => return Err(unreachable("no connection within 5 s".into())),
    };
    let keys = Keys::new(cluster);
    let node_keys = scan(&mut conn, &format!("{}*", keys.node_prefix()))
        .await
        .map_err(unreachable)?;
    let mut live_nodes: Vec<NodeId> = node_keys
        .iter()
        .filter_map(|key| key.strip_prefix(&keys.node_prefix())?.parse().ok())
        .map(NodeId)
        .collect();
    live_nodes.sort();
    if !live_nodes.is_empty() && !force {
        return Err(ResetError::LiveNodes {
            cluster: cluster.to_string(),
            nodes: live_nodes,
        });
    }
    let all = scan(&mut conn, &keys.all_pattern())
        .await
        .map_err(unreachable)?;
    let mut keys_removed = 0;
    for chunk in all.chunks(RESYNC_CHUNK) {
        let removed: u64 = timeout(
            RESET_COMMAND_TIMEOUT,
            ::redis::cmd("DEL").arg(chunk).query_async(&mut conn),
        )
        .await
        .map_err(|_| unreachable("DEL timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
        keys_removed += removed;
    }
    if !live_nodes.is_empty() {
        // The live nodes re-read the members and register again at their next heartbeat.
        let _ = timeout(
            RESET_COMMAND_TIMEOUT,
            ::redis::cmd("PUBLISH")
                .arg(keys.members())
                .arg("reset")
                .query_async::<()>(&mut conn),
        )
        .await;
    }
    Ok(ResetOutcome {
        live_nodes,
        keys_removed,
    })
}

/// Every key matching `pattern` (`SCAN`, so Redis is never blocked on a large keyspace).
async fn scan(conn: &mut MultiplexedConnection, pattern: &str) -> Result<Vec<String>, String> {
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = timeout(
            RESET_COMMAND_TIMEOUT,
            ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn),
        )
        .await
        .map_err(|_| "SCAN timed out".to_string())?
        .map_err(|e| e.to_string())?;
        found.extend(batch);
        if next == 0 {
            found.sort();
            found.dedup();
            return Ok(found);
        }
        cursor = next;
    }
}
