//! The built-in directory: one head server, several node clients over loopback TCP.

use std::net::SocketAddr;
use std::time::Duration;

use skyriver_core::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::{ContentDigest, NodeId, ObjectId, ObjectSizes};
use skyriver_transport::directory::builtin::{
    self, BuiltinDirectory, BuiltinDirectoryServer, ClientConfig, ServerConfig,
};
use skyriver_transport::directory::{
    notice_channel, Directory, DirectoryError, DirectoryNotice, MemberInfo, NoticeReceiver,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

#[path = "support/replies.rs"]
mod replies;
use replies::sorted;

const TOKEN: &str = "test-cluster-token";
/// Bound on every wait in these tests.
const WAIT: Duration = Duration::from_secs(10);

fn sizes(n: u64) -> ObjectSizes {
    ObjectSizes {
        data_size: n,
        metadata_size: 3,
    }
}

fn member(node: u32) -> MemberInfo {
    MemberInfo {
        node: NodeId(node),
        fabric_addr: SocketAddr::from(([127, 0, 0, 1], 7000 + node as u16)),
        fabric: "tcp".into(),
        incarnation: 1,
        failure_domain: String::new(),
    }
}

fn client_config() -> ClientConfig {
    ClientConfig {
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(1000),
        connect_timeout: Duration::from_secs(2),
        join_timeout: Duration::from_millis(200),
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_millis(200),
        ..ClientConfig::default()
    }
}

async fn start_server(heartbeat_timeout: Duration) -> BuiltinDirectoryServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, heartbeat_timeout)
}

/// A head that gathers membership changes for `delay` before it sends them.
async fn start_server_gathering_members_for(delay: Duration) -> BuiltinDirectoryServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = ServerConfig::new(TOKEN);
    config.member_list_delay = Some(delay);
    BuiltinDirectoryServer::spawn(listener, config).unwrap()
}

fn serve_on(listener: TcpListener, heartbeat_timeout: Duration) -> BuiltinDirectoryServer {
    let mut config = ServerConfig::new(TOKEN);
    config.heartbeat_timeout = heartbeat_timeout;
    BuiltinDirectoryServer::spawn(listener, config).unwrap()
}

/// One node's directory client and what it has been told.
struct Node {
    dir: BuiltinDirectory,
    notices: NoticeReceiver,
    next_op: u64,
}

impl Node {
    async fn join(server: SocketAddr, me: MemberInfo) -> Node {
        Self::try_join(server, me, TOKEN, client_config())
            .await
            .expect("joins")
    }

    async fn try_join(
        server: SocketAddr,
        me: MemberInfo,
        token: &str,
        config: ClientConfig,
    ) -> Result<Node, DirectoryError> {
        let (tx, notices) = notice_channel();
        let dir = builtin::connect(&server.to_string(), me, &token.into(), tx, config).await?;
        Ok(Node {
            dir,
            notices,
            next_op: 0,
        })
    }

