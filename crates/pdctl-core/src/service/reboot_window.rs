//! When a host may begin maintenance (`[maintenance] windows`): weekly windows in UTC, written
//! `"Sat 02:00-06:00 UTC"`, `"Mon-Fri 22:00-02:00 UTC"` (past midnight: the end is on the next
//! day) or `"* 03:00-04:00 UTC"` (every day). Pure.

/// Day names, Monday first (as ISO 8601 numbers them).
const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// One weekly window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootWindow {
    /// The days it opens on, Monday first.
    days: [bool; 7],
    /// Opens at this minute of the day (UTC).
    start: u32,
    /// Closes at this minute (UTC); not after `start`: on the next day.
    end: u32,
    /// As written.
    text: String,
}

fn day(s: &str) -> Option<usize> {
    DAYS.iter().position(|d| d.eq_ignore_ascii_case(s))
}

fn minute(s: &str) -> Option<u32> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 && s.len() == 5).then_some(h * 60 + m)
}

impl RebootWindow {
    /// Parse `"DAYS HH:MM-HH:MM UTC"`; `Err`: what is wrong, as the config error says it.
    pub fn parse(text: &str) -> Result<RebootWindow, String> {
        let how = "write it like \"Sat 02:00-06:00 UTC\", \"Mon-Fri 22:00-02:00 UTC\" or \"* 03:00-04:00 UTC\"";
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [days, times, zone] = parts.as_slice() else {
            return Err(format!("{text:?} is not a window: {how}"));
        };
        if *zone != "UTC" {
            return Err(format!("{text:?}: only UTC windows are understood (a local zone shifts with daylight saving): {how}"));
        }
        let mut set = [false; 7];
        if *days == "*" {
            set = [true; 7];
        } else {
            for item in days.split(',') {
                let (a, b) = item.split_once('-').unwrap_or((item, item));
                let (Some(a), Some(b)) = (day(a), day(b)) else {
                    return Err(format!("{text:?}: {item:?} is not a day or a range of days (Mon … Sun): {how}"));
                };
                let mut i = a;
                loop {
                    set[i] = true;
                    if i == b {
                        break;
                    }
                    i = (i + 1) % 7;
                }
            }
        }
        let Some((a, b)) = times.split_once('-') else {
            return Err(format!("{text:?}: {times:?} is not HH:MM-HH:MM: {how}"));
        };
        let (Some(start), Some(end)) = (minute(a), minute(b)) else {
            return Err(format!("{text:?}: {times:?} is not HH:MM-HH:MM (24-hour clock): {how}"));
        };
        if start == end {
            return Err(format!("{text:?} opens and closes at the same minute: {how}"));
        }
        Ok(RebootWindow { days: set, start, end, text: text.to_string() })
    }

    /// Whether it is open at `secs` (seconds since the epoch, UTC).
    pub fn open_at(&self, secs: u64) -> bool {
        // 1970-01-01 was a Thursday (index 3, Monday first).
        let days_since = secs / 86_400;
        let today = ((days_since + 3) % 7) as usize;
        let yesterday = (today + 6) % 7;
        let now = ((secs % 86_400) / 60) as u32;
        if self.start < self.end {
            self.days[today] && now >= self.start && now < self.end
        } else {
            // Past midnight: opened today, or opened yesterday and not closed yet.
            (self.days[today] && now >= self.start) || (self.days[yesterday] && now < self.end)
        }
    }

    /// As written.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Whether a new maintenance may begin at `secs`: no windows configured (always), or one open.
pub fn allowed(windows: &[RebootWindow], secs: u64) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.open_at(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-05 is a Saturday.
    const SAT_0000: u64 = 1_796_428_800;

    #[test]
    fn windows_open_on_their_days_and_hours_in_utc() {
        let sat = RebootWindow::parse("Sat 02:00-06:00 UTC").expect("parses");
        assert!(!sat.open_at(SAT_0000 + 3600), "01:00 Saturday: not yet");
        assert!(sat.open_at(SAT_0000 + 2 * 3600), "02:00 Saturday: open");
        assert!(!sat.open_at(SAT_0000 + 6 * 3600), "06:00: closed");
        assert!(!sat.open_at(SAT_0000 - 86_400 + 3 * 3600), "Friday: closed");
        let night = RebootWindow::parse("Mon-Fri 22:00-02:00 UTC").expect("parses");
        assert!(night.open_at(SAT_0000 + 3600), "Saturday 01:00 is Friday night's window");
        assert!(!night.open_at(SAT_0000 + 23 * 3600), "not Saturday night");
        let daily = RebootWindow::parse("* 03:00-04:00 UTC").expect("parses");
        assert!(daily.open_at(SAT_0000 + 3 * 3600 + 59 * 60));
        assert!(allowed(&[], 0), "no windows: always");
        assert!(!allowed(std::slice::from_ref(&sat), SAT_0000), "outside the only window");
    }

    #[test]
    fn a_bad_window_says_what_is_wrong() {
        for (bad, says) in [
            ("Sat 02:00-06:00", "not a window"),
            ("Sat 02:00-06:00 CET", "only UTC"),
            ("Sun-Fun 02:00-06:00 UTC", "not a day"),
            ("Sat 2:00-6:00 UTC", "HH:MM-HH:MM"),
            ("Sat 25:00-06:00 UTC", "HH:MM-HH:MM"),
            ("Sat 02:00-02:00 UTC", "same minute"),
        ] {
            let e = RebootWindow::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
