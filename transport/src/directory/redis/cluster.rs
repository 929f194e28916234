//! Redis Cluster as the directory: `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]`
//! (`rediss-cluster://` for TLS) names seed nodes; the redis crate's cluster client discovers
//! the rest, follows `MOVED`/`ASK` and refreshes the slot map.
//!
//! What differs from one Redis server, and only that, lives here and in [`Keys::sharded`]:
//!
//! - An object's records (its `obj:` hash and its publication channel) share one slot through a
//!   hash tag on the object id (`skyriver:CLUSTER:obj:{HEX}`), so objects spread over the
//!   masters; membership (token, node keys, `held:` sets, the members channel) keeps the
//!   cluster-name tag of the single-server layout, so it lives in one slot and its scripts stay
//!   atomic.
//! - Waiting uses sharded pub/sub: `SSUBSCRIBE` on the object's channel, which lives on the
//!   object's slot, and `SPUBLISH` from the publish script there (RESP3 pushes on the cluster
//!   connection).
//! - A pipeline may span slots: [`ClusterLink`] splits it into one sub-pipeline per slot, in
//!   order within a slot, the slots concurrently.
//! - A lost node connection (a master died, a failover is under way) ends the adapter, so the
//!   session reconnects and re-registers, re-publishes what the node holds and re-checks what it
//!   waits for: what a failover lost (writes the replica had not received) comes back within
//!   the reconnect backoff, as after a head restart.
//!
//! - Pushes wait in a bounded queue ([`PUSH_QUEUE`]). The redis crate hands them over from
//!   its connection's task, which must not wait, so a push that finds the queue full is dropped
//!   and the queue reports a lost connection once the adapter has taken what waited: the
//!   adapter re-registers and re-checks what it waits for, as after a failover, so nothing a
//!   dropped push said is lost for good.
//!
//! [`Keys::sharded`]: super::Keys::sharded

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::Slot;
use ::redis::{
    Cmd, IntoConnectionInfo, Pipeline, ProtocolVersion, PushInfo, PushKind, RedisFuture,
    RedisResult, TlsCertificates, Value,
};
use futures_util::future::try_join_all;
use tokio::sync::mpsc;

/// The URL schemes of a Redis Cluster directory: plain and TLS.
pub const CLUSTER_SCHEMES: [&str; 2] = ["redis-cluster", "rediss-cluster"];

/// The seed nodes of a `redis-cluster://` URL, as single-node URLs (`redis://` or `rediss://`)
/// each carrying the URL's credentials; `None` if `url` is not a valid cluster URL.
pub fn seed_urls(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let node_scheme = match scheme {
        "redis-cluster" => "redis",
        "rediss-cluster" => "rediss",
        _ => return None,
    };
    // No database: Redis Cluster has only database 0.
    if rest.contains('/') {
        return None;
    }
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, rest),
    };
    let mut seeds = Vec::new();
    for host_port in hosts.split(',') {
        if !super::super::valid_host_port(host_port) {
            return None;
        }
        seeds.push(match credentials {
            Some(credentials) => format!("{node_scheme}://{credentials}@{host_port}"),
            None => format!("{node_scheme}://{host_port}"),
        });
    }
    Some(seeds)
}

/// Whether `url` names a Redis Cluster (by its scheme).
pub fn is_cluster_url(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| CLUSTER_SCHEMES.contains(&scheme))
}

/// How to open cluster connections: the seeds and the TLS roots.
#[derive(Debug, Clone)]
pub(super) struct ClusterSeeds {
    seeds: Vec<String>,
    root_cert: Option<Vec<u8>>,
}

