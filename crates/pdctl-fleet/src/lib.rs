//! `pdctl-fleet`: etcd v3 for pdctl's fleet coordination — reads, all-or-nothing
//! compare-and-swap transactions on keys' revisions, prefix reads and watches, and a lease-bound
//! key kept alive. It knows nothing of slots or hosts (that logic is `pdctl_core::fleet`); every
//! call has a time limit, and every failure says what to do.
//!
//! Tested against Debian 12's `etcd-server` 3.4.23 with the `etcd-client` crate 0.21.

#![warn(missing_docs)]

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};

/// What went wrong talking to etcd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No connection, or the cluster refused the call.
    #[error("etcd at {endpoints} cannot be reached: {detail}")]
    Unreachable {
        /// The configured endpoints.
        endpoints: String,
        /// The client's error.
        detail: String,
    },
    /// No answer in time.
    #[error("etcd at {endpoints} did not answer within {after:?}")]
    Timeout {
        /// The configured endpoints.
        endpoints: String,
        /// The limit.
        after: Duration,
    },
    /// A watch could not be made or was ended by etcd.
    #[error("etcd at {endpoints}: a watch failed: {detail}")]
    Watch {
        /// The configured endpoints.
        endpoints: String,
        /// What happened.
        detail: String,
    },
}

/// Keys per page of a prefix read ([`Etcd::get_prefix`]): with values of at most a few kB (every
/// value pdctl writes), a page stays far below the client's 4 MB message limit.
pub const PAGE_KEYS: i64 = 500;

/// The end of the range of keys that start with `prefix` (etcd's rule: the prefix with its last
/// byte below 0xff increased and what follows it dropped; all 0xff or empty: every key, `\0`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One change of an all-or-nothing transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The key.
    pub key: String,
    /// Its mod revision when it was read (0: it did not exist); the transaction fails if it moved.
    /// Negative: not compared (a key written along).
    pub expect: i64,
    /// The new value (`Some(None)`: delete the key; `None`: only compare it).
    pub value: Option<Option<Vec<u8>>>,
}

/// A key's value as read, with its revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// Its lease (0: none).
    pub lease: i64,
}

/// TLS to etcd: the CA that signed the members' certificates, and this client's certificate and
/// key when the cluster asks for one (`--client-cert-auth`); PEM contents.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// The CA certificate(s).
    pub ca: Option<Vec<u8>>,
    /// This client's certificate and key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// A connection to an etcd cluster (cheap to clone).
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    endpoints: String,
    timeout: Duration,
}