    /// Waits (bounded) for a notice `pick` accepts; returns it and the notices skipped.
    async fn wait_for<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&DirectoryNotice) -> Option<T>,
    ) -> (T, Vec<DirectoryNotice>) {
        let mut skipped = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                let notice = self.notices.recv().await.expect("notices open");
                if let Some(found) = pick(&notice) {
                    return found;
                }
                skipped.push(notice);
            }
        })
        .await;
        match found {
            Ok(found) => (found, skipped),
            Err(_) => panic!("timed out waiting for {what}; got {skipped:?}"),
        }
    }

    /// Submits `request` and waits for its reply, returning notices that came first.
    async fn ask(&mut self, request: DirectoryRequest) -> (DirectoryReply, Vec<DirectoryNotice>) {
        self.next_op += 1;
        let op = DirectoryOpId(self.next_op);
        self.dir.submit(op, request.clone()).expect("queued");
        self.wait_for(&format!("the reply to {request}"), |n| match n {
            DirectoryNotice::Reply { op: o, reply } if *o == op => Some(reply.clone()),
            _ => None,
        })
        .await
    }

    async fn publish(&mut self, id: ObjectId, sizes: ObjectSizes) {
        let digest = digest_of(sizes);
        let (reply, _) = self
            .ask(DirectoryRequest::Publish { id, sizes, digest })
            .await;
        assert_eq!(reply, DirectoryReply::Done);
    }

    async fn lookup(&mut self, id: ObjectId, subscribe: bool) -> DirectoryReply {
        self.ask(DirectoryRequest::Lookup { id, subscribe }).await.0
    }

    async fn members_become(&mut self, nodes: &[u32]) {
        let want: Vec<NodeId> = nodes.iter().map(|&n| NodeId(n)).collect();
        self.wait_for(&format!("members {want:?}"), |n| match n {
            DirectoryNotice::Members(m) if m.iter().map(|m| m.node).eq(want.iter().copied()) => {
                Some(())
            }
            _ => None,
        })
        .await;
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

#[tokio::test]
async fn publish_lookup_withdraw_across_nodes() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let mut b = Node::join(addr, member(2)).await;
    let mut c = Node::join(addr, member(3)).await;
    c.members_become(&[1, 2, 3]).await;
    assert_eq!(
        server
            .members()
            .iter()
            .map(|m| m.node.0)
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );

    let x = ObjectId::from_u64(1);
    assert_eq!(c.lookup(x, false).await, located(&[], None));
    a.publish(x, sizes(100)).await;
    b.publish(x, sizes(100)).await;
    assert_eq!(
        sorted(c.lookup(x, false).await),
        located(&[1, 2], Some(sizes(100)))
    );

    let (reply, _) = a.ask(DirectoryRequest::Withdraw { id: x }).await;
    assert_eq!(reply, DirectoryReply::Done);
    assert_eq!(c.lookup(x, false).await, located(&[2], Some(sizes(100))));
    b.ask(DirectoryRequest::Withdraw { id: x }).await;
    assert_eq!(c.lookup(x, false).await, located(&[], None));
    // Withdrawing what one does not hold is harmless.
    let (reply, _) = a.ask(DirectoryRequest::Withdraw { id: x }).await;
    assert_eq!(reply, DirectoryReply::Done);
}

#[tokio::test]
async fn lookup_with_subscribe_fires_once_on_publish_elsewhere() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let mut b = Node::join(addr, member(2)).await;
    let x = ObjectId::from_u64(7);

    assert_eq!(b.lookup(x, true).await, located(&[], None));
    a.publish(x, sizes(4096)).await;
    let (event, _) = b
        .wait_for("Published", |n| match n {
            DirectoryNotice::Event(e) => Some(e.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        event,
        DirectoryEvent::Published {
            id: x,
            holder: NodeId(1),
            sizes: sizes(4096),
            digest: digest_of(sizes(4096)),
        }
    );

    // One-shot: a second publication of the same object is not pushed.
    let mut c = Node::join(addr, member(3)).await;
    c.publish(x, sizes(4096)).await;
    let (_, before) = b
        .ask(DirectoryRequest::Lookup {
            id: x,
            subscribe: false,
        })
        .await;
    assert!(
        !before
            .iter()
            .any(|n| matches!(n, DirectoryNotice::Event(_))),
        "{before:?}"
    );

    // A lookup that finds a holder registers no subscription.
    let y = ObjectId::from_u64(8);
    a.publish(y, sizes(1)).await;
    assert_eq!(b.lookup(y, true).await, located(&[1], Some(sizes(1))));
    c.publish(y, sizes(1)).await;
    let (_, before) = b
        .ask(DirectoryRequest::Lookup {
            id: y,
            subscribe: false,
        })
        .await;
    assert!(!before
        .iter()
        .any(|n| matches!(n, DirectoryNotice::Event(_))));

    // Unsubscribe cancels a pending subscription.
    let z = ObjectId::from_u64(9);
    assert_eq!(b.lookup(z, true).await, located(&[], None));
    b.dir
        .submit(DirectoryOpId(999), DirectoryRequest::Unsubscribe { id: z })
        .expect("queued");
    a.publish(z, sizes(2)).await;
    let (_, before) = b
        .ask(DirectoryRequest::Lookup {
            id: z,
            subscribe: false,
        })
        .await;
    assert!(!before
        .iter()
        .any(|n| matches!(n, DirectoryNotice::Event(_))));
}

#[tokio::test]
async fn many_waiters_all_hear_one_publish() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let mut publisher = Node::join(addr, member(0)).await;
    let mut waiters = Vec::new();
    for n in 1..=5 {
        waiters.push(Node::join(addr, member(n)).await);
    }
    let x = ObjectId::from_u64(42);
    for w in &mut waiters {
        assert_eq!(w.lookup(x, true).await, located(&[], None));
    }
    publisher.publish(x, sizes(10)).await;
    for w in &mut waiters {
        w.wait_for("Published", |n| match n {
            DirectoryNotice::Event(DirectoryEvent::Published { id, holder, .. })
                if *id == x && *holder == NodeId(0) =>
            {
                Some(())
            }
            _ => None,
        })
        .await;
    }
}

