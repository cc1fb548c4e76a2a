//! The extended query protocol: Parse (one statement, its parameter types), Describe of
//! statements and portals (the columns the route will answer with, without running anything),
//! and Execute (through the same [`crate::session::Session::run`] as the simple protocol).

use super::*;
use crate::session::bind::ParameterType;

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let started = Instant::now();
        let classified = classify::classify(sql);
        // The metrics outlive reloads: any snapshot's are the server's.
        let metrics = self.live.current().metrics.clone();
        metrics.stage(crate::metrics::Stage::Parse, started.elapsed());
        let mut statements = classified.map_err(|e| {
            metrics.failed(&e);
            user_error(&e)
        })?;
        if statements.len() > 1 {
            return Err(user_error(&Error::Syntax {
                message: "cannot insert multiple commands into a prepared statement".into(),
            }));
        }
        let Some(statement) = statements.pop() else {
            return Ok(None);
        };
        let conn = connection(client);
        let mut slot = conn.session.lock().await;
        let shared = self.live.current();
        let session = ensure_session(&mut slot, client, &shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        // Client-declared types win; otherwise the type PostgreSQL infers (the shadow catalog
        // prepares the statement on the upstream's column types: `$1::DATE` is a date, `age > $1`
        // an int4, `income > $1` a numeric), as drivers that bind by the described type
        // (asyncpg, psycopg 3 server-side) need; where the shadow cannot prepare the statement
        // (a pgdp-only function such as MEDIAN), the type analysis inferred from the context.
        let described = session::described_parameter_types(&shared, session, &statement).await;
        let inferred = if described.is_empty() {
            session::parameter_types(&shared, session, &statement)
        } else {
            Vec::new()
        };
        let count = inferred
            .iter()
            .map(|(i, _, _)| *i)
            .max()
            .unwrap_or(0)
            .max(types.len())
            .max(described.len())
            .max(session::placeholder_count(&statement));
        let parameter_types = (1..=count)
            .map(|i| {
                types.get(i - 1).cloned().flatten().unwrap_or_else(|| {
                    described
                        .get(i - 1)
                        .and_then(|oid| Type::from_oid(*oid))
                        .or_else(|| {
                            inferred
                                .iter()
                                .find(|(j, _, _)| *j == i)
                                .map(|(_, t, declared)| parameter_pg_type(*t, declared.as_deref()))
                        })
                        .unwrap_or(Type::TEXT)
                })
            })
            .collect::<Vec<Type>>();
        let oids: Vec<u32> = parameter_types.iter().map(Type::oid).collect();
        let columns = session::describe(&shared, session, &statement, &oids)
            .await
            .map_err(|e| {
                metrics.failed(&e);
                user_error(&e)
            })?;
        Ok(Some(Prepared {
            statement: Some(statement),
            columns,
            parameter_types,
        }))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.parameter_types.clone())
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let format = format.cloned().unwrap_or_default();
        Ok(stmt
            .columns
            .as_deref()
            .map(|c| fields(c, &format))
            .unwrap_or_default())
    }
}

#[async_trait]
impl ExtendedQueryHandler for QueryHandler {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    /// Execute with the client's row limit made safe before pgwire sees it: pgwire casts the
    /// `i32` to `usize` and preallocates that many rows, so a negative limit panicked and a huge
    /// one aborted the whole process on a failed allocation (found by the wire fuzzer). As in
    /// PostgreSQL, a limit of zero or less means all rows; a positive one is capped at
    /// [`crate::limits::ROWS_PER_EXECUTE_MAX`] (the portal is then suspended, and the client fetches on).
    async fn on_execute<C>(&self, client: &mut C, mut message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        message.max_rows = rows_per_execute(message.max_rows);
        self._on_execute(client, message).await
    }

