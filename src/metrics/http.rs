//! The metrics endpoint: a deliberately small HTTP/1.1 server on tokio that answers
//! `GET /metrics` (the [`Metrics`] exposition) and `GET /health` (whether the upstream and the
//! ledger answer), and nothing else.
//!
//! Two routes and no keep-alive did not earn an HTTP library (hyper and its dependencies would
//! double what pgdp builds for this); the bounds an HTTP server needs are kept here instead:
//! - a request head is read up to [`limits::METRICS_REQUEST_BYTES_MAX`] bytes (431 past it)
//!   and within [`limits::METRICS_IO_TIMEOUT_MS`] (the connection is closed after it); a request
//!   body is never read;
//! - every connection has a task of its own, and at most [`limits::METRICS_CONNECTIONS_MAX`] are
//!   served at once (later ones are closed at once), so one slow client stalls no other and many
//!   cannot exhaust the process;
//! - one response per connection (`Connection: close`), written within the same timeout;
//! - only `GET /metrics` and `GET /health`; any other method or path is 404, a malformed
//!   request line 400.
//!
//! `/health` runs the [`Probes`] of the server (`SELECT 1` on the upstream and on the ledger)
//! concurrently, each within [`limits::HEALTH_CHECK_TIMEOUT_MS`]; one check runs at a time and
//! its answer is reused for [`limits::HEALTH_CACHE_MS`], so frequent probes open no connection
//! storm. 200 with `upstream: ok` and `ledger: ok`, else 503 naming what did not answer. The body
//! never carries an error text from either server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};

use super::Metrics;
use crate::limits;

/// Whether the servers pgdp depends on answer; implemented by the server over its upstream pool
/// and ledger.
#[async_trait]
pub trait Probes: Send + Sync {
    /// Whether the upstream answers a trivial query.
    async fn upstream(&self) -> bool;
    /// Whether the ledger answers a trivial query.
    async fn ledger(&self) -> bool;
}

/// What `/health` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    /// The upstream answered in time.
    pub upstream: bool,
    /// The ledger answered in time.
    pub ledger: bool,
}

impl Health {
    /// The HTTP status and body of this finding.
    fn response(self) -> (u16, String) {
        let word = |ok: bool| if ok { "ok" } else { "unreachable" };
        let body = format!(
            "upstream: {}\nledger: {}\n",
            word(self.upstream),
            word(self.ledger)
        );
        let status = if self.upstream && self.ledger {
            200
        } else {
            503
        };
        (status, body)
    }
}

/// The health checks and their last answer.
struct Checker {
    probes: Arc<dyn Probes>,
    last: Mutex<Option<(Instant, Health)>>,
}

impl Checker {
    /// The last finding if it is recent, else a new one (callers arriving meanwhile wait for it
    /// rather than starting their own).
    async fn health(&self) -> Health {
        let mut last = self.last.lock().await;
        if let Some((at, health)) = *last {
            if at.elapsed() < Duration::from_millis(limits::HEALTH_CACHE_MS) {
                return health;
            }
        }
        let timeout = Duration::from_millis(limits::HEALTH_CHECK_TIMEOUT_MS);
        let (upstream, ledger) = tokio::join!(
            tokio::time::timeout(timeout, self.probes.upstream()),
            tokio::time::timeout(timeout, self.probes.ledger()),
        );
        let health = Health {
            upstream: upstream.unwrap_or(false),
            ledger: ledger.unwrap_or(false),
        };
        *last = Some((Instant::now(), health));
        health
    }
}

/// Serves the endpoint on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, probes: Arc<dyn Probes>) {
    let checker = Arc::new(Checker {
        probes,
        last: Mutex::new(None),
    });
    let connections = Arc::new(Semaphore::new(limits::METRICS_CONNECTIONS_MAX));
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics endpoint: too many connections; closed");
            continue;
        };
        let metrics = metrics.clone();
        let checker = checker.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let io = Duration::from_millis(limits::METRICS_IO_TIMEOUT_MS);
            if tokio::time::timeout(io * 2, answer(socket, &metrics, &checker))
                .await
                .is_err()
            {
                tracing::debug!(%peer, "metrics endpoint: client too slow; closed");
            }
        });
    }
}

/// Pause after a failed `accept` before trying again.
const ACCEPT_RETRY_MS: u64 = 50;

