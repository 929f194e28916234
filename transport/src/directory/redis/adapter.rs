//! The Redis backend's link: an adapter task that answers the registry protocol
//! ([`ToRegistry`] in, [`FromRegistry`] out) from Redis, so the Redis backend runs the same
//! reconnecting client and session as the built-in one. One adapter serves one connection
//! attempt: the session's hello checks the token and the node id and registers the node, its
//! pings refresh the node key's TTL, its requests become pipelines, and pub/sub messages become
//! events and member lists. When Redis is lost the adapter ends with the reason and the session
//! reconnects, replaying what the node holds and waits for.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::{AsyncConnectionConfig, RedisError, RedisResult, Value};
use skyriver_core::auth::{self, Nonce, Proof, Role};
use skyriver_core::directory::{DirectoryEvent, DirectoryReply, DirectoryRequest, MemberInfo};
use skyriver_core::registry::{wire as registry_wire, FromRegistry, Hello, ToRegistry, WireOpId};
use skyriver_core::{ContentDigest, NodeId, ObjectId, ObjectSizes};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use super::super::client::{Connector, Link, LINK_INCOMING_QUEUE};
use super::super::{LinkError, TokenRecordError};
use super::cluster::ClusterLink;
use super::connection::{Backend, Commands, Incoming, Subscriber};
use super::token_record::{self, Mismatch};
use super::{
    content_value, holder_value, old_token_record_reason, parse_holder_value, wrong_token_reason,
    Keys, RedisConfig, CLAIM_TOKEN, DELETE_IF_UNCHANGED, DROP_ENTRY_OF_INCARNATION,
    DROP_STALE_HOLDERS, EXPIRE_OVERDUE, FULL_REREAD_EVERY, HEARTBEAT, LEAVE, LOOKUP_AND_MARK,
    MARKER_PREFIX, MAX_BATCH, MAX_SUBSCRIPTIONS_PER_NODE, POP_STALE_HOLDERS, PRUNE_IF_EXPIRED,
    PUBLISH_SAME_CONTENT, RESYNC_CHUNK, SLOOKUP_AND_MARK, SPUBLISH_SAME_CONTENT,
};

/// What this process's session proves to its adapter: both are in one process, so the
/// handshake between them checks the plumbing, not a secret (that is Redis's credentials and
/// the token record's job).
pub(super) const SESSION_TOKEN: &str = "";
/// Bound on a clean leave (one pipeline to Redis).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// What every adapter of one node needs.
#[derive(Debug)]
pub(super) struct Params {
    pub(super) config: RedisConfig,
    pub(super) keys: Keys,
    pub(super) me: MemberInfo,
    pub(super) member_json: String,
    /// The cluster token, to check against the token record.
    pub(super) token: crate::token::ClusterToken,
    /// The token record last found to admit the token (a reconnection skips the derivation).
    pub(super) verified_record: Mutex<Option<String>>,
    pub(super) backend: Backend,
    /// The Redis URL with any password masked, for messages.
    pub(super) shown_url: String,
}

/// Opens Redis links: both connections, then an adapter task.
#[derive(Debug, Clone)]
pub(super) struct RedisConnector {
    pub(super) params: Arc<Params>,
}

impl Connector for RedisConnector {
    async fn connect(&mut self) -> Result<Link, LinkError> {
        let params = self.params.clone();
        let connect_timeout = params.config.connect_timeout;
        let live = match &params.backend {
            Backend::Single(client) => open_single(client, &params.config).await?,
            Backend::Cluster(seeds) => {
                match timeout(
                    connect_timeout,
                    seeds.open(connect_timeout, params.config.request_timeout),
                )
                .await
                {
                    Ok(Ok((conn, pushes))) => Live {
                        conn: Commands::Cluster(ClusterLink { conn: conn.clone() }),
                        subscriber: Subscriber::Sharded { conn, pushes },
                    },
                    Ok(Err(error)) => return Err(error.into()),
                    Err(_) => {
                        return Err(LinkError::timeout(
                            "Redis Cluster connection",
                            connect_timeout,
                        ))
                    }
                }
            }
        };
        // Bounded: the session's client task holds what finds no place (see `Link`); one
        // batch's worth, so batching is as before.
        let (outgoing, requests) = mpsc::channel(MAX_BATCH);
        // Bounded: the adapter waits for the client task (see `Link`).
        let (answers, incoming) = mpsc::channel(LINK_INCOMING_QUEUE);
        let adapter = Adapter {
            config: params.config.clone(),
            keys: params.keys.clone(),
            me: params.me.clone(),
            member_json: params.member_json.clone(),
            token_record: String::new(),
            params: params.clone(),
            shown_url: params.shown_url.clone(),
            answers,
            publications: BTreeMap::new(),
            subscriptions: BTreeMap::new(),
            marker_nonce: {
                let nonce = crate::token::fresh_nonce();
                u64::from_le_bytes(nonce[..8].try_into().expect("8 of 32 bytes"))
            },
            next_marker: 0,
            members: BTreeMap::new(),
            members_epoch: 0,
            checks_since_reread: 0,
            reread_due: false,
        };
        Ok(Link {
            outgoing: Some(outgoing),
            incoming,
            task: Some(tokio::spawn(adapter.run(live, requests))),
            helper: None,
        })
    }
}

/// Opens both connections to one Redis server.
async fn open_single(client: &::redis::Client, config: &RedisConfig) -> Result<Live, LinkError> {
    let connect_timeout = config.connect_timeout;
    let connection_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(config.request_timeout));
    let conn = match timeout(
        connect_timeout,
        client.get_multiplexed_async_connection_with_config(&connection_config),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => return Err(error.into()),
        Err(_) => return Err(LinkError::timeout("Redis connection", connect_timeout)),
    };
    let pubsub = match timeout(connect_timeout, client.get_async_pubsub()).await {
        Ok(Ok(pubsub)) => pubsub,
        Ok(Err(error)) => return Err(error.into()),
        Err(_) => return Err(LinkError::timeout("pub/sub connection", connect_timeout)),
    };
    let (sink, stream) = pubsub.split();
    Ok(Live {
        conn: Commands::Single(conn),
        subscriber: Subscriber::Single { sink, stream },
    })
}