impl Etcd {
    /// Connect to `endpoints` (with `user`/password when the cluster has authentication on);
    /// every call is bounded by `timeout`.
    pub async fn connect(endpoints: &[String], user: Option<(String, String)>, tls: Option<Tls>, timeout: Duration) -> Result<Etcd, Error> {
        let shown = endpoints.join(", ");
        let mut opts = ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout).with_keep_alive(Duration::from_secs(5), timeout);
        if let Some((u, p)) = user {
            opts = opts.with_user(u, p);
        }
        if let Some(t) = tls {
            let mut o = etcd_client::TlsOptions::new();
            if let Some(ca) = t.ca {
                o = o.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = t.identity {
                o = o.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(o);
        }
        let client = match tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts))).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Error::Unreachable { endpoints: shown, detail: e.to_string() }),
            Err(_) => return Err(Error::Timeout { endpoints: shown, after: timeout }),
        };
        let mut e = Etcd { client, endpoints: shown, timeout };
        // The channel connects lazily: ask for something to know it answers.
        e.revision().await?;
        Ok(e)
    }

    fn err(&self, e: etcd_client::Error) -> Error {
        Error::Unreachable { endpoints: self.endpoints.clone(), detail: e.to_string() }
    }

    async fn bounded<T>(&self, fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(_) => Err(Error::Timeout { endpoints: self.endpoints.clone(), after: self.timeout }),
        }
    }

    /// The cluster's current revision.
    pub async fn revision(&mut self) -> Result<i64, Error> {
        let mut c = self.client.clone();
        let r = self.bounded(c.get("/", Some(GetOptions::new().with_count_only()))).await?;
        Ok(r.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// One key (`None`: absent).
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, Error> {
        self.get_at(key, None).await
    }

    /// One key as it was at `revision` (`None`: now).
    pub async fn get_at(&self, key: &str, revision: Option<i64>) -> Result<Option<Entry>, Error> {
        let mut c = self.client.clone();
        let opts = revision.map(|r| GetOptions::new().with_revision(r));
        let r = self.bounded(c.get(key, opts)).await?;
        Ok(r.kvs().first().map(entry))
    }

    /// Every key under `prefix`, read in pages of [`PAGE_KEYS`] keys all at the revision of the
    /// first page (one consistent snapshot): one answer of a whole prefix could pass the
    /// client's 4 MB message limit as a fleet's history grows, and then fail every time.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<Entry>, Error> {
        let end = prefix_end(prefix.as_bytes());
        let mut from = prefix.as_bytes().to_vec();
        let mut at: Option<i64> = None;
        let mut out = Vec::new();
        loop {
            let mut c = self.client.clone();
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE_KEYS);
            if let Some(rev) = at {
                opts = opts.with_revision(rev);
            }
            let r = self.bounded(c.get(from.clone(), Some(opts))).await?;
            at = at.or(r.header().map(|h| h.revision()));
            out.extend(r.kvs().iter().map(entry));
            match r.kvs().last() {
                Some(last) if r.more() => {
                    // The next page starts just after the last key read.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(out),
            }
        }
    }

    /// Apply every change if and only if no key moved since it was read; whether it applied.
    pub async fn cas(&self, changes: &[Change]) -> Result<bool, Error> {
        let when: Vec<Compare> = changes
            .iter()
            .filter(|c| c.expect >= 0)
            .map(|c| {
                if c.expect == 0 {
                    Compare::version(c.key.clone(), CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(c.key.clone(), CompareOp::Equal, c.expect)
                }
            })
            .collect();
        let ops: Vec<TxnOp> = changes
            .iter()
            .filter_map(|c| match &c.value {
                Some(Some(v)) => Some(TxnOp::put(c.key.clone(), v.clone(), None)),
                Some(None) => Some(TxnOp::delete(c.key.clone(), None)),
                None => None,
            })
            .collect();
        let mut cl = self.client.clone();
        let r = self.bounded(cl.txn(Txn::new().when(when).and_then(ops))).await?;
        Ok(r.succeeded())
    }

    /// Put a value (no comparison).
    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<(), Error> {
        let mut c = self.client.clone();
        self.bounded(c.put(key, value, None)).await.map(|_| ())
    }

    /// Delete a key.
    pub async fn delete(&self, key: &str) -> Result<(), Error> {
        let mut c = self.client.clone();
        self.bounded(c.delete(key, None)).await.map(|_| ())
    }

    /// Keep `key` = `value()` alive on a lease of `ttl` seconds for as long as the returned
    /// task runs (the key disappears within `ttl` of the task's end or of this process's death).
    /// The lease is kept alive every third of `ttl`; the value is looked at then and written only
    /// when it changed (an idle host sends nothing but the keep-alive); a lost connection is
    /// retried with a new lease.
    pub fn keep_alive(&self, key: String, ttl: i64, value: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let _ = me.one_lease(&key, ttl, &value).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    }

    async fn one_lease(&self, key: &str, ttl: i64, value: &(impl Fn() -> Vec<u8> + Send + Sync)) -> Result<(), Error> {
        let mut c = self.client.clone();
        let lease = self.bounded(c.lease_grant(ttl, None)).await?.id();
        let (mut keeper, mut stream) = self.bounded(c.lease_keep_alive(lease)).await?;
        let every = Duration::from_secs((ttl as u64 / 3).max(1));
        let mut written: Option<Vec<u8>> = None;
        loop {
            let v = value();
            if written.as_ref() != Some(&v) {
                self.bounded(c.put(key, v.clone(), Some(PutOptions::new().with_lease(lease)))).await?;
                written = Some(v);
            }
            self.bounded(keeper.keep_alive()).await?;
            match self.bounded(stream.message()).await? {
                Some(r) if r.ttl() > 0 => {}
                _ => return Ok(()), // the lease expired: start again with a new one
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Watch every key under `prefix`: calls `on_change` with each put (key, value) and each
    /// delete (key, `None`) until it returns false or the watch ends.
    pub async fn watch_prefix(&self, prefix: &str, mut on_change: impl FnMut(&str, Option<&[u8]>) -> bool) -> Result<(), Error> {
        let mut c = self.client.clone();
        let mut stream = self.bounded(c.watch(prefix, Some(WatchOptions::new().with_prefix()))).await?;
        loop {
            let msg = stream.message().await.map_err(|e| self.err(e))?;
            let Some(msg) = msg else {
                return Ok(());
            };
            for ev in msg.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key()).to_string();
                let value = match ev.event_type() {
                    etcd_client::EventType::Put => Some(kv.value()),
                    etcd_client::EventType::Delete => None,
                };
                if !on_change(&key, value) {
                    return Ok(());
                }
            }
        }
    }
}

impl Etcd {
    /// Watch `ranges` (a key, or with `true` every key under it as a prefix) on one stream, for
    /// every change after revision `after` — none made since that revision is missed, however
    /// long after it the watch starts (within etcd's compaction window).
    pub async fn watch_from(&self, ranges: &[(String, bool)], after: i64) -> Result<Watch, Error> {
        let mut c = self.client.clone();
        let opts = |prefix: bool| {
            let o = WatchOptions::new().with_start_revision(after + 1);
            if prefix {
                o.with_prefix()
            } else {
                o
            }
        };
        let Some(((first, fp), rest)) = ranges.split_first() else {
            return Err(Error::Watch { endpoints: self.endpoints.clone(), detail: "nothing to watch".into() });
        };
        let mut stream = self.bounded(c.watch(first.as_str(), Some(opts(*fp)))).await?;
        for (key, prefix) in rest {
            self.bounded(stream.watch(key.as_str(), Some(opts(*prefix)))).await?;
        }
        Ok(Watch { stream, endpoints: self.endpoints.clone() })
    }
}

/// One change a [`Watch`] saw: the key, its value (`None`: deleted) and the change's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The key.
    pub key: String,
    /// The new value; `None`: the key was deleted.
    pub value: Option<Vec<u8>>,
    /// The revision of the change.
    pub revision: i64,
}

/// A watch made by [`Etcd::watch_from`].
pub struct Watch {
    stream: etcd_client::WatchStream,
    endpoints: String,
}

impl Watch {
    /// The next changes, in order, or `None` when `limit` passes first. A watch etcd cancels
    /// (its start revision was compacted away, or the stream ended) is an error: read again.
    pub async fn next(&mut self, limit: Duration) -> Result<Option<Vec<Changed>>, Error> {
        let t0 = tokio::time::Instant::now();
        loop {
            let left = limit.saturating_sub(t0.elapsed());
            let msg = match tokio::time::timeout(left, self.stream.message()).await {
                Err(_) => return Ok(None),
                Ok(m) => m.map_err(|e| Error::Watch { endpoints: self.endpoints.clone(), detail: e.to_string() })?,
            };
            let Some(msg) = msg else {
                return Err(Error::Watch { endpoints: self.endpoints.clone(), detail: "the watch stream ended".into() });
            };
            if msg.canceled() || msg.compact_revision() > 0 {
                let why =
                    if msg.compact_revision() > 0 { format!("compacted at revision {}", msg.compact_revision()) } else { msg.cancel_reason().to_string() };
                return Err(Error::Watch { endpoints: self.endpoints.clone(), detail: format!("etcd cancelled the watch: {why}") });
            }
            let out: Vec<Changed> = msg
                .events()
                .iter()
                .filter_map(|ev| {
                    let kv = ev.kv()?;
                    Some(Changed {
                        key: String::from_utf8_lossy(kv.key()).to_string(),
                        value: match ev.event_type() {
                            etcd_client::EventType::Put => Some(kv.value().to_vec()),
                            etcd_client::EventType::Delete => None,
                        },
                        revision: kv.mod_revision(),
                    })
                })
                .collect();
            // A watch's `created` answer has no events.
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
    }
}

fn entry(kv: &etcd_client::KeyValue) -> Entry {
    Entry { key: String::from_utf8_lossy(kv.key()).to_string(), value: kv.value().to_vec(), mod_revision: kv.mod_revision(), lease: kv.lease() }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_ends_where_its_last_byte_below_0xff_is_increased() {
        assert_eq!(prefix_end(b"/pdctl/t/requests/"), b"/pdctl/t/requests0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