/// A parsed request line: its method and path (without a query string).
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    method: &'a str,
    path: &'a str,
}

/// Why a request head could not be read.
#[derive(Debug, PartialEq, Eq)]
enum Unreadable {
    /// Longer than the limit (431).
    TooLarge,
    /// Not an HTTP/1.x request line (400).
    Malformed,
    /// The client went away or timed out before the head ended (no answer).
    Gone,
}

/// Reads the request head (up to the blank line), within the limits.
async fn read_head(socket: &mut TcpStream) -> Result<Vec<u8>, Unreadable> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(limits::METRICS_IO_TIMEOUT_MS);
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(head);
        }
        if head.len() >= limits::METRICS_REQUEST_BYTES_MAX {
            return Err(Unreadable::TooLarge);
        }
        let room = (limits::METRICS_REQUEST_BYTES_MAX - head.len()).min(chunk.len());
        match tokio::time::timeout_at(deadline, socket.read(&mut chunk[..room])).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(Unreadable::Gone),
            Ok(Ok(n)) => head.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The method and path of a request head's first line.
fn request_line(head: &[u8]) -> Result<Request<'_>, Unreadable> {
    let text = std::str::from_utf8(head).map_err(|_| Unreadable::Malformed)?;
    let line = text.lines().next().ok_or(Unreadable::Malformed)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Unreadable::Malformed);
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(Unreadable::Malformed);
    }
    let path = target.split('?').next().unwrap_or(target);
    Ok(Request { method, path })
}

/// Reads one request and writes its answer.
async fn answer(mut socket: TcpStream, metrics: &Metrics, checker: &Checker) {
    let head = match read_head(&mut socket).await {
        Ok(head) => head,
        Err(Unreadable::Gone) => return,
        Err(Unreadable::TooLarge) => {
            let _ = respond(&mut socket, 431, TEXT, "request head too large\n").await;
            return;
        }
        Err(Unreadable::Malformed) => {
            let _ = respond(&mut socket, 400, TEXT, "bad request\n").await;
            return;
        }
    };
    let request = match request_line(&head) {
        Ok(request) => request,
        Err(_) => {
            let _ = respond(&mut socket, 400, TEXT, "bad request\n").await;
            return;
        }
    };
    let (status, content_type, body) = match (request.method, request.path) {
        ("GET", "/metrics") => (200, OPENMETRICS, metrics.encode()),
        ("GET", "/health") => {
            let (status, body) = checker.health().await.response();
            (status, TEXT, body)
        }
        _ => (404, TEXT, "not found\n".to_string()),
    };
    let _ = respond(&mut socket, status, content_type, &body).await;
}

/// The content type of plain answers.
const TEXT: &str = "text/plain; charset=utf-8";

/// The content type of the exposition (what `prometheus-client` encodes).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Writes a whole response and closes the connection, within the I/O timeout.
async fn respond(
    socket: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(body.as_bytes());
    let write = async {
        socket.write_all(&response).await?;
        socket.shutdown().await
    };
    tokio::time::timeout(Duration::from_millis(limits::METRICS_IO_TIMEOUT_MS), write)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_give_method_and_path_without_query() {
        assert_eq!(
            request_line(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Request {
                method: "GET",
                path: "/metrics"
            })
        );
        assert_eq!(
            request_line(b"GET /health HTTP/1.0\r\n\r\n"),
            Ok(Request {
                method: "GET",
                path: "/health"
            })
        );
    }

    #[test]
    fn malformed_request_lines_are_refused() {
        for head in [
            &b"GET /metrics\r\n\r\n"[..],
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"\xff\xfe /metrics HTTP/1.1\r\n\r\n",
            b"\r\n\r\n",
        ] {
            assert_eq!(request_line(head), Err(Unreadable::Malformed), "{head:?}");
        }
    }

    #[test]
    fn health_is_503_naming_what_does_not_answer() {
        let (status, body) = Health {
            upstream: true,
            ledger: false,
        }
        .response();
        assert_eq!(status, 503);
        assert!(body.contains("ledger: unreachable"), "{body}");
        assert!(body.contains("upstream: ok"), "{body}");
        let (status, _) = Health {
            upstream: true,
            ledger: true,
        }
        .response();
        assert_eq!(status, 200);
    }
}
