//! `pdctl-sandbox`: the first process of a sandbox namespace (`__init`, started by the library),
//! and `up`, which boots the 1P1D stack and waits until interrupted (for poking at it by hand).

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("__init") if args.len() == 3 => pdctl_sandbox::init::run(&PathBuf::from(&args[1]), &PathBuf::from(&args[2])),
        _ => {
            eprintln!("usage: pdctl-sandbox __init CONFIG_HOME LOG_DIR   (internal: started by the pdctl-sandbox library under unshare)");
            std::process::exit(2);
        }
    }
}
