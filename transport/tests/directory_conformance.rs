//! One directory, three implementations, one suite: the same scenarios run against the core's
//! sans-IO `Registry` in process (nodes are the core's `DirectorySession`s, time is virtual),
//! the built-in head over loopback TCP, Redis (a private `redis-server`) and Redis Cluster (six
//! private servers), the last two skipped when not installed unless `SKYRIVER_REQUIRE_REDIS`
//! is set.
//!
//! A scenario is written once against [`Harness`] (joining, crashing, letting the heartbeat
//! bound pass) and [`Participant`] (one node: ask, submit, events, members).

use std::net::SocketAddr;

use skyriver_core::directory::{
    DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest, MemberInfo,
};
use skyriver_core::{ContentDigest, NodeId, ObjectId, ObjectSizes};

#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/skip.rs"]
mod skip;
use redis_server::RedisServer;
#[path = "support/redis_cluster.rs"]
mod redis_cluster;
use redis_cluster::RedisCluster;
#[path = "support/directory_harness.rs"]
mod directory_harness;
#[path = "support/replies.rs"]
mod replies;
use directory_harness::{
    BuiltinHarness, CoreHarness, Harness, Participant, RedisClusterHarness, RedisHarness, TOKEN,
};
use replies::sorted;

fn member(node: u32, incarnation: u32) -> MemberInfo {
    MemberInfo {
        node: NodeId(node),
        fabric_addr: SocketAddr::from(([127, 0, 0, 1], 7200 + node as u16)),
        fabric: "tcp".into(),
        incarnation,
        failure_domain: String::new(),
    }
}

fn sizes(n: u64) -> ObjectSizes {
    ObjectSizes {
        data_size: n,
        metadata_size: 2,
    }
}

/// The content digest these tests publish with objects of `sizes`.
fn digest_of(sizes: ObjectSizes) -> ContentDigest {
    ContentDigest(sizes.data_size ^ 0x5eed)
}

fn located(holders: &[u32], sizes: Option<ObjectSizes>) -> DirectoryReply {
    DirectoryReply::Located {
        holders: holders.iter().map(|&n| NodeId(n)).collect(),
        sizes,
        digest: sizes.map(digest_of),
    }
}

// ---- Scenarios ----

async fn publish_lookup_withdraw<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let mut c = h.join(member(3, 1)).await;
    let x = ObjectId::from_u64(0x10);
    assert_eq!(
        c.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[], None)
    );
    assert_eq!(
        a.ask(DirectoryRequest::Publish {
            id: x,
            sizes: sizes(8),
            digest: digest_of(sizes(8)),
        })
        .await,
        DirectoryReply::Done
    );
    assert_eq!(
        b.ask(DirectoryRequest::Publish {
            id: x,
            sizes: sizes(8),
            digest: digest_of(sizes(8)),
        })
        .await,
        DirectoryReply::Done
    );
    assert_eq!(
        sorted(
            c.ask(DirectoryRequest::Lookup {
                id: x,
                subscribe: false
            })
            .await
        ),
        located(&[1, 2], Some(sizes(8)))
    );
    assert_eq!(
        a.ask(DirectoryRequest::Withdraw { id: x }).await,
        DirectoryReply::Done
    );
    assert_eq!(
        c.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[2], Some(sizes(8)))
    );
    b.ask(DirectoryRequest::Withdraw { id: x }).await;
    assert_eq!(
        c.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[], None)
    );
}

async fn subscribe_then_publish_delivers_exactly_once<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let x = ObjectId::from_u64(0x20);
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: true
        })
        .await,
        located(&[], None)
    );
    a.ask(DirectoryRequest::Publish {
        id: x,
        sizes: sizes(3),
        digest: digest_of(sizes(3)),
    })
    .await;
    assert_eq!(
        b.next_event().await,
        DirectoryEvent::Published {
            id: x,
            holder: NodeId(1),
            sizes: sizes(3),
            digest: digest_of(sizes(3)),
        }
    );
    // One-shot: another publication of the same object is not pushed again.
    let mut c = h.join(member(3, 1)).await;
    c.ask(DirectoryRequest::Publish {
        id: x,
        sizes: sizes(3),
        digest: digest_of(sizes(3)),
    })
    .await;
    assert_eq!(
        b.events_before_marker(&mut a, ObjectId::from_u64(0x1f0))
            .await,
        vec![]
    );
    // A lookup that finds a holder registers no subscription.
    let y = ObjectId::from_u64(0x21);
    a.ask(DirectoryRequest::Publish {
        id: y,
        sizes: sizes(1),
        digest: digest_of(sizes(1)),
    })
    .await;
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: y,
            subscribe: true
        })
        .await,
        located(&[1], Some(sizes(1)))
    );
    c.ask(DirectoryRequest::Publish {
        id: y,
        sizes: sizes(1),
        digest: digest_of(sizes(1)),
    })
    .await;
    assert_eq!(
        b.events_before_marker(&mut a, ObjectId::from_u64(0x1f1))
            .await,
        vec![]
    );
}

