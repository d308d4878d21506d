//! Each PD role's pressure from the figures `pdctl status` reads of every worker (requests queued
//! and running, KV used: SGLang's `num_queue_reqs`, `num_running_reqs`, `token_usage`), and the
//! ratio they suggest. Pure. A prefill's queue is where a long prompt waits (time to first
//! token); a decode's KV and queue are where long answers pile up. Nothing is switched by it: the
//! suggestion is said, with the figures behind it, and `pdctl role set --ratio` acts on it.
//! Latencies (time to first token, between tokens) need two looks at SGLang's histograms, which a
//! status does not take: they are not judged here rather than judged from one look.

use serde::Serialize;

use pdctl_contract::records::Role;

/// Requests waiting per prefill from which prefills are short of capacity.
pub const QUEUE_HIGH: f64 = 4.0;
/// KV used (the fullest decode) from which decodes are short of capacity.
pub const KV_HIGH: f64 = 0.85;
/// KV used below which a decode can be given away.
pub const KV_LOW: f64 = 0.5;

/// One worker's figures (`None`: not read).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// The role it runs.
    pub role: Role,
    /// Requests queued.
    pub queued: Option<f64>,
    /// Requests running.
    pub running: Option<f64>,
    /// KV used, 0-1 (its fullest rank).
    pub kv_used: Option<f64>,
}

impl Load {
    /// A worker running `role` as its KV report says it (`None`: not read).
    pub fn of(role: Role, kv: Option<&pdctl_parse::kv::KvReport>) -> Load {
        Load { role, queued: kv.and_then(|k| k.queue_reqs), running: kv.and_then(|k| k.running_reqs), kv_used: kv.map(|k| k.token_usage) }
    }
}

/// One role's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolePressure {
    /// Its workers.
    pub workers: usize,
    /// Those whose figures were read.
    pub read: usize,
    /// Requests queued per worker read.
    pub queued_per_worker: Option<f64>,
    /// Requests running per worker read.
    pub running_per_worker: Option<f64>,
    /// KV used by its fullest worker (0-1).
    pub kv_used_max: Option<f64>,
}

/// Both roles' figures and what they suggest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pressure {
    /// The prefills.
    pub prefill: RolePressure,
    /// The decodes.
    pub decode: RolePressure,
    /// `P:D` to move to (`None`: keep the ratio, or not judged).
    pub suggested_ratio: Option<String>,
    /// Why, in one sentence with the figures.
    pub why: String,
}

