//! What a halt leaves: the failure with the unit's last lines, and no drain of this run behind.

use std::time::Duration;

use crate::engine::context::Ctx;
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
    notes: &mut Vec<String>,
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

pub(in crate::engine) async fn failure<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, unit: &str, step: Step, f: Fail) -> Failure {
    let last_lines = if unit == ROUTER || unit == FLEET {
        Vec::new()
    } else if !f.last_lines.is_empty() {
        f.last_lines
    } else {
        settled_last_lines(eng, unit).await
    };
    Failure::new(unit, step, &f.cause, last_lines)
}

/// The unit's last lines once its journal has settled. A process's own output reaches
/// journald through its stream, the manager's "Failed with result" through the manager: read
/// at once, a failed start's last words (an `ExecStartPre=` that printed why) can still be
/// on their way. Read again every 200 ms until two reads agree (at most 2 s).
async fn settled_last_lines<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, unit: &str) -> Vec<String> {
    let mut lines = eng.logs.last_lines(unit, LAST_LINES).await.unwrap_or_default();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = eng.logs.last_lines(unit, LAST_LINES).await.unwrap_or_default();
        if again == lines {
            break;
        }
        lines = again;
    }
    lines
}
