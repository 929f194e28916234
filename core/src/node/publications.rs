//! Keeping the directory told what this node holds: every seal wants a `Publish`, every
//! removal a `Withdraw`; the latest want per object wins, and each is retried with backoff
//! until the directory confirms it or the attempts run out.

use super::{DirectoryPurpose, Node, Timer};
use crate::directory::{DirectoryOpId, DirectoryReply, DirectoryRequest};
use crate::ids::ObjectId;
use crate::wire::ObjectSizes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    Publish(ObjectSizes),
    Withdraw,
}

/// The directory should learn that this node holds (or no longer holds) an object.
#[derive(Debug)]
pub(super) struct Publication {
    pub(super) want: Want,
    pub(super) op: Option<DirectoryOpId>,
    pub(super) attempts: u32,
}

impl Node {
    pub(super) fn want_publication(&mut self, id: ObjectId, want: Want) {
        if self.config.standalone {
            // No directory to tell.
            return;
        }
        let publication = self.publications.entry(id).or_insert(Publication {
            want,
            op: None,
            attempts: 0,
        });
        publication.want = want;
        publication.attempts = 0;
        self.cancel_timer(Timer::Publication(id));
        self.send_publication(id);
    }

    pub(super) fn send_publication(&mut self, id: ObjectId) {
        let Some(publication) = self.publications.get(&id) else {
            return;
        };
        let request = match publication.want {
            Want::Publish(sizes) => DirectoryRequest::Publish { id, sizes },
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
    }

    pub(super) fn publication_answered(
        &mut self,
        id: ObjectId,
        op: DirectoryOpId,
        reply: DirectoryReply,
    ) {
        let Some(publication) = self.publications.get_mut(&id) else {
            return;
        };
        if publication.op != Some(op) {
            return;
        }
        publication.op = None;
        match reply {
            DirectoryReply::Done | DirectoryReply::Located { .. } => {
                self.publications.remove(&id);
            }
            DirectoryReply::Unavailable { .. } => {
                if publication.attempts >= self.config.max_directory_attempts {
                    self.publications.remove(&id);
                    self.stats.publications_dropped += 1;
                } else {
                    let at = self.now + self.config.retry_backoff * publication.attempts;
                    self.set_timer(at, Timer::Publication(id));
                }
            }
        }
    }
}
