//! `pdctl demo`: the 1P1D stack in a sandbox (real systemd + journald + D-Bus, the real router,
//! simulated SGLang servers), rolled by `pdctl restart --rolling`, then `pdctl status`.

use std::time::{Duration, Instant};

use pdctl_probe::{Http, Router};
use pdctl_sandbox::stack::{Stack, StackOptions};

use crate::exit;

/// Options of `pdctl demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Keep the sandbox running after the rollout until Ctrl-C (the bus address, journal
    /// directory, config and URLs are printed, to poke at it with pdctl or curl).
    #[arg(long)]
    hold: bool,
}

/// Run the demo; returns the exit code of the rollout.
pub async fn run(args: DemoArgs) -> i32 {
    let t0 = Instant::now();
    println!("pdctl demo: booting a private systemd + journald + D-Bus sandbox with a 1P1D SGLang stack…");
    let stack = match tokio::task::block_in_place(|| Stack::boot(&StackOptions::default())) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pdctl demo: {e}");
            return exit::UNREACHABLE;
        }
    };
    let Some(router) = stack.router.clone() else {
        eprintln!("pdctl demo: the stack has no router");
        return exit::UNREACHABLE;
    };
    if let Err(e) = tokio::task::block_in_place(|| stack.wait_ready(Duration::from_secs(60))) {
        eprintln!("pdctl demo: {e}");
        return exit::GATE_FAILED;
    }
    // The router admits the workers in the background; wait for it (bounded) before rolling.
    let http = Http::new(Duration::from_secs(5));
    let r = Router { url: router.url.clone(), metrics_url: Some(router.metrics_url.clone()) };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let healthy = r.workers(&http).await.map(|l| l.iter().filter(|w| w.is_healthy).count()).unwrap_or(0);
        if healthy == 2 || Instant::now() > deadline {
            println!(
                "pdctl demo: stack up in {:.1}s: {} and {} ready (journald), router {} sees {healthy}/2 healthy",
                t0.elapsed().as_secs_f64(),
                stack.prefill.unit,
                stack.decode.unit,
                router.url
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let config = match stack.write_pdctl_config() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pdctl demo: {e}");
            return exit::UNREACHABLE;
        }
    };
    let daemon = match tokio::task::block_in_place(|| stack.start_pdctld()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pdctl demo: pdctld did not start: {e}");
            return exit::UNREACHABLE;
        }
    };
    println!("pdctl demo: pdctld runs as {} (Type=notify; its READY=1 reached systemd), socket {}", daemon.unit, daemon.socket.display());
    println!("\n$ pdctl status --config {}", config.display());
    crate::status::run(&config, false).await;
    println!("\n$ pdctl restart --rolling --config {} --socket {}", config.display(), daemon.socket.display());
    let client = crate::client::Client::new(&daemon.socket);
    let code = crate::rollout::start(&client, serde_json::json!({ "kind": "restart", "units": [] }), false).await;
    println!("\n$ pdctl rollout history --socket {}", daemon.socket.display());
    crate::rollout::history(&client, false).await;
    println!("\n$ pdctl status --config {}", config.display());
    crate::status::run(&config, false).await;
    if args.hold {
        println!(
            "\nholding the sandbox (Ctrl-C ends it):\n  socket   {}\n  config   {}\n  bus      {}\n  journal  {}\n  units    {}\n  router   {}  metrics {}",
            daemon.socket.display(),
            config.display(),
            stack.sandbox.bus_address(),
            stack.sandbox.journal_dir().display(),
            stack.sandbox.unit_dir().display(),
            router.url,
            router.metrics_url
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    println!("\npdctl demo: tearing the sandbox down.");
    drop(stack);
    code
}
