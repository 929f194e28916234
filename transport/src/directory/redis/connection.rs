//! The adapter's connections to Redis, for one server or for Redis Cluster: a command
//! connection ([`Commands`]) and a subscriber ([`Subscriber`]) that hide which one it is.

use ::redis::aio::{ConnectionLike, MultiplexedConnection, PubSubSink, PubSubStream};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};
use futures_util::StreamExt;

use super::cluster::{ClusterLink, ClusterSeeds, Push};

/// Where a node's Redis directory lives.
#[derive(Debug)]
pub(super) enum Backend {
    /// One Redis server.
    Single(Client),
    /// A Redis Cluster, reached through its seed nodes.
    Cluster(ClusterSeeds),
}

/// Commands and pipelines, to one server or spread over a cluster's slots.
pub(super) enum Commands {
    Single(MultiplexedConnection),
    Cluster(ClusterLink),
}

impl ConnectionLike for Commands {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Commands::Single(conn) => conn.req_packed_command(cmd),
            Commands::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Commands::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Commands::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Commands::Single(conn) => conn.get_db(),
            Commands::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Channel subscriptions: a pub/sub connection on one server; sharded pub/sub (`SSUBSCRIBE`)
/// over the cluster connection's pushes on Redis Cluster.
pub(super) enum Subscriber {
    Single {
        sink: PubSubSink,
        stream: PubSubStream,
    },
    Sharded {
        conn: ClusterConnection,
        pushes: super::cluster::PushQueue,
    },
}

/// What the subscriber received.
pub(super) enum Incoming {
    /// A message on a subscribed channel.
    Message { channel: String, payload: Vec<u8> },
    /// Nothing the adapter acts on (a subscription confirmation).
    Nothing,
    /// The subscriber lost (part of) its connection; with why.
    Lost(&'static str),
}

impl Subscriber {
    /// Subscribes to `channel`, confirmed by Redis.
    pub(super) async fn subscribe(&mut self, channel: String) -> RedisResult<()> {
        match self {
            Subscriber::Single { sink, .. } => sink.subscribe(channel).await,
            Subscriber::Sharded { conn, .. } => conn.ssubscribe(channel).await,
        }
    }

    /// Stops listening on `channel`.
    pub(super) async fn unsubscribe(&mut self, channel: String) -> RedisResult<()> {
        match self {
            Subscriber::Single { sink, .. } => sink.unsubscribe(channel).await,
            Subscriber::Sharded { conn, .. } => conn.sunsubscribe(channel).await,
        }
    }

    /// The next message (cancel-safe).
    pub(super) async fn next(&mut self) -> Incoming {
        match self {
            Subscriber::Single { stream, .. } => match stream.next().await {
                None => Incoming::Lost("the Redis pub/sub connection closed"),
                Some(message) => Incoming::Message {
                    channel: message.get_channel_name().to_string(),
                    payload: message.get_payload_bytes().to_vec(),
                },
            },
            Subscriber::Sharded { pushes, .. } => match pushes.recv().await {
                None => Incoming::Lost("the Redis Cluster connection closed"),
                Some(Push::Disconnected) => Incoming::Lost(
                    "a Redis Cluster node connection was lost (a failover?): re-registering",
                ),
                Some(Push::Message { channel, payload }) => Incoming::Message { channel, payload },
                Some(Push::Other) => Incoming::Nothing,
            },
        }
    }
}
