//! The Redis directory on a real Redis Cluster (six private `redis-server`s: three masters,
//! three replicas): objects spread over the masters, waiting uses sharded pub/sub, and a killed
//! master's replica takes over without losing an acknowledged location for longer than the
//! re-publication bound. The conformance suite (directory_conformance.rs) runs on it too.
//!
//! Without `redis-server` 7 and `redis-cli` the tests print a skip line and pass, unless
//! `SKYRIVER_REQUIRE_REDIS` is set (CI sets it), in which case they fail.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use skyriver_core::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::{ContentDigest, NodeId, ObjectId, ObjectSizes};
use skyriver_transport::directory::redis::{self, KdfCost, Keys, RedisConfig, RedisDirectory};
use skyriver_transport::directory::{
    notice_channel, Directory, DirectoryNotice, DirectorySpec, MemberInfo, NoticeReceiver,
};

#[path = "support/redis_cluster.rs"]
mod redis_cluster;
#[path = "support/skip.rs"]
mod skip;
use redis_cluster::RedisCluster;

const TOKEN: &str = "redis-cluster-test-token";
/// Bound on every wait for a reply or an event.
const WAIT: Duration = Duration::from_secs(20);

fn member(node: u32) -> MemberInfo {
    MemberInfo {
        node: NodeId(node),
        fabric_addr: SocketAddr::from(([127, 0, 0, 1], 7300 + node as u16)),
        fabric: "tcp".into(),
        incarnation: 1,
        failure_domain: String::new(),
    }
}

fn sizes(n: u64) -> ObjectSizes {
    ObjectSizes {
        data_size: n,
        metadata_size: 0,
    }
}

fn digest_of(sizes: ObjectSizes) -> ContentDigest {
    ContentDigest(sizes.data_size ^ 0xc105)
}

fn config(cluster: &RedisCluster) -> RedisConfig {
    let mut config = RedisConfig::new(cluster.url(), "c");
    config.request_timeout = Duration::from_millis(500);
    config.connect_timeout = Duration::from_millis(500);
    config.heartbeat_interval = Duration::from_millis(200);
    // Longer than a failover: the nodes' own records survive it.
    config.node_ttl = Duration::from_secs(10);
    config.member_refresh_interval = Duration::from_millis(200);
    config.join_timeout = Duration::from_millis(300);
    config.reconnect_backoff_min = Duration::from_millis(20);
    config.reconnect_backoff_max = Duration::from_millis(200);
    config.token_kdf = KdfCost::TESTING;
    config
}

struct Node {
    dir: RedisDirectory,
    notices: NoticeReceiver,
    next_op: u64,
}

impl Node {
    async fn join(config: RedisConfig, me: MemberInfo) -> Node {
        let (tx, notices) = notice_channel();
        let dir = redis::connect(config, me, &TOKEN.into(), tx)
            .await
            .expect("joins");
        Node {
            dir,
            notices,
            next_op: 0,
        }
    }