fn role_of(loads: &[Load], role: Role) -> RolePressure {
    let mine: Vec<&Load> = loads.iter().filter(|l| l.role == role).collect();
    let read: Vec<&&Load> = mine.iter().filter(|l| l.queued.is_some() || l.running.is_some() || l.kv_used.is_some()).collect();
    let mean = |f: &dyn Fn(&Load) -> Option<f64>| {
        let v: Vec<f64> = read.iter().filter_map(|l| f(l)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    RolePressure {
        workers: mine.len(),
        read: read.len(),
        queued_per_worker: mean(&|l| l.queued),
        running_per_worker: mean(&|l| l.running),
        kv_used_max: read.iter().filter_map(|l| l.kv_used).reduce(f64::max),
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or("not measured".into(), |v| format!("{:.0} %", v * 100.0))
}

fn num(x: Option<f64>) -> String {
    x.map_or("not measured".into(), |v| format!("{v:.1}"))
}

/// Each role's pressure over `loads`, and the ratio it suggests: a worker moves to the role short
/// of capacity only when the other role has one to spare (at least two workers, and little use).
pub fn pressure(loads: &[Load]) -> Pressure {
    let (p, d) = (role_of(loads, Role::Prefill), role_of(loads, Role::Decode));
    let ratio = |np: usize, nd: usize| Some(format!("{np}:{nd}"));
    let figures = format!(
        "prefills queue {} each; decodes queue {} each, run {} each, fullest KV {}",
        num(p.queued_per_worker),
        num(d.queued_per_worker),
        num(d.running_per_worker),
        pct(d.kv_used_max)
    );
    let (suggested_ratio, why) = if p.workers == 0 || d.workers == 0 {
        (None, "not a PD host: no ratio to change".to_string())
    } else if p.read == 0 || d.read == 0 {
        (None, format!("not judged: no figures read of every role ({} of {} prefills, {} of {} decodes)", p.read, p.workers, d.read, d.workers))
    } else {
        let prefill_short = p.queued_per_worker.is_some_and(|q| q >= QUEUE_HIGH);
        let decode_short = d.kv_used_max.is_some_and(|k| k >= KV_HIGH) || d.queued_per_worker.is_some_and(|q| q >= QUEUE_HIGH);
        let decode_spare = d.workers >= 2 && d.kv_used_max.is_some_and(|k| k < KV_LOW) && d.queued_per_worker.is_none_or(|q| q < 1.0);
        let prefill_spare = p.workers >= 2 && p.queued_per_worker.is_some_and(|q| q < 1.0);
        match (prefill_short, decode_short) {
            (true, false) if decode_spare => (ratio(p.workers + 1, d.workers - 1), format!("prefills are short, decodes have one to spare: {figures}")),
            (false, true) if prefill_spare => (ratio(p.workers - 1, d.workers + 1), format!("decodes are short, prefills have one to spare: {figures}")),
            (true, true) => (None, format!("both roles are short: more workers, not another ratio ({figures})")),
            (true, false) | (false, true) => (None, format!("one role is short but the other has none to spare: {figures}")),
            (false, false) => (None, format!("balanced: {figures}")),
        }
    };
    Pressure { prefill: p, decode: d, suggested_ratio, why }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(role: Role, queued: f64, running: f64, kv: f64) -> Load {
        Load { role, queued: Some(queued), running: Some(running), kv_used: Some(kv) }
    }

    #[test]
    fn a_prefill_queue_with_idle_decodes_suggests_one_more_prefill_and_the_reverse_one_more_decode() {
        let long_prompts = [l(Role::Prefill, 6.0, 1.0, 0.1), l(Role::Prefill, 5.0, 1.0, 0.1), l(Role::Decode, 0.0, 3.0, 0.2), l(Role::Decode, 0.0, 2.0, 0.3)];
        let p = pressure(&long_prompts);
        assert_eq!(p.suggested_ratio.as_deref(), Some("3:1"), "{p:?}");
        assert!(p.why.contains("prefills queue 5.5 each") && p.why.contains("fullest KV 30 %"), "{}", p.why);
        let long_answers = [l(Role::Prefill, 0.0, 0.0, 0.0), l(Role::Prefill, 0.0, 0.0, 0.0), l(Role::Decode, 2.0, 40.0, 0.9), l(Role::Decode, 0.0, 38.0, 0.7)];
        assert_eq!(pressure(&long_answers).suggested_ratio.as_deref(), Some("1:3"));
    }

    #[test]
    fn no_suggestion_when_balanced_both_short_nothing_to_spare_or_not_read() {
        let calm = [l(Role::Prefill, 0.0, 1.0, 0.1), l(Role::Decode, 0.0, 3.0, 0.2)];
        assert!(pressure(&calm).why.starts_with("balanced"));
        let both = [l(Role::Prefill, 9.0, 1.0, 0.1), l(Role::Prefill, 9.0, 1.0, 0.1), l(Role::Decode, 5.0, 40.0, 0.95), l(Role::Decode, 5.0, 40.0, 0.9)];
        assert!(pressure(&both).why.starts_with("both roles are short"));
        // One decode: none to give away, whatever the prefills' queue.
        let one_decode = [l(Role::Prefill, 9.0, 1.0, 0.1), l(Role::Decode, 0.0, 1.0, 0.1)];
        assert_eq!(pressure(&one_decode).suggested_ratio, None);
        let unread = [Load { role: Role::Prefill, queued: None, running: None, kv_used: None }, l(Role::Decode, 0.0, 1.0, 0.1)];
        let p = pressure(&unread);
        assert!(p.why.starts_with("not judged") && p.prefill.queued_per_worker.is_none(), "{p:?}");
        assert!(pressure(&[l(Role::Regular, 1.0, 1.0, 0.1)]).why.starts_with("not a PD host"));
    }
}
