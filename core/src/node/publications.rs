//! Keeping the directory told what this node holds: every seal wants a `Publish`, every
//! removal a `Withdraw`; the latest want per object wins, and each is retried with backoff
//! until the directory confirms it or the attempts run out.
//!
//! A copy fetched here is published only after [`NodeConfig::replica_publication_delay`]: the
//! holder it came from serves it meanwhile, and a copy removed before then was never announced,
//! so neither its publication nor its withdrawal is sent (a fetch, use and delete loop costs the
//! directory nothing, and its traffic stays off the next fetch's path).
//!
//! [`NodeConfig::replica_publication_delay`]: super::NodeConfig::replica_publication_delay

use super::sealing::Verdict;
use super::{DirectoryPurpose, Node, Timer};
use crate::digest::ContentDigest;
use crate::directory::{DirectoryOpId, DirectoryReply, DirectoryRequest};
use crate::ids::ObjectId;
use crate::wire::ObjectSizes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    Publish(ObjectSizes, ContentDigest),
    Withdraw,
}

/// The directory should learn that this node holds (or no longer holds) an object.
#[derive(Debug)]
pub(super) struct Publication {
    pub(super) want: Want,
    pub(super) op: Option<DirectoryOpId>,
    pub(super) attempts: u32,
    /// Whether a request for this entry ever left: until then the directory's view of the
    /// object is what it was before the entry (a deferred publication can simply be dropped).
    pub(super) sent: bool,
}

impl Node {
    pub(super) fn want_publication(&mut self, id: ObjectId, want: Want) {
        if self.config.standalone {
            // No directory to tell.
            return;
        }
        self.cancel_timer(Timer::Publication(id));
        if want == Want::Withdraw {
            // The copy is leaving the store: nothing of it is served any more.
            self.unvouched.remove(&id);
            self.refused_publications.remove(&id);
        }
        if want == Want::Withdraw
            && self
                .publications
                .get(&id)
                .is_some_and(|p| !p.sent && matches!(p.want, Want::Publish(..)))
        {
            // A deferred publication of a copy removed before it was due: the directory never
            // heard of the copy, and need not.
            self.publications.remove(&id);
            self.stats.publications_skipped += 1;
            return;
        }
        let publication = self.publications.entry(id).or_insert(Publication {
            want,
            op: None,
            attempts: 0,
            sent: false,
        });
        publication.want = want;
        publication.attempts = 0;
        self.send_publication(id);
    }

    /// A copy fetched here was sealed: publish it after the configured delay (at once when the
    /// delay is zero, or when an earlier want of the object is still on its way).
    pub(super) fn want_replica_publication(
        &mut self,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) {
        let delay = self.config.replica_publication_delay;
        if self.config.standalone || delay.is_zero() || self.publications.contains_key(&id) {
            self.want_publication(id, Want::Publish(sizes, digest));
            return;
        }
        self.publications.insert(
            id,
            Publication {
                want: Want::Publish(sizes, digest),
                op: None,
                attempts: 0,
                sent: false,
            },
        );
        self.set_timer(self.now + delay, Timer::Publication(id));
    }

    /// Whether this node holds `id` sealed but unpublished because the directory refused its
    /// publication for another content under the id (sealed during a directory outage, or
    /// fetched while the id was put again elsewhere).
    pub fn holds_refused_copy(&self, id: &ObjectId) -> bool {
        self.refused_publications.contains(id)
    }

    /// Whether this node serves its copy of `id` to peers: a copy sealed or recovered without
    /// the directory's acceptance of its content is not served until it accepts it.
    pub fn serves_peers(&self, id: &ObjectId) -> bool {
        !self.unvouched.contains(id)
    }

    /// The directory answers again: publish anew every copy it has not vouched for and whose
    /// publication gave up. A copy sealed or recovered while it was out is served to peers
    /// only once a publication of it is accepted, and that publication may have given up
    /// (after [`NodeConfig::max_directory_attempts`]) before the directory came back; the
    /// directory client's own replay re-registers it, but its answer does not reach the node.
    /// Publications still on their way or waiting to retry are left to finish.
    ///
    /// [`NodeConfig::max_directory_attempts`]: super::NodeConfig::max_directory_attempts
    pub(super) fn publish_unvouched_again(&mut self) {
        let unvouched: Vec<ObjectId> = self.unvouched.iter().copied().collect();
        self.publish_again(unvouched);
    }