    async fn wait_for<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&DirectoryNotice) -> Option<T>,
    ) -> T {
        let found = tokio::time::timeout(WAIT, async {
            loop {
                let notice = self.notices.recv().await.expect("notices open");
                if let Some(found) = pick(&notice) {
                    return found;
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    async fn ask(&mut self, request: DirectoryRequest) -> DirectoryReply {
        self.next_op += 1;
        let op = DirectoryOpId(self.next_op);
        self.dir.submit(op, request.clone()).expect("queued");
        self.wait_for(&format!("the reply to {request}"), |n| match n {
            DirectoryNotice::Reply { op: o, reply } if *o == op => Some(reply.clone()),
            _ => None,
        })
        .await
    }

    async fn publish(&mut self, id: ObjectId, size: u64) -> DirectoryReply {
        self.ask(DirectoryRequest::Publish {
            id,
            sizes: sizes(size),
            digest: digest_of(sizes(size)),
        })
        .await
    }

    async fn holders(&mut self, id: ObjectId) -> Option<Vec<NodeId>> {
        match self
            .ask(DirectoryRequest::Lookup {
                id,
                subscribe: false,
            })
            .await
        {
            DirectoryReply::Located { holders, .. } => Some(holders),
            _ => None,
        }
    }
}

fn published(id: ObjectId) -> impl FnMut(&DirectoryNotice) -> Option<DirectoryEvent> {
    move |n| match n {
        DirectoryNotice::Event(e @ DirectoryEvent::Published { id: i, .. }) if *i == id => {
            Some(e.clone())
        }
        _ => None,
    }
}

#[test]
fn redis_cluster_urls_parse_and_hide_their_password() {
    let spec: DirectorySpec = "redis-cluster://:hunter2@10.0.0.1:7000,10.0.0.2:7001"
        .parse()
        .unwrap();
    assert!(matches!(&spec, DirectorySpec::Redis { url } if url.starts_with("redis-cluster://")));
    assert_eq!(
        spec.to_string(),
        "redis-cluster://***@10.0.0.1:7000,10.0.0.2:7001"
    );
    assert!("rediss-cluster://h:1".parse::<DirectorySpec>().is_ok());
    for bad in [
        "redis-cluster://",
        "redis-cluster://h:1,",
        "redis-cluster://h:1/3",
    ] {
        assert!(bad.parse::<DirectorySpec>().is_err(), "{bad:?} parsed");
    }
    // Objects carry their id as the hash tag, membership the cluster name.
    let keys = Keys::sharded("c");
    let id = ObjectId::from_u64(5);
    assert_eq!(keys.object(&id), format!("skyriver:c:obj:{{{id}}}"));
    assert_eq!(
        keys.published(&id),
        format!("skyriver:c:published:{{{id}}}")
    );
    assert_eq!(keys.token(), "skyriver:{c}:token");
}

#[tokio::test]
async fn redis_cluster_spreads_objects_over_the_masters_and_wakes_waiters() {
    let Some(cluster) = RedisCluster::start("redis_cluster_spreads_objects") else {
        return;
    };
    let mut a = Node::join(config(&cluster), member(1)).await;
    let mut b = Node::join(config(&cluster), member(2)).await;
    let ids: Vec<ObjectId> = (0..48).map(ObjectId::from_u64).collect();
    // B waits for the last object (sharded pub/sub on its slot) before A publishes it.
    let last = *ids.last().unwrap();
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: last,
            subscribe: true
        })
        .await,
        DirectoryReply::Located {
            holders: vec![],
            sizes: None,
            digest: None
        }
    );
    for &id in &ids {
        assert_eq!(a.publish(id, 10).await, DirectoryReply::Done);
    }
    let event = b
        .wait_for("the waited-for publication", published(last))
        .await;
    assert!(matches!(event, DirectoryEvent::Published { holder, .. } if holder == NodeId(1)));
    for &id in &ids {
        assert_eq!(b.holders(id).await, Some(vec![NodeId(1)]));
    }
    // Every master holds some of the objects.
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3);
    for port in masters {
        let objects = cluster.keys(port, "skyriver:c:obj:*");
        assert!(
            !objects.is_empty(),
            "the master on port {port} holds no object"
        );
    }
}

