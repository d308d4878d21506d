//! What a PD worker's change can break in its pairs, found before anything restarts: its new
//! transfer settings against each running peer's (`pairing_preflight`: a change that would break
//! every transfer is refused), and a change of the model it computes with while its peers run
//! the old one (`coherence_preflight`: refused as `mixed_versions`, rolled as a coherent switch,
//! or restarted together).

use serde::Serialize;
use serde_json::Value;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Ctx, Outage};
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, Fail};
use crate::plan::Plan;
use crate::ports::{Probes, Units};

/// Does this restart change the model a PD worker computes with ([`crate::sglang::coherence`])? While
/// workers of the other role run the old one, a rolling restart would pair the versions:
/// refused (`mixed_versions`), unless `coherent = "never"` (a warning then) or a 1P1D pair
/// is restarted together (both at once: no old worker serves while a new one does).
pub(in crate::engine) async fn coherence_preflight<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    plan: &Plan,
    cfg: &crate::ports::UnitConfig,
    disk_argv: Option<&[String]>,
    ctx: Ctx<'_>,
) -> Result<Option<(String, Option<String>)>, Fail> {
    use crate::config::Coherent;
    // `check` restarts nothing; a regular worker pairs with no one.
    if ctx.outage == Outage::Check || w.role == Role::Regular {
        return Ok(None);
    }
    let Some(argv) = disk_argv.or(cfg.exec_start.first().map(Vec::as_slice)) else { return Ok(None) };
    // This host's peers, and with [fleet] the other hosts' the gateway lists: behind one
    // gateway any prefill pairs with any decode.
    let remote: Vec<Worker> = gates::slot::remote_peers(eng, w).await.into_iter().map(|(p, _)| p).collect();
    let peers: Vec<&Worker> = gates::pair::peers(eng, w).into_iter().chain(remote.iter()).collect();
    if peers.is_empty() {
        return Ok(None);
    }
    // A server that does not answer runs nothing to compare with (its own gates say so).
    let Some(running) = computes_with(eng, &w.url).await else { return Ok(None) };
    let mut extra = eng.settings.rollout.coherent_flags.clone();
    if eng.settings.rollout.coherent == Coherent::Always {
        extra.extend(crate::sglang::coherence::given_flags(argv));
        extra.extend(running.asked.iter().flat_map(|a| crate::sglang::coherence::given_flags(a)));
    }
    let changes = model_changes(argv, &running, &extra).await;
    if changes.is_empty() {
        return Ok(None);
    }
    let said: Vec<String> = changes.iter().map(|c| c.sentence()).collect();
    let names: Vec<&str> = peers.iter().map(|p| p.unit.as_str()).collect();
    let together = eng.settings.rollout.single_pair == crate::config::SinglePair::Together
        && plan.workers.len() == 2
        && peers.len() == 1
        && remote.is_empty()
        && plan.workers.iter().any(|x| x.unit == peers[0].unit);
    if together {
        return Ok(Some((
            format!(
                "{} changes the model it computes with ({}); restarted together with {}, no request pairs the two versions",
                w.unit,
                said.join("; "),
                names.join(", ")
            ),
            None,
        )));
    }
    // The peers that serve next to it (not held out by a coherent switch) already run what
    // it will: its restart joins them (the rest of an interrupted switch).
    let held = |u: &str| ctx.writes.ledger.and_then(|l| l.get(u)).is_some_and(|d| d.hold.is_some());
    let serving: Vec<&&Worker> = peers.iter().filter(|p| !held(&p.unit)).collect();
    let mut all_new = !serving.is_empty();
    for p in &serving {
        all_new &= match computes_with(eng, &p.url).await {
            Some(i) => model_changes(argv, &i, &extra).await.is_empty(),
            None => false,
        };
    }
    if all_new {
        return Ok(Some((
            format!(
                "{} changes the model it computes with ({}) to what {} already run: no request pairs two models",
                w.unit,
                said.join("; "),
                serving.iter().map(|p| p.unit.as_str()).collect::<Vec<_>>().join(", ")
            ),
            None,
        )));
    }
    not_coherent(eng, w, plan, ctx, &changes, &said, &names).map_err(|f| *f)
}

/// What preflight says of a model change, where it lets it through: the sentence, and the
/// coherent switch's plan on the worker that first needs it.
type Coherence = Option<(String, Option<String>)>;

/// A model change its serving peers do not run yet: said and let through (`coherent =
/// "never"`), rolled as a coherent switch (the plan said on the first worker that needs it), or
/// refused (`Err`: `mixed_versions`, with why no switch where one was asked of the plan).
fn not_coherent<U, L, P>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    plan: &Plan,
    ctx: Ctx<'_>,
    changes: &[crate::sglang::coherence::FlagChange],
    said: &[String],
    names: &[&str],
) -> Result<Coherence, Box<Fail>> {
    use crate::config::Coherent;
    if eng.settings.rollout.coherent == Coherent::Never {
        return Ok(Some((format!(
            "mixed versions (coherent = \"never\"): {} changes the model it computes with ({}); until {} are restarted too, PD requests pairing them decode KV their own model did not compute",
            w.unit,
            said.join("; "),
            names.join(", ")
        ), None)));
    }
    // The plan is said once, on the first worker that needs the switch.
    let switch = ctx.scope.switch.map(|sw| match &sw.groups {
        Ok(g) => Ok((!sw.needed.swap(true, std::sync::atomic::Ordering::SeqCst)).then(|| g.sentence(&plan.workers.iter().collect::<Vec<_>>()))),
        Err(why) => Err(why.clone()),
    });
    match switch {
        Some(Ok(how)) => Ok(Some((format!("{} changes the model it computes with ({}): rolled as a coherent switch", w.unit, said.join("; ")), how))),
        why_not => Err(Box::new(Fail {
            cause: Cause::MixedVersions { unit: w.unit.clone(), changes: said.join("; "), peers: names.join(", ") },
            detail: detail_of(&ModelChanges { changes, switch_refused: why_not.and_then(Result::err) }),
            unit: None,
            last_lines: Vec::new(),
        })),
    }
}

