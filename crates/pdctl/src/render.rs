//! Printing a rollout: NDJSON (`--json`), live progress on a terminal (a line per unit, the
//! current step with a spinner and its elapsed time, ✓/✗ per gate with its time), or plain lines
//! when the output is not a terminal.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use pdctl_contract::api::ROUTER;
use pdctl_contract::details::{Prefetch, PrefetchRead, PreflightDetail, SlotWait};
use pdctl_contract::events::{Event, Outcome, Status, Step, Summary};
use pdctl_core::plan::Plan;

/// What is being shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A rolling restart run by pdctld, watched.
    Rollout,
    /// Preflight only, run here.
    DryRun,
    /// All read-only gates, run here.
    Check,
}

/// Prints events as they come.
pub struct Renderer {
    json: bool,
    live: Option<(MultiProgress, HashMap<String, Line>)>,
    kind: Kind,
    units: usize,
    /// A dry run's preflight planned a coherent fleet switch: the next command is the fleet's.
    fleet_switch: bool,
    /// A dry run: the command that does what it previewed, with the same flags.
    next: Option<String>,
}

/// One unit's progress line.
pub struct Line {
    bar: ProgressBar,
    done: Vec<String>,
    current: Option<(String, Instant)>,
}

/// Bytes as MiB (a checkpoint's size).
fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn secs(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

impl Renderer {
    /// The same renderer, naming `next` as the command a passed dry run leads to.
    pub fn with_next(mut self, next: String) -> Renderer {
        self.next = Some(next);
        self
    }

    /// A renderer for `plan`.
    pub fn new(json: bool, plan: &Plan, kind: Kind) -> Renderer {
        let units: Vec<String> = plan.workers.iter().map(|w| w.unit.clone()).collect();
        Renderer::for_units(json, &units, kind)
    }

    /// A renderer for these units, in order.
    pub fn for_units(json: bool, units: &[String], kind: Kind) -> Renderer {
        Renderer::for_units_as(json, units, kind, None)
    }

    /// [`Renderer::for_units`] whose header names what runs (`what`: "revert (run by pdctld)", …;
    /// `None`: by `kind`).
    pub fn for_units_as(json: bool, units: &[String], kind: Kind, what: Option<&str>) -> Renderer {
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
            let what = what.unwrap_or(match kind {
                Kind::Rollout => "rolling restart (run by pdctld)",
                Kind::DryRun => "dry run (preflight only, nothing is touched) of a rolling restart",
                Kind::Check => "check (every gate but restart and soak; nothing is changed)",
            });
            let order: Vec<&str> = units.iter().map(String::as_str).collect();
            println!("pdctl: {what} of {} unit(s), in order: {}", order.len(), order.join(" → "));
        }
        Renderer { json, live, kind, units: units.len(), fleet_switch: false, next: None }
    }

    /// Redraw the live lines (the spinner and the current step's elapsed time advance).
    pub fn redraw(&mut self) {
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
        // A worker's preflight (the router's and the fleet's have other details).
        let preflight = match (e.step, e.status) {
            (Step::Preflight, Status::Passed) => serde_json::from_value::<PreflightDetail>(e.detail.clone()).ok(),
            _ => None,
        };
        if let Some(o) = preflight.as_ref().and_then(|p| p.outage.as_deref()) {
            self.note(&format!("pdctl: ⚠ {o}"));
        }
        // What the preflight found risky but not refused (a stop that could be SIGKILLed, a
        // timing that could fail the pair gate, a model change restarted together).
        for w in preflight.iter().flat_map(|p| &p.warnings) {
            self.note(&format!("pdctl: ⚠ {w}"));
        }
        // How PD pairs are kept to one model (the coherent switch's plan and capacity).
        if let Some(c) = preflight.as_ref().and_then(|p| p.coherence.as_deref()) {
            self.fleet_switch |= c.starts_with("coherent fleet switch");
            self.note(&format!("pdctl: {c}"));
        }
        if (e.step, e.status) == (Step::Rollback, Status::Started) {
            self.note(&format!("pdctl: ↩ {}: rolling back to its last good revision, then through its gates again", e.unit));
        }
        // What the restart loads besides the running files (a dry run says what it would).
        if let Some(p) = preflight.filter(|p| p.daemon_reload) {
            let what = if p.drop_ins_not_loaded.is_empty() { "its changed unit file".to_string() } else { p.drop_ins_not_loaded.join(", ") };
            let verb = if p.dry_run { "would reload systemd and load" } else { "reloaded systemd, loading" };
            self.note(&format!("pdctl: {}: {verb} {what}", e.unit));
        }
        // A fleet slot step waiting: who holds the slots (or the pause).
        if let (Step::Slot, Status::Started) = (e.step, e.status) {
            if let Ok(w) = serde_json::from_value::<SlotWait>(e.detail.clone()) {
                self.note(&format!("pdctl: {}: {}", e.unit, w.waiting));
            }
        }
        // A new checkpoint read into memory before anyone stops: its progress, and what it read.
        match (e.step, e.status) {
            (Step::Prefetch, Status::Started) => {
                if let Ok(p) = serde_json::from_value::<PrefetchRead>(e.detail.clone()) {
                    self.note(&format!("pdctl: {}: reading the new checkpoint into memory: {} of {}", e.unit, mib(p.read_bytes), mib(p.of_bytes)));
                }
            }
            (Step::Prefetch, Status::Passed) => {
                if let Ok(p) = serde_json::from_value::<Prefetch>(e.detail.clone()) {
                    self.note(&format!(
                        "pdctl: read {} ({} in {} files) into memory for {} in {}, before any of them stops",
                        p.model_path,
                        mib(p.read_bytes),
                        p.files,
                        p.units.join(", "),
                        secs(e.elapsed_ms)
                    ));
                }
            }
            _ => {}
        }
        if let Some(of) = &e.repair_of {
            if e.status == Status::Started && e.step == Step::Drain {
                self.note(&format!("pdctl: {} is restarted to repair its stale pairing with {of}", e.unit));
            }
        }
        if let Some(w) = pdctl_contract::details::Said::of(&e.detail).warning {
            self.note(&format!("pdctl: ⚠ {}: {w}", e.unit));
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

    /// Print a line above the progress block (it stays on screen while the block redraws).
    pub fn note(&self, text: &str) {
        match &self.live {
            Some((mp, _)) => {
                let _ = mp.println(text);
            }
            None if !self.json => eprintln!("{text}"),
            None => {}
        }
    }

    /// Print the summary: the last JSON line, or for humans what happened and, last, one line
    /// with the outcome and the next command to run.
    pub fn summary(self, s: &Summary, after: &Epilogue) {
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
        let took = secs(s.elapsed_ms);
        let not_started: Vec<&str> =
            after.plan.iter().map(String::as_str).filter(|u| !s.units.iter().any(|d| d == u) && s.failed.as_ref().is_none_or(|f| f.unit != *u)).collect();
        let not_started = if not_started.is_empty() { "none".to_string() } else { not_started.join(", ") };
        let verified = if s.units.is_empty() { "none".to_string() } else { s.units.join(", ") };
        let id = after.id.as_deref().map(|i| format!(" (rollout {i})")).unwrap_or_default();
        what_happened(s, after, &id);
        let state = |u: &str| after.unit_state.as_ref().filter(|(x, _)| x == u).map(|(_, st)| format!("; {u} is now {st}")).unwrap_or_default();
        let weights = after.kind == Some(pdctl_contract::api::RolloutKind::Weights) || after.in_place;
        let line = match (s.result, &s.failed, self.kind) {
            (Outcome::Succeeded, _, Kind::Rollout) if weights => {
                format!("✓ succeeded{id}: all {} worker(s) serve the new weights, verified, without a restart, in {took}", s.units.len())
            }
            (_, Some(f), Kind::Rollout) if weights => weights_failed(&id, f),
            (Outcome::Succeeded, _, Kind::Rollout) if host_done(after, &id, &took).is_some() => host_done(after, &id, &took).unwrap_or_default(),
            (Outcome::Succeeded, _, Kind::Rollout) if s.units.is_empty() => format!("✓ succeeded{id}: nothing was restarted ({took}); next: pdctl status"),
            (Outcome::Succeeded, _, Kind::Rollout) => format!("✓ succeeded{id}: all {} unit(s) restarted and verified in {took}", s.units.len()),
            (Outcome::Succeeded, _, Kind::DryRun) if self.fleet_switch => {
                format!("✓ preflight passed; nothing was touched ({took}); next: pdctl fleet restart --rolling --load-changes (every host in step)")
            }
            (Outcome::Succeeded, _, Kind::DryRun) => {
                format!("✓ preflight passed; nothing was touched ({took}); next: {}", self.next.as_deref().unwrap_or("pdctl restart --rolling"))
            }
            (Outcome::Succeeded, _, Kind::Check) => format!("✓ all {} unit(s) pass every gate ({took})", self.units),
            (Outcome::Aborted, _, _) => {
                let rest: Vec<&str> =
                    after.plan.iter().map(String::as_str).filter(|u| !s.units.iter().any(|d| d == u) && s.failed.as_ref().is_none_or(|f| f.unit != *u)).collect();
                let next = if rest.is_empty() { "pdctl status".to_string() } else { restart_of(&rest, after) };
                format!("■ aborted by an operator{id} after {took}: verified {verified}; not started: {not_started}; next: {next}")
            }
            (Outcome::RolledBack, Some(f), _) => format!(
                "↩ rolled back{id}: {} failed at {} ({}) and runs its last good revision again, verified (restored: see the notes above); not started: {not_started}; next: pdctl rollout diff, fix the change (the failed one is quarantined until its files change)",
                f.unit,
                f.step.as_str(),
                f.cause_code
            ),
            (_, Some(f), Kind::Rollout) => {
                use pdctl_contract::api::RolloutKind;
                // The retry it names covers what this rollout has left — the failed unit and
                // those not started — with the flags it ran with (it named the failed unit alone,
                // without them).
                let rest: Vec<&str> = after.plan.iter().map(String::as_str).filter(|u| !s.units.iter().any(|d| d == u)).collect();
                let retry = format!("`pdctl restart --rolling --unit {}`", f.unit);
                let next = match after.kind {
                    Some(RolloutKind::Restart | RolloutKind::Apply) if rest.contains(&f.unit.as_str()) => {
                        next_of(f).replace(&retry, &format!("`{}`", restart_of(&rest, after)))
                    }
                    _ => next_of(f),
                };
                format!(
                    "✗ halted{id} at {} ({}, {}){}; verified before it: {verified}; not started: {not_started}; next: {next}",
                    f.unit,
                    f.step.as_str(),
                    f.cause_code,
                    state(&f.unit)
                )
            }
            (_, Some(f), _) => format!("✗ {} failed at {} ({}); nothing was touched; next: {}", f.unit, f.step.as_str(), f.cause_code, next_of(f)),
            (_, None, _) => format!("✗ {:?} without a failed gate{id}", s.result),
        };
        println!("pdctl: {line}");
    }
}

/// `pdctl restart --rolling --unit …` for `units`, with the rollout's `--allow-outage` and
/// `--load-changes`.
fn restart_of(units: &[&str], after: &Epilogue) -> String {
    let mut n = String::from("pdctl restart --rolling");
    for u in units {
        n.push_str(&format!(" --unit {u}"));
    }
    if after.allow_outage {
        n.push_str(" --allow-outage");
    }
    if after.load_changes {
        n.push_str(" --load-changes");
    }
    n
}

/// The failure's next step (from its cause), or for a record written before pdctl said one, the
/// general advice.
fn next_of(f: &pdctl_contract::events::Failure) -> String {
    if f.next.is_empty() {
        format!("`journalctl -u {} -n 200`, fix the cause, then run this again", f.unit)
    } else {
        f.next.clone()
    }
}

/// What the last lines say besides the summary: the plan, the record's notes (what a rollback
/// restored, drains undone), the failed unit's state now, the rollout id.
#[derive(Debug, Default, Clone)]
pub struct Epilogue {
    /// What started it (a weights rollout restarts nothing: its last line says so).
    pub kind: Option<pdctl_contract::api::RolloutKind>,
    /// A config rollout that loaded its new weights in place (it restarted nothing either).
    pub in_place: bool,
    /// Every unit of the plan, in order.
    pub plan: Vec<String>,
    /// The record's notes.
    pub notes: Vec<String>,
    /// The failed unit and its systemd state now (`active/running`, …).
    pub unit_state: Option<(String, String)>,
    /// pdctld's rollout id.
    pub id: Option<String>,
    /// The record's `--load-changes` and `--allow-outage` (a command for the rest keeps them).
    pub load_changes: bool,
    /// See `load_changes`.
    pub allow_outage: bool,
}

/// The last line of a weights rollout that failed: the new weights not taken (every worker back on
/// its previous ones unless a note says otherwise), or taken by every worker while one's cache
/// was not flushed after the load.
fn weights_failed(id: &str, f: &pdctl_contract::events::Failure) -> String {
    if f.step == pdctl_contract::events::Step::Weights && f.cause.contains("prefix cache was not flushed") {
        return format!(
            "✗ failed{id}: every worker serves the new weights, but {}'s prefix cache was not flushed after the load and may answer cached prefixes from KV the old weights computed; next: {}",
            f.unit,
            next_of(f)
        );
    }
    format!(
        "✗ weights not taken{id}: {} failed at {} ({}); every worker that had loaded them serves its previous weights again unless a note above says otherwise, and every worker was continued; next: {}",
        f.unit,
        f.step.as_str(),
        f.cause_code,
        next_of(f)
    )
}

/// A host drain's or a host resume's last line when it succeeded: what it did, not "restarted".
fn host_done(after: &Epilogue, id: &str, took: &str) -> Option<String> {
    use pdctl_contract::api::RolloutKind;
    let n = after.plan.len();
    match after.kind {
        Some(RolloutKind::HostDrain) => Some(format!(
            "✓ succeeded{id}: all {n} worker(s) out of the gateway and stopped in {took}: the host may reboot; next: after the reboot pdctld resumes it by itself (pdctl host status)"
        )),
        Some(RolloutKind::HostResume) => Some(format!("✓ succeeded{id}: all {n} worker(s) back in service, each through its gates, in {took}; next: pdctl host status")),
        _ => None,
    }
}

/// What happened, before the last line: the failure with its unit's last log lines, what
/// clients saw, the rollout's notes.
fn what_happened(s: &Summary, after: &Epilogue, id: &str) {
    if let Some(f) = &s.failed {
        println!("pdctl: ✗ {} failed at {}: {}", f.unit, f.step.as_str(), f.cause);
        if !f.last_lines.is_empty() {
            println!("  last log lines of {}:", f.unit);
            for l in &f.last_lines {
                println!("    {l}");
            }
        }
    }
    if let Some(a) = &s.availability {
        println!("pdctl: availability: {}", a.sentence());
    }
    if !after.notes.is_empty() {
        println!("pdctl: notes{id}:");
        for n in &after.notes {
            println!("  - {n}");
        }
    }
}
