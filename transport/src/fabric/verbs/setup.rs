//! Connection set-up of the verbs fabric: the acceptor, both sides of the handshake (hello,
//! QP handshake, cost probe) and the installation of an established connection.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use skyriver_core::node::{PathCosts, PeerParams};
use skyriver_core::NodeId;

use super::errors::{HandshakeFailure, HelloRejection};
use super::hello::{
    Accepted, Challenge, Control, ControlError, CostsFrame, Hello, Open, Preamble, Proven, Reply,
    Transcript, Verdict,
};
use super::peer::{ConnState, PeerConn, RemoteTable};
use super::{lock, probe, Shared, Slot, VerbsFabricConfig};
use crate::fabric::FabricEvent;
use crate::verbs::{NegotiatedParams, VerbsConnection};

// ---- connection set-up ----------------------------------------------------------------------

/// What a finished handshake hands to [`install`].
struct Established {
    conn: VerbsConnection,
    control: TcpStream,
    peer_hello: Hello,
    costs: PathCosts,
    cost_note: String,
    backlog: Vec<crate::verbs::Completion>,
}

/// Control streams: no Nagle delay (small handshake frames), and keepalive probes so a silent
/// peer is noticed on an idle connection. Best effort: failures only weaken detection.
fn tune_control(stream: &TcpStream, cfg: &VerbsFabricConfig) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(cfg.control_keepalive)
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

fn control_err(stage: &'static str) -> impl Fn(ControlError) -> HandshakeFailure {
    move |source| HandshakeFailure::Control { stage, source }
}