impl ClusterSeeds {
    /// Checks `url` and reads the CA file (for `rediss-cluster://`) once.
    pub(super) fn new(
        url: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, super::OpenClientError> {
        let seeds = seed_urls(url).ok_or(super::OpenClientError::BadUrl)?;
        for seed in &seeds {
            seed.as_str()
                .into_connection_info()
                .map_err(|_| super::OpenClientError::BadUrl)?;
        }
        let tls = url.starts_with("rediss-cluster://");
        if tls {
            // One process-wide TLS provider; a second install (already done) is harmless.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let root_cert = match ca_file.filter(|_| tls) {
            Some(path) => {
                Some(
                    std::fs::read(path).map_err(|e| super::OpenClientError::CaFile {
                        path: path.to_path_buf(),
                        source: super::super::CaFileError::Read(e),
                    })?,
                )
            }
            None => None,
        };
        Ok(Self { seeds, root_cert })
    }

    /// Opens one cluster connection whose pushes (sharded messages, disconnections) arrive on
    /// the returned receiver. Commands are bounded by `response_timeout` and retried a little
    /// (a redirection or a refreshed slot map), not for long: the adapter reconnects instead.
    pub(super) async fn open(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<(ClusterConnection, PushQueue)> {
        let (pushes, received) = push_queue(PUSH_QUEUE);
        let mut builder = ClusterClientBuilder::new(self.seeds.clone())
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(pushes)
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(root_cert) = &self.root_cert {
            builder = builder.certs(TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert.clone()),
            });
        }
        let client = builder.build()?;
        let conn = client.get_async_connection().await?;
        Ok((conn, received))
    }
}

/// A cluster connection that takes pipelines spanning slots: one sub-pipeline per slot (in
/// order within a slot, so two commands on one object keep their order), the slots
/// concurrently, the answers put back in the pipeline's order.
#[derive(Clone)]
pub(super) struct ClusterLink {
    pub(super) conn: ClusterConnection,
}

/// The slot a command's key lives in (`None` for a keyless command such as `EVAL` with no
/// keys, which any node may serve).
fn command_slot(cmd: &Cmd) -> Option<Slot> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        ::redis::Arg::Simple(bytes) => bytes,
        _ => &b""[..],
    });
    let name = args.next()?;
    let key = if name.eq_ignore_ascii_case(b"EVAL") || name.eq_ignore_ascii_case(b"EVALSHA") {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        if keys == 0 {
            return None;
        }
        args.next()?
    } else {
        args.next()?
    };
    Some(Slot::for_key(key))
}

impl ConnectionLike for ClusterLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if pipeline.is_transaction() || offset != 0 {
                // MULTI/EXEC cannot span slots; this directory never sends one.
                return self.conn.req_packed_commands(pipeline, offset, count).await;
            }
            let mut groups: HashMap<Option<Slot>, (Pipeline, Vec<usize>)> = HashMap::new();
            for (index, cmd) in pipeline.cmd_iter().enumerate().take(count) {
                let (group, indices) = groups.entry(command_slot(cmd)).or_default();
                group.add_command(cmd.clone());
                indices.push(index);
            }
            let requests = groups.into_values().map(|(group, indices)| {
                let mut conn = self.conn.clone();
                async move {
                    let values = conn.req_packed_commands(&group, 0, group.len()).await?;
                    Ok::<_, ::redis::RedisError>((indices, values))
                }
            });
            let mut answers = vec![Value::Nil; count.min(pipeline.len())];
            for (indices, values) in try_join_all(requests).await? {
                for (index, value) in indices.into_iter().zip(values) {
                    answers[index] = value;
                }
            }
            Ok(answers)
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Pushes waiting for the adapter at most, per cluster connection.
pub(super) const PUSH_QUEUE: usize = 4096;

/// The adapter's end of the pushes of one cluster connection.
pub(super) struct PushQueue {
    received: mpsc::Receiver<PushInfo>,
    overflowed: Arc<AtomicBool>,
}

/// A queue of `capacity` pushes, and the sender the redis crate calls (it never waits: a push
/// that finds the queue full is dropped and marks the queue overflowed).
fn push_queue(
    capacity: usize,
) -> (
    impl Fn(PushInfo) -> Result<(), ()> + Send + Sync + 'static,
    PushQueue,
) {
    let (pushes, received) = mpsc::channel(capacity.max(1));
    let overflowed = Arc::new(AtomicBool::new(false));
    let mark = overflowed.clone();
    let send = move |push: PushInfo| match pushes.try_send(push) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Full(_)) => {
            mark.store(true, Ordering::Release);
            // Kept: the crate stops pushing to a sender that fails.
            Ok(())
        }
        Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
    };
    (
        send,
        PushQueue {
            received,
            overflowed,
        },
    )
}