#[tokio::test]
async fn redis_cluster_a_killed_master_is_replaced_and_locations_come_back() {
    let Some(mut cluster) = RedisCluster::start("redis_cluster_a_killed_master") else {
        return;
    };
    let mut a = Node::join(config(&cluster), member(1)).await;
    let mut b = Node::join(config(&cluster), member(2)).await;
    let ids: Vec<ObjectId> = (100..400).map(ObjectId::from_u64).collect();
    let (replicated, unreplicated) = ids.split_at(150);
    for &id in replicated {
        assert_eq!(a.publish(id, 20).await, DirectoryReply::Done);
    }
    // The master holding the membership (token, node records) dies: the hardest case. Its
    // replica is stopped first, so what the master acknowledges from then on is lost with it
    // (asynchronous replication): only the node's re-publication brings those locations back.
    let victim = cluster.master_of(&Keys::sharded("c").token());
    let replica = cluster.replica_of(victim);
    cluster.wait_ok();
    let waited = ObjectId::from_u64(999);
    assert!(matches!(
        b.ask(DirectoryRequest::Lookup { id: waited, subscribe: true }).await,
        DirectoryReply::Located { holders, .. } if holders.is_empty()
    ));
    cluster.pause(replica, true);
    for &id in unreplicated {
        assert_eq!(a.publish(id, 20).await, DirectoryReply::Done);
    }
    let killed = Instant::now();
    cluster.kill(victim);
    cluster.pause(replica, false);
    // Lookups go on: answered (perhaps Unavailable during the failover), never hanging.
    let deadline = killed + Duration::from_secs(30);
    let mut missing = ids.clone();
    while !missing.is_empty() {
        if Instant::now() > deadline {
            let last = b
                .ask(DirectoryRequest::Lookup {
                    id: missing[0],
                    subscribe: false,
                })
                .await;
            panic!(
                "{} locations still missing 30 s after the kill (first: {}, {last:?})",
                missing.len(),
                missing[0]
            );
        }
        let mut still = Vec::new();
        for id in missing {
            if b.holders(id).await != Some(vec![NodeId(1)]) {
                still.push(id);
            }
        }
        missing = still;
    }
    let whole = killed.elapsed();
    eprintln!(
        "every location answered again {} ms after the master was killed",
        whole.as_millis()
    );
    // The replica took over (three masters again), and a wait made before the kill still fires.
    cluster.wait_ok();
    loop {
        match a.publish(waited, 7).await {
            DirectoryReply::Done => break,
            DirectoryReply::Unavailable { .. } => {
                assert!(Instant::now() < deadline, "publishing never succeeded");
            }
            other => panic!("publish: {other:?}"),
        }
    }
    b.wait_for(
        "the publication waited for across the failover",
        published(waited),
    )
    .await;
}

/// On Redis Cluster the deadlines live in the membership's slot (the scripts that read them
/// with the node index would fail across slots), and a node whose heartbeats stopped is noticed
/// through them within its TTL and an interval, its deadline and index entry gone with it.
#[tokio::test]
async fn redis_cluster_a_silent_node_is_noticed_through_its_deadline() {
    let Some(cluster) = RedisCluster::start("redis_cluster_a_silent_node_is_noticed") else {
        return;
    };
    let names = Keys::sharded("c");
    let master = cluster.master_of(&names.nodes());
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{master}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut slots = Vec::new();
    for key in [names.nodes(), names.deadlines(), names.node(NodeId(1))] {
        let slot: u16 = ::redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        slots.push(slot);
    }
    assert!(slots.iter().all(|&s| s == slots[0]), "slots {slots:?}");
    let mut a = Node::join(config(&cluster), member(1)).await;
    let mut short = config(&cluster);
    short.node_ttl = Duration::from_millis(600);
    let members = |want: &'static [u32]| {
        move |n: &DirectoryNotice| match n {
            DirectoryNotice::Members(m) if m.iter().map(|m| m.node.0).eq(want.iter().copied()) => {
                Some(())
            }
            _ => None,
        }
    };
    let b = Node::join(short.clone(), member(2)).await;
    a.wait_for("members [1, 2]", members(&[1, 2])).await;
    b.dir.abandon().await;
    let stopped = Instant::now();
    a.wait_for("members [1]", members(&[1])).await;
    let bound = short.node_ttl + short.member_refresh_interval + Duration::from_millis(500);
    assert!(stopped.elapsed() < bound, "took {:?}", stopped.elapsed());
    let deadlines: Vec<String> = ::redis::cmd("ZRANGE")
        .arg(names.deadlines())
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deadlines, vec!["1".to_string()]);
    let nodes: Vec<String> = ::redis::cmd("SMEMBERS")
        .arg(names.nodes())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(nodes, vec!["1".to_string()]);
}
