//! `sglang-sim` binary: parse SGLang's flags, then run the simulated server.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match sglang_sim::args::parse(&args, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sglang-sim: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(sglang_sim::server::run(cfg));
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(code);
}
