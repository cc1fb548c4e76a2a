//! What a statement's run tells the metrics: how it was answered (from its [`route`], and for a
//! DP query from what the pipeline did), or why it failed.
//!
//! Invariant: only pgdp's own classification reaches the metrics (an outcome word, the
//! SQLSTATE class pgdp chose, the analyst's policy name): never the SQL text or a value read
//! from the upstream.

use crate::error::Result;
use crate::metrics::Served;

use super::classify::Statement;
use super::{route, Outcome, Route, Session, Shared};

impl Session {
    /// Records the result of one statement run by [`Session::run`] in the server's metrics.
    pub fn observe(&mut self, shared: &Shared, statement: &Statement, result: &Result<Outcome>) {
        let served = self.served.take();
        match result {
            Ok(_) => {
                let how = match route(statement) {
                    Ok(Route::Dp(_)) => served.unwrap_or(Served::AnsweredDp),
                    Ok(Route::Explain(_)) => Served::Explain,
                    Ok(Route::Catalog(_)) => Served::Catalog,
                    Ok(Route::Constant(_)) => Served::Constant,
                    Ok(Route::Budget(_)) => Served::Budget,
                    Ok(Route::Cursor) => Served::Cursor,
                    Ok(Route::Session | Route::Show(_) | Route::SetConfig(_)) | Err(_) => {
                        Served::Session
                    }
                };
                shared.metrics.served(how);
            }
            Err(e) => shared.metrics.failed(e),
        }
    }
}
