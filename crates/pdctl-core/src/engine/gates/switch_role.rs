//! The role step of `pdctl role set`, after the worker's drain: its unit's role drop-in written
//! and the manager reloaded (what the undo needs is kept first, in [`Undo`]), then — on the
//! runtime path — SGLang asked to check every precondition (`prepare_only`) and to switch. On the
//! restart path the restart that follows starts it in its new role.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::gates::Restarted;
use crate::engine::machine::Engine;
use crate::engine::step_run::{lock, Fail, Verdict};
use crate::ports::{Probes, Units};
use crate::sglang::role_switch::{self, Ask, SwitchPath, Way};
use crate::state::role_dropin;

/// A worker changing role: as it runs now, which way it changes, and what to undo if it fails.
#[derive(Clone, Copy)]
pub(in crate::engine) struct RoleChange<'a> {
    /// The worker as it runs now (its old role): drained as such.
    pub(in crate::engine) was: &'a Worker,
    /// Runtime switch (with the graphs' footprint to give), or restart.
    pub(in crate::engine) way: &'a Way,
    /// Written by the step before each side effect.
    pub(in crate::engine) undo: &'a Mutex<Undo>,
}

/// What a failed change of role leaves to undo.
#[derive(Debug, Default, Clone)]
pub(in crate::engine) struct Undo {
    /// The drop-in written, and what was at its place before.
    pub(in crate::engine) dropin: Option<(PathBuf, role_dropin::Before)>,
    /// The server was asked to switch and may have torn its old role down (`safe_to_restore`
    /// false, or no answer), or a restart into the new role follows: only a restart in the old
    /// role is sure to bring it back.
    pub(in crate::engine) torn_down: bool,
}

/// The role step's detail.
#[derive(serde::Serialize)]
pub(in crate::engine) struct RoleDetail {
    /// The role it ran.
    from: &'static str,
    /// The role it runs now (runtime), or starts with (restart).
    to: &'static str,
    /// `runtime` or `restart`.
    path: &'static str,
    /// Why it is restarted rather than switched.
    #[serde(skip_serializing_if = "Option::is_none")]
    restart_because: Option<String>,
    /// The drop-in written.
    drop_in: String,
    /// The decode CUDA graphs' footprint given to SGLang (a flip to decode at run time).
    #[serde(skip_serializing_if = "Option::is_none")]
    graph_memory_gb: Option<f64>,
    /// How long SGLang's switch took (its teardown and rebuild).
    #[serde(skip_serializing_if = "Option::is_none")]
    switch_ms: Option<u64>,
}

