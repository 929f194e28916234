//! The cores' view of the directory's member lists, converted once per list.
//!
//! At every membership change every node's session passes the same shared list on (see
//! [`skyriver_core::shared_list`]); converting it for each core, and writing its trace line's
//! names for each, would cost N members for each of N nodes. The last list seen is kept with
//! its conversion, so the N deliveries of one change share one view.

use std::rc::Rc;

use skyriver_core::directory::MemberList;
use skyriver_core::node::ClusterMember;
use skyriver_core::shared_list::SharedList;

/// The last member list delivered, with what the cores and the trace get of it.
#[derive(Debug, Default)]
pub(super) struct MemberViews {
    last: Option<MemberView>,
    /// Lists converted so far (each distinct list once while it is the latest).
    pub(super) conversions: u64,
    /// Lists delivered to cores so far.
    pub(super) deliveries: u64,
}

#[derive(Debug)]
struct MemberView {
    list: MemberList,
    /// The members' node ids, space-separated, for the trace.
    names: Rc<str>,
    /// What the cores are fed.
    members: SharedList<ClusterMember>,
}

impl MemberViews {
    /// The trace names and the cores' view of `list`.
    pub(super) fn view(&mut self, list: &MemberList) -> (Rc<str>, SharedList<ClusterMember>) {
        self.deliveries += 1;
        let view = match self.last.take() {
            Some(view) if view.list.same_list(list) => view,
            _ => {
                self.conversions += 1;
                let names: Vec<String> = list.iter().map(|m| m.node.to_string()).collect();
                MemberView {
                    list: list.clone(),
                    names: names.join(" ").into(),
                    members: list.iter().map(ClusterMember::from).collect(),
                }
            }
        };
        let answer = (Rc::clone(&view.names), view.members.clone());
        self.last = Some(view);
        answer
    }
}
