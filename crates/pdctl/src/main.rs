//! `pdctl`: the command-line front of pdctl. A thin layer: parse arguments, call the rooms that
//! do the work, print, and map outcomes to the exit codes of the contract (docs/cli.md).

mod demo;

use clap::{Parser, Subcommand};

/// Exit codes of the contract (shared/design.md).
pub mod exit {
    /// A gate failed; the rollout halted.
    pub const GATE_FAILED: i32 = 1;
    /// Bad usage or configuration.
    pub const USAGE: i32 = 2;
    /// Cannot reach systemd / the daemon / permission denied.
    pub const UNREACHABLE: i32 = 3;
}

#[derive(Parser)]
#[command(
    name = "pdctl",
    version,
    about = "Safe rolling restarts of SGLang units on systemd hosts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a private sandbox (real systemd + journald + D-Bus) with a 1-prefill/1-decode
    /// SGLang stack (simulated servers) behind the real SGLang router, and show its live state.
    Demo(demo::DemoArgs),
}

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pdctl: cannot start the async runtime: {e}");
            std::process::exit(exit::UNREACHABLE);
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Demo(a) => demo::run(a).await,
        }
    });
    std::process::exit(code);
}
