//! `pdctl`: the command-line front of pdctl. A thin layer: parse arguments, ask pdctld (or, for
//! the read-only `check`, `status` and `--dry-run`, run the engine here), print (live progress or
//! NDJSON), and end with the exit code of the outcome (`pdctl_contract::api::Exit`, docs/cli.md).

mod client;
mod context;
mod fleet;
mod host;
mod polkit;
mod render;
mod rollout;
mod status;
mod unit;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use pdctl_contract::api::{Exit, Request};

#[derive(Parser)]
#[command(name = "pdctl", version, about = "Safe rolling restarts of SGLang units on systemd hosts")]
struct Cli {
    /// Main config file (default: $PDCTL_CONFIG, else /etc/pdctl/pdctl.toml; config.d/*.toml next
    /// to it is merged in name order).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// pdctld's control socket.
    #[arg(long, global = true, value_name = "PATH", env = "PDCTL_SOCKET", default_value = "/run/pdctl/pdctl.sock")]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    /// Print completion candidates, one a line (used by the bash completion script): the
    /// configured units, or pdctld's rollout ids, newest first.
    #[command(hide = true, name = "__complete")]
    Candidates {
        /// `units` or `rollouts`.
        what: String,
    },
}

#[derive(Subcommand)]
enum HostCmd {
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
enum FleetCmd {
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
struct RestartArgs {
    /// Restart units one at a time (the only mode pdctl has; required to say so).
    #[arg(long)]
    rolling: bool,
    /// Only these units (repeatable), in rollout order.
    #[arg(long = "unit", value_name = "UNIT", value_hint = clap::ValueHint::Other)]
    units: Vec<String>,
    /// Print the plan and the preflight verdict; touch nothing.
    #[arg(long)]
    dry_run: bool,
    /// Restart even where the unit's files changed since its process started (drop-ins systemd
    /// has not loaded, edited EnvironmentFiles, a change quarantined after it failed): the
    /// restart loads them. Without it such a worker is refused (`changes_pending`); `pdctl
    /// rollout apply` rolls changes out with rollback.
    #[arg(long)]
    load_changes: bool,
    #[command(flatten)]
    start: StartArgs,
}

/// What every command that starts a rollout on this host takes.
#[derive(Args)]
struct StartArgs {
    /// Accept taking the only worker of a role down (serving stops while it restarts).
    #[arg(long)]
    allow_outage: bool,
    /// Why (kept in the rollout's record with who started it).
    #[arg(long)]
    reason: Option<String>,
    /// One JSON object per line (events, then a summary).
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum RolloutCmd {
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
struct OutputArgs {
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    // A closed pipe (`pdctl status | head -1`) ends the process quietly, as for any Unix tool,
    // instead of a panic in println!. Not for the commands that talk to etcd: a TLS peer that
    // closes its socket mid-handshake (a refused client certificate) would kill the process with
    // SIGPIPE instead of letting it say what went wrong (measured: exit by signal, no message).
    if !matches!(cli.command, Command::Fleet(_) | Command::Check(_)) {
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // Generated from the CLI's definition; no config, no daemon.
    match &cli.command {
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(*shell, &mut Cli::command(), "pdctl", &mut std::io::stdout());
            if *shell == clap_complete::Shell::Bash {
                print!("{BASH_DYNAMIC}");
            }
            Exit::Ok.exit_process();
        }
        Command::Man { dir } => man_pages(dir).exit_process(),
        _ => {}
    }
    // The engine's own warnings reach the screen as the events that carry them (a preflight's
    // `warnings`), rendered: its log lines are for pdctld's journal (PDCTL_LOG shows them here).
    // No colour codes where stderr is not a terminal.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PDCTL_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,pdctl_core=error")),
        )
        .init();
    // As pdctld's: a check or dry run runs the engine's steps in this process.
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_stack_size(8 << 20).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pdctl: cannot start the async runtime: {e}");
            Exit::Unreachable.exit_process();
        }
    };
    let config = pdctl_core::config::main_path(cli.config.as_deref());
    let client = client::Client::new(&cli.socket);
    rt.block_on(dispatch(cli.command, &config, &client)).exit_process();
}

/// Run one command (those that need the runtime); its exit code.
async fn dispatch(command: Command, config: &std::path::Path, client: &client::Client) -> Exit {
    match command {
        Command::Restart(a) => restart(a, config, client).await,
        Command::Rollout(r) => rollout_cmd(r, config, client).await,
        Command::Check(a) => context::check(config, a.json, client).await,
        Command::Status(a) => status::run_with_daemon(config, a.json, client).await,
        Command::UnitDropin { write } => unit::run(config, write),
        Command::PolkitRule { user, write } => polkit::run(config, &user, write),
        Command::Completions { .. } | Command::Man { .. } => Exit::Ok,
        Command::Candidates { what } => candidates(config, client, &what).await,
        Command::Fleet(f) => fleet_cmd(f, config, client).await,
        Command::Host(h) => match h {
            HostCmd::Drain { dry_run: true, start } => host::dry_run(client, config, start.json, start.allow_outage).await,
            HostCmd::Drain { start: StartArgs { allow_outage, reason, json }, .. } => {
                host::start(client, config, Request::HostDrain { allow_outage, reason, config: None }, json).await
            }
            HostCmd::Resume { reason, json } => host::start(client, config, Request::HostResume { reason, config: None }, json).await,
            HostCmd::Status(a) => host::status(client, a.json).await,
        },
    }
}

/// `pdctl restart --rolling`: a dry run here, else validated locally and started in pdctld.
async fn restart(a: RestartArgs, config: &std::path::Path, client: &client::Client) -> Exit {
    if !a.rolling {
        eprintln!("pdctl restart: say --rolling (pdctl only restarts units one at a time, each gated)");
        return Exit::Usage;
    }
    let StartArgs { allow_outage, reason, json } = a.start;
    if a.dry_run {
        return context::dry_run(config, &a.units, json, allow_outage, a.load_changes, client).await;
    }
    if let Err(c) = context::validate_locally(config, &a.units, json) {
        return c;
    }
    let identity = match rollout::same_config(client, config, json).await {
        Ok(i) => i,
        Err(c) => return c,
    };
    let req = Request::Restart { units: a.units, allow_outage, reason, load_changes: a.load_changes, config: identity };
    rollout::start(client, config, &req, json).await
}

/// `pdctl rollout …`.
async fn rollout_cmd(r: RolloutCmd, config: &std::path::Path, client: &client::Client) -> Exit {
    match r {
        RolloutCmd::Diff(a) => match context::validate_locally(config, &[], a.json) {
            Err(c) => c,
            Ok(()) => match rollout::same_config(client, config, a.json).await {
                Err(c) => c,
                Ok(_) => rollout::diff(client, a.json).await,
            },
        },
        RolloutCmd::Apply { if_changed, all, start: StartArgs { allow_outage, reason, json } } => {
            if let Err(c) = context::validate_locally(config, &[], json) {
                return c;
            }
            let identity = match rollout::same_config(client, config, json).await {
                Ok(i) => i,
                Err(c) => return c,
            };
            rollout::start(client, config, &Request::Apply { if_changed, all, allow_outage, reason, config: identity }, json).await
        }
        RolloutCmd::Watch { id, json } => rollout::watch(client, config, &id, json).await,
        RolloutCmd::Abort { id } => rollout::abort(client, &id).await,
        RolloutCmd::Resume { id, json } => {
            let identity = match rollout::same_config(client, config, json).await {
                Ok(i) => i,
                Err(c) => return c,
            };
            rollout::start(client, config, &Request::Resume { id, config: identity }, json).await
        }
        RolloutCmd::Weights { model_path, version, reason, dry_run, json } => {
            if dry_run {
                return context::weights_dry_run(config, &model_path, version.as_deref(), json).await;
            }
            let identity = match rollout::same_config(client, config, json).await {
                Ok(i) => i,
                Err(c) => return c,
            };
            rollout::start(client, config, &Request::Weights { model_path, version, reason, fleet_rollout: None, config: identity }, json).await
        }
        RolloutCmd::Revert { id, reason, allow_outage, json } => {
            let identity = match rollout::same_config(client, config, json).await {
                Ok(i) => i,
                Err(c) => return c,
            };
            rollout::start(client, config, &Request::Revert { id, reason, allow_outage: Some(allow_outage), config: identity }, json).await
        }
        RolloutCmd::History(a) => rollout::history(client, a.json).await,
        RolloutCmd::Show { id, json } => rollout::show(client, &id, json).await,
    }
}

/// A rollout id as pdctld makes them (`r` + seconds since the epoch, maybe `-N`): anything else
/// — a path, `../..` — is exit 2 here, named, instead of an HTTP route pdctld does not have.
fn rollout_id_arg(v: &str) -> Result<String, String> {
    let rest = v.strip_prefix('r').unwrap_or("");
    if !rest.is_empty() && rest.starts_with(|c: char| c.is_ascii_digit()) && rest.chars().all(|c| c.is_ascii_digit() || c == '-') {
        Ok(v.to_string())
    } else {
        Err(format!("{v:?} is not a rollout id (like r1764500000): `pdctl rollout history` lists them"))
    }
}

/// `--model-path` of a weights rollout: an absolute path ([`pdctl_core::sglang::model_path_problem`];
/// clap then exits 2 naming the flag, before anything is asked of pdctld).
fn model_path_arg(v: &str) -> Result<String, String> {
    match pdctl_core::sglang::model_path_problem(v) {
        Some(why) => Err(format!("{why}; nothing was touched")),
        None => Ok(v.to_string()),
    }
}

/// `pdctl fleet …`.
async fn fleet_cmd(f: FleetCmd, config: &std::path::Path, client: &client::Client) -> Exit {
    match f {
        FleetCmd::Status(a) => fleet::status(config, a.json).await,
        FleetCmd::Weights { model_path, version, hosts, reason, json } => {
            let weights = Some(pdctl_core::fleet::FleetWeights { model_path, version });
            fleet::restart(client, config, pdctl_contract::api::FleetRequest { hosts, allow_outage: false, reason, load_changes: false, weights }, json).await
        }
        FleetCmd::Restart { rolling, hosts, allow_outage, load_changes, reason, json } => {
            if !rolling {
                eprintln!("pdctl: fleet restart needs --rolling (pdctl only restarts one unit at a time per host, slots fleet-wide)");
                Exit::Usage
            } else {
                fleet::restart(client, config, pdctl_contract::api::FleetRequest { hosts, allow_outage, reason, load_changes, weights: None }, json).await
            }
        }
        FleetCmd::Watch { id, json } => fleet::watch(config, &id, json).await,
        FleetCmd::Release { holder, force } => fleet::release(config, &holder, force).await,
        FleetCmd::Pause { reason } => fleet::pause(config, Some(&reason)).await,
        FleetCmd::Unpause => fleet::pause(config, None).await,
    }
}

/// Appended to the generated bash completion: `--unit` completes the configured units and a
/// rollout command's ID pdctld's rollout ids (asked of `pdctl __complete`), else clap's own.
const BASH_DYNAMIC: &str = r#"
_pdctl_dynamic() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    if [[ "$prev" == "--unit" ]]; then
        COMPREPLY=($(compgen -W "$(pdctl __complete units 2>/dev/null)" -- "$cur"))
        return 0
    fi
    if [[ "${COMP_WORDS[1]}" == "rollout" && "$prev" =~ ^(watch|abort|resume|revert|show)$ ]]; then
        COMPREPLY=($(compgen -W "$(pdctl __complete rollouts 2>/dev/null)" -- "$cur"))
        return 0
    fi
    _pdctl "$@"
}
complete -F _pdctl_dynamic -o bashdefault -o default pdctl
"#;

