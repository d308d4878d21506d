//! The fleet bake's judgement of one host (`[fleet] bake`): after the last host of a fleet
//! rollout, the workers this host's part restarted are watched over one growing window (from
//! the bake's start) against their own figures from before their drains — the whole fleet has
//! changed by then, so no unchanged peer is left to compare with — by `[verify.slo]`'s
//! tolerances ([`crate::service::slo::judge`]). pdctld's fleet participation calls these between looks;
//! what a breach does (the fleet-wide revert) is decided there and in [`crate::fleet::bake`].

use std::collections::BTreeMap;

use pdctl_parse::service::ServiceScrape;

use crate::config::Slo;
use crate::engine::gates;
use crate::engine::gates::Mark;
use crate::engine::machine::Engine;
use crate::ports::{Logs, Probes, Units};
use crate::service::slo::{judge, Baseline, Report, Verdict, Window};

/// The bake's first scrapes: each watched worker's figures when the bake began.
#[derive(Debug, Clone)]
pub struct BakeMarks {
    marks: Vec<(String, Result<Mark, String>)>,
}

/// One worker's verdict at a look of the bake.
#[derive(Debug, Clone)]
pub struct BakeLook {
    /// The unit.
    pub unit: String,
    /// Its report (not judged: why, in the verdict).
    pub report: Report,
}

impl BakeLook {
    /// "sglang-decode.service: passed (412 requests vs 1,204 before its drain)" — or the breach's
    /// figure, or why it was not judged.
    pub fn sentence(&self) -> String {
        let r = &self.report;
        match &r.verdict {
            Verdict::Pass => format!("{}: passed ({} requests vs {} before its drain)", self.unit, r.requests, r.baseline_requests),
            Verdict::NotJudged { why } => format!("{}: not judged: {why}", self.unit),
            Verdict::Breach { figure } => {
                format!("{}: {} ({} requests vs {} before its drain)", self.unit, figure.sentence(), r.requests, r.baseline_requests)
            }
        }
    }
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The bake's start: each of `units` (configured workers of this host) scraped now, within
    /// `metrics_timeout` each.
    pub async fn bake_start(&self, units: &[String]) -> BakeMarks {
        let mut marks = Vec::new();
        for w in self.settings.workers.iter().filter(|w| units.contains(&w.unit)) {
            marks.push((w.unit.clone(), gates::service_level::mark(self, &w.unit, &w.url).await));
        }
        BakeMarks { marks }
    }

    /// One look: each watched worker's window since the bake's start judged against its figures
    /// from before its drain (`before`, kept by the rollout). A worker whose figures could not be
    /// read, that restarted meanwhile, or whose baseline was not kept is not judged (said why).
    pub async fn bake_look(&self, start: &BakeMarks, before: &BTreeMap<String, ServiceScrape>, slo: &Slo) -> Vec<BakeLook> {
        let not_judged = |unit: &str, why: String| BakeLook {
            unit: unit.to_string(),
            report: Report {
                verdict: Verdict::NotJudged { why },
                baseline: Baseline::OwnBeforeDrain,
                requests: 0,
                baseline_requests: 0,
                figures: Vec::new(),
                errors_from: None,
                judged_by: None,
            },
        };
        let mut out = Vec::new();
        for (unit, mark) in &start.marks {
            let mark = match mark {
                Ok(m) => m,
                Err(why) => {
                    out.push(not_judged(unit, format!("its figures could not be read when the bake began: {why}")));
                    continue;
                }
            };
            let Some(base) = before.get(unit) else {
                out.push(not_judged(unit, "its figures from before its drain were not kept (pdctld restarted since, or they could not be read then)".into()));
                continue;
            };
            match gates::service_level::window_since(self, mark).await {
                Ok(mine) => {
                    let report = judge(slo, &mine, &Window { service: base.clone(), gateway: None }, Baseline::OwnBeforeDrain);
                    out.push(BakeLook { unit: unit.clone(), report });
                }
                Err(why) => out.push(not_judged(unit, why)),
            }
        }
        out
    }
}
