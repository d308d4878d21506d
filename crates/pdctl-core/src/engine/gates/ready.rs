//! The ready gate: the ready line of *this* run (its InvocationID and MainPID), failing fast on a
//! fatal line, the manager's failure, or a crash.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::details::ReadyDetail;

use crate::cause::{Cause, Phase};
use crate::config::Worker;
use crate::engine::step_run::Fail;
use crate::engine::{Engine, LAST_LINES};
use crate::ports::{Follow, LogEntry, Logs, Probes, UnitState, Units, Watch};
use crate::sglang::judge::{crashed_since, Judge, Run, Verdict, MSG_FAILURE_RESULT, MSG_UNIT_STARTING};

pub(in crate::engine) async fn ready<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    cursor: Option<String>,
    watch: &mut U::W,
    after: &UnitState,
) -> Result<ReadyDetail, Fail> {
    let ro = &eng.settings.rollout;
    let mut judge = Judge {
        ready_pattern: ro.ready_pattern.clone(),
        fatal_patterns: ro.fatal_patterns.clone(),
        run: Run {
            invocation_id: after.invocation_id.clone(),
            main_pid: if after.main_pid != 0 { after.main_pid } else { after.exec_main_pid },
            procfs: eng.settings.procfs.clone(),
        },
    };
    let mut follow = eng.logs.follow(cursor, &w.unit);
    let t0 = Instant::now();
    let deadline = tokio::time::sleep(ro.ready_timeout);
    tokio::pin!(deadline);
    let mut foreign = 0u32;
    // A traceback of this run so far: the explanation if the run exits, nothing if it gets ready.
    let mut suspect: Option<String> = None;
    let mut crashed: Option<String> = crashed_since(after, after);
    // The unit's lines since the restart: a failed start's own last words, whatever systemd
    // (`Restart=`) or a rollback starts after it.
    let mut seen = RunLines::default();
    while crashed.is_none() {
        tokio::select! {
            e = follow.next() => match e {
                None => return Err(Cause::EventSourceClosed { what: "the journal follower".into() }.into()),
                Some(Err(e)) => return Err(Cause::JournalUnreadable { message: e.to_string() }.into()),
                Some(Ok(entry)) => match seen.pushed(&entry, &judge) {
                    Verdict::Ready => {
                        return Ok(ReadyDetail {
                            line: entry.message().to_string(),
                            pid: entry.pid(),
                            invocation_id: entry.get("_SYSTEMD_INVOCATION_ID").map(String::from),
                            detect_ms: entry.latency().as_secs_f64() * 1000.0,
                            journal_realtime_us: entry.realtime_us,
                            ignored_ready_lines_of_other_runs: foreign,
                            warning: suspect.as_ref().map(|l| format!("this run logged a traceback before its ready line and went on to be ready (not a failed start): {l}")),
                            since_restart_ms: t0.elapsed().as_millis() as u64,
                        })
                    }
                    Verdict::Fatal(line) => return Err(seen.fail(Cause::FatalLine { unit: w.unit.clone(), line })),
                    Verdict::ManagerFailure(m) => crashed = Some(format!("systemd reports: {m}")),
                    Verdict::ForeignReady => foreign += 1,
                    Verdict::Suspect(l) => suspect = suspect.or(Some(l)),
                    Verdict::Ignore => {}
                },
            },
            c = watch.changed() => {
                if c.is_none() {
                    return Err(Cause::EventSourceClosed { what: "the D-Bus connection to systemd".into() }.into());
                }
                let st = eng.units.state(&w.unit).await?;
                // A unit with `ExecStartPre=` has no main process yet when the restart's job
                // ends: its PID, once forked, is what tells this run's lines where journald
                // records no InvocationID (a process that exits at once is gone before its
                // lines are judged).
                if st.invocation_id == judge.run.invocation_id && st.main_pid != 0 {
                    judge.run.main_pid = st.main_pid;
                }
                crashed = crashed_since(&st, after);
            }
            _ = &mut deadline => {
                return Err(Cause::ReadyTimeout { unit: w.unit.clone(), pattern: ro.ready_pattern.clone(), after: ro.ready_timeout, foreign }.into())
            }
        }
    }
    // The unit died: look briefly (up to FATAL_LOOK) for the fatal line that explains it. Found, the cause is
    // that line (`fatal_line`), whichever of the two arrived first: an argparse rejection
    // is always `fatal_line`, never `crashed` by a race between journald and systemd.
    // The failure's last lines end where the run ended: at the manager's "Failed with result"
    // (a line of this run that journald delivers later still counts; the next start's do not).
    let why = crashed.unwrap_or_default();
    let mut fatal: Option<String> = None;
    let _ = tokio::time::timeout(FATAL_LOOK, async {
        while let Some(Ok(e)) = follow.next().await {
            match seen.pushed(&e, &judge) {
                Verdict::Fatal(l) if fatal.is_none() => fatal = Some(l),
                Verdict::Suspect(l) if suspect.is_none() => suspect = Some(l),
                _ => {}
            }
            if seen.ended && (fatal.is_some() || seen.window_fatal.is_some()) {
                return;
            }
        }
    })
    .await;
    // The run exited: a fatal line of its window, or a traceback it logged, is what explains it.
    match fatal.or(seen.window_fatal.take()).or(suspect) {
        Some(line) => Err(seen.fail(Cause::FatalLine { unit: w.unit.clone(), line })),
        None => Err(seen.fail(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Starting, why })),
    }
}

