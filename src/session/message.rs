//! A simple-protocol message with several statements is all or nothing for refusals, as
//! PostgreSQL's implicit transaction is: every statement is analysed before any of them runs, and
//! if one would be refused, the message is refused as a whole: nothing runs, nothing is charged,
//! nothing is released.
//!
//! The check runs each statement's refusal stages without I/O on the data: routing, SET and
//! RESET validation (on the settings as the earlier statements of the message leave them, then
//! put back), analysis, rewrite and mechanisms of DP queries and EXPLAIN (with the privacy
//! settings in force at that statement), the catalog allow-lists and the constants.
//!
//! What it cannot foresee, and what then still stops the message part-way as in PostgreSQL (the
//! results of earlier statements having been sent): a budget that runs out at a later
//! statement's charge, an upstream failure, FETCH or CLOSE of a cursor that does not exist.

use crate::error::Result;
use crate::session::classify::Statement;
use crate::session::route::{route, Route};
use crate::session::{Session, Shared};

impl Session {
    /// Checks every statement of a message before any of them runs; the first refusal refuses
    /// the message. The session's state is as before whatever the outcome.
    pub async fn check_message(&mut self, shared: &Shared, statements: &[Statement]) -> Result<()> {
        if statements.len() < 2 {
            return Ok(());
        }
        let saved = (
            self.settings.clone(),
            self.in_transaction,
            self.settings_at_begin.clone(),
            self.savepoints.clone(),
        );
        let verdict = self.check_each(shared, statements).await;
        (
            self.settings,
            self.in_transaction,
            self.settings_at_begin,
            self.savepoints,
        ) = saved;
        verdict
    }

    async fn check_each(&mut self, shared: &Shared, statements: &[Statement]) -> Result<()> {
        for statement in statements {
            match route(statement)? {
                // Transaction control, SET and RESET change the settings later statements see.
                Route::Session => {
                    self.session_state(shared, statement)?;
                }
                Route::Cursor => {
                    if let Statement::DeclareCursor { query, .. } = statement {
                        self.check_query(shared, query).await?;
                    }
                }
                Route::Show(name) => {
                    self.settings.show(name, &self.server_version)?;
                }
                Route::Budget(columns) => {
                    columns.names()?;
                }
                Route::Constant(items) => {
                    for item in items {
                        self.evaluate_constant(shared, item)?;
                    }
                }
                Route::SetConfig(call) => {
                    self.session_state(
                        shared,
                        &super::constant::set_config_statement(&call, &[])?,
                    )?;
                }
                Route::Catalog(query) => {
                    crate::upstream::catalog::check(query, &[], &|name| {
                        Ok(self.settings.show(name, &self.server_version)?.1)
                    })?;
                }
                Route::Dp(query) | Route::Explain(query) => {
                    let secret = shared.secret().await?;
                    self.plan_dp(shared, query, &[], secret).await?;
                }
            }
        }
        Ok(())
    }

    /// The checks of a cursor's query: those of the statement it would be on its own.
    async fn check_query(&mut self, shared: &Shared, query: &sqlparser::ast::Query) -> Result<()> {
        let statement = Statement::Query(Box::new(query.clone()));
        Box::pin(self.check_each(shared, std::slice::from_ref(&statement))).await
    }
}
