//! One answer to "is this the only worker of its role?" — for a restart, a config rollout, a
//! revert, a weights rollout and a host drain alike: the workers of the role the gateway admits
//! (healthy, `ready` where it says, not draining), other than those this action takes down,
//! across every host behind it; without a gateway to ask, this host's config. The answer carries
//! the numbers it used, so a refusal can say them.

use crate::config::{same_url, Role, Worker};
use crate::ports::RouterWorker;

/// Who else serves a role while some workers are down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peers {
    /// Workers of the role seen serving besides those taken down.
    pub others: usize,
    /// What was counted, said in a refusal ("the gateway admits 0 other prefill workers of 1
    /// it lists").
    pub basis: String,
}

impl Peers {
    /// No other worker of the role serves.
    pub fn alone(&self) -> bool {
        self.others == 0
    }
}

/// The workers of `role` that serve while those at `down` (URLs) are down: as `gateway` lists
/// them when it could be read, else as `configured` (this host's config) has them.
pub fn peers(role: Role, down: &[&str], gateway: Option<&[RouterWorker]>, configured: &[Worker]) -> Peers {
    let taken = |url: &str| down.iter().any(|d| same_url(d, url));
    let r = role.as_str();
    match gateway {
        Some(list) => {
            let listed = list.iter().filter(|x| x.worker_type == r).count();
            let others = list.iter().filter(|x| x.worker_type == r && x.admitted() && !x.draining() && !taken(&x.url)).count();
            Peers { others, basis: format!("the gateway admits {others} other {r} worker(s) of {listed} it lists") }
        }
        None => {
            let others = configured.iter().filter(|o| o.role == role && !taken(&o.url)).count();
            Peers { others, basis: format!("no gateway was read: this host's config has {others} other {r} worker(s)") }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(url: &str, role: &str, healthy: bool, status: Option<&str>) -> RouterWorker {
        RouterWorker {
            id: url.into(),
            url: url.into(),
            worker_type: role.into(),
            is_healthy: healthy,
            load: 0,
            status: status.map(String::from),
            bootstrap_port: None,
        }
    }

    #[test]
    fn another_hosts_admitted_worker_counts_and_a_draining_or_pending_one_does_not() {
        let mine = "http://10.0.0.1:30000";
        let other = listed("http://10.0.0.2:30000", "prefill", true, Some("ready"));
        let gw = vec![listed(mine, "prefill", true, Some("ready")), other.clone()];
        let p = peers(Role::Prefill, &[mine], Some(&gw), &[]);
        assert_eq!(p.others, 1, "{p:?}");
        assert!(p.basis.contains("1 other prefill worker(s) of 2"), "{p:?}");
        for (healthy, status) in [(true, Some("draining")), (true, Some("pending")), (false, Some("ready")), (false, None)] {
            let gw = vec![listed(mine, "prefill", true, Some("ready")), listed(&other.url, "prefill", healthy, status)];
            assert!(peers(Role::Prefill, &[mine], Some(&gw), &[]).alone(), "{healthy} {status:?}");
        }
        // A host drain takes both of this host's workers down: neither counts.
        let both = vec![listed(mine, "prefill", true, None), listed("http://10.0.0.1:30001", "prefill", true, None)];
        assert!(peers(Role::Prefill, &[mine, "http://10.0.0.1:30001/"], Some(&both), &[]).alone());
        // A decode does not serve prefill requests.
        assert!(peers(Role::Prefill, &[mine], Some(&[listed("http://10.0.0.3:1", "decode", true, None)]), &[]).alone());
    }
}