    /// pgwire's Parse, with the number of named prepared statements bounded (54000).
    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let named = message
            .name
            .clone()
            .filter(|n| !n.is_empty() && n != DEFAULT_NAME);
        if let Some(name) = &named {
            let conn = connection(client);
            let names = conn.prepared_names();
            if !names.contains(name) && names.len() >= self.prepared_statements_max {
                return Err(user_error(&Error::LimitExceeded {
                    what: "the number of prepared statements of this connection".into(),
                    limit: self.prepared_statements_max as u64,
                }));
            }
        }
        let name = named.clone().unwrap_or_else(|| DEFAULT_NAME.to_owned());
        match StoredStatement::parse(client, &message, self.query_parser()).await? {
            Some(statement) => client.portal_store().put_statement(Arc::new(statement)),
            None => client.portal_store().put_empty_statement(&name),
        }
        if let Some(name) = named {
            connection(client).prepared_names().insert(name);
        }
        client
            .send(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    /// pgwire's Describe, where a portal that Bind did not make may be a cursor: in PostgreSQL
    /// a cursor declared in SQL (`DECLARE c CURSOR WITH HOLD FOR …`) is a portal of that name,
    /// and psycopg 3's server-side cursors (Django's `.iterator()`, SQLAlchemy's
    /// `stream_results`, pandas' `chunksize`) describe it so before FETCH. Its rows are sent in
    /// text (pgdp declares no BINARY cursors), as PostgreSQL describes such a portal.
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        if message.target_type == TARGET_TYPE_BYTE_PORTAL
            && client.portal_store().get_portal(name).is_none()
        {
            let conn = connection(client);
            let cursor = conn
                .session
                .lock()
                .await
                .as_ref()
                .and_then(|s| s.cursor_columns(name));
            if let Some(columns) = cursor {
                let response = DescribePortalResponse::new(fields(&columns, &Format::UnifiedText));
                return send_describe_response(client, &response).await;
            }
        }
        self._on_describe(client, message).await
    }

    /// pgwire's Close, keeping the count of prepared statements.
    async fn on_close<C>(&self, client: &mut C, message: Close) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        match message.target_type {
            TARGET_TYPE_BYTE_STATEMENT => forget_statements(client, Some(name)),
            TARGET_TYPE_BYTE_PORTAL => client.portal_store().rm_portal(name),
            _ => {}
        }
        client
            .send(PgWireBackendMessage::CloseComplete(CloseComplete::new()))
            .await?;
        Ok(())
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(statement) = portal.statement.statement.statement.clone() else {
            return Ok(Response::EmptyQuery);
        };
        let conn = connection(client);
        let mut slot = conn.session.lock().await;
        let shared = self.live.current();
        let session = ensure_session(&mut slot, client, &shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let started = Instant::now();
        let failed = in_failed_transaction(client);
        let result = if failed && !matches!(statement, Statement::Commit | Statement::Rollback) {
            let aborted = aborted_transaction();
            shared.metrics.failed(&aborted);
            Err(aborted)
        } else {
            // Rows must match what Describe announced at Parse (a SET in between, e.g. of
            // pgdp.accuracy, can change them), as PostgreSQL insists for cached plans; checked
            // before running, so the refusal costs nothing.
            let described = &portal.statement.statement.columns;
            let oids: Vec<u32> = portal
                .statement
                .statement
                .parameter_types
                .iter()
                .map(Type::oid)
                .collect();
            let shape = match (&statement, described) {
                (Statement::Query(_), Some(before)) => {
                    match session::describe(&shared, session, &statement, &oids).await {
                        Ok(Some(now)) if now != *before => Err(Error::unsupported(
                            "a prepared statement whose result columns changed since it was prepared",
                            "Prepare the statement again: pgdp.accuracy or the pgdp policy changed since.",
                        )),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                _ => Ok(()),
            };
            match (shape, parameters_as_text(portal)) {
                (Err(e), _) | (Ok(()), Err(e)) => {
                    shared.metrics.failed(&e);
                    Err(e)
                }
                (Ok(()), Ok(params)) => {
                    // Parameters are values known at Bind: a DP statement is analysed with them.
                    let types: Vec<ParameterType> = portal
                        .statement
                        .statement
                        .parameter_types
                        .iter()
                        .map(|t| ParameterType::of_oid(t.oid()))
                        .collect();
                    match session::bind_statement(&statement, &params, &types) {
                        Ok(bound) => {
                            let statement = bound.as_ref().unwrap_or(&statement);
                            run_statement(session, &shared, statement, &params, failed).await
                        }
                        Err(e) => {
                            shared.metrics.failed(&e);
                            Err(e)
                        }
                    }
                }
            }
        };
        log_statement(&session.analyst.name, statement.kind(), &result, started);
        drop(slot);
        match result {
            Ok(outcome) => {
                if let Statement::Deallocate { name } = &statement {
                    forget_statements(client, name.as_deref());
                }
                let fetch = matches!(statement, Statement::Fetch { .. });
                respond(client, outcome, &portal.result_column_format, fetch).await
            }
            Err(e) => Err(PgWireError::UserError(Box::new(refusal_info(&e)))),
        }
    }
}
