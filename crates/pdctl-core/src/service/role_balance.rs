//! When pdctld changes this host's P:D ratio by itself (`[maintenance] balance_roles`): once the
//! role pressure ([`super::role_pressure`]) has suggested the same ratio at every look for
//! `balance_after`. Pure: the looks are given, with the time each was taken. A look with another
//! suggestion, or none, starts the count again; so does a change made.

use std::time::Duration;

/// What the looks so far add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Balance {
    /// The ratio suggested at every look since `since_ms`.
    pub ratio: Option<String>,
    /// When that suggestion was first seen (ms on the caller's clock).
    pub since_ms: u64,
}

impl Balance {
    /// One look at `now_ms` that suggested `suggested`: `Some(ratio)` when it has stood for
    /// `after` (the change is due; the count starts again once it is made, [`Balance::made`]).
    pub fn look(&mut self, suggested: Option<&str>, now_ms: u64, after: Duration) -> Option<String> {
        if self.ratio.as_deref() != suggested {
            self.ratio = suggested.map(String::from);
            self.since_ms = now_ms;
        }
        let stood = Duration::from_millis(now_ms.saturating_sub(self.since_ms));
        self.ratio.clone().filter(|_| stood >= after)
    }

    /// For how long the current suggestion has stood at `now_ms` (`None`: none stands).
    pub fn stood(&self, now_ms: u64) -> Option<Duration> {
        self.ratio.as_ref().map(|_| Duration::from_millis(now_ms.saturating_sub(self.since_ms)))
    }

    /// A change was started: the figures after it are another host's, counted from nothing.
    pub fn made(&mut self) {
        *self = Balance::default();
    }
}

/// How often pdctld looks: a quarter of `after` (so a suggestion is due within a look of it),
/// between 1 s and 30 s.
pub fn every(after: Duration) -> Duration {
    (after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);

    #[test]
    fn a_suggestion_is_due_once_it_stood_for_balance_after_and_any_other_look_starts_again() {
        let mut b = Balance::default();
        assert_eq!(b.look(Some("3:1"), 0, AFTER), None, "just seen");
        assert_eq!(b.look(Some("3:1"), 59_999, AFTER), None, "not yet");
        assert_eq!(b.look(Some("3:1"), 60_000, AFTER).as_deref(), Some("3:1"), "stood for a minute");
        // Another suggestion, or none, starts the count again.
        assert_eq!(b.look(Some("1:3"), 61_000, AFTER), None);
        assert_eq!(b.look(Some("1:3"), 120_000, AFTER), None, "59 s of 1:3");
        assert_eq!(b.look(None, 121_000, AFTER), None);
        assert_eq!(b.stood(121_000), None);
        assert_eq!(b.look(Some("1:3"), 122_000, AFTER), None, "counted from its return, not its first sight");
        assert_eq!(b.stood(130_000), Some(Duration::from_secs(8)));
        assert_eq!(b.look(Some("1:3"), 182_000, AFTER).as_deref(), Some("1:3"));
        b.made();
        assert_eq!(b.look(Some("1:3"), 183_000, AFTER), None, "a change made starts the count again");
    }

    #[test]
    fn it_looks_four_times_per_balance_after_within_bounds() {
        assert_eq!(every(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(every(Duration::from_secs(60)), Duration::from_secs(15));
        assert_eq!(every(Duration::from_secs(15 * 60)), Duration::from_secs(30));
    }
}
