//! Who is on the other end of a loopback TCP connection. The FleetLock protocol carries no
//! credential, but on loopback the kernel knows the peer socket's owner: the socket table
//! (`/proc/net/tcp`, `/proc/net/tcp6`, pdctld's network namespace) lists the caller's own end of
//! the connection — its address as pdctld sees the peer, the remote end pdctld's — with the uid
//! that owns it, as identd answers it. Read with the `procfs` crate.

use std::net::SocketAddr;

/// The uid owning the caller's end of the connection `peer` → `local` (both on this host), if
/// the table lists it; `None` for a peer that is not local, or a table that cannot be read.
pub fn loopback_peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    if !peer.ip().is_loopback() && !is_mapped_loopback(&peer) {
        return None;
    }
    let same = |a: &SocketAddr, b: &SocketAddr| a.port() == b.port() && canonical(a) == canonical(b);
    let v4 = procfs::net::tcp().unwrap_or_default();
    let v6 = procfs::net::tcp6().unwrap_or_default();
    v4.into_iter().chain(v6).find(|e| same(&e.local_address, &peer) && same(&e.remote_address, &local)).map(|e| e.uid)
}

/// An IPv4-mapped IPv6 address as the IPv4 one (a dual-stack socket lists its peer so).
fn canonical(a: &SocketAddr) -> std::net::IpAddr {
    match a.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(std::net::IpAddr::V6(v6)),
        ip => ip,
    }
}

fn is_mapped_loopback(a: &SocketAddr) -> bool {
    canonical(a).is_loopback()
}

/// The uid of a local account name (`getpwnam_r`), or why not.
pub fn uid_of(name: &str) -> Result<u32, String> {
    let c = std::ffi::CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids) for getpwnam_r to fill.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: valid name, buffer and out-pointers that outlive the call.
    let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
    if rc != 0 {
        return Err(format!("the account database could not be read ({})", std::io::Error::from_raw_os_error(rc)));
    }
    if found.is_null() {
        return Err(format!("no local account {name:?}"));
    }
    Ok(pw.pw_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_connection_is_told_by_its_callers_account_and_root_by_name() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (_s, peer) = l.accept().expect("accept");
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(loopback_peer_uid(peer, l.local_addr().expect("addr")), Some(me));
        assert_eq!(peer, c.local_addr().expect("client addr"));
        // Another connection's ends do not match.
        assert_eq!(loopback_peer_uid("127.0.0.1:1".parse().expect("addr"), l.local_addr().expect("addr")), None);
        assert_eq!(loopback_peer_uid("192.0.2.1:5000".parse().expect("addr"), l.local_addr().expect("addr")), None, "not local");
        assert_eq!(uid_of("root"), Ok(0));
        assert!(uid_of("no-such-account-pdctl").is_err_and(|e| e.contains("no local account")));
    }
}
