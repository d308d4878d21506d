//! One accept loop for every listener of pdctld (the control socket, the metrics port, the
//! FleetLock endpoint): how many connections at once, how many of one caller, how long a client
//! may take to ask.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::daemon;

/// Connections the control socket serves at once; more are closed at once (a local client
/// retries).
pub const MAX_CONNECTIONS: usize = 256;
/// Connections of pdctld's own account beyond [`MAX_CONNECTIONS`] (its watchdog's ping).
const OWN_CONNECTIONS: usize = 4;
/// Connections the metrics endpoint (and the FleetLock endpoint) serves at once (a scraper or
/// two, a dashboard, the host's update agent).
pub const METRICS_CONNECTIONS: usize = 32;
/// Connections one caller may hold at once on the metrics and FleetLock endpoints: a scraper or
/// an update agent needs one (no keep-alive). Three local accounts holding 40 connections each
/// took every slot of the metrics port (0 of 30 scrapes answered); at 4 each, eight callers would
/// have to collude to fill it.
pub const PER_CALLER: usize = 4;
/// A client must send its request head within this time (from the moment it connects); its
/// body then within `daemon::http`'s body timeout.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Whom a connection counts against for [`PER_CALLER`]: the local account that owns its end
/// where the kernel tells it, else its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Caller {
    /// A local account.
    Uid(u32),
    /// Another host (or a local one the socket table did not list).
    Addr(std::net::IpAddr),
    /// Neither is known.
    Unknown,
}

impl Caller {
    /// The account when known, else the address.
    pub fn of(uid: Option<u32>, addr: Option<std::net::IpAddr>) -> Caller {
        match (uid, addr) {
            (Some(u), _) => Caller::Uid(u),
            (None, Some(a)) => Caller::Addr(a),
            (None, None) => Caller::Unknown,
        }
    }
}

/// How many connections each caller holds, each at most `each`.
struct PerCaller {
    each: usize,
    held: Mutex<HashMap<Caller, usize>>,
}

/// One connection of a caller, given back when dropped.
struct Held(Arc<PerCaller>, Caller);

impl PerCaller {
    fn take(me: &Arc<PerCaller>, c: Caller) -> Option<Held> {
        let mut held = me.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(c).or_insert(0);
        (*n < me.each).then(|| {
            *n += 1;
            Held(me.clone(), c)
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.1);
            }
        }
    }
}

/// An accept loop with one discipline for every listener of pdctld: at most `max` connections
/// (and `per_caller` of one [`Caller`] when given), each closed unless it sends its request head
/// within [`HEADER_TIMEOUT`] (its body within the API's body timeout), one request per connection
/// (no idle keep-alive). So neither half-open nor slow connections, on the control socket or the
/// metrics port, can exhaust pdctld's file descriptors — which its rollouts need for their
/// journal, D-Bus, HTTP and record files (the unit's `LimitNOFILE=` leaves room for far more
/// than both caps) — or starve the API, and no one caller can take every slot of a port.
/// `accept` yields a connection, the peer's uid where the API needs it, and whom it counts
/// against.
pub async fn serve<S, F, Fut>(mut accept: F, app: axum::Router, max: usize, per_caller: Option<usize>, what: &'static str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<(S, Option<u32>, Caller)>>,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    // pdctld's own connections (the watchdog's ping through its socket) never wait for a slot
    // the clients hold: a few of their own.
    let own = Arc::new(tokio::sync::Semaphore::new(OWN_CONNECTIONS));
    let callers = per_caller.map(|each| Arc::new(PerCaller { each, held: Mutex::new(HashMap::new()) }));
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    loop {
        let (stream, uid, caller) = match accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning; the connections in hand
                // time out and free their descriptors.
                tracing::warn!("{what} cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over its own share: closed at once, before it takes one of everyone's slots.
        let held = match &callers {
            Some(c) => match PerCaller::take(c, caller) {
                Some(h) => Some(h),
                None => continue,
            },
            None => None,
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) if uid == Some(me) => match own.clone().try_acquire_owned() {
                Ok(s) => s,
                Err(_) => continue,
            },
            Err(_) => continue,
        };
        let peer = daemon::http::Peer { uid };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone().layer(axum::Extension(peer)));
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            let _ = conn.await;
            drop((slot, held));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_holds_at_most_its_share_and_gets_it_back() {
        let c = Arc::new(PerCaller { each: 2, held: Mutex::new(HashMap::new()) });
        let a = Caller::Uid(1000);
        let (x, y) = (PerCaller::take(&c, a).expect("1"), PerCaller::take(&c, a).expect("2"));
        assert!(PerCaller::take(&c, a).is_none(), "a third of the same account");
        assert!(PerCaller::take(&c, Caller::Uid(0)).is_some(), "another account is not held back");
        drop(x);
        assert!(PerCaller::take(&c, a).is_some(), "given back when a connection ends");
        drop(y);
        assert_eq!(Caller::of(None, Some([127, 0, 0, 1].into())), Caller::Addr([127, 0, 0, 1].into()));
        assert_eq!(Caller::of(Some(7), Some([127, 0, 0, 1].into())), Caller::Uid(7));
    }
}
