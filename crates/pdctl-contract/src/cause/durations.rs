//! Durations and expected outages as the causes' sentences say them.

use std::time::Duration;

/// A duration for people: "30.1s", "250ms", "2m05s" (never "30.081551416s").
pub fn dur(d: &Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        _ => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// "about 11s (its last measured window out of the router: take-out, stop, start, gates,
/// re-admission, 3h ago)" — for a pair restarted together, their last interruption; where only a start was measured, that start as a lower bound; or what is known
/// without a measurement.
pub fn outage(expected: Option<&crate::clock::StartTime>) -> String {
    let secs = |ms: u64| ms.div_ceil(1000).max(1);
    match expected {
        Some(crate::clock::StartTime { window_ms: Some(w), together_with: Some(other), at, .. }) => format!(
            "about {}s (the pair's last measured interruption, restarted together with {other}: first take-out to last re-admission, {})",
            secs(*w),
            crate::clock::ago(*at)
        ),
        Some(crate::clock::StartTime { window_ms: Some(w), at, .. }) => {
            format!("about {}s (its last measured window out of the router: take-out, stop, start, gates, re-admission, {})", secs(*w), crate::clock::ago(*at))
        }
        Some(s) if s.ms > 0 => {
            format!("more than {}s (its last measured start, {}s, plus its drain, stop and re-admission, not measured here yet)", secs(s.ms), secs(s.ms))
        }
        _ => "as long as its drain, stop, start and re-admission take (not measured here yet; a real model's start alone takes 60-80 s)".into(),
    }
}
