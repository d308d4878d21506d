//! The fleet's store port ([`Coordinator`]): etcd v3 reads, all-or-nothing compare-and-swap, and
//! watches.

use std::future::Future;
use std::time::Duration;

/// A boxed future (for the object-safe [`Coordinator`]).
pub type BoxFut<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A key of the fleet's store as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of its last change.
    pub mod_revision: i64,
}

/// One change of an all-or-nothing compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasChange {
    /// The key.
    pub key: String,
    /// Its mod revision when read (0: absent); the whole transaction fails if it moved. A
    /// negative value: not compared (a key written along, whatever its revision).
    pub expect: i64,
    /// What to write.
    pub write: Write,
}

/// What a [`CasChange`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Nothing: the key is only compared.
    Keep,
    /// This value.
    Put(Vec<u8>),
    /// Delete the key.
    Delete,
}

/// Why the fleet's store did not give pdctl what it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetFailure {
    /// etcd did not answer or refused the call (the driver's sentence, with what to do).
    Unreachable(String),
    /// A credential file named in `[fleet]` cannot be read (its sentence).
    Credentials(String),
    /// `key` holds a value pdctl cannot decode (another version's, or not pdctl's).
    Unreadable {
        /// The key.
        key: String,
        /// The decoder's error.
        error: String,
    },
    /// `key` kept changing under every compare-and-swap pdctl tried, bounded.
    Contended {
        /// The key.
        key: String,
        /// What pdctl tried (`"while pdctl tried to read it"`; empty: a change).
        doing: String,
    },
}

impl std::fmt::Display for FleetFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetFailure::Unreachable(s) | FleetFailure::Credentials(s) => f.write_str(s),
            FleetFailure::Unreadable { key, error } => write!(f, "{key} holds a value pdctl cannot read ({error}); inspect it with `etcdctl get {key}`"),
            FleetFailure::Contended { key, doing } if doing.is_empty() => write!(f, "{key} kept changing"),
            FleetFailure::Contended { key, doing } => write!(f, "{key} kept changing {doing}"),
        }
    }
}

/// The fleet's replicated store (etcd v3): reads and all-or-nothing compare-and-swap.
pub trait Coordinator: Send + Sync {
    /// One key (`None`: absent).
    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<Option<KvEntry>, FleetFailure>>;
    /// Every key under a prefix.
    fn get_prefix<'a>(&'a self, prefix: &'a str) -> BoxFut<'a, Result<Vec<KvEntry>, FleetFailure>>;
    /// Apply all changes iff no key moved since it was read; whether they applied.
    fn cas(&self, changes: Vec<CasChange>) -> BoxFut<'_, Result<bool, FleetFailure>>;
    /// The store's revision now: every change made after this call is newer. Without a store
    /// that keeps revisions: 0 (and [`Coordinator::watch`] polls).
    fn revision(&self) -> BoxFut<'_, Result<i64, FleetFailure>> {
        Box::pin(async { Ok(0) })
    }
    /// Watch `keys` (`(key, true)`: every key under a prefix) for the changes made after
    /// revision `after` (none is missed between a read at `after` and the watch). Without a
    /// store that can watch: a [`Polling`] watch (it says nothing, after a second: read again).
    fn watch(&self, keys: Vec<(String, bool)>, after: i64) -> BoxFut<'_, Result<Box<dyn ChangeWatch>, FleetFailure>> {
        let _ = (keys, after);
        Box::pin(async { Ok(Box::new(Polling) as Box<dyn ChangeWatch>) })
    }
}

/// One change a [`ChangeWatch`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvChange {
    /// The key.
    pub key: String,
    /// Its new value; `None`: deleted.
    pub value: Option<Vec<u8>>,
    /// The change's revision.
    pub revision: i64,
}

/// A watch made by [`Coordinator::watch`].
pub trait ChangeWatch: Send {
    /// The next changes, or `None` when `limit` passed first (or the watch cannot tell: read
    /// again). An error: the watch ended (read again, then watch again).
    fn next(&mut self, limit: Duration) -> BoxFut<'_, Result<Option<Vec<KvChange>>, FleetFailure>>;
}

/// The watch of a store that cannot watch: every `next` waits up to a second and says nothing.
pub struct Polling;

impl ChangeWatch for Polling {
    fn next(&mut self, limit: Duration) -> BoxFut<'_, Result<Option<Vec<KvChange>>, FleetFailure>> {
        Box::pin(async move {
            tokio::time::sleep(limit.min(Duration::from_secs(1))).await;
            Ok(None)
        })
    }
}
