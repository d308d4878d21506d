//! What a halt leaves: the failure with the unit's last lines, and no drain of this run behind.

use std::time::Duration;

use crate::engine::context::{Ctx, Notes};
use crate::engine::machine::{Engine, LAST_LINES};
use crate::engine::policy::{self, Failed, Rollback};
use crate::engine::step_run::Fail;
use crate::events::{Failure, Sink, Step};
use crate::names::{FLEET, ROUTER};
use crate::ports::{Logs, Probes, Units};

/// After a failed step: a drain this run made is never left behind — each worker it drained
/// (the one rolled, a decode being repaired) is re-admitted if it serves.
pub(in crate::engine) async fn reconcile_drains<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    unit: &str,
    step: Step,
    ctx: Ctx<'_>,
    sink: &Sink,
    notes: &Notes,
) {
    let Some(l) = ctx.writes.ledger else { return };
    // As `after_failure` decides: a failed unit that was restarted is rolled back next.
    let rollback_follows = policy::after_restart(Failed { step, unit }, &eng.settings.rollout, ctx.writes.revisions.is_some()).rollback == Rollback::Yes;
    for d in l.all().0.into_iter().filter(|d| d.rollout_id == ctx.writes.id) {
        let budget = if step == Step::Restart && d.unit == unit { eng.settings.rollout.ready_timeout } else { Duration::ZERO };
        notes.push(match eng.reconcile_as(&d, l, budget, sink, rollback_follows && d.unit == unit).await {
            Ok(n) => n,
            Err(c) => c.sentence(),
        });
    }
}

pub(in crate::engine) async fn failure<U, L: Logs, P>(eng: &Engine<U, L, P>, unit: &str, step: Step, f: Fail) -> Failure {
    let last_lines = if unit == ROUTER || unit == FLEET {
        Vec::new()
    } else if !f.last_lines.is_empty() {
        f.last_lines
    } else {
        settled_last_lines(&eng.logs, unit).await
    };
    Failure::new(unit, step, &f.cause, last_lines)
}

/// The unit's last lines once its journal has settled. A process's own output reaches
/// journald through its stream, the manager's "Failed with result" through the manager's own
/// socket, and journald reads the two apart: read at once, a failed start's last words (an
/// `ExecStartPre=` that printed why and exited 1) can still be on their way. Measured beside a
/// second suite and a build (two cores): an `ExecStartPre=`'s five lines came later than two
/// reads 200 ms apart that agreed without them. So the lines are read again every
/// [`SETTLE_POLL`] until two reads agree and at least [`SETTLE_MIN`] has passed since the
/// first, and for at most [`SETTLE_MAX`]: a failure is said up to 1.5 s later, with its words.
async fn settled_last_lines<L: Logs>(logs: &L, unit: &str) -> Vec<String> {
    let t0 = tokio::time::Instant::now();
    let mut lines = logs.last_lines(unit, LAST_LINES).await.unwrap_or_default();
    while t0.elapsed() < SETTLE_MAX {
        tokio::time::sleep(SETTLE_POLL).await;
        let again = logs.last_lines(unit, LAST_LINES).await.unwrap_or_default();
        if again == lines && t0.elapsed() >= SETTLE_MIN {
            break;
        }
        lines = again;
    }
    lines
}

/// How often a failed unit's last lines are read while they settle.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// How long at least they are read again before two reads that agree are taken as settled.
const SETTLE_MIN: Duration = Duration::from_millis(1500);
/// How long at most.
const SETTLE_MAX: Duration = Duration::from_secs(3);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ports::LogError;

    /// A journal whose stream lines of a failed start arrive `late` after the manager's.
    struct Late {
        t0: std::time::Instant,
        late: Duration,
        inner: crate::fakes::FakeLogs,
    }

    impl Logs for Late {
        type F = <crate::fakes::FakeLogs as Logs>::F;
        async fn tail_cursor(&self) -> Result<Option<String>, LogError> {
            self.inner.tail_cursor().await
        }
        async fn boot_head_cursor(&self, boot_id: &str) -> Result<Option<String>, LogError> {
            self.inner.boot_head_cursor(boot_id).await
        }
        fn follow(&self, cursor: Option<String>, unit: &str) -> Self::F {
            self.inner.follow(cursor, unit)
        }
        async fn last_lines(&self, _unit: &str, _n: usize) -> Result<Vec<String>, LogError> {
            let mut lines = vec!["Starting d.service...".to_string(), "d.service: Failed with result 'exit-code'.".to_string()];
            if self.t0.elapsed() >= self.late {
                lines.insert(1, "ExecStartPre: the model directory is missing".into());
            }
            Ok(lines)
        }
    }

    #[tokio::test]
    async fn a_failed_starts_own_words_that_journald_reads_late_are_among_its_last_lines() {
        let logs = Late { t0: std::time::Instant::now(), late: Duration::from_millis(700), inner: crate::fakes::FakeLogs(crate::fakes::world()) };
        let lines = settled_last_lines(&logs, "d.service").await;
        assert!(lines.iter().any(|l| l.contains("model directory is missing")), "{lines:?}");
    }
}
