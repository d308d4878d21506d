//! `pdctl-demo [--hold]`: the 1P1D stack in a sandbox (real systemd + journald + D-Bus, the real
//! router, simulated SGLang servers), pdctld as a `Type=notify` unit of it, and the commands an
//! operator types — `pdctl status`, `pdctl restart --rolling`, `pdctl rollout history`,
//! `pdctl status` — run as the real `pdctl` binary. A binary of its own so that `pdctl` itself
//! never links the test sandbox.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_sandbox::workspace_bin;

const USAGE: &str = "usage: pdctl-demo [--hold]\n  --hold  keep the sandbox running after the rollout until Ctrl-C (its socket, config, bus,\n          journal and URLs are printed, to poke at it with pdctl or curl)";

/// Run one `pdctl` command as an operator would, echoing it; its exit code.
fn pdctl(pdctl: &Path, args: &[&str]) -> i32 {
    println!("\n$ pdctl {}", args.join(" "));
    match Command::new(pdctl).args(args).status() {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => {
            eprintln!("pdctl-demo: cannot run {}: {e}", pdctl.display());
            1
        }
    }
}

fn wait_for_ctrl_c() {
    // SAFETY: an empty signal set, then SIGINT added to it and blocked for this thread only;
    // sigwait returns when SIGINT arrives.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
    }
}

fn run(hold: bool) -> Result<i32, String> {
    let t0 = Instant::now();
    let bin = workspace_bin("pdctl", "PDCTL_BIN").map_err(|e| e.to_string())?;
    println!("pdctl demo: booting a private systemd + journald + D-Bus sandbox with a 1P1D SGLang stack…");
    let stack = Stack::boot(&StackOptions::default()).map_err(|e| e.to_string())?;
    stack.wait_ready(Duration::from_secs(60)).map_err(|e| e.to_string())?;
    // The router admits the workers in the background; wait for it (bounded) before rolling.
    let healthy = stack.wait_router_healthy(2, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let router = stack.router.clone().ok_or("the stack has no router")?;
    println!(
        "pdctl demo: stack up in {:.1}s: {} and {} ready (journald), router {} sees {healthy}/2 healthy",
        t0.elapsed().as_secs_f64(),
        stack.prefill.unit,
        stack.decode.unit,
        router.url
    );
    let config = stack.write_pdctl_config().map_err(|e| e.to_string())?;
    let daemon = stack.start_pdctld().map_err(|e| format!("pdctld did not start: {e}"))?;
    println!("pdctl demo: pdctld runs as {} (Type=notify; its READY=1 reached systemd), socket {}", daemon.unit, daemon.socket.display());
    let (cfg, sock) = (config.display().to_string(), daemon.socket.display().to_string());
    pdctl(&bin, &["status", "--config", &cfg, "--socket", &sock]);
    let code = pdctl(&bin, &["restart", "--rolling", "--config", &cfg, "--socket", &sock]);
    pdctl(&bin, &["rollout", "history", "--config", &cfg, "--socket", &sock]);
    pdctl(&bin, &["status", "--config", &cfg, "--socket", &sock]);
    if hold {
        println!(
            "\nholding the sandbox (Ctrl-C ends it):\n  socket   {}\n  config   {}\n  bus      {}\n  journal  {}\n  units    {}\n  router   {}  metrics {}",
            sock,
            cfg,
            stack.sandbox.bus_address(),
            stack.sandbox.journal_dir().display(),
            stack.sandbox.unit_dir().display(),
            router.url,
            router.metrics_url
        );
        wait_for_ctrl_c();
    }
    println!("\npdctl demo: tearing the sandbox down.");
    drop(stack);
    Ok(code)
}

fn main() {
    let mut hold = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--hold" => hold = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => {
                eprintln!("pdctl-demo: unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    match run(hold) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pdctl-demo: {e}");
            std::process::exit(3);
        }
    }
}
