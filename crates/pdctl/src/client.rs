//! A client of pdctld's control API: HTTP/1.1 + JSON over its Unix socket (hyper), with a
//! timeout on every request and NDJSON streaming for events.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::Request;
use hyper_util::rt::TokioIo;
use pdctl_contract::api::{ApiError, Exit, StreamLine};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Timeout of a plain request.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// Why the daemon could not be asked.
#[derive(Debug)]
pub enum ClientError {
    /// No daemon at the socket.
    NotRunning(PathBuf, String),
    /// Permission denied on the socket.
    Denied(PathBuf),
    /// The path is there but is no socket (a regular file, a directory): the wrong path.
    NotASocket(PathBuf, &'static str),
    /// Anything else.
    Other(String),
}

/// Why a call to pdctld ([`Client::call`]) gave no answer of the type asked for.
#[derive(Debug)]
pub enum CallError {
    /// pdctld answered with its error: the request was refused or failed there.
    Refused(ApiError),
    /// pdctld could not be reached or used (no answer, or one this pdctl cannot read).
    Unreachable(ClientError),
}

/// What pdctld answered a call with (inside [`Client::call`], before its deadline).
enum Answer<T> {
    /// The document asked for.
    Done(T),
    /// Its error body.
    Refused(ApiError),
}

impl ClientError {
    /// Every client error means pdctld cannot be reached (or used).
    pub fn exit(&self) -> Exit {
        match self {
            ClientError::NotRunning(..) | ClientError::Denied(..) | ClientError::NotASocket(..) | ClientError::Other(_) => Exit::Unreachable,
        }
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NotRunning(p, e) => write!(
                f,
                "pdctld is not running (cannot connect to {}: {e}); start it with `systemctl start pdctld` (or point --socket / PDCTL_SOCKET at its socket)",
                p.display()
            ),
            ClientError::Denied(p) => write!(f, "permission denied on {}; run as root or as a member of the socket's group", p.display()),
            ClientError::NotASocket(p, what) => write!(
                f,
                "{} is {what}, not a socket: point --socket (or PDCTL_SOCKET) at pdctld's control socket (its [daemon] socket; `systemctl status pdctld` shows it running)",
                p.display()
            ),
            ClientError::Other(e) => write!(f, "talking to pdctld failed: {e}"),
        }
    }
}

/// The daemon at a socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client for `socket`.
    pub fn new(socket: &Path) -> Client {
        Client { socket: socket.to_path_buf() }
    }

    async fn send(&self, method: &str, path: &str, body: Option<String>) -> Result<(u16, Incoming), ClientError> {
        let stream = tokio::net::UnixStream::connect(&self.socket).await.map_err(|e| {
            use std::os::unix::fs::FileTypeExt;
            // A path that is there but is no socket is a wrong --socket, not a stopped pdctld.
            let kind = std::fs::metadata(&self.socket).ok().map(|m| m.file_type()).filter(|t| !t.is_socket()).map(|t| {
                if t.is_dir() {
                    "a directory"
                } else if t.is_file() {
                    "a regular file"
                } else {
                    "a special file (a FIFO or a device)"
                }
            });
            match (kind, e.kind()) {
                (Some(what), _) => ClientError::NotASocket(self.socket.clone(), what),
                (None, std::io::ErrorKind::PermissionDenied) => ClientError::Denied(self.socket.clone()),
                (None, _) => ClientError::NotRunning(self.socket.clone(), e.to_string()),
            }
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| ClientError::Other(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let bytes = body.map(Bytes::from).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(format!("http://pdctld{path}"))
            .header("host", "pdctld")
            .header("content-type", "application/json")
            .body(Full::new(bytes))
            .map_err(|e| ClientError::Other(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| ClientError::Other(e.to_string()))?;
        Ok((resp.status().as_u16(), resp.into_body()))
    }

    /// A request whose answer is one JSON document of type `T` (2xx); else pdctld's error body
    /// ([`CallError::Refused`]) or why it gave none ([`CallError::Unreachable`]).
    pub async fn call<T: DeserializeOwned>(&self, method: &str, path: &str, body: Option<&impl Serialize>) -> Result<T, CallError> {
        let body = match body.map(serde_json::to_string).transpose() {
            Ok(b) => b,
            Err(e) => return Err(CallError::Unreachable(ClientError::Other(format!("cannot encode the request: {e}")))),
        };
        let fut = async {
            let (status, body) = self.send(method, path, body).await?;
            let bytes = body.collect().await.map_err(|e| ClientError::Other(e.to_string()))?.to_bytes();
            if (200..300).contains(&status) {
                return serde_json::from_slice::<T>(&bytes).map(Answer::Done).map_err(|e| {
                    ClientError::Other(format!("pdctld answered {path} with a body this pdctl cannot read ({e}); are pdctl and pdctld the same version?"))
                });
            }
            Ok(Answer::Refused(serde_json::from_slice::<ApiError>(&bytes).unwrap_or_else(|_| ApiError {
                error: format!("pdctld answered {status}: {}", String::from_utf8_lossy(&bytes).trim()),
                exit_code: Exit::Unreachable,
                cause_code: "unknown".into(),
                next: String::new(),
            })))
        };
        match tokio::time::timeout(TIMEOUT, fut).await {
            Ok(Ok(Answer::Done(v))) => Ok(v),
            Ok(Ok(Answer::Refused(e))) => Err(CallError::Refused(e)),
            Ok(Err(e)) => Err(CallError::Unreachable(e)),
            Err(_) => Err(CallError::Unreachable(ClientError::Other(format!("no answer within {TIMEOUT:?}")))),
        }
    }

    /// Stream the NDJSON lines of a rollout from `path` to `on_line` until the stream ends.
    pub async fn lines(&self, path: &str, mut on_line: impl FnMut(StreamLine)) -> Result<(), ClientError> {
        let (status, mut body) = self.send("GET", path, None).await?;
        let mut buf: Vec<u8> = Vec::new();
        if status != 200 {
            let bytes = body.collect().await.map_err(|e| ClientError::Other(e.to_string()))?.to_bytes();
            return Err(ClientError::Other(String::from_utf8_lossy(&bytes).into_owned()));
        }
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Other(e.to_string()))?;
            if let Some(d) = frame.data_ref() {
                buf.extend_from_slice(d);
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    match serde_json::from_slice::<StreamLine>(&line) {
                        Ok(v) => on_line(v),
                        Err(e) => tracing::warn!("pdctld sent a line this pdctl cannot read ({e}): {}", String::from_utf8_lossy(&line).trim()),
                    }
                }
            }
        }
        Ok(())
    }
}