#[tokio::test]
async fn a_node_that_disconnects_stops_being_a_holder() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let mut b = Node::join(addr, member(2)).await;
    b.members_become(&[1, 2]).await;
    let x = ObjectId::from_u64(3);
    a.publish(x, sizes(5)).await;
    assert_eq!(b.lookup(x, false).await, located(&[1], Some(sizes(5))));
    let y = ObjectId::from_u64(4);
    assert_eq!(a.lookup(y, true).await, located(&[], None));

    drop(a);
    b.members_become(&[2]).await;
    assert_eq!(b.lookup(x, false).await, located(&[], None));
    // Its subscription went with it: publishing fires nothing and breaks nothing.
    b.publish(y, sizes(1)).await;
    assert_eq!(b.lookup(y, false).await, located(&[2], Some(sizes(1))));
}

#[tokio::test]
async fn a_silent_node_expires_after_the_heartbeat_timeout() {
    let server = start_server(Duration::from_millis(300)).await;
    let addr = server.local_addr();
    let mut watcher = Node::join(addr, member(1)).await;
    let mut silent_config = client_config();
    // Never pings, and does not give up on the head before the head gives up on it.
    silent_config.heartbeat_interval = Duration::from_secs(3600);
    silent_config.heartbeat_timeout = Duration::from_secs(3600);
    let mut silent = Node::try_join(addr, member(2), TOKEN, silent_config)
        .await
        .unwrap();
    watcher.members_become(&[1, 2]).await;
    let x = ObjectId::from_u64(11);
    silent.publish(x, sizes(1)).await;
    assert_eq!(
        watcher.lookup(x, false).await,
        located(&[2], Some(sizes(1)))
    );
    watcher.members_become(&[1]).await;
    assert_eq!(watcher.lookup(x, false).await, located(&[], None));
}

#[tokio::test]
async fn wrong_token_is_refused_with_a_clear_error() {
    let server = start_server(Duration::from_secs(5)).await;
    let result = Node::try_join(
        server.local_addr(),
        member(1),
        "not-the-token",
        client_config(),
    )
    .await;
    match result {
        Err(DirectoryError::Refused(reason)) => {
            assert!(reason.contains("wrong cluster token"), "{reason}")
        }
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("a node with the wrong token was accepted"),
    }
    assert!(server.members().is_empty());
}

#[tokio::test]
async fn a_second_daemon_with_a_live_node_id_is_refused() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let _first = Node::join(addr, member(1)).await;
    // Another daemon (another fabric address) claiming a live node id.
    let mut other = member(1);
    other.incarnation = 2;
    other.fabric_addr = SocketAddr::from(([127, 0, 0, 2], 7001));
    match Node::try_join(addr, other, TOKEN, client_config()).await {
        Err(DirectoryError::Refused(reason)) => {
            assert!(reason.contains("already a member"), "{reason}")
        }
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("a duplicate node id was accepted"),
    }
    assert_eq!(server.members(), vec![member(1)]);
}

#[tokio::test]
async fn unreachable_head_is_reported() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    match Node::try_join(addr, member(1), TOKEN, client_config()).await {
        Err(DirectoryError::Unreachable { .. }) => {}
        Err(other) => panic!("expected Unreachable, got {other}"),
        Ok(_) => panic!("joined a head that is not there"),
    }
}