async fn unsubscribe_cancels_a_subscription<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let z = ObjectId::from_u64(0x30);
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: z,
            subscribe: true
        })
        .await,
        located(&[], None)
    );
    b.submit(
        DirectoryOpId(9_999),
        DirectoryRequest::Unsubscribe { id: z },
    );
    // A round trip on b's connection: the unsubscribe is served before a's publish.
    b.ask(DirectoryRequest::Lookup {
        id: ObjectId::from_u64(0x31),
        subscribe: false,
    })
    .await;
    a.ask(DirectoryRequest::Publish {
        id: z,
        sizes: sizes(2),
        digest: digest_of(sizes(2)),
    })
    .await;
    assert_eq!(
        b.events_before_marker(&mut a, ObjectId::from_u64(0x3f0))
            .await,
        vec![]
    );
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: z,
            subscribe: false
        })
        .await,
        located(&[1], Some(sizes(2)))
    );
}

async fn a_dead_node_loses_its_locations<H: Harness>(h: &mut H) {
    let mut silent = h.join_silent(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let x = ObjectId::from_u64(0x40);
    silent
        .ask(DirectoryRequest::Publish {
            id: x,
            sizes: sizes(5),
            digest: digest_of(sizes(5)),
        })
        .await;
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[1], Some(sizes(5)))
    );
    h.outlive_heartbeat_bound(&mut [&mut b]).await;
    b.wait_members(&[member(2, 1)]).await;
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[], None)
    );
}

async fn a_restart_with_a_new_incarnation_starts_clean<H: Harness>(h: &mut H) {
    let mut old = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let (x, y) = (ObjectId::from_u64(0x50), ObjectId::from_u64(0x51));
    old.ask(DirectoryRequest::Publish {
        id: x,
        sizes: sizes(1),
        digest: digest_of(sizes(1)),
    })
    .await;
    assert_eq!(
        old.ask(DirectoryRequest::Lookup {
            id: y,
            subscribe: true
        })
        .await,
        located(&[], None)
    );
    h.crash(old).await;
    // At once, not after the old registration expires.
    let mut restarted = h.join(member(1, 2)).await;
    b.wait_members(&[member(1, 2), member(2, 1)]).await;
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[], None)
    );
    b.ask(DirectoryRequest::Publish {
        id: y,
        sizes: sizes(1),
        digest: digest_of(sizes(1)),
    })
    .await;
    assert_eq!(
        restarted
            .events_before_marker(&mut b, ObjectId::from_u64(0x5f0))
            .await,
        vec![],
        "the old incarnation's subscription is gone"
    );
    assert_eq!(
        restarted
            .ask(DirectoryRequest::Lookup {
                id: y,
                subscribe: false
            })
            .await,
        located(&[2], Some(sizes(1)))
    );
}

