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
    tls: Option<TlsFiles>,
}

/// Certificates for an etcd that speaks TLS and asks clients for theirs.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed both.
    pub ca: PathBuf,
    /// The server's certificate and key (SAN IP:127.0.0.1).
    pub server: (PathBuf, PathBuf),
    /// A client certificate and key the server accepts.
    pub client: (PathBuf, PathBuf),
}

impl TlsFiles {
    /// A fresh CA, server and client certificate in `dir` (openssl CLI), valid one day.
    pub fn generate(dir: &std::path::Path) -> Result<TlsFiles> {
        std::fs::create_dir_all(dir).map_err(|e| SandboxError::Io { what: "create the certificate directory".into(), source: e })?;
        let run = |args: &[&str]| -> Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| SandboxError::Io { what: "run openssl".into(), source: e })?;
            if out.status.success() {
                Ok(())
            } else {
                Err(SandboxError::Command { cmd: format!("openssl {}", args.join(" ")), detail: String::from_utf8_lossy(&out.stderr).into_owned() })
            }
        };
        run(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=pdctl-test-ca"])?;
        for (name, ext) in [("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"), ("client", "extendedKeyUsage=clientAuth")] {
            std::fs::write(dir.join(format!("{name}.ext")), ext.replace("\\n", "\n"))
                .map_err(|e| SandboxError::Io { what: "write an openssl extension file".into(), source: e })?;
            run(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &format!("{name}.key"), "-out", &format!("{name}.csr"), "-subj", &format!("/CN={name}")])?;
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "1",
                "-extfile",
                &format!("{name}.ext"),
            ])?;
        }
        Ok(TlsFiles {
            ca: dir.join("ca.pem"),
            server: (dir.join("server.pem"), dir.join("server.key")),
            client: (dir.join("client.pem"), dir.join("client.key")),
        })
    }
}

impl Etcd {
    /// Start one on free loopback ports; returns once `/health` answers (bounded: 30 s).
    pub fn start() -> Result<Etcd> {
        let dir = std::env::temp_dir().join(format!("pdctl-etcd-{}-{}", std::process::id(), free_port()?));
        let mut e = Etcd { child: None, dir, port: free_port()?, peer: free_port()?, tls: None };
        e.resume()?;
        Ok(e)
    }

    /// Start one that serves TLS only and requires client certificates signed by `tls.ca`.
    pub fn start_tls(tls: TlsFiles) -> Result<Etcd> {
        let dir = std::env::temp_dir().join(format!("pdctl-etcd-{}-{}", std::process::id(), free_port()?));
        let mut e = Etcd { child: None, dir, port: free_port()?, peer: free_port()?, tls: Some(tls) };
        e.resume()?;
        Ok(e)
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), its client URL.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", if self.tls.is_some() { "https" } else { "http" }, self.port)
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
        let mut cmd = Command::new(bin);
        cmd.args(["--name", "t", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c, "--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("t={p}"), "--log-level", "warn"]);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file").arg(&t.server.0).arg("--key-file").arg(&t.server.1).arg("--trusted-ca-file").arg(&t.ca).arg("--client-cert-auth");
        }
        let child =
            cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().map_err(|e| SandboxError::Io { what: "start etcd".into(), source: e })?;
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            let up = match &self.tls {
                // TLS with client certificates: the port accepting is as far as plain HTTP sees.
                Some(_) => std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
                None => matches!(crate::stack::http_get(&format!("{}/health", self.url())), Ok((200, body)) if body.contains("true")),
            };
            if up {
                return Ok(());
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