#[tokio::test]
async fn garbage_and_oversized_frames_harm_nobody_else() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let x = ObjectId::from_u64(5);
    a.publish(x, sizes(9)).await;

    let mut garbage = TcpStream::connect(addr).await.unwrap();
    garbage.write_all(b"\x05\x00\x00\x00hello").await.unwrap();
    let mut huge = TcpStream::connect(addr).await.unwrap();
    huge.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    let mut truncated = TcpStream::connect(addr).await.unwrap();
    truncated.write_all(&[10, 0, 0, 0, 1]).await.unwrap();
    drop(truncated);

    let mut b = Node::join(addr, member(2)).await;
    assert_eq!(b.lookup(x, false).await, located(&[1], Some(sizes(9))));
    assert_eq!(
        server
            .members()
            .iter()
            .map(|m| m.node.0)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[tokio::test]
async fn nodes_ride_out_a_head_restart() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let mut b = Node::join(addr, member(2)).await;
    let x = ObjectId::from_u64(21);
    let y = ObjectId::from_u64(22);
    a.publish(x, sizes(1)).await;
    assert_eq!(b.lookup(y, true).await, located(&[], None));

    server.shutdown().await;
    for node in [&mut a, &mut b] {
        node.wait_for("Health(Err)", |n| match n {
            DirectoryNotice::Health(Err(reason)) => Some(reason.clone()),
            _ => None,
        })
        .await;
    }
    match b.lookup(x, false).await {
        DirectoryReply::Unavailable { .. } => {}
        other => panic!("expected Unavailable while the head is down, got {other}"),
    }

    // A new head on the same port: nodes reconnect and re-register what they hold and wait for.
    // It learns it restarted from their hellos, and holds publications of ids it does not list
    // for its grace period (twice its heartbeat timeout): 1 s here, well inside WAIT.
    let listener = TcpListener::bind(addr).await.unwrap();
    let restarted = std::time::Instant::now();
    let _server = serve_on(listener, Duration::from_millis(500));
    for node in [&mut a, &mut b] {
        node.wait_for("Health(Ok)", |n| {
            matches!(n, DirectoryNotice::Health(Ok(()))).then_some(())
        })
        .await;
    }
    b.members_become(&[1, 2]).await;
    assert_eq!(b.lookup(x, false).await, located(&[1], Some(sizes(1))));
    a.publish(y, sizes(2)).await;
    assert!(
        restarted.elapsed() >= Duration::from_millis(1000),
        "a new id's publication was answered within the restarted head's grace period"
    );
    b.wait_for("Published after the restart", |n| match n {
        DirectoryNotice::Event(DirectoryEvent::Published { id, .. }) if *id == y => Some(()),
        _ => None,
    })
    .await;
}

/// Appends one frame as the directory sends them: a little-endian length, then postcard.
fn push_frame<T: serde::Serialize>(buffer: &mut Vec<u8>, message: &T) {
    let body = postcard::to_allocvec(message).unwrap();
    buffer.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buffer.extend_from_slice(&body);
}

/// Sends one frame.
async fn send_frame<T: serde::Serialize>(stream: &mut TcpStream, message: &T) {
    let mut frame = Vec::new();
    push_frame(&mut frame, message);
    stream.write_all(&frame).await.unwrap();
}

/// The next frame, or `None` once the peer closed.
async fn receive_frame<T: serde::de::DeserializeOwned>(stream: &mut TcpStream) -> Option<T> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    tokio::time::timeout(WAIT, stream.read_exact(&mut len))
        .await
        .expect("an answer in time")
        .ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    stream.read_exact(&mut body).await.ok()?;
    Some(postcard::from_bytes(&body).expect("a valid frame"))
}

mod handshake {
    use super::*;
    use skyriver_core::auth::{prove, Nonce, Proof, Role};
    use skyriver_core::registry::{
        wire, FromRegistry, Hello, ToRegistry, HELLO_MAGIC, PROTOCOL_VERSION,
    };

