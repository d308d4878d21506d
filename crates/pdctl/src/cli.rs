//! The command line as clap parses it: every verb, its options and their help (the man pages are
//! generated from these).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "pdctl", version, about = "Safe rolling restarts of SGLang units on systemd hosts")]
pub(crate) struct Cli {
    /// Main config file (default: $PDCTL_CONFIG, else /etc/pdctl/pdctl.toml; config.d/*.toml next
    /// to it is merged in name order).
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    /// pdctld's control socket.
    #[arg(long, global = true, value_name = "PATH", env = "PDCTL_SOCKET", default_value = "/run/pdctl/pdctl.sock")]
    pub(crate) socket: PathBuf,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Restart workers one at a time, each gated on journald readiness, /health, router
    /// re-admission, KV metrics and a soak (run by pdctld; --dry-run runs here).
    Restart(RestartArgs),
    /// Rollouts run by pdctld: config rollouts, watch, abort, resume, history.
    #[command(subcommand)]
    Rollout(RolloutCmd),
    /// Run every gate except restart and soak on every worker, changing nothing.
    Check(OutputArgs),
    /// Show each worker: unit state, invocation, router view, KV usage, requests.
    Status(OutputArgs),
    /// Print (or --write) the drop-in that lets the hardened pdctld.service reach the addresses
    /// its config names on other hosts (etcd, the gateway, workers).
    UnitDropin {
        /// Write it to /etc/systemd/system/pdctld.service.d/50-pdctl-addresses.conf.
        #[arg(long)]
        write: bool,
    },
    /// Print (or --write) the polkit rule that lets pdctld, run as its own account (not root),
    /// start, stop and restart exactly the configured units and reload systemd; nothing else.
    PolkitRule {
        /// The account pdctld.service runs as (`User=` of its drop-in).
        #[arg(long, default_value = "pdctl", value_name = "NAME")]
        user: String,
        /// Write it to /etc/polkit-1/rules.d/50-pdctl.rules.
        #[arg(long)]
        write: bool,
    },
    /// Print a shell completion script (bash, zsh or fish) generated from this CLI's definition.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (pdctl.1 and one per subcommand) into DIR (packaging).
    #[command(hide = true)]
    Man {
        /// Where to write them.
        dir: PathBuf,
    },
    /// Many hosts behind one gateway, coordinated through etcd ([fleet] in the config).
    #[command(subcommand)]
    Fleet(FleetCmd),
    /// Host maintenance (a driver, CUDA or kernel update that reboots the host): drain it under
    /// the fleet's budget before the reboot, resume it through every gate after.
    #[command(subcommand)]
    Host(HostCmd),
    /// Change workers between prefill and decode (the P:D ratio), each through every gate.
    #[command(subcommand)]
    Role(RoleCmd),
    /// Print completion candidates, one a line (used by the bash completion script): the
    /// configured units, or pdctld's rollout ids, newest first.
    #[command(hide = true, name = "__complete")]
    Candidates {
        /// `units` or `rollouts`.
        what: String,
    },
}

