//! Cancellation: a CancelRequest stops only the running upstream statement of the connection
//! whose key it carries; a client that goes away mid-statement has its statement cancelled too.
//! Either way the charge stands.

use super::*;

/// The [`Cancel`] of every open client connection, by peer address, with the key pgwire sent
/// it in BackendKeyData once its session exists.
#[derive(Default)]
pub struct Cancels {
    by_peer: std::sync::Mutex<HashMap<SocketAddr, CancelEntry>>,
}

pub(super) struct CancelEntry {
    cancel: Arc<Cancel>,
    key: Option<(i32, SecretKey)>,
}

impl Cancels {
    /// Registers a new connection.
    pub(super) fn open(&self, peer: SocketAddr) -> Arc<Cancel> {
        let cancel = Arc::new(Cancel::default());
        if let Ok(mut by_peer) = self.by_peer.lock() {
            by_peer.insert(
                peer,
                CancelEntry {
                    cancel: cancel.clone(),
                    key: None,
                },
            );
        }
        cancel
    }

    /// Forgets a connection that ended.
    pub(super) fn close(&self, peer: SocketAddr) {
        if let Ok(mut by_peer) = self.by_peer.lock() {
            by_peer.remove(&peer);
        }
    }

    /// The connection's [`Cancel`], now reachable with its BackendKeyData.
    pub(super) fn attach(&self, peer: SocketAddr, pid: i32, key: SecretKey) -> Arc<Cancel> {
        let Ok(mut by_peer) = self.by_peer.lock() else {
            return Arc::new(Cancel::default());
        };
        match by_peer.get_mut(&peer) {
            Some(entry) => {
                entry.key = Some((pid, key));
                entry.cancel.clone()
            }
            None => Arc::new(Cancel::default()),
        }
    }

    /// The connection a CancelRequest names, if its process id and secret key both match.
    fn find(&self, pid: i32, key: &SecretKey) -> Option<Arc<Cancel>> {
        let by_peer = self.by_peer.lock().ok()?;
        by_peer.values().find_map(|entry| match &entry.key {
            Some((p, k)) if *p == pid && same_key(k, key) => Some(entry.cancel.clone()),
            _ => None,
        })
    }
}

/// Compares secret keys in time independent of where they differ.
pub(super) fn same_key(a: &SecretKey, b: &SecretKey) -> bool {
    let (a, b) = (a.to_bytes(), b.to_bytes());
    a.len() == b.len() && a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[async_trait]
impl CancelHandler for Cancels {
    async fn on_cancel_request(&self, request: CancelRequest) {
        match self.find(request.pid, &request.secret_key) {
            Some(cancel) => {
                // Its own task: under a release schedule the cancel waits for the schedule's
                // next point, which must not hold (or be cut short with) this connection.
                let pid = request.pid;
                tokio::spawn(async move {
                    let running = cancel.request(CancelReason::UserRequest).await;
                    tracing::info!(pid, running, "cancel request");
                });
            }
            None => tracing::info!(
                pid = request.pid,
                "cancel request with an unknown key ignored"
            ),
        }
    }
}

/// Watches `socket` for the client going away, through a duplicate of its descriptor (pgwire
/// owns the original): when the client closes or resets the connection, `cancel` stops the
/// upstream statement it was waiting for. Returns the socket for pgwire and the watcher task.
/// While the client has sent bytes pgdp has not read yet (pipelined messages), the end of the
/// stream cannot be seen behind them; the watcher then looks again every
/// [`crate::limits::CLIENT_WATCH_INTERVAL_MS`].
pub(super) fn watch_client(
    socket: TcpStream,
    cancel: Arc<Cancel>,
) -> std::io::Result<(TcpStream, tokio::task::JoinHandle<()>)> {
    let original = socket.into_std()?;
    let duplicate = original.try_clone()?;
    let socket = TcpStream::from_std(original)?;
    let watched = TcpStream::from_std(duplicate)?;
    let watcher = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        loop {
            match watched.peek(&mut byte).await {
                Ok(0) | Err(_) => {
                    cancel.request(CancelReason::ClientGone).await;
                    return;
                }
                Ok(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(
                        crate::limits::CLIENT_WATCH_INTERVAL_MS,
                    ))
                    .await
                }
            }
        }
    });
    Ok((socket, watcher))
}
