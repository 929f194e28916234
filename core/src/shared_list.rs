//! An immutable list shared by reference count: one allocation serves every holder.
//!
//! The directory's member list is the case it is for. At every membership change the registry
//! sends the same list of N members to N nodes; as a `Vec` each message, each session and each
//! core held a copy of its own, N² members per change, which was most of the time and memory of
//! a 1,000-node simulation. Built once, a [`SharedList`] is cloned by bumping a count, and a
//! receiver tells a list it already has by [`SharedList::same_list`] without comparing it.
//!
//! On the wire (serde) it is a plain sequence, byte for byte what a `Vec` of the same items
//! is, so messages and recordings that carried a `Vec` read the same.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An immutable, cheaply cloned list. See the module documentation.
#[derive(PartialEq, Eq, Hash)]
pub struct SharedList<T>(Arc<[T]>);

impl<T> SharedList<T> {
    /// Whether `other` is this very list (one allocation), not merely an equal one.
    pub fn same_list(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> Clone for SharedList<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Default for SharedList<T> {
    fn default() -> Self {
        Self(Arc::from(Vec::new()))
    }
}

impl<T> Deref for SharedList<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> From<Vec<T>> for SharedList<T> {
    fn from(items: Vec<T>) -> Self {
        Self(Arc::from(items))
    }
}

impl<T> FromIterator<T> for SharedList<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        Self(items.into_iter().collect())
    }
}

impl<T: fmt::Debug> fmt::Debug for SharedList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl<T: Serialize> Serialize for SharedList<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for SharedList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<T>::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_is_the_same_list_an_equal_one_is_not() {
        let list: SharedList<u32> = vec![1, 2, 3].into();
        let clone = list.clone();
        let equal: SharedList<u32> = (1..=3).collect();
        assert!(list.same_list(&clone));
        assert_eq!(list, equal);
        assert!(!list.same_list(&equal));
    }

    #[test]
    fn it_encodes_as_the_vec_of_its_items() {
        let items = vec![7u32, 300, 70_000];
        let list = SharedList::from(items.clone());
        let encoded = postcard::to_allocvec(&list).expect("encodes");
        assert_eq!(encoded, postcard::to_allocvec(&items).expect("encodes"));
        let decoded: SharedList<u32> = postcard::from_bytes(&encoded).expect("decodes");
        assert_eq!(&decoded[..], &items[..]);
        assert_eq!(format!("{list:?}"), format!("{items:?}"));
    }
}
