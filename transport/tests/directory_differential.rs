//! The Redis directory checked against the core's rules, by difference: seeded random sequences
//! of directory operations from four nodes (publishes of a few ids with one of three contents,
//! withdrawals, lookups with and without a subscription, unsubscriptions, restarts with a new
//! incarnation) run against the core's sans-IO `Registry` (in process, the reference) and then
//! against Redis and Redis Cluster, and every reply and every node's delivered events must be
//! the same. The conformance suite's scenarios check the rules someone thought of; this finds
//! the ones nobody did (it would have found that a listed holder publishing another content is
//! taken off the holders, which Redis lacked).
//!
//! A mismatch names the seed and the step; `SKYRIVER_DIFF_SEED=<seed>` runs that sequence alone.
//! Redis is skipped when not installed unless `SKYRIVER_REQUIRE_REDIS` is set.

use std::net::SocketAddr;

use skyriver_core::directory::{DirectoryEvent, DirectoryReply, DirectoryRequest, MemberInfo};
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
#[allow(dead_code)] // Dying nodes and refusals are the conformance suite's.
mod directory_harness;
use directory_harness::{CoreHarness, Harness, NamedRedisHarness, Participant};

/// Nodes taking part in every sequence.
const NODES: usize = 4;
/// Ids the sequences publish, withdraw and look up.
const IDS: u64 = 3;
/// The contents a node may publish under an id: two sizes, and two digests of one size.
const CONTENTS: [(u64, u64); 3] = [(4, 0xaaaa), (6, 0xbbbb), (4, 0xcccc)];
/// Steps of a sequence, the event drains included.
const STEPS: usize = 40;
/// Every node's delivered events are collected and compared every this many steps (and last).
const DRAIN_EVERY: usize = 10;
/// Sequences against one Redis server, and against one Redis Cluster.
const REDIS_SEQUENCES: u64 = 20;
const CLUSTER_SEQUENCES: u64 = 6;
/// The first seed; sequence `k` uses `BASE_SEED + k`.
const BASE_SEED: u64 = 0xd1ff_0000;
/// An id no sequence publishes: a lookup of it is a round trip and nothing more.
const NOBODY: u64 = 0xfff;
/// The event drains' marker ids count up from here (each is published once).
const MARKERS: u64 = 0x1_0000;

/// A splitmix64: a seed is a whole sequence, on every machine.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One step of a sequence; `node` is a slot, 0..NODES (node id `node + 1`).
#[derive(Debug, Clone, Copy)]
enum Step {
    Publish {
        node: usize,
        id: u64,
        content: usize,
    },
    Withdraw {
        node: usize,
        id: u64,
    },
    Lookup {
        node: usize,
        id: u64,
        subscribe: bool,
    },
    /// Unsubscribe (no reply), then a round trip on the same node so that it is served before
    /// the next step's request from another node.
    Unsubscribe {
        node: usize,
        id: u64,
    },
    /// The node's process dies and a new incarnation joins at once; its events so far are
    /// drained first (a dead node's undelivered events are lost in every implementation).
    Restart {
        node: usize,
    },
    /// Every node's events so far.
    Drain,
}

/// What a step observed.
#[derive(Debug, PartialEq)]
enum Outcome {
    Reply(DirectoryReply),
    /// Per node drained, its events in a canonical order.
    Events(Vec<Vec<DirectoryEvent>>),
}

fn sequence(seed: u64) -> Vec<Step> {
    let mut rng = SplitMix64(seed);
    (0..STEPS)
        .map(|at| {
            if (at + 1) % DRAIN_EVERY == 0 || at + 1 == STEPS {
                return Step::Drain;
            }
            let node = rng.below(NODES as u64) as usize;
            let id = rng.below(IDS);
            match rng.below(100) {
                0..35 => Step::Publish {
                    node,
                    id,
                    content: rng.below(CONTENTS.len() as u64) as usize,
                },
                35..50 => Step::Withdraw { node, id },
                50..68 => Step::Lookup {
                    node,
                    id,
                    subscribe: false,
                },
                68..88 => Step::Lookup {
                    node,
                    id,
                    subscribe: true,
                },
                88..96 => Step::Unsubscribe { node, id },
                _ => Step::Restart { node },
            }
        })
        .collect()
}

