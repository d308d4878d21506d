//! `pdctl demo`: the 1P1D stack in a sandbox, for a newcomer to see pdctl work without GPUs.

use std::time::{Duration, Instant};

use pdctl_sandbox::stack::{Stack, StackOptions};
use serde_json::Value;

/// Options of `pdctl demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Keep the sandbox running until Ctrl-C (to poke at it: the bus address, journal directory
    /// and URLs are printed).
    #[arg(long)]
    hold: bool,
}

fn prop(stack: &Stack, unit: &str, name: &str) -> String {
    stack
        .sandbox
        .systemctl(&["show", "-p", name, "--value", unit])
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("? ({e})"))
}

async fn router_workers(client: &reqwest::Client, url: &str) -> Option<Vec<Value>> {
    let v: Value = client
        .get(format!("{url}/workers"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v.get("workers")?.as_array().cloned()
}

/// Run the demo; returns the process exit code.
pub async fn run(args: DemoArgs) -> i32 {
    let t0 = Instant::now();
    println!("pdctl demo: booting a private systemd + journald + D-Bus sandbox with a 1P1D SGLang stack…");
    let stack = match tokio::task::block_in_place(|| Stack::boot(&StackOptions::default())) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pdctl demo: {e}");
            return crate::exit::UNREACHABLE;
        }
    };
    let Some(router) = stack.router.clone() else {
        eprintln!("pdctl demo: the stack has no router");
        return crate::exit::UNREACHABLE;
    };
    match tokio::task::block_in_place(|| stack.wait_ready(Duration::from_secs(60))) {
        Ok(entries) => {
            for (w, e) in stack.workers().iter().zip(entries) {
                println!(
                    "  journald: {} (pid {}) logged \"{}\"",
                    w.unit,
                    e.get("_PID").and_then(Value::as_str).unwrap_or("?"),
                    e.get("MESSAGE").and_then(Value::as_str).unwrap_or("")
                );
            }
        }
        Err(e) => {
            eprintln!("pdctl demo: {e}");
            return crate::exit::GATE_FAILED;
        }
    }
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pdctl demo: cannot build an HTTP client: {e}");
            return crate::exit::UNREACHABLE;
        }
    };
    // The router admits workers in the background; give it a bounded time.
    let deadline = Instant::now() + Duration::from_secs(60);
    let workers = loop {
        let ws = router_workers(&client, &router.url)
            .await
            .unwrap_or_default();
        if ws.iter().filter(|w| w["is_healthy"] == true).count() == 2 || Instant::now() > deadline {
            break ws;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("\nunits ({:.1} s after boot):", t0.elapsed().as_secs_f64());
    println!(
        "  {:<30} {:<18} {:>7}  {:<34} CUDA_VISIBLE_DEVICES",
        "UNIT", "STATE", "PID", "INVOCATION"
    );
    let mut units: Vec<(&str, String)> = stack
        .workers()
        .iter()
        .map(|w| (w.unit.as_str(), w.url.clone()))
        .collect();
    units.push((router.unit.as_str(), router.url.clone()));
    for (unit, _) in &units {
        let env = prop(&stack, unit, "Environment");
        let cuda = env
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("CUDA_VISIBLE_DEVICES="))
            .unwrap_or("-")
            .to_string();
        println!(
            "  {:<30} {:<18} {:>7}  {:<34} {}",
            unit,
            format!(
                "{}/{}",
                prop(&stack, unit, "ActiveState"),
                prop(&stack, unit, "SubState")
            ),
            prop(&stack, unit, "MainPID"),
            prop(&stack, unit, "InvocationID"),
            cuda
        );
    }
    println!("\nrouter {} sees:", router.url);
    println!("  {:<26} {:<8} {:<8} ID", "WORKER", "TYPE", "HEALTHY");
    for w in &workers {
        println!(
            "  {:<26} {:<8} {:<8} {}",
            w["url"].as_str().unwrap_or("?"),
            w["worker_type"].as_str().unwrap_or("?"),
            w["is_healthy"].to_string(),
            w["id"].as_str().unwrap_or("?")
        );
    }
    let healthy = workers.iter().filter(|w| w["is_healthy"] == true).count();
    if args.hold {
        println!(
            "\nholding the sandbox (Ctrl-C ends it):\n  bus      {}\n  journal  {}\n  units    {}\n  router   {}  metrics {}",
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
    if healthy == 2 {
        0
    } else {
        eprintln!("pdctl demo: the router admitted {healthy} of 2 workers within 60 s");
        crate::exit::GATE_FAILED
    }
}
