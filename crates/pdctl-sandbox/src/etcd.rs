//! A real etcd (Debian's `etcd-server`, 3.4) for the fleet tests and the fleet benchmark: one
//! member on loopback ports of its own, in a temporary data directory; stopped and started again
//! on the same data (an etcd outage and its return), killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, Result, SandboxError};

/// A running single-member etcd.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    peer: u16,
}

impl Etcd {
    /// Start one on free loopback ports; returns once `/health` answers (bounded: 30 s).
    pub fn start() -> Result<Etcd> {
        let dir = std::env::temp_dir().join(format!("pdctl-etcd-{}-{}", std::process::id(), free_port()?));
        let mut e = Etcd { child: None, dir, port: free_port()?, peer: free_port()? };
        e.resume()?;
        Ok(e)
    }

    /// `http://127.0.0.1:PORT`, its client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kill it (an outage: clients get connection refused).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same data and ports; returns once `/health` answers.
    pub fn resume(&mut self) -> Result<()> {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| SandboxError::Command { cmd: "etcd".into(), detail: "not installed: scripts/setup installs Debian's etcd-server".into() })?;
        let (c, p) = (self.url(), format!("http://127.0.0.1:{}", self.peer));
        let log = std::fs::File::create(std::env::temp_dir().join(format!("pdctl-etcd-{}.log", self.port)))
            .map_err(|e| SandboxError::Io { what: "create the etcd log".into(), source: e })?;
        let child = Command::new(bin)
            .args(["--name", "t", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c, "--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("t={p}"), "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| SandboxError::Io { what: "start etcd".into(), source: e })?;
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            if let Ok((200, body)) = crate::stack::http_get(&format!("{}/health", self.url())) {
                if body.contains("true") {
                    return Ok(());
                }
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(SandboxError::Command { cmd: "etcd".into(), detail: format!("{}/health did not answer within 30 s", self.url()) });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