/// How long, after a start died, its fatal line is looked for in the journal. journald may
/// deliver a process's last stderr lines after the manager's "Failed with result" (their streams
/// are read apart): measured on a loaded machine (two test suites at once), an argparse
/// rejection's lines came more than 1 s after it, and the start was called `crashed`, not
/// `fatal_line`. The look ends as soon as the line and the run's end are both seen, so only a
/// crash without any fatal line waits it out.
const FATAL_LOOK: Duration = Duration::from_secs(3);

/// What the follower delivered of the run pdctl started — from the restart's cursor to the
/// manager's "Failed with result" of the first run that started after it (with `Restart=` and a
/// start that fails at once, systemd may have started the next one before pdctl reads the
/// unit's state) —: its last [`LAST_LINES`] messages (pdctl's own left out), oldest first, and
/// its first fatal line by text.
#[derive(Default)]
struct RunLines {
    lines: VecDeque<String>,
    /// The InvocationID of the first run the manager said it was starting.
    first_run: Option<String>,
    /// That run's "Failed with result" was seen.
    ended: bool,
    window_fatal: Option<String>,
}

impl RunLines {
    /// Keep `e`, and judge it.
    fn pushed(&mut self, e: &LogEntry, judge: &Judge) -> Verdict {
        if self.ended {
            // A line of this run journald delivered after the manager's end of it (its stderr
            // stream read late): its fatal line is still its last word, and kept.
            let v = judge.judge(e);
            if matches!(v, Verdict::Fatal(_)) && !e.is_pdctl_own() {
                if self.lines.len() == LAST_LINES {
                    self.lines.pop_front();
                }
                self.lines.push_back(e.message().to_string());
            }
            return v;
        }
        if self.first_run.is_none() {
            self.first_run = judge.manager_message(e, MSG_UNIT_STARTING).map(String::from);
        }
        if !e.is_pdctl_own() {
            if self.lines.len() == LAST_LINES {
                self.lines.pop_front();
            }
            self.lines.push_back(e.message().to_string());
            if self.first_run.is_some() && self.window_fatal.is_none() {
                self.window_fatal = judge.fatal_text(e);
            }
        }
        self.ended = self.first_run.is_some() && judge.manager_message(e, MSG_FAILURE_RESULT) == self.first_run.as_deref();
        judge.judge(e)
    }

    fn fail(self, cause: Cause) -> Fail {
        Fail { last_lines: self.lines.into(), ..Fail::from(cause) }
    }
}