/// `pdctl __complete units|rollouts`: completion candidates, one a line (nothing on error).
async fn candidates(config: &std::path::Path, client: &client::Client, what: &str) -> Exit {
    match what {
        "units" => {
            if let Ok(s) = pdctl_core::config::load(config) {
                for w in &s.workers {
                    println!("{}", w.unit);
                }
            }
        }
        "rollouts" => {
            if let Ok(h) = client.call::<pdctl_contract::api::History>("GET", "/v1/rollouts", None::<&()>).await {
                for r in h.rollouts.iter().rev() {
                    println!("{}", r.id);
                }
            }
        }
        _ => return Exit::Usage,
    }
    Exit::Ok
}

/// `pdctl man DIR`: pdctl.1 and one page per subcommand at every depth (pdctl-rollout.1,
/// pdctl-rollout-apply.1, …: each page's SEE ALSO names exist), from clap, each with an EXIT
/// STATUS section from the exit-code table.
fn man_pages(dir: &std::path::Path) -> Exit {
    use clap::CommandFactory as _;
    let mut pages = Vec::new();
    // `help` subcommands would be referenced as pages of their own: `--help` is on every page.
    fn no_help(c: clap::Command) -> clap::Command {
        c.disable_help_subcommand(true).mut_subcommands(no_help)
    }
    collect_pages("pdctl", no_help(Cli::command()), &mut pages);
    for (name, cmd) in pages {
        let mut out = Vec::new();
        let written = clap_mangen::Man::new(cmd).render(&mut out).and_then(|()| {
            out.extend_from_slice(exit_status_roff().as_bytes());
            std::fs::write(dir.join(format!("{name}.1")), &out)
        });
        if let Err(e) = written {
            eprintln!("pdctl: cannot write {}/{name}.1: {e}", dir.display());
            return Exit::Unreachable;
        }
    }
    Exit::Ok
}