    fn hello(nonce: Nonce) -> Hello {
        Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            legacy_token: String::new(),
            member: member(1),
            nonce,
            returning: false,
            learns_locations: false,
        }
    }

    fn proof(token: &str, hello: &Hello, challenge: &Nonce) -> Proof {
        let identity = wire::member_identity(&hello.member);
        prove(
            token,
            Role::Dialer,
            &wire::transcript(&hello.nonce, challenge, &identity),
        )
    }

    async fn challenge(stream: &mut TcpStream, hello: &Hello) -> Nonce {
        send_frame(stream, &ToRegistry::Hello(hello.clone())).await;
        match receive_frame(stream).await {
            Some(FromRegistry::Challenge { nonce }) => nonce,
            other => panic!("expected a challenge, got {other:?}"),
        }
    }

    /// A raw connection that joined `server` as member 1 (its hello nonce `nonce`).
    async fn welcomed(server: &BuiltinDirectoryServer, nonce: Nonce) -> TcpStream {
        let mut node = TcpStream::connect(server.local_addr()).await.unwrap();
        let hello = hello(nonce);
        let challenge = challenge(&mut node, &hello).await;
        send_frame(
            &mut node,
            &ToRegistry::Proof(proof(TOKEN, &hello, &challenge)),
        )
        .await;
        assert!(matches!(
            receive_frame(&mut node).await,
            Some(FromRegistry::Welcome { .. })
        ));
        node
    }

    #[tokio::test]
    async fn a_replayed_handshake_gets_no_session() {
        let server = start_server(Duration::from_secs(5)).await;
        let addr = server.local_addr();
        // An honest handshake, recorded.
        let recorded_hello = hello([7; 32]);
        let mut honest = TcpStream::connect(addr).await.unwrap();
        let first = challenge(&mut honest, &recorded_hello).await;
        let recorded_proof = proof(TOKEN, &recorded_hello, &first);
        send_frame(&mut honest, &ToRegistry::Proof(recorded_proof)).await;
        assert!(matches!(
            receive_frame(&mut honest).await,
            Some(FromRegistry::Welcome { .. })
        ));
        drop(honest);
        wait_until(|| server.members().is_empty()).await;
        // Replayed word for word on a new connection: a new challenge, so the proof fails.
        let mut replay = TcpStream::connect(addr).await.unwrap();
        let second = challenge(&mut replay, &recorded_hello).await;
        assert_ne!(first, second, "every connection gets a fresh challenge");
        send_frame(&mut replay, &ToRegistry::Proof(recorded_proof)).await;
        match receive_frame::<FromRegistry>(&mut replay).await {
            Some(FromRegistry::Refused { reason, .. }) => {
                assert!(reason.contains("wrong cluster token"), "{reason}")
            }
            other => panic!("a replayed proof must be refused, got {other:?}"),
        }
        assert!(receive_frame::<FromRegistry>(&mut replay).await.is_none());
        assert!(server.members().is_empty());
    }

    #[tokio::test]
    async fn a_version_1_node_is_told_which_version_the_head_speaks() {
        /// Version 1's hello: the token in clear, no nonce.
        #[derive(serde::Serialize)]
        struct HelloV1 {
            magic: [u8; 8],
            version: u16,
            token: String,
            member: MemberInfo,
        }
        #[derive(serde::Serialize)]
        enum ToRegistryV1 {
            Hello(HelloV1),
        }
        let server = start_server(Duration::from_secs(5)).await;
        let mut old = TcpStream::connect(server.local_addr()).await.unwrap();
        let v1 = ToRegistryV1::Hello(HelloV1 {
            magic: HELLO_MAGIC,
            version: 1,
            token: TOKEN.into(),
            member: member(1),
        });
        send_frame(&mut old, &v1).await;
        match receive_frame::<FromRegistry>(&mut old).await {
            Some(FromRegistry::Refused { reason, retryable }) => {
                assert!(
                    reason.contains("version 1")
                        && reason.contains(&format!(
                            "speaks {}",
                            skyriver_core::registry::PROTOCOL_VERSION
                        )),
                    "{reason}"
                );
                assert!(!retryable);
            }
            other => panic!("expected a refusal naming the versions, got {other:?}"),
        }
        assert!(server.members().is_empty());
    }

    #[tokio::test]
    async fn a_connection_without_a_hello_is_refused_and_may_try_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut config = ServerConfig::new(TOKEN);
        config.hello_timeout = Duration::from_millis(200);
        let server = BuiltinDirectoryServer::spawn(listener, config).unwrap();
        let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
        match receive_frame::<FromRegistry>(&mut silent).await {
            Some(FromRegistry::Refused { reason, retryable }) => {
                assert!(reason.contains("no hello within 200 ms"), "{reason}");
                // Thousands of nodes forming at once can miss the bound; they try again.
                assert!(retryable);
            }
            other => panic!("expected a refusal for the missing hello, got {other:?}"),
        }
        assert!(server.members().is_empty());
        // The same head then takes a node that says hello in time.
        let node = Node::join(server.local_addr(), member(1)).await;
        wait_until(|| server.members().len() == 1).await;
        drop(node);
    }

    /// A head too busy to answer a node's first hello within its connect timeout: the node
    /// tries again within its join timeout instead of giving up.
    #[tokio::test]
    async fn a_hello_that_times_out_is_tried_again_within_the_join_timeout() {
        let server = start_server(Duration::from_secs(5)).await;
        let head = server.local_addr();
        // In front of the head: the first connection is accepted and never answered, later
        // ones are passed through.
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let relay = tokio::spawn(async move {
            let (silent, _) = front.accept().await.unwrap();
            loop {
                let (mut node, _) = front.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut upstream = TcpStream::connect(head).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut node, &mut upstream).await;
                });
                let _ = &silent;
            }
        });
        let config = ClientConfig {
            connect_timeout: Duration::from_millis(200),
            join_timeout: Duration::from_secs(10),
            ..client_config()
        };
        let node = Node::try_join(front_addr, member(1), TOKEN, config)
            .await
            .expect("joins on a later try");
        wait_until(|| server.members().len() == 1).await;
        drop(node);
        relay.abort();
    }

    #[tokio::test]
    async fn a_node_drops_a_head_that_cannot_prove_the_token() {
        // Something at the head's address that speaks the protocol without the token: it
        // challenges, then welcomes with a made-up proof.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let impostor = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let Some(ToRegistry::Hello(h)) = receive_frame(&mut stream).await else {
                panic!("expected a hello");
            };
            assert!(h.legacy_token.is_empty(), "the token never travels");
            send_frame(&mut stream, &FromRegistry::Challenge { nonce: [1; 32] }).await;
            let Some(ToRegistry::Proof(_)) = receive_frame(&mut stream).await else {
                panic!("expected a proof");
            };
            send_frame(
                &mut stream,
                &FromRegistry::Welcome {
                    version: PROTOCOL_VERSION,
                    proof: [0; 32],
                },
            )
            .await;
            // Hold the connection until the node drops it.
            let _ = receive_frame::<ToRegistry>(&mut stream).await;
        });
        match Node::try_join(addr, member(1), TOKEN, client_config()).await {
            Err(error) => assert!(
                error
                    .to_string()
                    .contains("could not prove the cluster token"),
                "{error}"
            ),
            Ok(_) => panic!("joined a head that cannot prove the token"),
        }
        impostor.abort();
    }

    /// A node that pipelines: a burst of requests and pings written at once, one frame split
    /// across two writes. Every reply arrives, complete and in the order asked.
    #[tokio::test]
    async fn replies_to_a_pipelined_burst_arrive_complete_and_in_order() {
        use skyriver_core::registry::WireOpId;
        const BURST: u64 = 1000;
        let server = start_server(Duration::from_secs(5)).await;
        let mut node = welcomed(&server, [3; 32]).await;
        // Even numbers are lookups (op n), odd ones pings (seq n), all in one buffer.
        let mut burst = Vec::new();
        for n in 0..BURST {
            let message = if n % 2 == 0 {
                ToRegistry::Request {
                    op: WireOpId(n),
                    request: DirectoryRequest::Lookup {
                        id: ObjectId::from_u64(n + 1),
                        subscribe: false,
                    },
                }
            } else {
                ToRegistry::Ping { seq: n }
            };
            push_frame(&mut burst, &message);
        }
        // The last frame's length prefix is split, and so is its body's first byte.
        let split = burst.len() - 3;
        node.write_all(&burst[..split]).await.unwrap();
        node.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        node.write_all(&burst[split..]).await.unwrap();
        let mut next = 0;
        while next < BURST {
            match receive_frame::<FromRegistry>(&mut node).await {
                Some(FromRegistry::Reply { op, reply }) => {
                    assert_eq!(op, WireOpId(next), "replies in the order asked");
                    assert!(matches!(reply, DirectoryReply::Located { .. }), "{reply:?}");
                    next += 1;
                }
                Some(FromRegistry::Pong { seq }) => {
                    assert_eq!(seq, next, "pongs in the order asked");
                    next += 1;
                }
                Some(FromRegistry::Members { .. } | FromRegistry::MembersChanged { .. }) => {}
                other => panic!("after {next} answers: {other:?}"),
            }
        }
        assert_eq!(server.members().len(), 1);
    }

    /// A node that keeps sending but never reads fills its queue at the head (the head writes
    /// replies itself while the socket takes them, then queues them) and is disconnected.
    #[tokio::test]
    async fn a_node_that_never_reads_is_disconnected() {
        let server = start_server(Duration::from_secs(30)).await;
        let mut node = welcomed(&server, [4; 32]).await;
        wait_until(|| server.members().len() == 1).await;
        let mut burst = Vec::new();
        for seq in 0..10_000u64 {
            push_frame(&mut burst, &ToRegistry::Ping { seq });
        }
        // Pings, never reading a pong, until the head lets the node go.
        let deadline = tokio::time::Instant::now() + WAIT;
        while !server.members().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "still a member");
            if node.write_all(&burst).await.is_err() {
                break;
            }
        }
        wait_until(|| server.members().is_empty()).await;
    }

    async fn wait_until(mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "timed out");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Nodes join one at a time, two leave, one comes back: every node's list follows, and after
