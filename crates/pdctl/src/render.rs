//! Printing a rollout: NDJSON (`--json`), live progress on a terminal (a line per unit, the
//! current step with a spinner and its elapsed time, ✓/✗ per gate with its time), or plain lines
//! when the output is not a terminal.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use pdctl_core::api::ROUTER;
use pdctl_core::events::{Event, Status, Summary};
use pdctl_core::plan::Plan;

use crate::context::Kind;

/// Prints events as they come.
pub struct Renderer {
    json: bool,
    live: Option<(MultiProgress, HashMap<String, Line>)>,
    kind: Kind,
    units: usize,
}

/// One unit's progress line.
pub struct Line {
    bar: ProgressBar,
    done: Vec<String>,
    current: Option<(String, Instant)>,
}

fn secs(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

impl Renderer {
    /// A renderer for `plan`.
    pub fn new(json: bool, plan: &Plan, kind: Kind) -> Renderer {
        let units: Vec<String> = plan.workers.iter().map(|w| w.unit.clone()).collect();
        Renderer::for_units(json, &units, kind)
    }

    /// A renderer for these units, in order.
    pub fn for_units(json: bool, units: &[String], kind: Kind) -> Renderer {
        let live = (!json && std::io::stdout().is_terminal()).then(|| {
            let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let style = ProgressStyle::with_template("{prefix:.bold} {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner());
            let width = units.iter().map(String::len).max().unwrap_or(10).max(8);
            let mut lines = HashMap::new();
            for name in std::iter::once(ROUTER.to_string()).chain(units.iter().cloned()) {
                let bar = mp.add(ProgressBar::new_spinner());
                bar.set_style(style.clone());
                bar.set_prefix(format!("{name:<width$}"));
                lines.insert(name, Line { bar, done: Vec::new(), current: None });
            }
            (mp, lines)
        });
        if !json {
            let what = match kind {
                Kind::Rollout => "rolling restart (run by pdctld)",
                Kind::DryRun => "dry run (preflight only, nothing is touched) of a rolling restart",
                Kind::Check => "check (every gate but restart and soak; nothing is changed)",
            };
            let order: Vec<&str> = units.iter().map(String::as_str).collect();
            println!("pdctl: {what} of {} unit(s), in order: {}", order.len(), order.join(" → "));
        }
        Renderer { json, live, kind, units: units.len() }
    }

    fn redraw(&mut self) {
        const SPIN: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
        let Some((_, lines)) = &mut self.live else {
            return;
        };
        for l in lines.values() {
            let mut msg = l.done.join("  ");
            if let Some((step, t0)) = &l.current {
                let i = (t0.elapsed().as_millis() / 100) as usize % SPIN.len();
                msg = format!("{msg}  {} {step} {:.1}s", SPIN[i], t0.elapsed().as_secs_f64());
            }
            l.bar.set_message(msg.trim_start().to_string());
        }
    }

    /// Show one event.
    pub fn event(&mut self, e: &Event) {
        if self.json {
            if let Ok(s) = serde_json::to_string(e) {
                println!("{s}");
            }
            return;
        }
        let step = e.step.as_str();
        let mark = match e.status {
            Status::Started => None,
            Status::Passed => Some(format!("✓ {step} {}", secs(e.elapsed_ms))),
            Status::Failed => Some(format!("✗ {step} {}", secs(e.elapsed_ms))),
            Status::Skipped => Some(format!("– {step}")),
        };
        match &mut self.live {
            Some((_, lines)) => {
                if let Some(l) = lines.get_mut(&e.unit) {
                    match mark {
                        None => l.current = Some((step.to_string(), Instant::now())),
                        Some(m) => {
                            l.current = None;
                            l.done.push(m);
                        }
                    }
                }
                self.redraw();
            }
            None => {
                if let Some(m) = mark {
                    println!("  {:<32} {m}", e.unit);
                }
            }
        }
    }

    /// Consume events until the channel closes; returns itself for the summary.
    pub async fn run(mut self, mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Renderer {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => self.event(&e),
                    None => break,
                },
                _ = tick.tick() => self.redraw(),
            }
        }
        self
    }

    /// Print the summary (the last JSON line, or the verdict for humans).
    pub fn summary(self, s: &Summary) {
        if let Some((_, lines)) = &self.live {
            for l in lines.values() {
                if l.done.is_empty() {
                    l.bar.finish_and_clear();
                } else {
                    l.bar.finish();
                }
            }
        }
        if self.json {
            if let Ok(v) = serde_json::to_string(s) {
                println!("{v}");
            }
            return;
        }
        match &s.failed {
            None => {
                let what = match self.kind {
                    Kind::Rollout => {
                        format!("all {} unit(s) restarted and verified", s.units.len())
                    }
                    Kind::DryRun => "preflight passed; nothing was touched".into(),
                    Kind::Check => format!("all {} unit(s) pass every gate", self.units),
                };
                println!("pdctl: ✓ {what} in {}", secs(s.elapsed_ms));
            }
            Some(f) => {
                println!("pdctl: ✗ {} failed at {}: {}", f.unit, f.step.as_str(), f.cause);
                if !f.last_lines.is_empty() {
                    println!("  last log lines of {}:", f.unit);
                    for l in &f.last_lines {
                        println!("    {l}");
                    }
                }
                if matches!(self.kind, Kind::Rollout) {
                    let rest = if s.units.is_empty() {
                        "no unit was restarted before it".to_string()
                    } else {
                        format!("restarted and verified before it: {}", s.units.join(", "))
                    };
                    println!("pdctl: rollout halted; nothing after {} was touched ({rest})", f.unit);
                }
            }
        }
    }
}