/// The outgoing side of a handshake. Errors are the reason for `PeerLost`.
pub(super) fn connect_to(
    s: &Arc<Shared>,
    peer: NodeId,
    addr: SocketAddr,
    attempt: u64,
) -> Result<(), HandshakeFailure> {
    let cfg = &s.config;
    let deadline = Instant::now() + cfg.handshake_timeout;
    let mut stream = TcpStream::connect_timeout(&addr, cfg.handshake_timeout)
        .map_err(|source| HandshakeFailure::Connect { addr, source })?;
    tune_control(&stream, &s.config);
    let pings = if cfg.probe { probe::PINGS } else { 0 };
    let mut ctl = Control::new(&mut stream, cfg.handshake_timeout).map_err(control_err("hello"))?;
    ctl.write_preamble().map_err(control_err("hello"))?;
    let nonce = crate::token::fresh_nonce();
    ctl.write_frame(&Open {
        node: s.identity.node.0,
        nonce,
    })
    .map_err(control_err("hello"))?;
    let challenge: Challenge = ctl.read_frame().map_err(control_err("hello"))?;
    if challenge.node != peer.0 {
        return Err(HelloRejection::WrongNode {
            expected: peer,
            found: challenge.node,
        }
        .into());
    }
    let transcript = Transcript {
        connector_nonce: nonce,
        acceptor_nonce: challenge.nonce,
        connector: s.identity.node.0,
        acceptor: challenge.node,
    };
    let mine = s.my_hello(pings);
    ctl.write_frame(&Proven {
        proof: transcript.connector_proof(s.identity.cluster_token.expose_secret(), &mine),
        hello: mine.clone(),
    })
    .map_err(control_err("hello"))?;
    let theirs = match ctl.read_frame::<Reply>().map_err(control_err("hello"))? {
        Reply::Accept(Accepted { hello, proof }) => {
            let proven = transcript.check_acceptor(
                s.identity.cluster_token.expose_secret(),
                &mine,
                &hello,
                &proof,
            );
            if !proven || hello.node != challenge.node {
                let reason = HelloRejection::Unproven {
                    node: challenge.node,
                };
                let _ = ctl.write_frame(&Verdict::Refuse(reason.to_string()));
                tracing::warn!(%peer, %addr, %reason, "verbs fabric: refusing the peer");
                return Err(reason.into());
            }
            hello
        }
        Reply::Refuse(reason) => return Err(HandshakeFailure::RefusedByPeer { peer, reason }),
        Reply::Yield(reason) => return s.yield_to_peer(peer, attempt, deadline, reason),
    };
    if let Err(reason) = s.check_hello(&theirs, Some(peer)) {
        let _ = ctl.write_frame(&Verdict::Refuse(reason.to_string()));
        tracing::warn!(%peer, %addr, %reason, "verbs fabric: refusing the peer");
        return Err(reason.into());
    }
    let remote =
        RemoteTable::from_hello(&theirs.arenas).map_err(|source| HelloRejection::Shape {
            node: theirs.node,
            source,
        })?;
    ctl.write_frame(&Verdict::Accept)
        .map_err(control_err("hello"))?;
    drop(ctl);

    let mut conn = VerbsConnection::connect(&s.device, &mut stream, &s.connection_config())
        .map_err(|source| HandshakeFailure::QpHandshake { peer, source })?;
    let frame = if cfg.probe {
        let left = deadline.saturating_duration_since(Instant::now());
        match probe::measure(
            &mut conn,
            s.probe.reg.chunks()[0],
            theirs.probe_region,
            cfg.probe_budget,
            left,
        ) {
            Ok(m) => m.frame,
            Err(source) => return Err(HandshakeFailure::Probe { peer, source }),
        }
    } else {
        CostsFrame {
            measured: false,
            round_trip_ns: 0.0,
            message_overhead_ns: 0.0,
            wire_bytes_per_sec: 0.0,
            read_setup_ns: 0.0,
            note: "probe disabled".into(),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let mut ctl = Control::new(&mut stream, left.max(Duration::from_millis(1)))
        .map_err(control_err("sending costs"))?;
    ctl.write_frame(&frame)
        .map_err(control_err("sending costs"))?;
    drop(ctl);
    let costs = s.path_costs(&frame, &theirs, s.device.name());
    install(
        s,
        peer,
        attempt,
        Established {
            conn,
            control: stream,
            peer_hello: theirs,
            costs,
            cost_note: frame.note,
            backlog: Vec::new(),
        },
        remote,
    );
    Ok(())
}

pub(super) fn accept_loop(s: &Arc<Shared>, listener: TcpListener) {
    while !s.shutdown.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                let _ = stream.set_nonblocking(false);
                if s.accepts_in_flight.load(Ordering::Acquire) >= s.config.max_pending_accepts {
                    tracing::warn!(%from, "verbs fabric: too many handshakes in progress; closing");
                    continue;
                }
                s.accepts_in_flight.fetch_add(1, Ordering::AcqRel);
                let shared = s.clone();
                let spawned =
                    thread::Builder::new()
                        .name("verbs-accepted".into())
                        .spawn(move || {
                            accept_from(&shared, stream, from);
                            shared.accepts_in_flight.fetch_sub(1, Ordering::AcqRel);
                        });
                if let Err(e) = spawned {
                    s.accepts_in_flight.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(%from, error = %e, "verbs fabric: cannot start a handshake thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                tracing::warn!(error = %e, "verbs fabric: accept failed");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The accepting side of a handshake.
fn accept_from(s: &Arc<Shared>, mut stream: TcpStream, from: SocketAddr) {
    let cfg = &s.config;
    let deadline = Instant::now() + cfg.handshake_timeout;
    tune_control(&stream, &s.config);
    let mut ctl = match Control::new(&mut stream, cfg.handshake_timeout) {
        Ok(ctl) => ctl,
        Err(e) => {
            tracing::warn!(%from, error = %e, "verbs fabric: control stream unusable; closing");
            return;
        }
    };
    match ctl.read_preamble() {
        Ok(Preamble::Current) => {}
        Ok(Preamble::Version1) => {
            let reason = "this node speaks verbs fabric handshake version 3, which proves the \
                          cluster token instead of sending it; version 1 is not supported \
                          (run the same Skyriver version on every node)";
            tracing::warn!(%from, "verbs fabric: refusing a version 1 handshake");
            let _ = ctl.write_frame(&Reply::Refuse(reason.into()));
            return;
        }
        Ok(Preamble::Version2) => {
            // Version 2 waits for a challenge it cannot tell from a refusal: it fails on its
            // side with a malformed frame; the reason is logged here.
            tracing::warn!(
                %from,
                "verbs fabric: refusing a version 2 handshake: this node speaks version 3 \
                 (peer messages with per-lease READ keys); run the same Skyriver version on \
                 every node"
            );
            return;
        }
        Err(e) => {
            tracing::warn!(%from, error = %e, "verbs fabric: bad handshake; closing");
            return;
        }
    }
    let proven = (|| -> Result<(Transcript, Proven), ControlError> {
        let open: Open = ctl.read_frame()?;
        let transcript = Transcript {
            connector_nonce: open.nonce,
            acceptor_nonce: crate::token::fresh_nonce(),
            connector: open.node,
            acceptor: s.identity.node.0,
        };
        ctl.write_frame(&Challenge {
            node: s.identity.node.0,
            nonce: transcript.acceptor_nonce,
        })?;
        Ok((transcript, ctl.read_frame()?))
    })();
    let (
        transcript,
        Proven {
            proof,
            hello: theirs,
        },
    ) = match proven {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(%from, error = %e, "verbs fabric: bad handshake; closing");
            return;
        }
    };
    let peer = NodeId(theirs.node);
    let authentic =
        if !transcript.check_connector(s.identity.cluster_token.expose_secret(), &theirs, &proof) {
            Err(HelloRejection::WrongToken { node: theirs.node })
        } else if theirs.node != transcript.connector {
            Err(HelloRejection::SwitchedNode {
                opened: transcript.connector,
                hello: theirs.node,
            })
        } else {
            Ok(())
        };
    if let Err(reason) = authentic.and_then(|()| s.check_hello(&theirs, None)) {
        // Unauthenticated: no event (the claimed node id is unverified; a PeerLost for it would
        // let anyone without the token disturb a real peer's connection).
        tracing::warn!(%from, claimed = %peer, %reason, "verbs fabric: refusing a connection");
        let _ = ctl.write_frame(&Reply::Refuse(reason.to_string()));
        return;
    }
    let remote = match RemoteTable::from_hello(&theirs.arenas) {
        Ok(r) => r,
        Err(reason) => {
            tracing::warn!(%from, %peer, %reason, "verbs fabric: refusing a connection");
            let _ = ctl.write_frame(&Reply::Refuse(reason.to_string()));
            return;
        }
    };
    // Claim the peer's slot, or refuse a duplicate. Of two simultaneous connections between the
    // same nodes, the one opened by the lower node id wins on both sides.
    let attempt = {
        let mut t = lock(&s.table);
        t.next_attempt += 1;
        let attempt = t.next_attempt;
        let mut driver_waits = false;
        let refuse = match t.peers.get(&peer) {
            None => None,
            Some(Slot::Up(_)) => Some(Reply::Refuse(format!(
                "{} is already connected to {peer}",
                s.identity.node
            ))),
            Some(Slot::Connecting { outgoing: true, .. }) if s.identity.node < peer => {
                Some(Reply::Yield(format!(
                    "simultaneous connect: the connection opened by {} (the lower id) wins",
                    s.identity.node
                )))
            }
            Some(Slot::Connecting { outgoing: true, .. }) => {
                // This connection replaces the driver's own attempt, which ends quietly.
                driver_waits = true;
                None
            }
            Some(Slot::Connecting {
                outgoing: false, ..
            }) => Some(Reply::Refuse(format!(
                "another connection from {peer} is being set up"
            ))),
        };
        if let Some(reply) = refuse {
            drop(t);
            tracing::info!(%peer, "verbs fabric: refusing a duplicate connection");
            let _ = ctl.write_frame(&reply);
            return;
        }
        t.peers.insert(
            peer,
            Slot::Connecting {
                attempt,
                outgoing: false,
                driver_waits,
            },
        );
        attempt
    };
    drop(ctl);
    let result = (|| -> Result<Established, HandshakeFailure> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut ctl = Control::new(&mut stream, left.max(Duration::from_millis(1)))
            .map_err(control_err("hello"))?;
        let mine = s.my_hello(0);
        let proof =
            transcript.acceptor_proof(s.identity.cluster_token.expose_secret(), &theirs, &mine);
        ctl.write_frame(&Reply::Accept(Accepted { hello: mine, proof }))
            .map_err(control_err("hello"))?;
        match ctl.read_frame::<Verdict>().map_err(control_err("hello"))? {
            Verdict::Accept => {}
            Verdict::Refuse(reason) => {
                return Err(HandshakeFailure::RefusedByPeer { peer, reason })
            }
        }
        drop(ctl);
        let mut conn = VerbsConnection::accept(&s.device, &mut stream, &s.connection_config())
            .map_err(|source| HandshakeFailure::QpHandshake { peer, source })?;
        let left = deadline.saturating_duration_since(Instant::now());
        let backlog = probe::echo_pings(&mut conn, theirs.probe_pings, left)
            .map_err(|source| HandshakeFailure::Probe { peer, source })?;
        let left = deadline.saturating_duration_since(Instant::now());
        let mut ctl = Control::new(&mut stream, left.max(Duration::from_millis(1)))
            .map_err(control_err("receiving costs"))?;
        let frame: CostsFrame = ctl.read_frame().map_err(control_err("receiving costs"))?;
        drop(ctl);
        let costs = s.path_costs(&frame, &theirs, &theirs.device);
        Ok(Established {
            conn,
            control: stream,
            peer_hello: theirs,
            costs,
            cost_note: frame.note,
            backlog,
        })
    })();
    match result {
        Ok(est) => install(s, peer, attempt, est, remote),
        Err(reason) => s.attempt_failed(peer, attempt, reason),
    }
}

/// Makes an established connection live: `PeerConnected`, then visible to callers and the
/// poller (both under the table lock). Drops it quietly if the attempt was superseded or the
/// fabric is shutting down.
fn install(s: &Arc<Shared>, peer: NodeId, attempt: u64, est: Established, remote: RemoteTable) {
    let params = est.conn.params();
    let summary = summary(
        s,
        peer,
        &est.peer_hello,
        &params,
        &est.costs,
        &est.cost_note,
    );
    let peer_params = PeerParams {
        // Cannot truncate: at most MAX_LANES (16).
        lanes: params.lanes as u16,
        costs: est.costs,
    };
    if let Err(source) = est.control.set_nonblocking(true) {
        s.attempt_failed(peer, attempt, HandshakeFailure::ControlStream { source });
        return;
    }
    // A message the driver drops hands its receive slot back: wake the poller to re-post it
    // (it may sleep on completion events, and a peer held back by full slots sends none).
    let weak = Arc::downgrade(s);
    est.conn.set_return_waker(Box::new(move || {
        if let Some(shared) = weak.upgrade() {
            shared.wake_poller();
        }
    }));
    let conn = Arc::new(PeerConn::new(
        peer,
        params,
        remote,
        ConnState::new(est.conn, est.control, est.backlog, params.lanes),
    ));
    let mut t = lock(&s.table);
    let ours =
        matches!(t.peers.get(&peer), Some(Slot::Connecting { attempt: a, .. }) if *a == attempt);
    if !ours || s.shutdown.load(Ordering::Acquire) {
        drop(t);
        tracing::debug!(%peer, "verbs fabric: dropping a superseded connection");
        return;
    }
    tracing::info!(%peer, %summary, "verbs fabric: peer connected");
    s.emit(FabricEvent::PeerConnected {
        peer,
        params: peer_params,
        summary,
    });
    t.peers.insert(peer, Slot::Up(conn));
    drop(t);
    s.wake_poller();
}

fn summary(
    s: &Shared,
    peer: NodeId,
    theirs: &Hello,
    p: &NegotiatedParams,
    c: &PathCosts,
    note: &str,
) -> String {
    format!(
        "verbs {}:{} <-> {peer} ({}): {} lane(s), MTU {} B, {} outstanding READs/QP, {} receive \
         slots x {} B shared by the lanes, inline <= {} B, send queue {} per lane; costs ({note}): rtt {:.1} \
         us, message {:.1} us, READ {:.0} MB/s, copy {:.0} MB/s, READ setup {:.1} us",
        s.device.name(),
        s.device.port().port,
        theirs.device,
        p.lanes,
        p.mtu_bytes,
        p.max_rd_atomic,
        p.recv_slots,
        p.recv_slot_bytes,
        p.max_inline_bytes,
        p.send_queue_depth,
        c.round_trip_ns / 1e3,
        c.message_overhead_ns / 1e3,
        c.wire_bytes_per_sec / 1e6,
        c.copy_bytes_per_sec / 1e6,
        c.read_setup_ns / 1e3,
    )
}