fn member(slot: usize, incarnation: u32) -> MemberInfo {
    let node = slot as u32 + 1;
    MemberInfo {
        node: NodeId(node),
        fabric_addr: SocketAddr::from(([127, 0, 0, 1], 7300 + node as u16)),
        fabric: "tcp".into(),
        incarnation,
        failure_domain: String::new(),
    }
}

fn object(id: u64) -> ObjectId {
    ObjectId::from_u64(0x100 + id)
}

/// Holders in id order: neither implementation promises an order.
fn sorted(reply: DirectoryReply) -> DirectoryReply {
    match reply {
        DirectoryReply::Located {
            mut holders,
            sizes,
            digest,
        } => {
            holders.sort();
            DirectoryReply::Located {
                holders,
                sizes,
                digest,
            }
        }
        other => other,
    }
}

/// Events in a canonical order: each publication a node waited for is pushed to it when it is
/// served, but pushes caused by different nodes' requests reach it over different paths (the
/// registry's one connection in process; per-object channels with Redis), so only the set (with
/// its multiplicity) is compared, not the order.
fn canonical(mut events: Vec<DirectoryEvent>) -> Vec<DirectoryEvent> {
    events.sort_by_key(|event| format!("{event:?}"));
    events
}

/// Two distinct elements of `nodes`, mutably.
fn pair<T>(nodes: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    assert_ne!(a, b);
    if a < b {
        let (low, high) = nodes.split_at_mut(b);
        (&mut low[a], &mut high[0])
    } else {
        let (low, high) = nodes.split_at_mut(a);
        (&mut high[0], &mut low[b])
    }
}

/// Says, when the run panics anywhere (a harness's bounded wait too), which backend, seed and
/// step it was at, and how to replay it.
struct Replay {
    backend: &'static str,
    seed: u64,
    at: Option<(usize, Step)>,
}

impl Drop for Replay {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "directory_differential: {} failed on seed {} at step {:?}; \
                 replay with SKYRIVER_DIFF_SEED={}",
                self.backend, self.seed, self.at, self.seed
            );
        }
    }
}

/// The events `nodes[slot]` received so far (another node publishes the drain's marker).
async fn drain<N: Participant>(
    nodes: &mut [N],
    slot: usize,
    markers: &mut u64,
) -> Vec<DirectoryEvent> {
    *markers += 1;
    let marker = ObjectId::from_u64(MARKERS + *markers);
    let (node, publisher) = pair(nodes, slot, (slot + 1) % NODES);
    canonical(node.events_before_marker(publisher, marker).await)
}

/// Runs `steps` against `h`; with `expected` (the core's outcomes), stops at the first step
/// whose outcome differs.
async fn run<H: Harness>(
    h: &mut H,
    backend: &'static str,
    seed: u64,
    steps: &[Step],
    expected: Option<&[Outcome]>,
) -> Vec<Outcome> {
    let mut replay = Replay {
        backend,
        seed,
        at: None,
    };
    let mut incarnations = [1u32; NODES];
    let members = |incarnations: &[u32; NODES]| -> Vec<MemberInfo> {
        (0..NODES).map(|s| member(s, incarnations[s])).collect()
    };
    let mut nodes = Vec::new();
    for slot in 0..NODES {
        nodes.push(h.join(member(slot, 1)).await);
    }
    for node in &mut nodes {
        node.wait_members(&members(&incarnations)).await;
    }
    let mut markers = 0;
    let mut outcomes = Vec::new();
    for (at, &step) in steps.iter().enumerate() {
        replay.at = Some((at, step));
        let outcome = match step {
            Step::Publish { node, id, content } => {
                let (data_size, digest) = CONTENTS[content];
                Outcome::Reply(
                    nodes[node]
                        .ask(DirectoryRequest::Publish {
                            id: object(id),
                            sizes: ObjectSizes {
                                data_size,
                                metadata_size: 2,
                            },
                            digest: ContentDigest(digest),
                        })
                        .await,
                )
            }
            Step::Withdraw { node, id } => Outcome::Reply(
                nodes[node]
                    .ask(DirectoryRequest::Withdraw { id: object(id) })
                    .await,
            ),
            Step::Lookup {
                node,
                id,
                subscribe,
            } => Outcome::Reply(sorted(
                nodes[node]
                    .ask(DirectoryRequest::Lookup {
                        id: object(id),
                        subscribe,
                    })
                    .await,
            )),
            Step::Unsubscribe { node, id } => {
                let n = &mut nodes[node];
                n.submit(
                    skyriver_core::directory::DirectoryOpId(u64::MAX - at as u64),
                    DirectoryRequest::Unsubscribe { id: object(id) },
                );
                Outcome::Reply(
                    n.ask(DirectoryRequest::Lookup {
                        id: ObjectId::from_u64(NOBODY),
                        subscribe: false,
                    })
                    .await,
                )
            }
            Step::Restart { node } => {
                let events = drain(&mut nodes, node, &mut markers).await;
                let old = nodes.remove(node);
                h.crash(old).await;
                incarnations[node] += 1;
                nodes.insert(node, h.join(member(node, incarnations[node])).await);
                for n in &mut nodes {
                    n.wait_members(&members(&incarnations)).await;
                }
                Outcome::Events(vec![events])
            }
            Step::Drain => {
                let mut all = Vec::new();
                for slot in 0..NODES {
                    all.push(drain(&mut nodes, slot, &mut markers).await);
                }
                Outcome::Events(all)
            }
        };
        if let Some(expected) = expected {
            assert_eq!(
                outcome,
                expected[at],
                "{backend} (left) differs from the core registry (right) on seed {seed} at step \
                 {at}: {step:?}; the steps: {:#?}",
                &steps[..=at]
            );
        }
        outcomes.push(outcome);
    }
    for node in nodes {
        h.crash(node).await;
    }
    replay.at = None;
    outcomes
}

