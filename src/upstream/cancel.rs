//! Stopping the upstream statement of one client connection from another task (a CancelRequest,
//! or the client going away).
//!
//! Invariant: a cancel reaches only a statement that is running, as in PostgreSQL; a client that
//! went away is remembered, so its session starts no upstream statement after it.

use std::sync::Mutex;

use crate::dsn::Canceller;

use crate::error::{Error, Result};

/// Why a running upstream statement is stopped on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// A CancelRequest with the session's key (psql's Ctrl-C).
    UserRequest,
    /// The client closed its connection; nobody waits for the answer.
    ClientGone,
}

impl CancelReason {
    /// The end of PostgreSQL's "canceling statement due to …" message.
    pub(super) fn message(self) -> &'static str {
        match self {
            CancelReason::UserRequest => "user request",
            CancelReason::ClientGone => "client disconnect",
        }
    }
}

impl std::fmt::Debug for CancelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelState")
            .field("running", &self.running.is_some())
            .field("requested", &self.requested)
            .field("client_gone", &self.client_gone)
            .finish()
    }
}

/// Stops the upstream statement of one client connection from another task: a CancelRequest
/// naming the connection's key, or the watcher that notices the client went away.
///
/// Like PostgreSQL, a cancel reaches only a statement that is running: one that arrives between
/// statements does nothing. A client that went away is remembered, so the session starts no
/// statement after it (its charge, if any, was made and stays).
#[derive(Debug, Default)]
pub struct Cancel {
    state: Mutex<CancelState>,
}

#[derive(Default)]
struct CancelState {
    /// The cancel token of the upstream connection running this connection's statement.
    running: Option<Canceller>,
    /// Why the running statement was cancelled, if it was.
    requested: Option<CancelReason>,
    /// The client went away.
    client_gone: bool,
}

impl Cancel {
    /// Cancels the running upstream statement, if any; returns whether one was running. The
    /// cancel is sent to the upstream before this returns (best effort: it is logged if the
    /// upstream cannot be reached).
    pub async fn request(&self, reason: CancelReason) -> bool {
        let token = {
            let Ok(mut state) = self.state.lock() else {
                return false;
            };
            if reason == CancelReason::ClientGone {
                state.client_gone = true;
            }
            match state.running.take() {
                Some(token) => {
                    state.requested = Some(reason);
                    token
                }
                None => return false,
            }
        };
        tracing::info!(
            reason = reason.message(),
            "cancelling the upstream statement"
        );
        if let Err(e) = token.cancel().await {
            tracing::warn!(error = %e, "cannot send the cancel request to the upstream");
        }
        true
    }

    /// Marks a statement as running on the connection of `token`.
    pub(super) fn begin(&self, token: Canceller) -> Result<Running<'_>> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| Error::internal("cancel state poisoned"))?;
        if state.client_gone {
            return Err(Error::Canceled {
                reason: CancelReason::ClientGone.message().into(),
            });
        }
        state.running = Some(token);
        state.requested = None;
        Ok(Running {
            cancel: self,
            ended: false,
        })
    }
}

/// A statement running under a [`Cancel`]; [`Running::end`] says whether it was cancelled. If it
/// is dropped instead (the future running the statement was dropped), the statement is
/// cancelled on the upstream.
pub(super) struct Running<'c> {
    cancel: &'c Cancel,
    ended: bool,
}

impl Running<'_> {
    /// The statement completed (or failed); returns why it was cancelled, if it was.
    pub(super) fn end(mut self) -> Option<CancelReason> {
        self.ended = true;
        self.cancel.state.lock().ok().and_then(|mut state| {
            state.running = None;
            state.requested.take()
        })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let token = self
            .cancel
            .state
            .lock()
            .ok()
            .and_then(|mut state| state.running.take());
        if let (Some(token), Ok(runtime)) = (token, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                let _ = token.cancel().await;
            });
        }
    }
}