    /// Publishes anew each of `ids` with no publication on its way. One gone from the store
    /// (its withdrawal clears it), or with no digest to publish, is left as it is: unserved to
    /// peers, the safe side.
    pub(super) fn publish_again(&mut self, ids: Vec<ObjectId>) {
        for id in ids {
            if self.publications.contains_key(&id) {
                continue;
            }
            if let Some((sizes, Some(digest))) = self.store.sealed_sizes_and_digest(&id) {
                self.want_publication(id, Want::Publish(sizes, digest));
            }
        }
    }

    /// The directory client's replay of this node's publication of `id` was refused: another
    /// content holds the id (a head that restarted accepted it before the replay came). The
    /// copy stays local and is served to no peer, as when the node's own publication is
    /// refused.
    pub(super) fn replay_refused(&mut self, id: ObjectId) {
        if !self.store.contains(&id) {
            return;
        }
        self.copy_refused(id);
        self.stats.id_conflicts += 1;
    }

    /// The registry refused this node's copy of `id` (the id names another content): the copy
    /// stays local, is served to no peer (a hinted fetch would have no directory digest to
    /// tell the contents apart), and is no copy of record, since it can count toward no copies
    /// of the content the id names.
    fn copy_refused(&mut self, id: ObjectId) {
        if self.store.contains(&id) {
            self.unvouched.insert(id);
            self.refused_publications.insert(id);
        }
        self.copy_of_record_refused(id);
    }

    pub(super) fn send_publication(&mut self, id: ObjectId) {
        let Some(publication) = self.publications.get(&id) else {
            return;
        };
        let request = match publication.want {
            Want::Publish(sizes, digest) => self.publish_request(id, sizes, digest),
            Want::Withdraw => DirectoryRequest::Withdraw { id },
        };
        if let Some(old) = publication.op {
            self.directory_ops.remove(&old);
            self.directory_sent.remove(&old);
            self.cancel_timer(Timer::DirectoryOp(old));
        }
        let op = self.directory(request, Some(DirectoryPurpose::Publication(id)));
        let publication = self.publications.get_mut(&id).expect("looked up above");
        publication.op = Some(op);
        publication.attempts += 1;
        publication.sent = true;
    }

    pub(super) fn publication_answered(
        &mut self,
        id: ObjectId,
        op: DirectoryOpId,
        reply: DirectoryReply,
    ) {
        let healthy = self.directory_healthy();
        let held = self.store.contains(&id);
        let Some(publication) = self.publications.get_mut(&id) else {
            return;
        };
        if publication.op != Some(op) {
            return;
        }
        publication.op = None;
        match reply {
            DirectoryReply::Done
            | DirectoryReply::Located { .. }
            | DirectoryReply::CopiesLocated { .. } => {
                self.publications.remove(&id);
                self.unvouched.remove(&id);
                self.refused_publications.remove(&id);
                self.seal_verdict(id, Verdict::Accepted);
            }
            DirectoryReply::Conflict { .. } => {
                self.publications.remove(&id);
                // Sealed here during an outage, or a fetched copy whose content the id no
                // longer names (every holder left and the id was put again meanwhile).
                self.copy_refused(id);
                self.stats.id_conflicts += 1;
                self.seal_verdict(id, Verdict::Refused);
            }
            DirectoryReply::Unavailable { .. } => {
                let publish = matches!(publication.want, Want::Publish(..));
                let attempts_used = publication.attempts >= self.config.max_directory_attempts;
                if publish && attempts_used && held {
                    // No attempt was answered: the id may name another content by now (every
                    // holder left and the id was put again while this node could not hear it,
                    // even for a copy fetched from a holder the directory named). Served to no
                    // peer until a publication of it is accepted.
                    self.unvouched.insert(id);
                }
                let unserved_publish = publish && healthy && self.unvouched.contains(&id);
                if attempts_used && unserved_publish {
                    // The directory answers, but not this publication in time (a restarted head
                    // holds new publications until its grace period ends, and then accepts
                    // them): another round later, or the copy would stay unserved to peers
                    // while the directory lists it. Rounds end when the directory is reported
                    // down; its return publishes unvouched copies again.
                    publication.attempts = 0;
                    self.stats.publication_rounds_restarted += 1;
                    let at = self.now
                        + self.config.retry_backoff * self.config.max_directory_attempts.max(1);
                    self.set_timer(at, Timer::Publication(id));
                } else if attempts_used {
                    self.publications.remove(&id);
                    self.stats.publications_dropped += 1;
                } else {
                    let at = self.now + self.config.retry_backoff * publication.attempts;
                    self.set_timer(at, Timer::Publication(id));
                }
                self.seal_verdict(id, Verdict::Unknown);
            }
        }
    }
}
