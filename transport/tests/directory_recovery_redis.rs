//! How fast the directory is whole again after it failed, with N objects published: a
//! restarted built-in head (every node re-registers and re-publishes what it holds) and a
//! Redis Cluster failover (the replica takes over; what the master had not replicated comes
//! back by the same re-publication). While the head is down, requests are answered
//! `Unavailable` at once, never left hanging. The times are printed (`--nocapture`) and bounded.
//!
//! The Redis Cluster case is skipped without `redis-server` 7 and `redis-cli`, unless
//! `SKYRIVER_REQUIRE_REDIS` is set (CI sets it).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use skyriver_core::directory::{DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::{ContentDigest, NodeId, ObjectId, ObjectSizes};
use skyriver_transport::directory::builtin::{
    self, BuiltinDirectoryServer, ClientConfig, ServerConfig,
};
use skyriver_transport::directory::redis::{self, KdfCost, Keys, RedisConfig};
use skyriver_transport::directory::{
    notice_channel, Directory, DirectoryClient, DirectoryNotice, MemberInfo, NoticeReceiver,
};
use tokio::net::TcpListener;

#[path = "support/redis_cluster.rs"]
mod redis_cluster;
#[path = "support/skip.rs"]
mod skip;
use redis_cluster::RedisCluster;

const TOKEN: &str = "recovery-token";
/// Nodes holding objects.
const HOLDERS: u32 = 4;
/// Objects published over the holders.
const OBJECTS: u64 = 4000;
/// Bound on being whole again.
const WHOLE_WITHIN: Duration = Duration::from_secs(30);

fn member(node: u32) -> MemberInfo {
    MemberInfo {
        node: NodeId(node),
        fabric_addr: SocketAddr::from(([127, 0, 0, 1], 7400 + node as u16)),
        fabric: "tcp".into(),
        incarnation: 1,
        failure_domain: String::new(),
    }
}

struct Node {
    dir: DirectoryClient,
    notices: NoticeReceiver,
    next_op: u64,
}

impl Node {
    fn new(dir: DirectoryClient, notices: NoticeReceiver) -> Self {
        Node {
            dir,
            notices,
            next_op: 0,
        }
    }

