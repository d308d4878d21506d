//! `pdctl unit-dropin`: the drop-in that lets the hardened `pdctld.service` (which allows loopback
//! only: `IPAddressDeny=any`, `IPAddressAllow=localhost`) reach exactly the addresses its config
//! names — a fleet's etcd, a gateway and workers on other hosts.

use std::net::ToSocketAddrs as _;
use std::path::Path;

use pdctl_contract::api::Exit;

/// Where the drop-in goes.
pub const DROPIN: &str = "/etc/systemd/system/pdctld.service.d/50-pdctl-addresses.conf";

/// The drop-in's text for these `(what, url, resolved addresses)`; `None` when every address is
/// loopback (the unit as shipped allows them).
pub fn text(entries: &[(String, String, Vec<std::net::IpAddr>)]) -> Option<String> {
    let mut allow: Vec<String> = Vec::new();
    let mut lines = String::new();
    for (what, url, ips) in entries {
        let remote: Vec<String> = ips.iter().filter(|ip| !ip.is_loopback()).map(|ip| ip.to_string()).collect();
        if remote.is_empty() {
            continue;
        }
        lines.push_str(&format!("#   {what}: {url} → {}\n", remote.join(", ")));
        for r in remote {
            if !allow.contains(&r) {
                allow.push(r);
            }
        }
    }
    if allow.is_empty() {
        return None;
    }
    Some(format!(
        "# {DROPIN} — written by `pdctl unit-dropin`\n\
         # pdctld.service allows loopback only (IPAddressAllow=localhost); its config names these\n\
         # addresses on other hosts (resolved when this was written):\n{lines}\
         [Service]\nIPAddressAllow={}\n",
        allow.join(" ")
    ))
}

/// `pdctl unit-dropin [--write]`.
pub fn run(config: &Path, write: bool) -> Exit {
    let s = match crate::context::settings(config) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut entries = Vec::new();
    for (what, url) in s.urls() {
        let authority = url.split_once("://").map(|(_, r)| r).unwrap_or(&url).split('/').next().unwrap_or_default().to_string();
        let ips: Vec<std::net::IpAddr> = match authority.to_socket_addrs() {
            Ok(a) => a.map(|a| a.ip()).collect(),
            Err(e) => {
                eprintln!("pdctl: ✗ cannot resolve {authority} ({what}, {url}): {e}; fix the config or DNS, then run this again");
                return Exit::Usage;
            }
        };
        entries.push((what, url, ips));
    }
    let Some(t) = text(&entries) else {
        println!("pdctl: every address in {} is loopback: pdctld.service as shipped reaches them; no drop-in needed", config.display());
        return Exit::Ok;
    };
    if !write {
        print!("{t}");
        println!("# next: pdctl unit-dropin --write, then systemctl daemon-reload and restart pdctld while no rollout runs");
        return Exit::Ok;
    }
    let p = Path::new(DROPIN);
    if let Some(dir) = p.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("pdctl: ✗ cannot create {}: {e}; run as root", dir.display());
            return Exit::Unreachable;
        }
    }
    match pdctl_core::state::revisions::atomic_write(p, t.as_bytes(), 0o644) {
        Ok(()) => {
            println!("pdctl: ✓ wrote {DROPIN}; next: systemctl daemon-reload && systemctl restart pdctld (while no rollout runs: pdctl status)");
            Exit::Ok
        }
        Err(e) => {
            eprintln!("pdctl: ✗ cannot write {DROPIN}: {e}; run as root");
            Exit::Unreachable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_exactly_the_remote_addresses_once_each() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let entries = vec![
            ("etcd".to_string(), "http://10.0.0.5:2379".to_string(), vec![ip("10.0.0.5")]),
            ("the router".to_string(), "http://10.0.0.9:30001".to_string(), vec![ip("10.0.0.9")]),
            ("the router's metrics".to_string(), "http://10.0.0.9:29001/metrics".to_string(), vec![ip("10.0.0.9")]),
            ("sglang-prefill.service".to_string(), "http://127.0.0.1:30003".to_string(), vec![ip("127.0.0.1")]),
        ];
        let t = text(&entries).unwrap();
        assert!(t.ends_with("[Service]\nIPAddressAllow=10.0.0.5 10.0.0.9\n"), "{t}");
        assert!(t.contains("#   etcd: http://10.0.0.5:2379 → 10.0.0.5\n"), "{t}");
        assert!(!t.contains("127.0.0.1"), "loopback is allowed already: {t}");
        assert_eq!(text(&entries[3..]), None);
    }
}