/// `name` and every visible subcommand below it, named as clap_mangen refers to them.
fn collect_pages(name: &str, cmd: clap::Command, out: &mut Vec<(String, clap::Command)>) {
    for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set() && c.get_name() != "help") {
        let n = format!("{name}-{}", sub.get_name());
        collect_pages(&n, sub.clone().display_name(n.clone()).bin_name(n.replace('-', " ")), out);
    }
    out.push((name.to_string(), cmd));
}

/// The EXIT STATUS section of a man page: the exit-code table (`pdctl_contract::api::Exit`).
fn exit_status_roff() -> String {
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    for e in Exit::ALL {
        s.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", e.code(), e.meaning().replace('\\', "\\\\").replace('-', "\\-")));
    }
    s
}

#[cfg(test)]
mod next_steps {
    use clap::Parser as _;

    /// A rollout id is pdctld's form; a path is refused by the CLI, naming it (exit 2).
    #[test]
    fn a_rollout_id_is_pdctlds_form_and_a_path_is_refused() {
        assert!(super::rollout_id_arg("r1764500000").is_ok() && super::rollout_id_arg("r1764500000-2").is_ok());
        for bad in ["../../etc/passwd", "r", "r-1", "1764500000", "r17645/../x"] {
            assert!(super::rollout_id_arg(bad).is_err(), "{bad}");
        }
        let e = super::Cli::try_parse_from(["pdctl", "rollout", "show", "../../etc/passwd"]).err().expect("refused");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("is not a rollout id"), "{e}");
    }

    /// Every `pdctl …` command that a cause's next step suggests is one this CLI parses.
    #[test]
    fn every_suggested_command_parses() {
        let mut seen = 0;
        for cause in pdctl_contract::cause::Cause::examples() {
            for unit in ["sglang-prefill.service", "router", "fleet", ""] {
                // pdctld puts the rollout's id in place of `ID` (a cause is written without one).
                let next = cause.next_step(unit).replace("pdctl rollout show ID", "pdctl rollout show r1764500000");
                for cmd in pdctl_contract::next::pdctl_commands(&next) {
                    let args: Vec<&str> = cmd.split_whitespace().collect();
                    match super::Cli::try_parse_from(&args) {
                        Ok(_) => {}
                        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {}
                        Err(e) => panic!("{} suggests `{cmd}`, which pdctl refuses: {e}", cause.code()),
                    }
                    seen += 1;
                }
            }
        }
        assert!(seen > 40, "only {seen} commands were checked");
    }

    /// Every page a man page refers to (`pdctl-x-y(1)`) is written, and every page has EXIT STATUS.
    #[test]
    fn man_pages_refer_only_to_pages_that_exist() {
        let dir = std::env::temp_dir().join(format!("pdctl-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(super::man_pages(&dir), super::Exit::Ok);
        let names: Vec<String> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(names.contains(&"pdctl-rollout-apply.1".to_string()), "{names:?}");
        for n in &names {
            let text = std::fs::read_to_string(dir.join(n)).unwrap();
            assert!(text.contains(".SH \"EXIT STATUS\"") && text.contains("130"), "{n}");
            for (i, _) in text.match_indices("(1)") {
                let start = text[..i].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '\\')).map(|p| p + 1).unwrap_or(0);
                let page = text[start..i].replace("\\-", "-");
                if page.starts_with("pdctl") {
                    assert!(names.contains(&format!("{page}.1")), "{n} refers to {page}(1), which is not written: {names:?}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