/// Open connections to Redis.
struct Live {
    conn: Commands,
    subscriber: Subscriber,
}

/// Why a command failed.
enum Failure {
    /// The connection is gone or Redis does not answer: reconnect.
    Lost(LinkError),
    /// Redis answered with an error, or with something this version does not read: this
    /// request fails, the connection stays. The text is the `Unavailable` reply's reason,
    /// which the core only shows.
    Failed(String),
}

impl Failure {
    /// The reason an `Unavailable` reply gives.
    fn reason(&self) -> String {
        match self {
            Failure::Lost(error) => error.to_string(),
            Failure::Failed(reason) => reason.clone(),
        }
    }
}

fn classify(error: RedisError) -> Failure {
    let lost = LinkError::from(error);
    if let LinkError::Redis(error) = &lost {
        if !(error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_unrecoverable_error()
            // Nothing works without the credentials: the link is no use.
            || lost.is_redis_auth())
        {
            return Failure::Failed(format!("Redis error: {error}"));
        }
    }
    Failure::Lost(lost)
}

/// One item of a batch, waiting for its pipeline results.
enum Pending {
    Lookup {
        op: WireOpId,
        id: ObjectId,
        subscribe: bool,
        /// With `subscribe`: the marker the lookup announced on the object's channel.
        marker: u64,
        index: usize,
    },
    Write {
        op: WireOpId,
    },
    Publish {
        op: WireOpId,
        id: ObjectId,
        content: (ObjectSizes, ContentDigest),
        index: usize,
    },
}

/// A pending subscription to one object, as the core registry keeps it, on top of a channel
/// whose messages arrive late.
///
/// The core fires a subscription with the publications served after the lookup that started
/// it. Here publication messages reach the subscriber's connection after the requests that
/// followed them may have been served, so a message can be older than the subscription it
/// finds. The rule: a subscribing lookup announces a marker on the object's channel in the
/// same atomic script that reads the holders (`LOOKUP_AND_MARK`); the channel delivers in
/// publication order, so a message before the marker was published before the lookup and
/// fires only a subscription that was already live then, never the one the lookup starts.
/// A node's own publication is answered on the command connection after its lookups, so it
/// fires whatever subscription the node has at once (its message, arriving later, finds it
/// gone or, if the node subscribed again meanwhile, before that lookup's marker: stale).
#[derive(Debug, Default)]
struct Subscription {
    /// Fired by the next publication message (its lookup's marker arrived).
    live: bool,
    /// Markers of lookups that found no holder and whose marker has not arrived: each makes
    /// the subscription live when it does (again, if a message fired it meanwhile).
    arming: BTreeSet<u64>,
}

/// The adapter of one connection attempt.
struct Adapter {
    config: RedisConfig,
    keys: Keys,
    me: MemberInfo,
    member_json: String,
    /// The cluster's token record once the hello checked it (claimed or refreshed by every
    /// heartbeat).
    token_record: String,
    params: Arc<Params>,
    shown_url: String,
    answers: mpsc::Sender<Result<FromRegistry, LinkError>>,
    /// What this node published on this connection (for a clean leave).
    publications: BTreeMap<ObjectId, (ObjectSizes, ContentDigest)>,
    /// Objects this node waits for (subscribed on the pub/sub connection).
    subscriptions: BTreeMap<ObjectId, Subscription>,
    /// Names this adapter's lookup markers (another connection's are not its own).
    marker_nonce: u64,
    /// The next lookup marker's number.
    next_marker: u64,
    /// Live members as last read.
    members: BTreeMap<NodeId, MemberInfo>,
    /// The number of the last member list given to the session (0: none yet). The session
    /// is in this process, so every list goes whole.
    members_epoch: u64,
    /// Periodic expiry checks since every member was last re-read.
    checks_since_reread: u32,
    /// The next periodic check re-reads every member (a members message was not understood).
    reread_due: bool,
}

impl Adapter {
    /// Hands `message` to the client task, waiting for a place: meanwhile the adapter takes
    /// no request and reads nothing from Redis. The client task never waits on the adapter,
    /// so this cannot deadlock.
    async fn answer(&self, message: FromRegistry) {
        // The session dropped the link: nothing to do, the task ends with its requests.
        let _ = self.answers.send(Ok(message)).await;
    }

    async fn reply(&self, op: WireOpId, reply: DirectoryReply) {
        self.answer(FromRegistry::Reply { op, reply }).await;
    }

    async fn run(mut self, mut live: Live, mut requests: mpsc::Receiver<ToRegistry>) {
        match self.serve(&mut live, &mut requests).await {
            Ok(()) => {}
            Err(Failure::Lost(error)) => {
                let _ = self.answers.send(Err(error)).await;
            }
            // A failed command that ends `serve` (one of the hello's): the link is no use.
            Err(Failure::Failed(reason)) => {
                let _ = self.answers.send(Err(LinkError::Command(reason))).await;
            }
        }
    }