/// The role step of `w` (the worker in its new role). `in_gateway`: its drain left the taking
/// out to a stop (the only worker of its role): a runtime switch is refused then (SGLang
/// switches only an idle server). Returns the run the later gates hold it to on the runtime
/// path, `None` when a restart follows.
pub(in crate::engine) async fn change<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    c: RoleChange<'_>,
    in_gateway: bool,
) -> Result<(Verdict<RoleDetail>, Option<Restarted<U::W>>), Fail> {
    let unit = w.unit.as_str();
    let cfg = eng.units.config(unit).await?;
    let [argv] = cfg.exec_start_words.as_slice() else {
        return Err(Cause::BadRequest {
            message: format!("{unit} has {} ExecStart= commands: pdctl role set changes a unit with one", cfg.exec_start_words.len()),
        }
        .into());
    };
    let path = role_dropin::path(unit, &cfg.fragment_path);
    let text = role_dropin::text(unit, w.role, argv);
    let unwritable = |e: std::io::Error| Fail::from(Cause::RecordUnwritable { dir: path.display().to_string(), error: e.to_string() });
    // What was there is known before the write: a failure after it puts that back.
    let before = std::fs::read_to_string(&path).ok();
    lock(c.undo).dropin = Some((path.clone(), before));
    role_dropin::write(&path, &text).map_err(unwritable)?;
    eng.units.reload().await?;
    let mut detail = RoleDetail {
        from: c.was.role.as_str(),
        to: w.role.as_str(),
        path: "restart",
        restart_because: None,
        drop_in: path.display().to_string(),
        graph_memory_gb: c.way.graph_memory_gb,
        switch_ms: None,
    };
    if let SwitchPath::Restart(why) = &c.way.path {
        // The restart that follows runs the new role: from here only a restart brings the old
        // one back.
        lock(c.undo).torn_down = true;
        detail.restart_because = Some(why.clone());
        return Ok((Verdict::passed(detail), None));
    }
    detail.path = "runtime";
    if in_gateway {
        return Err(failed(w, "it is the only worker of its role in the gateway, which keeps it until a stop: SGLang switches only an idle server".into()));
    }
    let limit = eng.settings.rollout.ready_timeout;
    let watch = eng.units.watch(unit).await?;
    // Every precondition on every DP worker first; nothing is torn down by it. A flip to decode
    // that has not captured decode graphs must be told their footprint (0.5.23 asks even with
    // --disable-cuda-graph): measured on a serving decode, or 0 with that flag ([`way`]).
    let ask = Ask { new_role: w.role, graph_memory_gb: c.way.graph_memory_gb, prepare_only: true };
    let said = eng.probes.role_switch(&w.url, &ask, limit).await.map_err(|e| failed(w, format!("its preparation check did not answer: {e}")))?;
    if let Some(r) = said.refusal() {
        return Err(failed(w, format!("its preparation check refused ({r:?}): {}", said.message)));
    }
    let t0 = Instant::now();
    lock(c.undo).torn_down = true;
    let said = eng.probes.role_switch(&w.url, &Ask { prepare_only: false, ..ask }, limit).await.map_err(|e| failed(w, format!("no answer: {e}")))?;
    if let Some(r) = said.refusal() {
        lock(c.undo).torn_down = !(r.safe_to_restore() || said.safe_to_restore);
        return Err(failed(w, said.message));
    }
    detail.switch_ms = Some(t0.elapsed().as_millis() as u64);
    let after = eng.units.state(unit).await?;
    let run = Restarted { watch, cursor: None, after, taken_out: None, ran_through: true };
    Ok((Verdict::passed(detail), Some(run)))
}

/// `w`'s switch failed with `message`.
fn failed(w: &Worker, message: String) -> Fail {
    Cause::RoleSwitchFailed { unit: w.unit.clone(), url: w.url.clone(), to: w.role.as_str().into(), message }.into()
}

/// The way `was` changes to `to`: at run time when the server runs with `--enable-pd-role-switch`
/// and a backend that can, a flip to decode then given its graphs' footprint (0 with
/// `--disable-cuda-graph`, else the largest a serving decode of this host reports); else a
/// restart, and why.
pub(in crate::engine) async fn way<U, L, P: Probes>(eng: &Engine<U, L, P>, was: &Worker, to: Role) -> Way {
    let restart = |why: String| Way { path: SwitchPath::Restart(why), graph_memory_gb: None };
    let info = match eng.probes.server_info(&was.url).await {
        Ok(i) => i,
        Err(e) => return restart(format!("its /server_info did not answer ({e})")),
    };
    let launch = crate::sglang::launch_argv(&info);
    let backend = info.get("disaggregation_transfer_backend").and_then(|b| b.as_str());
    let path = role_switch::path_for(launch.as_deref(), backend, role_switch::Radix::of(&info), to);
    if path != SwitchPath::Runtime || to != Role::Decode {
        return Way { path, graph_memory_gb: None };
    }
    if !launch.as_deref().is_some_and(|a| role_switch::captures_graphs(a, to)) {
        return Way { path, graph_memory_gb: Some(0.0) };
    }
    let mut measured: Option<f64> = None;
    for peer in eng.settings.workers.iter().filter(|p| p.role == Role::Decode && p.unit != was.unit) {
        if let Ok(Some(gb)) = eng.probes.decode_graph_gb(&peer.url).await {
            measured = Some(measured.map_or(gb, |m: f64| m.max(gb)));
        }
    }
    match measured {
        Some(gb) => Way { path, graph_memory_gb: Some(gb) },
        None => restart(
            "as a decode it captures CUDA graphs and no serving decode of this host reports their footprint (sglang:graph_memory_usage_gb), which SGLang needs first".into(),
        ),
    }
}
