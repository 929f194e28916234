//! Directory replies, compared across implementations.

use skyriver_core::directory::DirectoryReply;

/// A reply with its holders in id order: no implementation promises an order.
pub fn sorted(reply: DirectoryReply) -> DirectoryReply {
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