/// its first list each node is sent only what changed.
#[tokio::test]
async fn member_lists_follow_joins_and_departures_as_changes() {
    let server = start_server(Duration::from_secs(5)).await;
    let addr = server.local_addr();
    const NODES: u32 = 12;
    let mut nodes = Vec::new();
    for n in 1..=NODES {
        nodes.push(Node::join(addr, member(n)).await);
        let all: Vec<u32> = (1..=n).collect();
        for node in &mut nodes {
            node.members_become(&all).await;
        }
    }
    let after_joins = server.member_list_stats();
    // Each node got one whole list (its first) and a change per later join.
    assert_eq!(after_joins.whole, u64::from(NODES), "{after_joins:?}");
    assert_eq!(
        after_joins.changes,
        u64::from(NODES * (NODES - 1) / 2),
        "{after_joins:?}"
    );
    // Two leave (their connections close), and one of them joins again.
    let fourth = nodes.remove(3);
    let ninth = nodes.remove(7);
    drop(fourth);
    drop(ninth);
    let left: Vec<u32> = (1..=NODES).filter(|n| ![4, 9].contains(n)).collect();
    for node in &mut nodes {
        node.members_become(&left).await;
    }
    nodes.push(Node::join(addr, member(9)).await);
    let back: Vec<u32> = (1..=NODES).filter(|&n| n != 4).collect();
    for node in &mut nodes {
        node.members_become(&back).await;
    }
    let stats = server.member_list_stats();
    assert_eq!(stats.whole, after_joins.whole + 1, "{stats:?}");
    // A change from list to list is small: well under a whole list of twelve.
    let change_bytes = (stats.bytes - after_joins.bytes) as f64;
    let messages = (stats.whole + stats.changes - after_joins.whole - after_joins.changes) as f64;
    assert!(
        change_bytes / messages < 120.0,
        "{change_bytes} bytes in {messages} messages"
    );
    server.shutdown().await;
}