/// What a server computes with: what it was asked at its start (`/server_info`'s
/// `launch_command`), corrected by `/model_info` for a weight update loaded since (0.5.23
/// `http_server.py`); `None`: it does not answer.
async fn computes_with<U, L, P: Probes>(eng: &Engine<U, L, P>, url: &str) -> Option<crate::sglang::coherence::Running> {
    let info = eng.probes.server_info(url).await.ok()?;
    Some(crate::sglang::coherence::Running::new(info, eng.probes.model_info(url).await.ok()))
}

/// Preflight of a PD worker: the settings its ExecStart asks for are compared with what each
/// peer of the other role was asked (`/server_info`'s `launch_command`, its reported values
/// where it has none; for a peer restarted together with it, the peer's ExecStart), so that a
/// change that would break every transfer is refused before anything is touched. Asked is
/// compared with asked: 0.5.23 reports resolved values (`mooncake_tcp` as `mooncake`), which
/// an unchanged ExecStart does not spell.
pub(in crate::engine) async fn pairing_preflight<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    plan: &Plan,
    cfg: &crate::ports::UnitConfig,
) -> Result<Value, Fail> {
    use crate::sglang::pairing::{compare, describe, settings_of_argv, settings_of_info};
    let Some(argv) = cfg.exec_start.first().filter(|_| eng.settings.verify.pair && w.role != Role::Regular) else {
        return Ok(Value::Null);
    };
    let ours = settings_of_argv(argv);
    let together = eng.settings.rollout.single_pair == crate::config::SinglePair::Together && plan.workers.len() == 2;
    let mut checked = Vec::new();
    for peer in gates::pair::peers(eng, w) {
        let theirs = if together && plan.workers.iter().any(|x| x.unit == peer.unit) {
            eng.units.config(&peer.unit).await.ok().and_then(|c| c.exec_start.first().map(|a| settings_of_argv(a)))
        } else {
            // What the running peer was asked, read as our ExecStart is; its resolved values
            // only where it does not report that.
            eng.probes.server_info(&peer.url).await.ok().map(|v| match crate::sglang::launch_argv(&v) {
                Some(asked) => settings_of_argv(&asked),
                None => settings_of_info(&v),
            })
        };
        let Some(theirs) = theirs else {
            checked.push(PeerCompared { peer: &peer.unit, compared: false, why: Some("its settings could not be read"), settings: None });
            continue;
        };
        let m = compare(&ours, &theirs);
        if !m.is_empty() {
            return Err(Fail {
                cause: Cause::IncompatibleChange {
                    unit: w.unit.clone(),
                    peer: peer.unit.clone(),
                    detail: describe(&m, &format!("{} new", w.unit), &format!("{} running", peer.unit)),
                },
                detail: detail_of(&Mismatches { mismatches: &m }),
                unit: None,
                last_lines: Vec::new(),
            });
        }
        checked.push(PeerCompared { peer: &peer.unit, compared: true, why: None, settings: Some(ours.clone()) });
    }
    Ok(detail_of(&checked))
}

/// [`crate::sglang::coherence::changes`], less a tokenizer named by another path that holds the same
/// tokenizer files ([`crate::sglang::tokenizer::same`], read off the async threads): after new weights
/// were loaded in place with the tokenizer unpinned, the files name the new path's tokenizer
/// while the server runs its start's — the same one when the files are the same.
async fn model_changes(argv: &[String], running: &crate::sglang::coherence::Running, extra: &[String]) -> Vec<crate::sglang::coherence::FlagChange> {
    let mut out = crate::sglang::coherence::changes(argv, running, extra);
    if let Some(i) = out.iter().position(|c| c.flag == "--tokenizer-path") {
        let (a, b) = (out[i].running.clone(), out[i].new.clone());
        if tokio::task::spawn_blocking(move || crate::sglang::tokenizer::same(&a, &b)).await.is_ok_and(|r| r.is_ok()) {
            out.remove(i);
        }
    }
    out
}

/// A model change refused (`mixed_versions`): the flags that change, and why no coherent switch.
#[derive(Serialize)]
struct ModelChanges<'a> {
    changes: &'a [crate::sglang::coherence::FlagChange],
    switch_refused: Option<String>,
}

/// One peer's pairing settings compared with the new ExecStart's (`settings`), or why not.
#[derive(Serialize)]
struct PeerCompared<'a> {
    peer: &'a str,
    compared: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    settings: Option<crate::sglang::pairing::PairSettings>,
}

/// A change its peers cannot pair with: the settings that differ.
#[derive(Serialize)]
struct Mismatches<'a> {
    mismatches: &'a [crate::sglang::pairing::Mismatch],
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_pd_checks_details_have_the_keys_of_the_contract() {
        let unread = PeerCompared { peer: "d", compared: false, why: Some("its settings could not be read"), settings: None };
        assert_eq!(detail_of(&unread), json!({"peer": "d", "compared": false, "why": "its settings could not be read"}));
        assert_eq!(detail_of(&ModelChanges { changes: &[], switch_refused: None }), json!({"changes": [], "switch_refused": null}));
        assert_eq!(detail_of(&Mismatches { mismatches: &[] }), json!({"mismatches": []}));
    }
}