/// One id names one content: while live nodes hold an id, a publication of other sizes or
/// another digest is refused with the content they hold; the same content is a second holder;
/// a dead node's content stands in nobody's way.
async fn one_id_names_one_content<H: Harness>(h: &mut H) {
    let mut silent = h.join_silent(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let mut c = h.join(member(3, 1)).await;
    let x = ObjectId::from_u64(0x50);
    let publish = |sizes: ObjectSizes, digest: u64| DirectoryRequest::Publish {
        id: x,
        sizes,
        digest: ContentDigest(digest),
    };
    assert_eq!(
        silent.ask(publish(sizes(4), 0xaaaa)).await,
        DirectoryReply::Done
    );
    let held = DirectoryReply::Conflict {
        sizes: sizes(4),
        digest: ContentDigest(0xaaaa),
    };
    assert_eq!(b.ask(publish(sizes(4), 0xbbbb)).await, held);
    assert_eq!(b.ask(publish(sizes(6), 0xaaaa)).await, held);
    assert_eq!(c.ask(publish(sizes(4), 0xaaaa)).await, DirectoryReply::Done);
    let lookup = DirectoryRequest::Lookup {
        id: x,
        subscribe: false,
    };
    assert_eq!(
        sorted(b.ask(lookup.clone()).await),
        DirectoryReply::Located {
            holders: vec![NodeId(1), NodeId(3)],
            sizes: Some(sizes(4)),
            digest: Some(ContentDigest(0xaaaa)),
        }
    );
    // Once its holders are gone (one withdrew, one died), the id may name new bytes.
    assert_eq!(
        c.ask(DirectoryRequest::Withdraw { id: x }).await,
        DirectoryReply::Done
    );
    h.outlive_heartbeat_bound(&mut [&mut b, &mut c]).await;
    b.wait_members(&[member(2, 1), member(3, 1)]).await;
    assert_eq!(b.ask(publish(sizes(6), 0xbbbb)).await, DirectoryReply::Done);
    assert_eq!(
        c.ask(lookup).await,
        DirectoryReply::Located {
            holders: vec![NodeId(2)],
            sizes: Some(sizes(6)),
            digest: Some(ContentDigest(0xbbbb)),
        }
    );
}

/// A holder whose withdrawal was lost (cut off from the directory) and that put the id again
/// with other bytes publishes them: refused with the content another node holds, and no longer
/// listed as a holder of that content, which it does not have any more (else lookups keep
/// sending requesters to a node that refuses them).
async fn a_listed_holder_that_publishes_another_content_is_no_longer_listed<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let x = ObjectId::from_u64(0x51);
    let publish = |digest: u64| DirectoryRequest::Publish {
        id: x,
        sizes: sizes(4),
        digest: ContentDigest(digest),
    };
    assert_eq!(a.ask(publish(0xaaaa)).await, DirectoryReply::Done);
    assert_eq!(b.ask(publish(0xaaaa)).await, DirectoryReply::Done);
    assert_eq!(
        a.ask(publish(0xbbbb)).await,
        DirectoryReply::Conflict {
            sizes: sizes(4),
            digest: ContentDigest(0xaaaa),
        }
    );
    assert_eq!(
        sorted(
            b.ask(DirectoryRequest::Lookup {
                id: x,
                subscribe: false,
            })
            .await
        ),
        DirectoryReply::Located {
            holders: vec![NodeId(2)],
            sizes: Some(sizes(4)),
            digest: Some(ContentDigest(0xaaaa)),
        },
        "node 1 no longer holds the listed content"
    );
}

/// A daemon that stops cleanly says goodbye: it is gone from the members and its locations at
/// once, not after the heartbeat bound (exactly so in process, where time stands still; the
/// real backends' member wait would also outlast a node TTL).
async fn a_node_that_leaves_is_forgotten_at_once<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let x = ObjectId::from_u64(0x60);
    a.ask(DirectoryRequest::Publish {
        id: x,
        sizes: sizes(3),
        digest: digest_of(sizes(3)),
    })
    .await;
    b.wait_members(&[member(1, 1), member(2, 1)]).await;
    h.leave(a).await;
    b.wait_members(&[member(2, 1)]).await;
    assert_eq!(
        b.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false
        })
        .await,
        located(&[], None)
    );
}

async fn refusals<H: Harness>(h: &mut H) {
    // (With Redis the first node of a cluster sets its token: join it first.)
    let _first = h.join(member(1, 1)).await;
    match h.join_as(member(2, 1), "not-the-token").await {
        Err(error) => assert!(
            error
                .refusal()
                .is_some_and(|r| r.contains("wrong cluster token")),
            "{error}"
        ),
        Ok(_) => panic!("a node with the wrong token joined"),
    }
    let mut other_daemon = member(1, 2);
    other_daemon.fabric_addr = SocketAddr::from(([127, 0, 0, 2], 7201));
    match h.join_as(other_daemon, TOKEN).await {
        Err(error) => assert!(
            error
                .refusal()
                .is_some_and(|r| r.contains("already a member")),
            "{error}"
        ),
        Ok(_) => panic!("a second daemon with a live node id joined"),
    }
}

