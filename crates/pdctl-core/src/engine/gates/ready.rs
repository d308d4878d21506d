//! The ready gate: the ready line of *this* run (its InvocationID and MainPID), failing fast on a
//! fatal line, the manager's failure, or a crash.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::details::ReadyDetail;

use crate::cause::{Cause, Phase};
use crate::config::Worker;
use crate::engine::machine::{Engine, LAST_LINES};
use crate::engine::step_run::Fail;
use crate::ports::{Follow, LogEntry, Logs, UnitState, Units, Watch};
use crate::sglang::judge::{crashed_since, Judge, Run, Verdict, MSG_FAILURE_RESULT, MSG_UNIT_STARTING};

pub(in crate::engine) async fn ready<U: Units, L: Logs, P>(
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
    Err(died(&mut follow, seen, &judge, suspect, crashed.unwrap_or_default(), w).await)
}

/// The run died (`why`): look briefly (up to [`FATAL_LOOK`]) for the fatal line that explains it.
/// Found, the cause is that line (`fatal_line`), whichever of the two arrived first: an argparse
/// rejection is always `fatal_line`, never `crashed` by a race between journald and systemd.
/// The failure's last lines end where the run ended: at the manager's "Failed with result" (a
/// line of this run that journald delivers later still counts; the next start's do not).
async fn died(follow: &mut impl Follow, mut seen: RunLines, judge: &Judge, mut suspect: Option<String>, why: String, w: &Worker) -> Fail {
    let mut fatal: Option<String> = None;
    let _ = tokio::time::timeout(FATAL_LOOK, async {
        while let Some(Ok(e)) = follow.next().await {
            match seen.pushed(&e, judge) {
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
        Some(line) => seen.fail(Cause::FatalLine { unit: w.unit.clone(), line }),
        None => seen.fail(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Starting, why }),
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
    /// The runs the manager said it was starting after that first one (`Restart=`).
    later_runs: Vec<String>,
}

impl RunLines {
    /// Keep `e`, and judge it.
    fn pushed(&mut self, e: &LogEntry, judge: &Judge) -> Verdict {
        if let Some(inv) = judge.manager_message(e, MSG_UNIT_STARTING) {
            match &self.first_run {
                None => self.first_run = Some(inv.to_string()),
                Some(first) if first != inv && !self.later_runs.iter().any(|r| r == inv) => self.later_runs.push(inv.to_string()),
                Some(_) => {}
            }
        }
        if self.ended {
            // A line journald delivered after the manager's end of the run (its stderr stream
            // read late): the run's fatal line is still its last word, and kept.
            let v = judge.judge(e);
            let late = match &v {
                Verdict::Fatal(l) => Some(l.clone()),
                _ => self.late_word(e, judge),
            };
            if let Some(line) = late {
                if self.lines.len() == LAST_LINES {
                    self.lines.pop_front();
                }
                self.lines.push_back(e.message().to_string());
                self.window_fatal = self.window_fatal.take().or(Some(line));
            }
            return v;
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

    /// A fatal line, delivered after the first run ended, that is that run's own. Where journald
    /// recorded the line's InvocationID, it decides. Where it did not (user managers of systemd
    /// 252), the PID decides: when pdctl judges that same run, the line must be its process's;
    /// when systemd had already started the next run before pdctl read the unit (`Restart=`
    /// after a start that failed at once), the first run's PID was never seen, so a line that is
    /// not the judged run's is the first run's — while no third run has started.
    fn late_word(&self, e: &LogEntry, judge: &Judge) -> Option<String> {
        let first = self.first_run.as_deref()?;
        if e.is_pdctl_own() {
            return None;
        }
        let text = judge.fatal_text(e)?;
        let ours = match e.get("_SYSTEMD_INVOCATION_ID") {
            Some(inv) if inv == first => true,
            // On systemd 239-244 a user unit's lines carry user@UID.service's id.
            Some(_) if e.get("_SYSTEMD_USER_UNIT").is_none() => false,
            _ if judge.run.invocation_id == first => judge.of_this_run(e),
            _ => self.later_runs.len() <= 1 && !judge.of_this_run(e),
        };
        ours.then_some(text)
    }

    fn fail(self, cause: Cause) -> Fail {
        Fail { last_lines: self.lines.into(), ..Fail::from(cause) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sglang::judge::testing::{entry, judge};
    use crate::sglang::judge::{MSG_FAILURE_RESULT, MSG_UNIT_STARTING};

    fn manager(id: &str, inv: &str, msg: &str) -> LogEntry {
        entry(&[("MESSAGE", msg), ("MESSAGE_ID", id), ("USER_INVOCATION_ID", inv), ("_UID", "0")])
    }

    const ARGPARSE: &str = "launch_server.py: error: unrecognized arguments: --enable-turbo-mode";

    /// Run 1 (pdctl's start) fails at once; systemd starts run 2 before pdctl reads the unit, so
    /// pdctl judges run 2 (PID 200); run 1's argparse line (PID 150) arrives after its end.
    fn run_1_then_late(judged: &Judge, late: &LogEntry) -> RunLines {
        let mut seen = RunLines::default();
        for e in [
            manager(MSG_UNIT_STARTING, "r1", "Starting p.service..."),
            entry(&[("MESSAGE", "start number 1"), ("_PID", "140")]),
            manager(MSG_FAILURE_RESULT, "r1", "p.service: Failed with result 'exit-code'."),
            manager(MSG_UNIT_STARTING, "r2", "Starting p.service..."),
        ] {
            seen.pushed(&e, judged);
        }
        assert!(seen.ended && seen.window_fatal.is_none());
        seen.pushed(late, judged);
        seen
    }

    #[test]
    fn a_late_fatal_line_of_the_first_run_counts_when_pdctl_already_judges_the_next_run() {
        let seen = run_1_then_late(&judge("r2", 200), &entry(&[("MESSAGE", ARGPARSE), ("_PID", "150")]));
        assert!(seen.window_fatal.as_deref().is_some_and(|l| l.contains("unrecognized arguments")), "run 1's own last word");
        assert_eq!(seen.lines.back().map(String::as_str), Some(ARGPARSE), "among its last lines");
    }

    #[test]
    fn a_late_line_of_another_run_does_not() {
        // Judging run 1 itself (PID 150): a line of PID 300 is a later run's, not run 1's.
        let mut seen = RunLines::default();
        let j = judge("r1", 150);
        for e in [manager(MSG_UNIT_STARTING, "r1", "Starting"), manager(MSG_FAILURE_RESULT, "r1", "Failed")] {
            seen.pushed(&e, &j);
        }
        seen.pushed(&entry(&[("MESSAGE", ARGPARSE), ("_PID", "300")]), &j);
        assert!(seen.window_fatal.is_none(), "a later run's line");
        seen.pushed(&entry(&[("MESSAGE", ARGPARSE), ("_PID", "150")]), &j);
        assert!(seen.window_fatal.is_some(), "run 1's own, late");
        // Where journald records the InvocationID, it decides.
        let seen = run_1_then_late(&judge("r2", 200), &entry(&[("MESSAGE", ARGPARSE), ("_PID", "150"), ("_SYSTEMD_INVOCATION_ID", "r9")]));
        assert!(seen.window_fatal.is_none(), "another run's by its InvocationID");
        let seen = run_1_then_late(&judge("r2", 200), &entry(&[("MESSAGE", ARGPARSE), ("_PID", "150"), ("_SYSTEMD_INVOCATION_ID", "r1")]));
        assert!(seen.window_fatal.is_some(), "run 1's by its InvocationID");
        // The judged run's own line is its Fatal verdict, not the first run's late word; a third
        // run's start ends the attribution by PID.
        let mut seen = run_1_then_late(&judge("r2", 200), &entry(&[("MESSAGE", "unrelated"), ("_PID", "150")]));
        seen.pushed(&manager(MSG_UNIT_STARTING, "r3", "Starting"), &judge("r2", 200));
        seen.pushed(&entry(&[("MESSAGE", ARGPARSE), ("_PID", "400")]), &judge("r2", 200));
        assert!(seen.window_fatal.is_none(), "a third run's line");
    }
}
