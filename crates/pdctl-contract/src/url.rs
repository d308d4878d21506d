//! Server URLs compared by meaning, not spelling: one canonical form (scheme and host in lower
//! case, the port explicit, no trailing slash). A leaf: it imports nothing of this crate.

/// The canonical form of an http(s) URL, for comparing spellings of one server: lower-case
/// scheme and host, the port made explicit (80/443 by default), no trailing slash. `Err` says
/// what is wrong with it.
pub fn canonical_url(u: &str) -> Result<String, String> {
    let (scheme, rest) = u.split_once("://").ok_or("must start with http:// or https://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return Err("must start with http:// or https://".into()),
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("must not carry a user name or password".into());
    }
    let (host, port) = if let Some(h) = authority.strip_prefix('[') {
        let (h, after) = h.split_once(']').ok_or("has an unclosed [IPv6] host")?;
        (format!("[{}]", h.to_ascii_lowercase()), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (authority.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err("has no host".into());
    }
    if !host.chars().all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c)) {
        return Err(format!("has an invalid host {host:?}"));
    }
    let port: u16 = match port {
        None => default_port,
        Some(p) => p.parse().ok().filter(|p| *p > 0).ok_or_else(|| format!("has an invalid port {p:?}"))?,
    };
    Ok(format!("{scheme}://{host}:{port}{}", path.trim_end_matches('/')))
}

/// `u` as it may be shown: a user name and password in it (`http://user:pw@host`) replaced by
/// `***@`, so that an error about the URL does not repeat the secret it carries.
pub fn redacted(u: &str) -> String {
    redacted_in(u)
}

/// `s` with every URL's user name and password (`scheme://user:pw@`) replaced by `***@`.
pub fn redacted_in(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let start = i + 3;
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(|c: char| c.is_whitespace() || "/?#'\"".contains(c)).unwrap_or(rest.len());
        if let Some(at) = rest[..end].rfind('@') {
            out.push_str("***");
            rest = &rest[at..];
        }
    }
    out.push_str(rest);
    out
}

/// Do `a` and `b` name the same server (scheme, host, port, trailing slash compared canonically)?
pub fn same_url(a: &str, b: &str) -> bool {
    match (canonical_url(a), canonical_url(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.trim_end_matches('/') == b.trim_end_matches('/'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_a_url_is_never_repeated() {
        assert_eq!(redacted("http://admin:s3cret@10.0.0.1:2379/x"), "http://***@10.0.0.1:2379/x");
        assert_eq!(redacted("http://10.0.0.1:2379"), "http://10.0.0.1:2379");
        assert!(canonical_url("http://admin:s3cret@h:1").is_err());
    }
}