/// A node that waits for an object and publishes it itself is told once, before its publish
/// is answered, even if it unsubscribes at once; and the announcement of that publication,
/// however late it reaches the node, does not fire a subscription the node starts afterwards.
async fn a_node_waiting_for_what_it_publishes_is_told_once<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let x = ObjectId::from_u64(0x90);
    let own = DirectoryEvent::Published {
        id: x,
        holder: NodeId(1),
        sizes: sizes(4),
        digest: digest_of(sizes(4)),
    };
    assert_eq!(
        a.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: true
        })
        .await,
        located(&[], None)
    );
    assert_eq!(
        a.ask(DirectoryRequest::Publish {
            id: x,
            sizes: sizes(4),
            digest: digest_of(sizes(4)),
        })
        .await,
        DirectoryReply::Done
    );
    a.submit(
        DirectoryOpId(9_998),
        DirectoryRequest::Unsubscribe { id: x },
    );
    // A round trip on a's connection: the unsubscribe is served.
    a.ask(DirectoryRequest::Lookup {
        id: ObjectId::from_u64(0x91),
        subscribe: false,
    })
    .await;
    assert_eq!(
        a.events_before_marker(&mut b, ObjectId::from_u64(0x9f0))
            .await,
        vec![own.clone()]
    );
    // Again, then withdrawn and waited for anew: only b's later publication fires the new
    // subscription, not the announcement of a's. Submitted together, the requests are likely
    // served in one Redis pipeline, so that announcement is still unread when the new
    // subscription starts.
    for (n, request) in [
        DirectoryRequest::Lookup {
            id: x,
            subscribe: true,
        },
        DirectoryRequest::Withdraw { id: x },
        DirectoryRequest::Lookup {
            id: x,
            subscribe: true,
        },
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(4),
            digest: digest_of(sizes(4)),
        },
        DirectoryRequest::Withdraw { id: x },
    ]
    .into_iter()
    .enumerate()
    {
        a.submit(DirectoryOpId(9_000 + n as u64), request);
    }
    assert_eq!(
        a.ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: true
        })
        .await,
        located(&[], None)
    );
    b.ask(DirectoryRequest::Publish {
        id: x,
        sizes: sizes(4),
        digest: digest_of(sizes(4)),
    })
    .await;
    assert_eq!(
        a.events_before_marker(&mut b, ObjectId::from_u64(0x9f1))
            .await,
        vec![
            own,
            DirectoryEvent::Published {
                id: x,
                holder: NodeId(2),
                sizes: sizes(4),
                digest: digest_of(sizes(4)),
            }
        ]
    );
}

/// `LocateCopies` names the holders as a lookup does. The registry answers `CopiesLocated`
/// (here with no copies of record: the object was put with one copy); Redis, which keeps no
/// records, answers `Located`, which tells the node so.
async fn locate_copies_names_the_holders<H: Harness>(h: &mut H) {
    let mut a = h.join(member(1, 1)).await;
    let mut b = h.join(member(2, 1)).await;
    let mut c = h.join(member(3, 1)).await;
    let x = ObjectId::from_u64(0x30);
    for node in [&mut a, &mut b] {
        let published = node
            .ask(DirectoryRequest::Publish {
                id: x,
                sizes: sizes(8),
                digest: digest_of(sizes(8)),
            })
            .await;
        assert_eq!(published, DirectoryReply::Done);
    }
    let reply = c.ask(DirectoryRequest::LocateCopies { id: x }).await;
    let as_lookup = match reply {
        DirectoryReply::CopiesLocated {
            holders,
            sizes,
            digest,
            of_record,
        } => {
            assert_eq!(of_record, None, "put with one copy");
            DirectoryReply::Located {
                holders,
                sizes,
                digest,
            }
        }
        other => other,
    };
    assert_eq!(sorted(as_lookup), located(&[1, 2], Some(sizes(8))));
}

// ---- The suite, once per implementation ----

macro_rules! conformance {
    ($scenario:ident) => {
        mod $scenario {
            use super::*;

            #[tokio::test]
            async fn core_registry() {
                super::$scenario(&mut CoreHarness::new()).await;
            }

            #[tokio::test]
            async fn builtin_server() {
                super::$scenario(&mut BuiltinHarness::new().await).await;
            }

            #[tokio::test]
            async fn redis() {
                let Some(server) =
                    RedisServer::start(concat!("conformance ", stringify!($scenario)))
                else {
                    return;
                };
                super::$scenario(&mut RedisHarness { server }).await;
            }

            #[tokio::test]
            async fn redis_cluster() {
                let Some(cluster) =
                    RedisCluster::start(concat!("conformance ", stringify!($scenario)))
                else {
                    return;
                };
                super::$scenario(&mut RedisClusterHarness { cluster }).await;
            }
        }
    };
}

conformance!(publish_lookup_withdraw);
conformance!(subscribe_then_publish_delivers_exactly_once);
conformance!(unsubscribe_cancels_a_subscription);
conformance!(a_dead_node_loses_its_locations);
conformance!(a_restart_with_a_new_incarnation_starts_clean);
conformance!(refusals);
conformance!(one_id_names_one_content);
conformance!(a_listed_holder_that_publishes_another_content_is_no_longer_listed);
conformance!(a_node_that_leaves_is_forgotten_at_once);
conformance!(a_node_waiting_for_what_it_publishes_is_told_once);
conformance!(locate_copies_names_the_holders);
