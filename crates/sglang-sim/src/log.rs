//! SGLang's log format: `[YYYY-MM-DD HH:MM:SS] message` on stderr (local time, like Python's
//! `logging` with `datefmt="%Y-%m-%d %H:%M:%S"`), and uvicorn's `INFO:     ` level prefix.

use std::io::Write as _;

/// The current local time as `YYYY-MM-DD HH:MM:SS`.
pub fn timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as libc::time_t).unwrap_or(0);
    // SAFETY: localtime_r writes into the zeroed `tm` we own; `now` is a valid time_t.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        tm
    };
    format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// Format one line as SGLang's main process does.
pub fn format_line(msg: &str) -> String {
    format!("[{}] {msg}", timestamp())
}

/// Write one SGLang log line to stderr (unbuffered, as the line is complete).
pub fn line(msg: &str) {
    raw(&format_line(msg));
}

/// Write one uvicorn `INFO:` line to stderr.
pub fn uvicorn(msg: &str) {
    line(&format!("INFO:     {msg}"));
}

/// Write an already formatted line to stderr.
pub fn raw(text: &str) {
    let mut err = std::io::stderr().lock();
    // Nothing sensible can be done if stderr is gone (journald stopped); ignore.
    let _ = writeln!(err, "{text}");
    let _ = err.flush();
}