/// The seeds to run: `count` from [`BASE_SEED`], or the one `SKYRIVER_DIFF_SEED` names.
fn seeds(count: u64) -> Vec<u64> {
    match std::env::var("SKYRIVER_DIFF_SEED") {
        Ok(seed) if !seed.is_empty() => vec![seed.parse().expect("SKYRIVER_DIFF_SEED is a number")],
        _ => (BASE_SEED..BASE_SEED + count).collect(),
    }
}

/// What the agreed outcomes covered, for the log: a sweep that never meets a conflict or
/// delivers no event checks little.
#[derive(Debug, Default)]
struct Coverage {
    sequences: u64,
    steps: usize,
    located: usize,
    located_empty: usize,
    conflicts: usize,
    events: usize,
    restarts: usize,
}

impl Coverage {
    fn add(&mut self, steps: &[Step], outcomes: &[Outcome]) {
        self.sequences += 1;
        self.steps += steps.len();
        self.restarts += steps
            .iter()
            .filter(|s| matches!(s, Step::Restart { .. }))
            .count();
        for outcome in outcomes {
            match outcome {
                Outcome::Reply(DirectoryReply::Located { holders, .. }) if holders.is_empty() => {
                    self.located_empty += 1
                }
                Outcome::Reply(DirectoryReply::Located { .. }) => self.located += 1,
                Outcome::Reply(DirectoryReply::Conflict { .. }) => self.conflicts += 1,
                Outcome::Reply(_) => {}
                Outcome::Events(per_node) => {
                    self.events += per_node.iter().map(Vec::len).sum::<usize>()
                }
            }
        }
    }
}

/// Every seed against the core, then against Redis at `url` (a directory of its own per seed).
async fn differ(backend: &'static str, url: String, count: u64) {
    let mut coverage = Coverage::default();
    for seed in seeds(count) {
        let steps = sequence(seed);
        let expected = run(&mut CoreHarness::new(), "core", seed, &steps, None).await;
        let mut redis = NamedRedisHarness {
            url: url.clone(),
            name: format!("differential-{seed}"),
        };
        run(&mut redis, backend, seed, &steps, Some(&expected)).await;
        coverage.add(&steps, &expected);
    }
    eprintln!("{backend} agreed with the core registry: {coverage:?}");
}

#[tokio::test]
async fn redis_agrees_with_the_core_registry() {
    let Some(server) = RedisServer::start("directory_differential redis") else {
        return;
    };
    differ("Redis", server.url(), REDIS_SEQUENCES).await;
}

#[tokio::test]
async fn redis_cluster_agrees_with_the_core_registry() {
    let Some(cluster) = RedisCluster::start("directory_differential redis_cluster") else {
        return;
    };
    differ("Redis Cluster", cluster.url(), CLUSTER_SEQUENCES).await;
}

/// A seed is a sequence: the same on every run, different from another seed's.
#[test]
fn a_seed_names_one_sequence() {
    let text = |seed| format!("{:?}", sequence(seed));
    assert_eq!(text(BASE_SEED), text(BASE_SEED));
    assert_ne!(text(BASE_SEED), text(BASE_SEED + 1));
}
