//! The ready gate: the ready line of *this* run (its InvocationID and MainPID), failing fast on a
//! fatal line, the manager's failure, or a crash.

use std::time::{Duration, Instant};

use crate::details::ReadyDetail;

use crate::cause::{Cause, Phase};
use crate::config::Worker;
use crate::engine::step_run::Fail;
use crate::engine::Engine;
use crate::ports::{Follow, Logs, Probes, UnitState, Units, Watch};
use crate::sglang::judge::{crashed_since, Judge, Run, Verdict};

pub(in crate::engine) async fn ready<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    cursor: Option<String>,
    watch: &mut U::W,
    after: &UnitState,
) -> Result<ReadyDetail, Fail> {
    let ro = &eng.settings.rollout;
    let judge = Judge {
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
    while crashed.is_none() {
        tokio::select! {
            e = follow.next() => match e {
                None => return Err(Cause::EventSourceClosed { what: "the journal follower".into() }.into()),
                Some(Err(e)) => return Err(Cause::JournalUnreadable { message: e.to_string() }.into()),
                Some(Ok(entry)) => match judge.judge(&entry) {
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
                    Verdict::Fatal(line) => return Err(Cause::FatalLine { unit: w.unit.clone(), line }.into()),
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
                crashed = crashed_since(&st, after);
            }
            _ = &mut deadline => {
                return Err(Cause::ReadyTimeout { unit: w.unit.clone(), pattern: ro.ready_pattern.clone(), after: ro.ready_timeout, foreign }.into())
            }
        }
    }
    // The unit died: look briefly for the fatal line that explains it. Found, the cause is
    // that line (`fatal_line`), whichever of the two arrived first: an argparse rejection
    // is always `fatal_line`, never `crashed` by a race between journald and systemd.
    let why = crashed.unwrap_or_default();
    let fatal = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(e)) = follow.next().await {
            match judge.judge(&e) {
                Verdict::Fatal(l) => return Some(l),
                Verdict::Suspect(l) if suspect.is_none() => suspect = Some(l),
                _ => {}
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    // The run exited: a traceback it logged is what explains it.
    .or(suspect);
    match fatal {
        Some(line) => Err(Cause::FatalLine { unit: w.unit.clone(), line }.into()),
        None => Err(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Starting, why }.into()),
    }
}