impl PushQueue {
    /// The next push; after one was dropped, [`Push::Disconnected`] once those before it were
    /// taken (the adapter then re-registers). `None` when the connection is gone.
    pub(super) async fn recv(&mut self) -> Option<Push> {
        if self.received.is_empty() && self.overflowed.swap(false, Ordering::AcqRel) {
            return Some(Push::Disconnected);
        }
        self.received.recv().await.map(read_push)
    }
}

/// What a push from the cluster connection means to the adapter.
pub(super) enum Push {
    /// A message on a (sharded) channel.
    Message { channel: String, payload: Vec<u8> },
    /// A node connection was lost: the adapter must reconnect and re-register.
    Disconnected,
    /// A subscription confirmation or anything else the adapter ignores.
    Other,
}

/// Reads a push from the cluster connection.
fn read_push(push: PushInfo) -> Push {
    match push.kind {
        PushKind::Disconnection => Push::Disconnected,
        PushKind::SMessage | PushKind::Message => {
            let mut data = push.data.into_iter();
            match (data.next(), data.next()) {
                (Some(channel), Some(payload)) => {
                    let channel: Option<String> = ::redis::from_redis_value(channel).ok();
                    let payload: Option<Vec<u8>> = ::redis::from_redis_value(payload).ok();
                    match (channel, payload) {
                        (Some(channel), Some(payload)) => Push::Message { channel, payload },
                        _ => Push::Other,
                    }
                }
                _ => Push::Other,
            }
        }
        _ => Push::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(n: u8) -> PushInfo {
        PushInfo {
            kind: PushKind::SMessage,
            data: vec![
                ::redis::Value::BulkString(b"chan".to_vec()),
                ::redis::Value::BulkString(vec![n]),
            ],
        }
    }

    /// A full queue drops the push the crate cannot wait with, and reports a lost connection
    /// after what waited, so the adapter re-registers instead of missing it silently.
    #[tokio::test(flavor = "current_thread")]
    async fn a_push_that_finds_the_queue_full_becomes_a_lost_connection() {
        let (send, mut queue) = push_queue(2);
        for n in 0..5 {
            assert!(send(message(n)).is_ok(), "the sender stays registered");
        }
        assert_eq!(queue.received.len(), 2, "no more than the capacity waited");
        for n in 0..2 {
            match queue.recv().await {
                Some(Push::Message { payload, .. }) => assert_eq!(payload, [n]),
                _ => panic!("push {n} was not the message sent"),
            }
        }
        assert!(matches!(queue.recv().await, Some(Push::Disconnected)));
        // Once told, the queue carries on.
        send(message(9)).unwrap();
        assert!(matches!(queue.recv().await, Some(Push::Message { .. })));
    }

    #[test]
    fn a_cluster_url_gives_one_seed_per_node_with_the_credentials() {
        assert_eq!(
            seed_urls("redis-cluster://10.0.0.1:7000,10.0.0.2:7001").unwrap(),
            ["redis://10.0.0.1:7000", "redis://10.0.0.2:7001"]
        );
        assert_eq!(
            seed_urls("rediss-cluster://u:p%40w@h:1,[::1]:2").unwrap(),
            ["rediss://u:p%40w@h:1", "rediss://u:p%40w@[::1]:2"]
        );
        for bad in [
            "redis-cluster://",
            "redis-cluster://h",
            "redis-cluster://h:1,",
            "redis-cluster://h:1/2",
            "redis://h:1",
            "redis-cluster://h:0",
        ] {
            assert!(seed_urls(bad).is_none(), "{bad}");
        }
        assert!(is_cluster_url("redis-cluster://h:1"));
        assert!(!is_cluster_url("redis://h:1"));
    }

    #[test]
    fn commands_go_to_their_key_slot_and_keyless_scripts_anywhere() {
        let mut get = ::redis::cmd("HGETALL");
        get.arg("skyriver:c:obj:{00ff}");
        assert_eq!(command_slot(&get), Some(Slot::for_key("x{00ff}")));
        let mut eval = ::redis::cmd("EVAL");
        eval.arg("return 1").arg(1).arg("{abc}k").arg("v");
        assert_eq!(command_slot(&eval), Some(Slot::for_key("abc")));
        let mut keyless = ::redis::cmd("EVAL");
        keyless.arg("return 1").arg(0).arg("v");
        assert_eq!(command_slot(&keyless), None);
    }
}
