//! Stopping the upstream statement of one client connection from another task (a CancelRequest,
//! or the client going away).
//!
//! Invariant: a cancel reaches only a statement that is running, as in PostgreSQL; a client that
//! went away is remembered, so its session starts no upstream statement after it.
//!
//! Invariant: under a release schedule ([`Cancel::defer_to_release_points`]) a CancelRequest
//! takes effect only at the schedule's next point, so whether it finds the statement still
//! running tells no more than the point the answer would have left at.

use std::sync::Mutex;
use std::time::Instant;

use crate::policy::ReleaseSchedule;

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
            .field("schedule", &self.schedule)
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
    /// Deferrals begun so far (one per scheduled DP statement), so a deferred cancel reaches
    /// only the statement it was meant for, whichever of its upstream queries (public domain,
    /// release) runs at the point.
    deferrals: u64,
    /// The release schedule of the statement under way and when it started, if any.
    schedule: Option<(Instant, ReleaseSchedule)>,
}

impl Cancel {
    /// Cancels the running upstream statement, if any; returns whether one was running. The
    /// cancel is sent to the upstream before this returns (best effort: it is logged if the
    /// upstream cannot be reached).
    ///
    /// Under a release schedule, a CancelRequest from the client waits for the schedule's next
    /// point and then cancels the statement if that same statement is still running. An answer
    /// that was ready by then leaves at its own point, as without the cancel; one that was not
    /// is cancelled. Either way the outcome depends on the point, not on the exact time the
    /// upstream finished, which a cancel sent at a chosen moment would otherwise reveal.
    pub async fn request(&self, reason: CancelReason) -> bool {
        if reason == CancelReason::UserRequest {
            let deferred = match self.state.lock() {
                Ok(state) if state.running.is_some() => {
                    state.schedule.map(|(started, schedule)| {
                        (
                            started + schedule.release_at(started.elapsed()),
                            state.deferrals,
                        )
                    })
                }
                _ => None,
            };
            if let Some((at, deferral)) = deferred {
                tokio::time::sleep_until(at.into()).await;
                let same = self
                    .state
                    .lock()
                    .is_ok_and(|s| s.schedule.is_some() && s.deferrals == deferral);
                if !same {
                    return false;
                }
            }
        }
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

impl Cancel {
    /// While the returned guard lives, the session's statement (started at `started`) releases
    /// its answer on `schedule`, and CancelRequests wait for its points.
    pub fn defer_to_release_points(
        &self,
        started: Instant,
        schedule: ReleaseSchedule,
    ) -> Deferred<'_> {
        if let Ok(mut state) = self.state.lock() {
            state.schedule = Some((started, schedule));
            state.deferrals = state.deferrals.wrapping_add(1);
        }
        Deferred { cancel: self }
    }
}

/// Cancels deferred to a release schedule; dropping it ends the deferral.
#[must_use = "the deferral ends when this is dropped"]
pub struct Deferred<'c> {
    cancel: &'c Cancel,
}

impl Drop for Deferred<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.cancel.state.lock() {
            state.schedule = None;
        }
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
