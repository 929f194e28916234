//! The narrow interface the slot index needs from the medium that holds it.

/// A byte-addressed medium: the index file in production, an in-memory disk with torn and
/// lost writes in the simulator.
///
/// Writes may reach the medium in any order and may tear, until [`Storage::sync`]: every
/// write issued before a `sync` that returned is durable and whole. `set_len` is durable at
/// once (a crash while growing leaves at worst a partial last slot, which the scan ignores).
pub trait Storage {
    /// What the medium reports when an operation fails.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Current length in bytes.
    fn len_bytes(&mut self) -> Result<u64, Self::Error>;

    /// Fills `buf` from `offset`; the range lies inside the current length.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Self::Error>;

    /// Writes `bytes` at `offset`, inside the current length; durable only after a `sync`.
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), Self::Error>;

    /// Sets the length; new bytes read as zero.
    fn set_len(&mut self, len_bytes: u64) -> Result<(), Self::Error>;

    /// The barrier: returns when every write issued before it is durable.
    fn sync(&mut self) -> Result<(), Self::Error>;
}