    /// Sends `requests` (up to 256 in flight) and returns the replies in order.
    async fn ask_all(&mut self, requests: Vec<DirectoryRequest>) -> Vec<DirectoryReply> {
        let first = self.next_op + 1;
        let mut replies = vec![None; requests.len()];
        let mut sent = 0;
        let mut answered = 0;
        let mut requests = requests.into_iter();
        let total = replies.len();
        tokio::time::timeout(Duration::from_secs(20), async {
            while answered < total {
                while sent - answered < 256 {
                    let Some(request) = requests.next() else {
                        break;
                    };
                    self.next_op += 1;
                    self.dir
                        .submit(DirectoryOpId(self.next_op), request)
                        .expect("queued");
                    sent += 1;
                }
                match self.notices.recv().await.expect("notices open") {
                    DirectoryNotice::Reply { op, reply } if op.0 >= first => {
                        replies[(op.0 - first) as usize] = Some(reply);
                        answered += 1;
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("every request is answered");
        replies.into_iter().map(|r| r.expect("answered")).collect()
    }
}

fn publish(n: u64) -> DirectoryRequest {
    DirectoryRequest::Publish {
        id: ObjectId::from_u64(n),
        sizes: ObjectSizes {
            data_size: 64,
            metadata_size: 0,
        },
        digest: ContentDigest(n),
    }
}

/// Publishes the objects over the holders (object n on holder `1 + n % HOLDERS`).
async fn publish_all(holders: &mut [Node]) {
    for (k, holder) in holders.iter_mut().enumerate() {
        let requests = (0..OBJECTS)
            .filter(|n| n % HOLDERS as u64 == k as u64)
            .map(publish)
            .collect();
        for reply in holder.ask_all(requests).await {
            assert_eq!(reply, DirectoryReply::Done);
        }
    }
}

/// Looks every object up from `observer` until each names its holder; returns how long.
async fn time_until_whole(observer: &mut Node, since: Instant) -> Duration {
    let mut missing: Vec<u64> = (0..OBJECTS).collect();
    loop {
        let replies = observer
            .ask_all(
                missing
                    .iter()
                    .map(|&n| DirectoryRequest::Lookup {
                        id: ObjectId::from_u64(n),
                        subscribe: false,
                    })
                    .collect(),
            )
            .await;
        missing = missing
            .into_iter()
            .zip(replies)
            .filter(|(n, reply)| {
                !matches!(reply, DirectoryReply::Located { holders, .. }
                    if holders == &[NodeId(1 + (n % HOLDERS as u64) as u32)])
            })
            .map(|(n, _)| n)
            .collect();
        if missing.is_empty() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < WHOLE_WITHIN,
            "{} of {OBJECTS} objects still not located {WHOLE_WITHIN:?} on",
            missing.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn head_config() -> ClientConfig {
    ClientConfig {
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        join_timeout: Duration::from_millis(300),
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_millis(200),
        ..ClientConfig::default()
    }
}

async fn head_node(addr: SocketAddr, node: u32) -> Node {
    let (tx, rx) = notice_channel();
    let dir = builtin::connect(
        &addr.to_string(),
        member(node),
        &TOKEN.into(),
        tx,
        head_config(),
    )
    .await
    .expect("joins");
    Node::new(dir, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_head_is_whole_again_and_requests_fail_fast_while_it_is_down() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = BuiltinDirectoryServer::spawn(listener, ServerConfig::new(TOKEN)).unwrap();
    let mut holders = Vec::new();
    for node in 1..=HOLDERS {
        holders.push(head_node(addr, node).await);
    }
    let mut observer = head_node(addr, 99).await;
    publish_all(&mut holders).await;
    assert!(time_until_whole(&mut observer, Instant::now()).await < WHOLE_WITHIN);

    server.shutdown().await;
    // While the head is down, a lookup is answered Unavailable at once (the caller decides;
    // a daemon serves its local objects and fetches whose holder it already knows).
    let asked = Instant::now();
    let replies = observer
        .ask_all(vec![DirectoryRequest::Lookup {
            id: ObjectId::from_u64(0),
            subscribe: false,
        }])
        .await;
    assert!(
        matches!(replies[0], DirectoryReply::Unavailable { .. }),
        "{:?}",
        replies[0]
    );
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );

    let listener = TcpListener::bind(addr).await.unwrap();
    let restarted = Instant::now();
    let _server = BuiltinDirectoryServer::spawn(listener, ServerConfig::new(TOKEN)).unwrap();
    let whole = time_until_whole(&mut observer, restarted).await;
    eprintln!(
        "head restart: {OBJECTS} objects on {HOLDERS} nodes located again {} ms after the restart",
        whole.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_failover_is_whole_again_by_re_publication() {
    let Some(mut cluster) = RedisCluster::start("a_redis_cluster_failover_is_whole_again") else {
        return;
    };
    let config = || {
        let mut config = RedisConfig::new(cluster.url(), "rec");
        config.request_timeout = Duration::from_millis(500);
        config.connect_timeout = Duration::from_millis(500);
        config.heartbeat_interval = Duration::from_millis(200);
        config.node_ttl = Duration::from_secs(10);
        config.reconnect_backoff_min = Duration::from_millis(20);
        config.reconnect_backoff_max = Duration::from_millis(200);
        config.token_kdf = KdfCost::TESTING;
        config
    };
    let join = |node: u32| {
        let config = config();
        async move {
            let (tx, rx) = notice_channel();
            let dir = redis::connect(config, member(node), &TOKEN.into(), tx)
                .await
                .expect("joins");
            Node::new(dir, rx)
        }
    };
    let mut holders = Vec::new();
    for node in 1..=HOLDERS {
        holders.push(join(node).await);
    }
    let mut observer = join(99).await;
    publish_all(&mut holders).await;
    cluster.wait_ok();
    let victim = cluster.master_of(&Keys::sharded("rec").token());
    let killed = Instant::now();
    cluster.kill(victim);
    let whole = time_until_whole(&mut observer, killed).await;
    eprintln!(
        "Redis Cluster failover: {OBJECTS} objects on {HOLDERS} nodes located again {} ms after \
         the membership's master was killed (node timeout 1 s)",
        whole.as_millis()
    );
    drop(holders);
}