#[derive(Subcommand)]
pub(crate) enum RoleCmd {
    /// One worker to a role (`pdctl role set UNIT prefill|decode`), or this host's PD workers to a
    /// ratio (`--ratio 3:1`; pdctl chooses which flip, the least busy first). Each is drained in
    /// its old role, given its unit's role drop-in (a revision like any change), switched at run
    /// time when its server runs with --enable-pd-role-switch (else restarted), and verified in
    /// its new role: health, pairs, gateway, metrics, soak. Run by pdctld.
    Set {
        /// The worker.
        #[arg(required_unless_present = "ratio", conflicts_with = "ratio")]
        unit: Option<String>,
        /// Its new role: prefill or decode.
        #[arg(required_unless_present = "ratio", value_parser = ["prefill", "decode"])]
        role: Option<String>,
        /// This host's PD workers as P:D.
        #[arg(long, value_name = "P:D")]
        ratio: Option<String>,
        /// Say which workers flip and which way (run-time switch or restart); touch nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why (kept in the rollout's record with who started it).
        #[arg(long)]
        reason: Option<String>,
        /// One JSON object per line (events, then a summary).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum HostCmd {
    /// Before a reboot: a slot for every worker of this host in its role's budget (with [fleet]:
    /// in one etcd transaction, the semaphore restarts take), each worker out of the gateway and
    /// stopped (decodes first), the host recorded as in maintenance. The slots stay held until
    /// `pdctl host resume` passed.
    Drain {
        /// Say what it would do and whether it would wait or be refused; touch nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        start: StartArgs,
    },
    /// After the reboot: each worker started if the boot did not, through its ready line of
    /// this run, health, pair, router, metrics, stranded KV and the soak; then the slots given
    /// back. pdctld runs it by itself at its start after a reboot.
    Resume {
        /// Why (kept in the record).
        #[arg(long)]
        reason: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// This host's maintenance, the FleetLock endpoint, and whether a maintenance may begin now.
    Status(OutputArgs),
}

#[derive(Subcommand)]
pub(crate) enum FleetCmd {
    /// Restart every host's workers, each host through its own gates, coordinated by the
    /// fleet's slots (asked of this host's pdctld, which writes the request for every pdctld).
    Restart {
        /// Restart units one at a time (required to say so).
        #[arg(long)]
        rolling: bool,
        /// Only these hosts (repeatable; default: every host alive now).
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Accept taking the only worker of a role (fleet-wide, as the router sees it) down.
        #[arg(long)]
        allow_outage: bool,
        /// Restart even where a worker's files changed since its process started (see
        /// `pdctl restart --load-changes`).
        #[arg(long)]
        load_changes: bool,
        /// Why (kept with who started it).
        #[arg(long)]
        reason: Option<String>,
        /// One JSON object per line (events with a `host` field, then the fleet summary).
        #[arg(long)]
        json: bool,
    },
    /// New weights into every worker of every host at once, without a restart: each host pauses
    /// its workers, then all load PATH, then — once every host serves it — all continue (steps in
    /// etcd); a host that fails makes every host load its previous weights back. Requests wait for
    /// the load (fleet-wide) instead of failing; no request pairs two versions.
    Weights {
        /// The checkpoint (an absolute path every host's servers read).
        #[arg(long, value_hint = clap::ValueHint::AnyPath, value_parser = model_path_arg)]
        model_path: String,
        /// Its version (SGLang's weight_version), verified on every worker.
        #[arg(long)]
        version: Option<String>,
        /// Only these hosts (repeatable; default: every host alive now).
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Why (kept with who started it).
        #[arg(long)]
        reason: Option<String>,
        /// One JSON object per line (events with a `host` field, then the fleet summary).
        #[arg(long)]
        json: bool,
    },
    /// Follow a fleet rollout: every host's events, then the fleet summary.
    Watch {
        /// The fleet rollout id.
        #[arg(value_hint = clap::ValueHint::Other)]
        id: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Every live host (its rollout, workers' state and KV usage), the slots and their holders,
    /// and whether the fleet is paused.
    Status(OutputArgs),
    /// Give back a dead host's slots (HOLDER is `host/unit` or `host`); refused while that host
    /// is alive unless --force.
    Release {
        /// `host/unit` (one holder) or `host` prefix as `pdctl fleet status` shows it.
        holder: String,
        /// Release even though the holder's host is alive.
        #[arg(long)]
        force: bool,
    },
    /// Grant no new slot anywhere in the fleet (a freeze during an incident); units in progress
    /// finish.
    Pause {
        /// Why (shown to every waiting rollout).
        #[arg(long)]
        reason: String,
    },
    /// Grant slots again.
    Unpause,
}

#[derive(Args)]
pub(crate) struct RestartArgs {
    /// Restart units one at a time (the only mode pdctl has; required to say so).
    #[arg(long)]
    pub(crate) rolling: bool,
    /// Only these units (repeatable), in rollout order.
    #[arg(long = "unit", value_name = "UNIT", value_hint = clap::ValueHint::Other)]
    pub(crate) units: Vec<String>,
    /// Print the plan and the preflight verdict; touch nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Restart even where the unit's files changed since its process started (drop-ins systemd
    /// has not loaded, edited EnvironmentFiles, a change quarantined after it failed): the
    /// restart loads them. Without it such a worker is refused (`changes_pending`); `pdctl
    /// rollout apply` rolls changes out with rollback.
    #[arg(long)]
    pub(crate) load_changes: bool,
    #[command(flatten)]
    pub(crate) start: StartArgs,
}

/// What every command that starts a rollout on this host takes.
#[derive(Args)]
pub(crate) struct StartArgs {
    /// Accept taking the only worker of a role down (serving stops while it restarts).
    #[arg(long)]
    pub(crate) allow_outage: bool,
    /// Why (kept in the rollout's record with who started it).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    /// One JSON object per line (events, then a summary).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand)]
pub(crate) enum RolloutCmd {
    /// Which workers are stale (unit file, drop-ins, EnvironmentFiles or watch_files changed since
    /// their last verified start, or NeedDaemonReload) and why.
    Diff(OutputArgs),
    /// Reload the manager if needed and roll the stale workers through every gate.
    Apply {
        /// Do nothing (and exit 0) when no worker is stale.
        #[arg(long)]
        if_changed: bool,
        /// Roll every worker, stale or not.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        start: StartArgs,
    },
    /// Follow a rollout from its first event (re-attach after Ctrl-C).
    Watch {
        /// The rollout id (`r` and digits, as `rollout history` lists them).
        #[arg(value_hint = clap::ValueHint::Other, value_parser = rollout_id_arg)]
        id: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Stop a rollout after the unit in progress is verified.
    Abort {
        /// The rollout id.
        #[arg(value_hint = clap::ValueHint::Other)]
        id: String,
    },
    /// Continue an interrupted rollout from the unit it stopped at (re-verified first).
    Resume {
        /// The interrupted rollout's id.
        #[arg(value_hint = clap::ValueHint::Other)]
        id: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// New weights without a restart: every worker paused, loaded with PATH, verified to serve
    /// it (and --version), continued; then pair, health, router and metrics gates. Requests wait
    /// for the load instead of failing; a failure puts the previous weights back everywhere.
    Weights {
        /// The checkpoint to load (the servers read it: an absolute path on this host).
        #[arg(long, value_hint = clap::ValueHint::AnyPath, value_parser = model_path_arg)]
        model_path: String,
        /// Its version (SGLang's weight_version), verified on every worker.
        #[arg(long)]
        version: Option<String>,
        /// Why (kept in the record).
        #[arg(long)]
        reason: Option<String>,
        /// Print what would happen (each worker's weights now, the plan) and touch nothing.
        #[arg(long)]
        dry_run: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Put back what a finished rollout changed: each worker it restarted with changed files, the
    /// last first, gets its files from before and is restarted through every gate.
    Revert {
        /// The rollout to revert.
        #[arg(value_hint = clap::ValueHint::Other)]
        id: String,
        /// Why (kept in the record).
        #[arg(long)]
        reason: Option<String>,
        /// Accept serving stopping while the only worker of a role restarts (not taken from the
        /// reverted rollout: asked here, or `[rollout] allow_outage`).
        #[arg(long)]
        allow_outage: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Past rollouts.
    History(OutputArgs),
    /// One rollout's record: plan, state, every step with its time, the failure, notes.
    Show {
        /// The rollout id (`r` and digits, as `rollout history` lists them).
        #[arg(value_hint = clap::ValueHint::Other, value_parser = rollout_id_arg)]
        id: String,
        /// The record as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub(crate) struct OutputArgs {
    /// One JSON object per line.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A rollout id as pdctld makes them (`r` + seconds since the epoch, maybe `-N`): anything else
/// — a path, `../..` — is exit 2 here, named, instead of an HTTP route pdctld does not have.
pub(crate) fn rollout_id_arg(v: &str) -> Result<String, String> {
    let rest = v.strip_prefix('r').unwrap_or("");
    if !rest.is_empty() && rest.starts_with(|c: char| c.is_ascii_digit()) && rest.chars().all(|c| c.is_ascii_digit() || c == '-') {
        Ok(v.to_string())
    } else {
        Err(format!("{v:?} is not a rollout id (like r1764500000): `pdctl rollout history` lists them"))
    }
}

/// `--model-path` of a weights rollout: an absolute path ([`pdctl_core::sglang::model_path_problem`];
/// clap then exits 2 naming the flag, before anything is asked of pdctld).
pub(crate) fn model_path_arg(v: &str) -> Result<String, String> {
    match pdctl_core::sglang::model_path_problem(v) {
        Some(why) => Err(format!("{why}; nothing was touched")),
        None => Ok(v.to_string()),
    }
}
