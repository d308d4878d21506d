//! Text from outside shown or kept by pdctl — a unit's journal lines in a failure, which go into
//! records, the API, etcd and the terminal — without the secrets it may carry or the control
//! characters that would drive a terminal. Pure.
//!
//! SGLang 0.5.23 logs its resolved arguments at start as a dict (`server_args={'model_path': …,
//! 'api_key': '…', 'admin_api_key': …}`: `entrypoints/engine.py`, only watermark secrets
//! redacted), older versions as `ServerArgs(… api_key='…' …)`, and a unit's command line
//! (`--api-key K`) appears in systemd's own lines: those values are replaced by `***`, as are
//! `Authorization: Bearer …` values and the password of a URL (`http://user:pw@host`).

/// Keys whose quoted value (`key='v'`, `key="v"`, `key=v`) is a secret.
const SECRET_KEYS: &[&str] = &["api_key", "admin_api_key", "password", "token", "secret"];
/// Flags whose next word (or `=value`) is a secret.
const SECRET_FLAGS: &[&str] = &["--api-key", "--admin-api-key", "--password", "--token"];

/// One line as it may be kept and shown: control characters (terminal escapes included) shown as
/// `\u{…}`, tabs as a space, and secrets replaced by `***`.
pub fn line(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| match c {
            '\t' => " ".to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect();
    secrets(&clean)
}

/// `s` with the values of [`SECRET_KEYS`], [`SECRET_FLAGS`], bearer tokens and URL passwords
/// replaced by `***`.
pub fn secrets(s: &str) -> String {
    let mut out = s.to_string();
    for k in SECRET_KEYS {
        out = after_each(&out, &format!("{k}="), value_end);
        out = after_each(&out, &format!("'{k}': "), value_end);
        out = after_each(&out, &format!("\"{k}\": "), value_end);
    }
    for f in SECRET_FLAGS {
        out = after_each(&out, &format!("{f}="), word_end);
        out = after_each(&out, &format!("{f} "), word_end);
    }
    out = after_each(&out, "Bearer ", word_end);
    crate::url::redacted_in(&out)
}

/// Where a `key=` value ends: a quoted value at its closing quote, else at a space, comma or
/// closing parenthesis. Returns (start of the secret, its end) relative to `rest`.
fn value_end(rest: &str) -> (usize, usize) {
    match rest.chars().next() {
        Some(q @ ('\'' | '"')) => (1, rest[1..].find(q).map_or(rest.len(), |i| i + 1)),
        _ => (0, rest.find([' ', ',', ')', '}']).unwrap_or(rest.len())),
    }
}

/// Where a flag's value ends: at the next whitespace.
fn word_end(rest: &str) -> (usize, usize) {
    (0, rest.find(char::is_whitespace).unwrap_or(rest.len()))
}

/// Replace the value after every `marker` in `s` (as `end` delimits it) by `***`, unless it is
/// empty or `None` (SGLang's "no key").
fn after_each(s: &str, marker: &str, end: fn(&str) -> (usize, usize)) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(marker) {
        // A key only as a whole word (`my_api_key=` counts, `xapi_key` inside a word does not matter).
        let cut = i + marker.len();
        out.push_str(&rest[..cut]);
        rest = &rest[cut..];
        let (from, to) = end(rest);
        let value = &rest[from..to];
        out.push_str(&rest[..from]);
        if value.is_empty() || value == "None" || value == "***" {
            out.push_str(value);
        } else {
            out.push_str("***");
        }
        rest = &rest[to..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_terminal_escapes_never_pass() {
        let started = "server_args=ServerArgs(model_path='/m', api_key='k3y-123', admin_api_key=None, port=30000)";
        assert_eq!(line(started), "server_args=ServerArgs(model_path='/m', api_key='***', admin_api_key=None, port=30000)");
        // 0.5.23's form: a dict of the resolved arguments.
        let dict = "server_args={'model_path': '/m', 'api_key': 'k3y-123', 'admin_api_key': 'adm', 'port': 1}";
        assert_eq!(line(dict), "server_args={'model_path': '/m', 'api_key': '***', 'admin_api_key': '***', 'port': 1}");
        assert_eq!(line("{\"api_key\": \"k\"}"), "{\"api_key\": \"***\"}");
        assert_eq!(line("ExecStart=python -m sglang.launch_server --api-key k3y --port 1"), "ExecStart=python -m sglang.launch_server --api-key *** --port 1");
        assert_eq!(line("--admin-api-key=adm1n x"), "--admin-api-key=*** x");
        assert_eq!(line("Authorization: Bearer abc.def"), "Authorization: Bearer ***");
        assert_eq!(line("etcd http://root:pw@10.0.0.1:2379 down"), "etcd http://***@10.0.0.1:2379 down");
        let escaped = line("\u{1b}[31mred\u{1b}[0m\tend");
        assert!(!escaped.contains('\u{1b}') && escaped.contains("red") && escaped.ends_with(" end"), "{escaped}");
    }
}