    /// Answers the session until it drops the link or leaves, or Redis is lost.
    async fn serve(
        &mut self,
        live: &mut Live,
        requests: &mut mpsc::Receiver<ToRegistry>,
    ) -> Result<(), Failure> {
        let mut welcomed = false;
        // The hello waiting for its proof, with the nonce this side sent. The session runs the
        // same handshake here as with the built-in head; Redis itself is guarded by its own
        // credentials and the cluster token's record (checked when the proof arrives).
        let mut handshake: Option<(Hello, Nonce)> = None;
        let mut next: Option<ToRegistry> = None;
        let refresh = tokio::time::sleep(self.config.member_refresh_interval);
        tokio::pin!(refresh);
        loop {
            let message = match next.take() {
                Some(message) => Some(message),
                None => tokio::select! {
                    message = requests.recv() => match message {
                        None => return Ok(()),
                        Some(message) => Some(message),
                    },
                    message = live.subscriber.next(), if welcomed => match message {
                        Incoming::Lost(reason) => {
                            return Err(Failure::Lost(LinkError::SubscriberLost(reason)))
                        }
                        Incoming::Nothing => None,
                        Incoming::Message { channel, payload } => {
                            if self.on_message(live, &channel, &payload).await? {
                                // A members message not understood: one re-read of every
                                // member for a burst of them.
                                self.reread_due = true;
                                let soon = Instant::now() + Duration::from_millis(50);
                                if refresh.deadline() > soon {
                                    refresh.as_mut().reset(soon);
                                }
                            }
                            None
                        }
                    },
                    _ = &mut refresh, if welcomed => {
                        refresh.as_mut().reset(Instant::now() + self.config.member_refresh_interval);
                        Self::tolerate(self.periodic_check(live).await)?;
                        None
                    }
                },
            };
            let Some(message) = message else { continue };
            // Redis keeps the directory's state across its own restarts (no grace period to
            // honour): a replayed publication is an ordinary one.
            let message = match message {
                ToRegistry::Reclaim {
                    op,
                    id,
                    sizes,
                    digest,
                } => ToRegistry::Request {
                    op,
                    request: DirectoryRequest::Publish { id, sizes, digest },
                },
                other => other,
            };
            match message {
                ToRegistry::Hello(hello) => {
                    if welcomed || handshake.is_some() {
                        return Err(Failure::Lost(LinkError::Protocol(
                            "a second hello on one connection",
                        )));
                    }
                    let nonce = crate::token::fresh_nonce();
                    handshake = Some((hello, nonce));
                    self.answer(FromRegistry::Challenge { nonce }).await;
                }
                ToRegistry::Proof(proof) => {
                    let Some((hello, nonce)) = handshake.take() else {
                        return Err(Failure::Lost(LinkError::Protocol(
                            "a proof without a hello",
                        )));
                    };
                    let identity = registry_wire::member_identity(&hello.member);
                    let transcript = registry_wire::transcript(&hello.nonce, &nonce, &identity);
                    if !auth::verify(SESSION_TOKEN, Role::Dialer, &transcript, &proof) {
                        return Err(Failure::Lost(LinkError::Protocol(
                            "the session's proof does not hold",
                        )));
                    }
                    let own_proof = auth::prove(SESSION_TOKEN, Role::Acceptor, &transcript);
                    match self.hello(live, hello, own_proof).await? {
                        Ok(()) => welcomed = true,
                        Err((reason, retryable)) => {
                            self.answer(FromRegistry::Refused { reason, retryable })
                                .await;
                            return Ok(());
                        }
                    }
                }
                ToRegistry::Ping { seq } => {
                    Self::tolerate(self.register(live, false).await)?;
                    self.answer(FromRegistry::Pong { seq }).await;
                }
                ToRegistry::Goodbye => {
                    self.leave(live).await;
                    return Ok(());
                }
                ToRegistry::Request { op, request } => {
                    if !welcomed {
                        return Err(Failure::Lost(LinkError::Protocol(
                            "a request before the hello",
                        )));
                    }
                    let mut batch = vec![(op, request)];
                    while batch.len() < MAX_BATCH {
                        match requests.try_recv() {
                            Ok(ToRegistry::Request { op, request }) => batch.push((op, request)),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    Self::tolerate(self.serve_batch(live, batch).await)?;
                }
                ToRegistry::Reclaim { .. } => unreachable!("made a request above"),
            }
        }
    }

    /// A failed command that left the connection up is logged; a lost one ends the adapter.
    fn tolerate(result: Result<(), Failure>) -> Result<(), Failure> {
        match result {
            Err(Failure::Failed(reason)) => {
                tracing::warn!(%reason, "Redis directory command failed");
                Ok(())
            }
            other => other,
        }
    }

    /// Checks the token and the node id, registers the node and answers `Welcome` and the
    /// members; `Ok(Err((reason, retryable)))` when the node is refused.
    async fn hello(
        &mut self,
        live: &mut Live,
        hello: Hello,
        proof: Proof,
    ) -> Result<Result<(), (String, bool)>, Failure> {
        if hello.member != self.me {
            return Ok(Err(("the hello names another node".into(), false)));
        }
        // The first node of a cluster sets the token record; later ones must match it.
        let mut pipe = ::redis::pipe();
        pipe.cmd("GET").arg(self.keys.token());
        pipe.cmd("GET").arg(self.keys.node(self.me.node));
        pipe.cmd("PTTL").arg(self.keys.token());
        let (stored, existing, token_ttl_ms): (Option<String>, Option<String>, i64) = self
            .bounded("the token check", pipe.query_async(&mut live.conn))
            .await?;
        let stored = match stored {
            Some(stored) => stored,
            None => {
                let (cluster, cost) = (self.config.cluster.clone(), self.config.token_kdf);
                let params = self.params.clone();
                let fresh = tokio::task::spawn_blocking(move || {
                    token_record::create(&cluster, params.token.expose_secret(), cost)
                })
                .await
                .map_err(TokenRecordError::Task)
                .and_then(|made| made)
                .map_err(|source| {
                    Failure::Lost(LinkError::TokenRecord {
                        stage: "derived",
                        source: Arc::new(source),
                    })
                })?;
                self.token_record = fresh;
                // SET if absent; another node may have claimed it meanwhile.
                let mut pipe = ::redis::pipe();
                self.add_claim_token(&mut pipe);
                let (held,): (String,) = self
                    .bounded("the token claim", pipe.query_async(&mut live.conn))
                    .await?;
                held
            }
        };
        if let Err(mismatch) = self.check_token_record(&stored).await? {
            let reason = match mismatch {
                Mismatch::WrongToken => {
                    wrong_token_reason(&self.shown_url, &self.config.cluster, token_ttl_ms)
                }
                Mismatch::OldFormat | Mismatch::TooCostly => {
                    old_token_record_reason(&self.shown_url, &self.config.cluster)
                }
            };
            return Ok(Err((reason, false)));
        }
        self.token_record = stored;
        if let Some(existing) = existing {
            if let Ok(other) = serde_json::from_str::<MemberInfo>(&existing) {
                let same_address = other.fabric_addr == self.me.fabric_addr;
                let restart = same_address && self.me.incarnation > other.incarnation;
                if restart {
                    // The old daemon is gone: its holder entries no longer count (their
                    // incarnation is not the member's) and its subscriptions died with its
                    // pub/sub connection.
                    tracing::info!(node = %self.me.node, old = other.incarnation, "node restarted");
                } else if other.incarnation != self.me.incarnation || !same_address {
                    let reason = format!(
                        "{} is already a member (incarnation {}, fabric at {}); a restarted \
                         daemon is accepted once the old registration expires ({} ms)",
                        self.me.node,
                        other.incarnation,
                        other.fabric_addr,
                        self.config.node_ttl.as_millis()
                    );
                    return Ok(Err((reason, !same_address)));
                }
            }
        }
        self.bounded("SUBSCRIBE", live.subscriber.subscribe(self.keys.members()))
            .await?;
        self.register(live, true).await?;
        self.answer(FromRegistry::Welcome {
            version: skyriver_core::registry::PROTOCOL_VERSION,
            proof,
        })
        .await;
        self.refresh_members(live).await?;
        // What an earlier incarnation of this node, or nodes gone while none of the cluster
        // ran, left behind.
        Self::tolerate(self.drop_stale_holders(live).await)?;
        Ok(Ok(()))
    }

    /// Whether the stored token record admits this node's token: the record verified last
    /// time, or a derivation with the record's salt and cost (off the async threads).
    async fn check_token_record(&self, stored: &str) -> Result<Result<(), Mismatch>, Failure> {
        let verified = |params: &Params| {
            params
                .verified_record
                .lock()
                .is_ok_and(|v| v.as_deref() == Some(stored))
        };
        if verified(&self.params) {
            return Ok(Ok(()));
        }
        if stored == self.token_record {
            // This node made the record.
            if let Ok(mut verified) = self.params.verified_record.lock() {
                *verified = Some(stored.to_string());
            }
            return Ok(Ok(()));
        }
        let params = self.params.clone();
        let (record, cluster) = (stored.to_string(), self.config.cluster.clone());
        let outcome = tokio::task::spawn_blocking(move || {
            let outcome = token_record::verify(&record, &cluster, params.token.expose_secret());
            if outcome.is_ok() {
                if let Ok(mut verified) = params.verified_record.lock() {
                    *verified = Some(record);
                }
            }
            outcome
        })
        .await
        .map_err(|e| {
            Failure::Lost(LinkError::TokenRecord {
                stage: "checked",
                source: Arc::new(TokenRecordError::Task(e)),
            })
        })?;
        Ok(outcome)
    }

    /// Runs `future` under the request timeout.
    async fn bounded<T>(
        &self,
        what: &'static str,
        future: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, Failure> {
        match timeout(self.config.request_timeout, future).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(classify(error)),
            Err(_) => Err(Failure::Lost(LinkError::timeout(
                what,
                self.config.request_timeout,
            ))),
        }
    }

    /// Writes this node's key (with its TTL) and index entry and refreshes the token's TTL;
    /// announces a join if `announce`.
    async fn register(&self, live: &mut Live, announce: bool) -> Result<(), Failure> {
        let mut pipe = ::redis::pipe();
        self.add_claim_token(&mut pipe);
        pipe.ignore();
        pipe.cmd("EVAL")
            .arg(HEARTBEAT)
            .arg(2)
            .arg(self.keys.node(self.me.node))
            .arg(self.keys.deadlines())
            .arg(&self.member_json)
            .arg(self.config.node_ttl.as_millis().max(1) as u64)
            .arg(self.me.node.0)
            .ignore();
        pipe.cmd("SADD")
            .arg(self.keys.nodes())
            .arg(self.me.node.0)
            .ignore();
        pipe.cmd("SADD")
            .arg(self.keys.held_index())
            .arg(self.held_entry())
            .ignore();
        if announce {
            pipe.cmd(self.keys.publish_command())
                .arg(self.keys.members())
                .arg(format!("join {}", self.me.node.0))
                .ignore();
        }
        self.bounded("the heartbeat", pipe.query_async::<()>(&mut live.conn))
            .await
    }

    /// This node incarnation's entry in the index of `held:` sets.
    fn held_entry(&self) -> String {
        format!("{}:{}", self.me.node.0, self.me.incarnation)
    }

    /// Adds to (or removes from) this node incarnation's `held:` set, which lets others drop
    /// its holder entries once it is gone.
    fn add_held(&self, pipe: &mut ::redis::Pipeline, id: &ObjectId, published: bool) {
        pipe.cmd(if published { "SADD" } else { "SREM" })
            .arg(self.keys.held(self.me.node, self.me.incarnation))
            .arg(id.to_string())
            .ignore();
    }

    /// Drops the holder entries of every node incarnation that is gone (its node key expired,
    /// or the node restarted with a newer incarnation), from their `held:` sets, in chunks.
    /// Any node may run it at any time: an incarnation alive again is left alone.
    async fn drop_stale_holders(&mut self, live: &mut Live) -> Result<(), Failure> {
        let entries: Vec<String> = self.set_members(live, self.keys.held_index()).await?;
        for entry in entries {
            let parsed = entry
                .split_once(':')
                .and_then(|(n, i)| Some((n.parse::<u32>().ok()?, i.parse::<u32>().ok()?)));
            let Some((node, incarnation)) = parsed else {
                tracing::warn!(entry, "ignoring a malformed held index entry in Redis");
                continue;
            };
            if node == self.me.node.0 && incarnation == self.me.incarnation {
                continue;
            }
            let mut dropped = false;
            loop {
                let left: i64 = if self.keys.is_sharded() {
                    self.pop_stale_holders(live, NodeId(node), incarnation)
                        .await?
                } else {
                    self.bounded(
                        "dropping a gone node's holder entries",
                        ::redis::cmd("EVAL")
                            .arg(DROP_STALE_HOLDERS)
                            .arg(0)
                            .arg(self.keys.prefix())
                            .arg(node)
                            .arg(incarnation)
                            .arg(RESYNC_CHUNK)
                            .query_async(&mut live.conn),
                    )
                    .await?
                };
                dropped |= left >= 0;
                if left <= 0 {
                    break;
                }
            }
            if dropped {
                tracing::info!(node = %NodeId(node), incarnation, "dropped a gone node's holder entries");
            }
        }
        Ok(())
    }

    /// On Redis Cluster, one chunk of [`Adapter::drop_stale_holders`]: pops up to
    /// `RESYNC_CHUNK` objects from the gone incarnation's `held:` set (in the membership slot,
    /// atomically with the liveness check), then drops its entries in those objects' slots.
    /// Returns -1 if the incarnation is alive, else how many are left.
    async fn pop_stale_holders(
        &self,
        live: &mut Live,
        node: NodeId,
        incarnation: u32,
    ) -> Result<i64, Failure> {
        let popped: Vec<Value> = self
            .bounded(
                "popping a gone node's holder entries",
                ::redis::cmd("EVAL")
                    .arg(POP_STALE_HOLDERS)
                    .arg(1)
                    .arg(self.keys.held(node, incarnation))
                    .arg(self.keys.prefix())
                    .arg(node.0)
                    .arg(incarnation)
                    .arg(RESYNC_CHUNK)
                    .query_async(&mut live.conn),
            )
            .await?;
        let mut popped = popped.into_iter();
        let left: i64 = popped
            .next()
            .and_then(|v| ::redis::from_redis_value(v).ok())
            .ok_or_else(|| Failure::Failed("unexpected answer popping holder entries".into()))?;
        let mut drop = ::redis::pipe();
        for value in popped {
            let Some(id) = ::redis::from_redis_value::<String>(value)
                .ok()
                .and_then(|id| id.parse::<ObjectId>().ok())
            else {
                continue;
            };
            drop.cmd("EVAL")
                .arg(DROP_ENTRY_OF_INCARNATION)
                .arg(1)
                .arg(self.keys.object(&id))
                .arg(node.0)
                .arg(incarnation)
                .ignore();
        }
        self.bounded(
            "dropping a gone node's holder entries",
            drop.query_async::<()>(&mut live.conn),
        )
        .await?;
        Ok(left)
    }

    /// Claims the token key for this cluster's token record or refreshes its TTL; its result is
    /// what the key holds.
    fn add_claim_token(&self, pipe: &mut ::redis::Pipeline) {
        pipe.cmd("EVAL")
            .arg(CLAIM_TOKEN)
            .arg(1)
            .arg(self.keys.token())
            .arg(&self.token_record)
            .arg(self.config.token_ttl.as_millis().max(1) as u64);
    }

    /// The members of the set at `key`.
    async fn set_members<T: ::redis::FromRedisValue>(
        &self,
        live: &mut Live,
        key: String,
    ) -> Result<Vec<T>, Failure> {
        self.bounded(
            "SMEMBERS",
            ::redis::cmd("SMEMBERS")
                .arg(key)
                .query_async(&mut live.conn),
        )
        .await
    }

    /// Every member refresh interval: looks for expired nodes through their deadlines (O(expired)
    /// reads), or re-reads every member when that is due (see [`FULL_REREAD_EVERY`]).
    async fn periodic_check(&mut self, live: &mut Live) -> Result<(), Failure> {
        self.checks_since_reread += 1;
        if self.reread_due || self.checks_since_reread >= FULL_REREAD_EVERY {
            return self.refresh_members(live).await;
        }
        self.expire_overdue(live).await
    }

    /// Asks Redis for the nodes past their deadline ([`EXPIRE_OVERDUE`], which drops the gone
    /// ones from the index); announces their leave, drops them from the view and drops their
    /// holder entries. While some registered node has no deadline (an earlier version's),
    /// re-reads every member instead, as that version does.
    async fn expire_overdue(&mut self, live: &mut Live) -> Result<(), Failure> {
        let answer: Vec<i64> = self
            .bounded(
                "looking for expired nodes",
                ::redis::cmd("EVAL")
                    .arg(EXPIRE_OVERDUE)
                    .arg(2)
                    .arg(self.keys.nodes())
                    .arg(self.keys.deadlines())
                    .arg(self.keys.node_prefix())
                    .arg(RESYNC_CHUNK)
                    .query_async(&mut live.conn),
            )
            .await?;
        let Some((&without_deadline, gone)) = answer.split_first() else {
            return Err(Failure::Failed(
                "unexpected answer looking for expired nodes".into(),
            ));
        };
        if without_deadline > 0 {
            return self.refresh_members(live).await;
        }
        let gone: Vec<u32> = gone
            .iter()
            .filter_map(|&id| u32::try_from(id).ok())
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let mut announce = ::redis::pipe();
        let mut changed = false;
        for &id in &gone {
            tracing::info!(node = %NodeId(id), "node expired");
            announce
                .cmd(self.keys.publish_command())
                .arg(self.keys.members())
                .arg(format!("leave {id}"))
                .ignore();
            changed |= self.members.remove(&NodeId(id)).is_some();
        }
        self.bounded("PUBLISH", announce.query_async::<()>(&mut live.conn))
            .await?;
        if changed {
            self.announce_members().await;
        }
        Self::tolerate(self.drop_stale_holders(live).await)
    }

    /// Re-reads the live members and tells the driver when they changed.
    async fn refresh_members(&mut self, live: &mut Live) -> Result<(), Failure> {
        self.checks_since_reread = 0;
        self.reread_due = false;
        let ids: Vec<u32> = self.set_members(live, self.keys.nodes()).await?;
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
                            .arg(3)
                            .arg(key)
                            .arg(self.keys.nodes())
                            .arg(self.keys.deadlines())
                            .arg(*id);
                    }
                }
            }
            if !expired.is_empty() {
                let pruned: Vec<i64> = self
                    .bounded("pruning expired nodes", prune.query_async(&mut live.conn))
                    .await?;
                let mut announce = ::redis::pipe();
                let pruned_any = pruned.contains(&1);
                for (id, pruned) in expired.iter().zip(pruned) {
                    if pruned == 1 {
                        tracing::info!(node = %NodeId(*id), "node expired");
                        announce
                            .cmd(self.keys.publish_command())
                            .arg(self.keys.members())
                            .arg(format!("leave {id}"))
                            .ignore();
                    }
                }
                self.bounded("PUBLISH", announce.query_async::<()>(&mut live.conn))
                    .await?;
                if pruned_any {
                    Self::tolerate(self.drop_stale_holders(live).await)?;
                }
            }
        }
        if members != self.members || self.members_epoch == 0 {
            self.members = members;
            self.announce_members().await;
        }
        Ok(())
    }

    /// Gives the session the member view as a new list.
    async fn announce_members(&mut self) {
        self.members_epoch += 1;
        self.answer(FromRegistry::Members {
            epoch: self.members_epoch,
            members: self.members.values().cloned().collect(),
        })
        .await;
    }

    /// A message of the members channel: a `join` reads that node's entry alone, a `leave`
    /// drops it, so a change costs each node one read, not a read of every member. `false`
    /// when the message is not understood (the caller re-reads every member soon).
    async fn on_member_message(
        &mut self,
        live: &mut Live,
        payload: &[u8],
    ) -> Result<bool, Failure> {
        let payload = String::from_utf8_lossy(payload);
        let Some((what, id)) = payload.split_once(' ') else {
            return Ok(false);
        };
        let Ok(id) = id.parse::<u32>() else {
            return Ok(false);
        };
        let node = NodeId(id);
        let entry = match what {
            "join" => {
                let key = self.keys.node(node);
                let json: Option<String> = self
                    .bounded(
                        "GET",
                        ::redis::cmd("GET").arg(&key).query_async(&mut live.conn),
                    )
                    .await?;
                match json.map(|j| serde_json::from_str::<MemberInfo>(&j)) {
                    Some(Ok(member)) if member.node == node => Some(member),
                    // Gone already (its leave follows), or malformed: a re-read of every
                    // member settles it.
                    Some(_) | None => return Ok(false),
                }
            }
            "leave" => None,
            _ => return Ok(false),
        };
        let changed = match entry {
            Some(member) => self.members.insert(node, member.clone()).as_ref() != Some(&member),
            None => self.members.remove(&node).is_some(),
        };
        if changed {
            self.announce_members().await;
        }
        Ok(true)
    }

    /// The holders in an `obj:` hash that are alive with the incarnation that published, and
    /// the sizes. Refreshes the member view when it meets an unknown node, and deletes entries
    /// of nodes that are gone or restarted.
    async fn live_holders(
        &mut self,
        live: &mut Live,
        id: &ObjectId,
        value: Value,
    ) -> Result<(Vec<NodeId>, Option<(ObjectSizes, ContentDigest)>), Failure> {
        let raw: HashMap<String, String> = ::redis::from_redis_value(value)
            .map_err(|e| Failure::Failed(format!("unexpected holder entry: {e}")))?;
        self.live_entries(live, id, raw.into_iter().collect()).await
    }

    /// Of holder entries (field, value) of `id`'s hash: the live holders and the content they
    /// name. Refreshes the member view when it meets an unknown node, and deletes entries of
    /// nodes that are gone or restarted.
    async fn live_entries(
        &mut self,
        live: &mut Live,
        id: &ObjectId,
        raw: Vec<(String, String)>,
    ) -> Result<(Vec<NodeId>, Option<(ObjectSizes, ContentDigest)>), Failure> {
        type Entry = (String, NodeId, u32, (ObjectSizes, ContentDigest), String);
        let entries: Vec<Entry> = raw
            .into_iter()
            .filter_map(|(field, value)| {
                let node = NodeId(field.parse().ok()?);
                let (incarnation, sizes, digest) = parse_holder_value(&value)?;
                Some((field, node, incarnation, (sizes, digest), value))
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
        let mut content = None;
        let mut stale = ::redis::pipe();
        let mut any_stale = false;
        for (field, node, incarnation, c, value) in entries {
            if is_live(&self.members, &node, incarnation) {
                holders.push(node);
                content.get_or_insert(c);
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
        Ok((holders, content))
    }

    /// Publishes `id` unless live nodes hold it with another content (then that content).
    /// Entries of dead nodes that stand in the way are deleted and the publish tried again.
    /// With the reply, the content if it was published (`sent`, the content this publish
    /// sent, then withdrawn if a withdrawal followed in the same batch: that publish is
    /// answered `Done` either way).
    async fn publish_checked(
        &mut self,
        live: &mut Live,
        id: ObjectId,
        sent: (ObjectSizes, ContentDigest),
        first_answer: Value,
    ) -> Result<(DirectoryReply, Option<(ObjectSizes, ContentDigest)>), Failure> {
        let read = |answer| {
            ::redis::from_redis_value::<Vec<String>>(answer)
                .map_err(|e| Failure::Failed(format!("unexpected publish answer: {e}")))
        };
        let pairs = |conflicts: Vec<String>| -> Vec<(String, String)> {
            conflicts
                .chunks_exact(2)
                .map(|pair| (pair[0].clone(), pair[1].clone()))
                .collect()
        };
        let Some(&(sizes, digest)) = self.publications.get(&id) else {
            // Withdrawn in the same batch, after the publish. It was published unless a live
            // holder of another content was in the way. A gone incarnation's entry (they
            // linger until met) does not count, as in the core, which lists none: once such
            // entries are deleted, the publication runs again and the withdrawal after it, so
            // that whoever waits for the object hears of it (this node's own message is not
            // its business: see `on_message`).
            let conflicts = read(first_answer)?;
            if conflicts.is_empty() {
                return Ok((DirectoryReply::Done, Some(sent)));
            }
            let (holders, _) = self.live_entries(live, &id, pairs(conflicts)).await?;
            if !holders.is_empty() {
                return Ok((DirectoryReply::Done, None));
            }
            let mut pipe = ::redis::pipe();
            pipe.add_command(self.publish_command(id, sent.0, sent.1));
            pipe.cmd("HDEL")
                .arg(self.keys.object(&id))
                .arg(self.me.node.0)
                .ignore();
            let mut again: Vec<Value> = self
                .bounded("publishing", pipe.query_async(&mut live.conn))
                .await?;
            let again = again
                .pop()
                .ok_or_else(|| Failure::Failed("missing pipeline result".into()))?;
            let published = read(again)?.is_empty().then_some(sent);
            return Ok((DirectoryReply::Done, published));
        };
        let mut answer = first_answer;
        for attempt in 0..2 {
            let conflicts = read(answer)?;
            if conflicts.is_empty() {
                return Ok((DirectoryReply::Done, Some((sizes, digest))));
            }
            let (holders, content) = self.live_entries(live, &id, pairs(conflicts)).await?;
            if let (false, Some((sizes, digest))) = (holders.is_empty(), content) {
                self.publications.remove(&id);
                return Ok((DirectoryReply::Conflict { sizes, digest }, None));
            }
            if attempt == 1 {
                break;
            }
            // Only dead nodes' entries were in the way (deleted by `live_entries`): again.
            answer = self
                .bounded(
                    "publishing",
                    self.publish_command(id, sizes, digest)
                        .query_async(&mut live.conn),
                )
                .await?;
        }
        Err(Failure::Failed(format!(
            "{id}: holder entries of another content keep coming back"
        )))
    }

    /// The [`PUBLISH_SAME_CONTENT`] call for one publication.
    fn publish_command(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("EVAL");
        cmd.arg(if self.keys.is_sharded() {
            SPUBLISH_SAME_CONTENT
        } else {
            PUBLISH_SAME_CONTENT
        })
        .arg(2)
        .arg(self.keys.object(&id))
        .arg(self.keys.published(&id))
        .arg(self.me.node.0)
        .arg(holder_value(self.me.incarnation, &sizes, digest))
        .arg(content_value(&sizes, digest))
        .arg(format!(
            "{} {}",
            self.me.node.0,
            holder_value(self.me.incarnation, &sizes, digest)
        ));
        cmd
    }

    /// A publication of `id` by `holder`: fires the subscription to it, if any. `true` when
    /// that ended it (no later lookup waits for its marker), so the caller stops listening on
    /// the object's channel. A publication message (`own` false) fires only a live
    /// subscription; this node's own publication (`own`), answered after its lookups, fires
    /// any and ends it.
    async fn fire(
        &mut self,
        id: ObjectId,
        holder: NodeId,
        (sizes, digest): (ObjectSizes, ContentDigest),
        own: bool,
    ) -> bool {
        let Some(subscription) = self.subscriptions.get_mut(&id) else {
            return false;
        };
        if !own && !subscription.live {
            return false;
        }
        subscription.live = false;
        let ended = own || subscription.arming.is_empty();
        if ended {
            self.subscriptions.remove(&id);
        }
        self.answer(FromRegistry::Event(DirectoryEvent::Published {
            id,
            holder,
            sizes,
            digest,
        }))
        .await;
        ended
    }

    /// This adapter's lookup marker `marker` for `id` arrived: a subscription that lookup
    /// started is live from now on.
    fn on_marker(&mut self, id: ObjectId, marker: u64) {
        if let Some(subscription) = self.subscriptions.get_mut(&id) {
            if subscription.arming.remove(&marker) {
                subscription.live = true;
            }
        }
    }

    /// Handles one pub/sub message; `Ok(true)` when the members may have changed.
    async fn on_message(
        &mut self,
        live: &mut Live,
        channel: &str,
        payload: &[u8],
    ) -> Result<bool, Failure> {
        if channel == self.keys.members() {
            // Understood: nothing more to do; not understood, or the read failed (as during
            // a failover): re-read every member soon.
            return match self.on_member_message(live, payload).await {
                Ok(understood) => Ok(!understood),
                Err(Failure::Failed(reason)) => {
                    tracing::warn!(%reason, "reading a joining node's entry failed");
                    Ok(true)
                }
                Err(lost) => Err(lost),
            };
        }
        let Some(id) = self.keys.object_of_channel(channel) else {
            return Ok(false);
        };
        let payload = String::from_utf8_lossy(payload).into_owned();
        if let Some(marker) = payload.strip_prefix(MARKER_PREFIX) {
            // Another node's, or another connection's, markers are not this one's business.
            let mine = marker
                .split_once(' ')
                .filter(|(nonce, _)| *nonce == format!("{:016x}", self.marker_nonce))
                .and_then(|(_, seq)| seq.parse().ok());
            if let Some(seq) = mine {
                self.on_marker(id, seq);
            }
            return Ok(false);
        }
        let parsed = (|| {
            let mut parts = payload.split(' ');
            let node = NodeId(parts.next()?.parse().ok()?);
            let (_, sizes, digest) = parse_holder_value(&parts.collect::<Vec<_>>().join(" "))?;
            Some((node, (sizes, digest)))
        })();
        match parsed {
            // This node's own publication fired its subscription when it was answered; its
            // message, arriving later, is stale (and a publication run again after a gone
            // node's entry was in the way comes after the batch's later lookups' markers).
            Some((holder, _)) if holder == self.me.node => {}
            Some((holder, content)) => {
                if self.fire(id, holder, content, false).await {
                    self.bounded(
                        "UNSUBSCRIBE",
                        live.subscriber.unsubscribe(self.keys.published(&id)),
                    )
                    .await?;
                }
            }
            None => tracing::warn!(%id, %payload, "ignoring a malformed publication message"),
        }
        Ok(false)
    }

    /// Serves requests queued together: subscriptions first (confirmed by Redis), then one
    /// pipeline for everything else.
    async fn serve_batch(
        &mut self,
        live: &mut Live,
        batch: Vec<(WireOpId, DirectoryRequest)>,
    ) -> Result<(), Failure> {
        let mut pipe = ::redis::pipe();
        let mut commands = 0;
        let mut pending = Vec::new();
        let mut touched = HashSet::new();
        let mut result = Ok(());
        for (op, request) in batch {
            // Redis keeps no copies of record: a `LocateCopies` is a lookup, answered `Located`
            // (which tells the node so).
            let request = match request {
                DirectoryRequest::LocateCopies { id } => DirectoryRequest::Lookup {
                    id,
                    subscribe: false,
                },
                other => other,
            };
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
                    if self.subscriptions.remove(&id).is_some() {
                        touched.insert(id);
                    }
                }
                DirectoryRequest::Lookup { id, subscribe } => {
                    if subscribe && !self.subscriptions.contains_key(&id) && touched.insert(id) {
                        if let Err(failure) = self
                            .bounded(
                                "SUBSCRIBE",
                                live.subscriber.subscribe(self.keys.published(&id)),
                            )
                            .await
                        {
                            result = Err(failure);
                        }
                    }
                    let marker = self.next_marker;
                    if subscribe {
                        self.next_marker += 1;
                        pipe.cmd("EVAL")
                            .arg(if self.keys.is_sharded() {
                                SLOOKUP_AND_MARK
                            } else {
                                LOOKUP_AND_MARK
                            })
                            .arg(2)
                            .arg(self.keys.object(&id))
                            .arg(self.keys.published(&id))
                            .arg(format!(
                                "{MARKER_PREFIX}{:016x} {marker}",
                                self.marker_nonce
                            ));
                    } else {
                        pipe.cmd("HGETALL").arg(self.keys.object(&id));
                    }
                    pending.push(Pending::Lookup {
                        op,
                        id,
                        subscribe,
                        marker,
                        index: commands,
                    });
                    commands += 1;
                }
                // Redis runs no registry rules: a replicated publication is a plain one (no
                // copies are placed or repaired) and a delete everywhere withdraws this copy.
                DirectoryRequest::Publish { id, sizes, digest }
                | DirectoryRequest::PublishReplicated {
                    id, sizes, digest, ..
                } => {
                    self.publications.insert(id, (sizes, digest));
                    pipe.add_command(self.publish_command(id, sizes, digest));
                    // Listed even if refused: dropping a field this node never set is harmless.
                    self.add_held(&mut pipe, &id, true);
                    pending.push(Pending::Publish {
                        op,
                        id,
                        content: (sizes, digest),
                        index: commands,
                    });
                    commands += 1;
                }
                DirectoryRequest::Withdraw { id } | DirectoryRequest::DeleteEverywhere { id } => {
                    self.publications.remove(&id);
                    pipe.cmd("HDEL")
                        .arg(self.keys.object(&id))
                        .arg(self.me.node.0);
                    self.add_held(&mut pipe, &id, false);
                    pending.push(Pending::Write { op });
                    commands += 1;
                }
                // No copies are placed with Redis, so none is declined: nothing to write.
                DirectoryRequest::DeclineReplica { .. } => pending.push(Pending::Write { op }),
                DirectoryRequest::LocateCopies { .. } => unreachable!("made a lookup above"),
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
                let (Pending::Lookup { op, .. }
                | Pending::Write { op, .. }
                | Pending::Publish { op, .. }) = p;
                self.reply(
                    op,
                    DirectoryReply::Unavailable {
                        reason: failure.reason(),
                    },
                )
                .await;
            }
            return result;
        }
        let mut values: Vec<Option<Value>> = values.into_iter().map(Some).collect();
        let mut failure = None;
        for p in pending {
            match p {
                Pending::Write { op } => self.reply(op, DirectoryReply::Done).await,
                Pending::Publish {
                    op,
                    id,
                    content,
                    index,
                } => {
                    let value = values.get_mut(index).and_then(Option::take);
                    let answered = match (value, &failure) {
                        (Some(value), None) => self.publish_checked(live, id, content, value).await,
                        (_, Some(Failure::Lost(reason))) => Err(Failure::Lost(reason.clone())),
                        _ => Err(Failure::Failed("missing pipeline result".into())),
                    };
                    match answered {
                        Ok((reply, published)) => {
                            // As the core registry: the node's own subscription fires before
                            // its publish is answered. Its channel is left below, once the
                            // batch's later lookups had their say.
                            if let Some(content) = published {
                                if self.fire(id, self.me.node, content, true).await {
                                    touched.insert(id);
                                }
                            }
                            self.reply(op, reply).await
                        }
                        Err(f) => {
                            self.reply(op, DirectoryReply::Unavailable { reason: f.reason() })
                                .await;
                            if matches!(f, Failure::Lost(_)) {
                                failure = Some(f);
                            }
                        }
                    }
                }
                Pending::Lookup {
                    op,
                    id,
                    subscribe,
                    marker,
                    index,
                } => {
                    let value = values.get_mut(index).and_then(Option::take);
                    let found = match (value, &failure) {
                        (Some(value), None) => self.live_holders(live, &id, value).await,
                        (_, Some(Failure::Lost(reason))) => Err(Failure::Lost(reason.clone())),
                        _ => Err(Failure::Failed("missing pipeline result".into())),
                    };
                    match found {
                        Ok((holders, content)) => {
                            if subscribe && holders.is_empty() {
                                if !self.subscriptions.contains_key(&id)
                                    && self.subscriptions.len() >= MAX_SUBSCRIPTIONS_PER_NODE
                                {
                                    self.reply(
                                        op,
                                        DirectoryReply::Unavailable {
                                            reason: format!(
                                                "{MAX_SUBSCRIPTIONS_PER_NODE} pending subscriptions, the most a node keeps"
                                            ),
                                        },
                                    ).await;
                                    continue;
                                }
                                // Live once the lookup's marker arrives (see `Subscription`).
                                self.subscriptions
                                    .entry(id)
                                    .or_default()
                                    .arming
                                    .insert(marker);
                            }
                            self.reply(
                                op,
                                DirectoryReply::Located {
                                    holders,
                                    sizes: content.map(|(sizes, _)| sizes),
                                    digest: content.map(|(_, digest)| digest),
                                },
                            )
                            .await;
                        }
                        Err(f) => {
                            self.reply(op, DirectoryReply::Unavailable { reason: f.reason() })
                                .await;
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
            if !self.subscriptions.contains_key(&id) {
                self.bounded(
                    "UNSUBSCRIBE",
                    live.subscriber.unsubscribe(self.keys.published(&id)),
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
            .arg(4)
            .arg(self.keys.node(self.me.node))
            .arg(self.keys.nodes())
            .arg(self.keys.token())
            .arg(self.keys.deadlines())
            .arg(&self.member_json)
            .arg(self.me.node.0)
            .arg(self.keys.node_prefix())
            .arg(&self.token_record)
            .ignore();
        pipe.cmd(self.keys.publish_command())
            .arg(self.keys.members())
            .arg(format!("leave {}", self.me.node.0))
            .ignore();
        for id in self.publications.keys() {
            pipe.cmd("HDEL")
                .arg(self.keys.object(id))
                .arg(self.me.node.0)
                .ignore();
        }
        pipe.cmd("DEL")
            .arg(self.keys.held(self.me.node, self.me.incarnation))
            .ignore();
        pipe.cmd("SREM")
            .arg(self.keys.held_index())
            .arg(self.held_entry())
            .ignore();
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
