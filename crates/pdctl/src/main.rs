//! `pdctl`: the command-line front of pdctl. A thin layer: parse arguments, ask pdctld (or, for
//! the read-only `check`, `status` and `--dry-run`, run the engine here), print (live progress or
//! NDJSON), and end with the exit code of the outcome (`pdctl_contract::api::Exit`, docs/cli.md).

mod cli;
mod client;
mod context;
mod fleet;
mod host;
mod polkit;
mod render;
mod role_set;
mod rollout;
mod status;
mod unit;

use clap::Parser;

use crate::cli::{Cli, Command, FleetCmd, HostCmd, RestartArgs, RoleCmd, RolloutCmd, StartArgs};
use pdctl_contract::api::{Exit, Request};

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
        Command::Role(RoleCmd::Set { unit, role, ratio, dry_run, reason, json }) => {
            let ask = role_set::Ask { unit, role, ratio };
            if dry_run {
                return role_set::dry_run(config, &ask, json, client).await;
            }
            let identity = match rollout::same_config(client, config, json).await {
                Ok(i) => i,
                Err(c) => return c,
            };
            let req = Request::Role { unit: ask.unit, role: ask.role, ratio: ask.ratio, reason, config: identity };
            rollout::start(client, config, &req, json).await
        }
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
        assert!(crate::cli::rollout_id_arg("r1764500000").is_ok() && crate::cli::rollout_id_arg("r1764500000-2").is_ok());
        for bad in ["../../etc/passwd", "r", "r-1", "1764500000", "r17645/../x"] {
            assert!(crate::cli::rollout_id_arg(bad).is_err(), "{bad}");
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

    /// The command `pdctl status` suggests for a role short of capacity is one this CLI parses.
    #[test]
    fn the_suggested_ratio_change_parses() {
        use pdctl_core::config::Role;
        use pdctl_core::service::role_pressure::{pressure, Load};
        let l = |role, queued, kv| Load { role, queued: Some(queued), running: Some(1.0), kv_used: Some(kv) };
        let p = pressure(&[l(Role::Prefill, 6.0, 0.1), l(Role::Prefill, 6.0, 0.1), l(Role::Decode, 0.0, 0.2), l(Role::Decode, 0.0, 0.2)]);
        let line = crate::status::pressure_line(&p).expect("a PD host");
        let cmds = pdctl_contract::next::pdctl_commands(&line);
        assert_eq!(cmds, ["pdctl role set --ratio 3:1 --dry-run"], "{line}");
        assert!(super::Cli::try_parse_from(cmds[0].split_whitespace()).is_ok(), "{line}");
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
