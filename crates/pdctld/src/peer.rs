//! Who is on the other end of a loopback TCP connection. The FleetLock protocol carries no
//! credential, but on loopback the kernel knows the peer socket's owner: asked for the caller's
//! own end of the connection by its four addresses (`sock_diag`, an exact lookup in the kernel's
//! socket hash, as `ss` asks it), it answers with the uid that owns it, as identd does. One
//! request and one answer per connection, whatever the number of sockets: reading the whole
//! socket table (`/proc/net/tcp`) per connection instead grows with every closed connection
//! waiting out its TIME_WAIT, and a client reconnecting in a loop held up the accept loop with it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// Where `idiag_uid` lies in the answer: after the 16-byte `nlmsghdr`, `struct inet_diag_msg`'s
/// family, state, timer, retrans (4), `inet_diag_sockid` (48), expires, rqueue, wqueue (12).
const UID_AT: usize = 16 + 4 + 48 + 12;

/// The uid owning the caller's end of the connection `peer` → `local` (both on this host), as the
/// kernel tells it; `None` for a peer that is not local, a socket it does not know, or a kernel
/// that cannot be asked (pdctld's unit allows `AF_NETLINK` for this).
pub fn loopback_peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let (peer_ip, local_ip) = (canonical(&peer), canonical(&local));
    if !peer_ip.is_loopback() {
        return None;
    }
    let fd = rustix::net::socket(rustix::net::AddressFamily::NETLINK, rustix::net::SocketType::DGRAM, Some(rustix::net::netlink::SOCK_DIAG)).ok()?;
    rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, Some(Duration::from_secs(1))).ok()?;
    let ask = request(peer_ip, peer.port(), local_ip, local.port())?;
    rustix::net::sendto(&fd, &ask, rustix::net::SendFlags::empty(), &rustix::net::netlink::SocketAddrNetlink::new(0, 0)).ok()?;
    let mut answer = [0u8; 512];
    let (_, n) = rustix::net::recv(&fd, &mut answer[..], rustix::net::RecvFlags::empty()).ok()?;
    // Anything else (`NLMSG_ERROR`: no such socket) tells no one.
    let kind = u16::from_ne_bytes([answer[4], answer[5]]);
    if kind != SOCK_DIAG_BY_FAMILY || n < UID_AT + 4 {
        return None;
    }
    Some(u32::from_ne_bytes([answer[UID_AT], answer[UID_AT + 1], answer[UID_AT + 2], answer[UID_AT + 3]]))
}

/// The 72-byte request for the TCP socket `src` → `dst` (`nlmsghdr` + `inet_diag_req_v2`; the
/// layout is the kernel's stable ABI): `None` when the two are not of one family.
fn request(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Option<Vec<u8>> {
    let (family, s, d) = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (libc::AF_INET as u8, s.octets().to_vec(), d.octets().to_vec()),
        (IpAddr::V6(s), IpAddr::V6(d)) => (libc::AF_INET6 as u8, s.octets().to_vec(), d.octets().to_vec()),
        _ => return None,
    };
    let mut m = Vec::with_capacity(72);
    m.extend_from_slice(&72u32.to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes()); // nlmsg_type
    m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes()); // nlmsg_flags: one socket, no dump
    m.extend_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    m.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]); // family, protocol, ext, pad
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // idiag_states: any
    m.extend_from_slice(&sport.to_be_bytes());
    m.extend_from_slice(&dport.to_be_bytes());
    for a in [s, d] {
        let mut addr = [0u8; 16];
        addr[..a.len()].copy_from_slice(&a);
        m.extend_from_slice(&addr);
    }
    m.extend_from_slice(&0u32.to_ne_bytes()); // idiag_if
    m.extend_from_slice(&[0xff; 8]); // idiag_cookie: INET_DIAG_NOCOOKIE
    (m.len() == 72).then_some(m)
}

/// An IPv4-mapped IPv6 address as the IPv4 one (a dual-stack socket lists its peer so; the
/// caller's own socket is then an IPv4 one).
fn canonical(a: &SocketAddr) -> IpAddr {
    match a.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        ip => ip,
    }
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