/// The head gathers membership changes before sending them, but a node always hears the
/// latest list before any reply sent after a change.
#[tokio::test]
async fn a_node_hears_of_a_join_before_a_reply_that_follows_it() {
    // Gathered for longer than the test: only a reply can bring the list.
    let server = start_server_gathering_members_for(Duration::from_secs(3600)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let _b = Node::join(addr, member(2)).await;
    let id = ObjectId::from_u64(77);
    let (reply, before) = a
        .ask(DirectoryRequest::Lookup {
            id,
            subscribe: false,
        })
        .await;
    assert_eq!(reply, located(&[], None));
    let lists: Vec<Vec<NodeId>> = before
        .iter()
        .filter_map(|n| match n {
            DirectoryNotice::Members(m) => Some(m.iter().map(|m| m.node).collect()),
            _ => None,
        })
        .collect();
    assert_eq!(
        lists.last(),
        Some(&vec![NodeId(1), NodeId(2)]),
        "{before:?}"
    );
    server.shutdown().await;
}

/// Gathered changes go out by themselves after the delay, to nodes that ask nothing.
#[tokio::test]
async fn gathered_member_changes_reach_idle_nodes() {
    let server = start_server_gathering_members_for(Duration::from_millis(50)).await;
    let addr = server.local_addr();
    let mut a = Node::join(addr, member(1)).await;
    let _b = Node::join(addr, member(2)).await;
    let _c = Node::join(addr, member(3)).await;
    a.members_become(&[1, 2, 3]).await;
    server.shutdown().await;
}
