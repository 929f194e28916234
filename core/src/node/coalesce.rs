//! Coalesced service: the `FetchRequest`s a holder is given in one drive pass are answered
//! together, object by object.
//!
//! A drive pass is what a driver gives the node before it next polls an output: one input
//! for the simulator and the core's tests, a run of peer messages for a daemon that reads many
//! at once (while none of them left an output queued, see [`Node::outputs_queued`]). When many
//! nodes fetch one small object at once, its holder so looks it up once (sealed, vouched,
//! digest), decides eager or rendezvous once per request size, and sends every requester its
//! `EagerData` in one pass of the driver, instead of waking, looking up and sending per
//! request. Requests are answered in the order their objects were first asked for, each
//! object's requesters in arrival order.
//!
//! Requests wait here only until the next [`Node::poll_output`]; the state they are answered
//! against is the state then (an object deleted meanwhile is refused as usual).

use super::Node;
use crate::ids::{NodeId, ObjectId, TransferId};
use crate::store::ObjectInfo;
use crate::wire::{self, ObjectSizes};

/// Most requests held for one pass; past it a request is served at once.
pub(super) const MAX_COALESCED_REQUESTS: usize = 1024;

/// One peer's `FetchRequest`, as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FetchAsk {
    pub(super) peer: NodeId,
    pub(super) req: TransferId,
    pub(super) eager_limit: u64,
    pub(super) max_chunk_bytes: u32,
}

/// The requests of the current pass, by object.
#[derive(Debug, Default)]
pub(super) struct Coalesced {
    /// Objects in the order of their first request, each with its requests in arrival order
    /// (a pass holds few objects: a linear search is cheapest).
    by_object: Vec<(ObjectId, Vec<FetchAsk>)>,
    requests: usize,
}

impl Coalesced {
    /// Holds `ask` for `id` until the pass ends; false when the pass holds all it may.
    pub(super) fn hold(&mut self, id: ObjectId, ask: FetchAsk) -> bool {
        if self.requests >= MAX_COALESCED_REQUESTS {
            return false;
        }
        self.requests += 1;
        match self.by_object.iter_mut().find(|(held, _)| *held == id) {
            Some((_, asks)) => asks.push(ask),
            None => self.by_object.push((id, vec![ask])),
        }
        true
    }

    pub(super) fn is_empty(&self) -> bool {
        self.requests == 0
    }

    /// Every held request, by object, emptying the pass.
    pub(super) fn take(&mut self) -> Vec<(ObjectId, Vec<FetchAsk>)> {
        self.requests = 0;
        std::mem::take(&mut self.by_object)
    }
}

/// What the holder found for one object, once per pass.
struct Servable {
    info: ObjectInfo,
    sizes: ObjectSizes,
    digest: crate::digest::ContentDigest,
}

impl Node {
    /// A `FetchRequest` arrived: held for the pass's end (see the module doc).
    pub(super) fn ask_fetch(
        &mut self,
        peer: NodeId,
        req: TransferId,
        id: ObjectId,
        eager_limit: u64,
        max_chunk_bytes: u32,
    ) {
        let ask = FetchAsk {
            peer,
            req,
            eager_limit,
            max_chunk_bytes,
        };
        if !self.coalesced.hold(id, ask) {
            self.serve_fetch_request(peer, req, id, eager_limit, max_chunk_bytes);
        }
    }

    /// Whether outputs wait to be polled: a driver that reads many peer messages at once may
    /// give the node the next one without polling first while this is false (the requests
    /// among them are then answered together, see `coalesce`). An output may name bytes of
    /// the message just given (`WriteLocal`), so it must be carried out before the next.
    pub fn outputs_queued(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// Answers every request held in this pass: one lookup per object, the eager replies
    /// together; a request the object cannot be sent eagerly for takes the usual path.
    pub(super) fn serve_coalesced(&mut self) {
        for (id, asks) in self.coalesced.take() {
            self.stats.coalesced_requests += asks.len() as u64 - 1;
            let servable = self.servable(id);
            for ask in asks {
                let FetchAsk {
                    peer,
                    req,
                    eager_limit,
                    max_chunk_bytes,
                } = ask;
                let eager = servable.as_ref().filter(|s| {
                    eager_chunk(s.info.region.len, eager_limit, max_chunk_bytes).is_some()
                        && !self.leases.contains_key(&(peer, req))
                });
                match eager {
                    Some(s) => {
                        let chunk = eager_chunk(s.info.region.len, eager_limit, max_chunk_bytes)
                            .expect("checked just above");
                        let (info, sizes, digest) = (s.info, s.sizes, s.digest);
                        self.send_eager_chunks(peer, req, id, (info, sizes, digest), chunk);
                    }
                    None => self.serve_fetch_request(peer, req, id, eager_limit, max_chunk_bytes),
                }
            }
        }
    }

    /// The object as eager replies serve it: sealed here, vouched for, with its digest.
    fn servable(&self, id: ObjectId) -> Option<Servable> {
        let info = self.store.sealed_info(&id)?;
        if self.unvouched.contains(&id) {
            return None;
        }
        let digest = self.store.digest(&id)?;
        Some(Servable {
            sizes: ObjectSizes {
                data_size: info.data_size,
                metadata_size: info.metadata_size,
            },
            info,
            digest,
        })
    }
}

/// The chunk size an object of `total` bytes goes out in eagerly to a requester that allows
/// `eager_limit` bytes in chunks of at most `max_chunk_bytes`; None: it goes by rendezvous.
pub(super) fn eager_chunk(total: u64, eager_limit: u64, max_chunk_bytes: u32) -> Option<u64> {
    let own_chunk = (wire::MAX_MESSAGE_BYTES - wire::HEADER_BYTES - wire::EAGER_FIXED_BYTES) as u64;
    let chunk = (max_chunk_bytes as u64).min(own_chunk);
    let eager = total == 0
        || (total <= eager_limit
            && chunk > 0
            && total.div_ceil(chunk) <= super::transfer::MAX_EAGER_CHUNKS_SENT);
    eager.then_some(chunk)
}
