//! The PostgreSQL wire protocol front end (pgwire): startup and SCRAM-SHA-256 authentication of
//! analysts, the simple and extended query protocols, Describe, and encoding of results, notices
//! and errors.
//!
//! Invariants:
//! - Nothing here decides what is allowed: every statement goes through [`crate::classify`] and
//!   [`crate::session::Session::execute`]; this module only translates between messages and
//!   plain data.
//! - Errors reach the client as `ErrorResponse` with the SQLSTATE of [`Error::sqlstate`], our
//!   message and hint; a refused statement never ends the connection.
//! - Authentication failures look the same for unknown analysts and wrong passwords (28P01):
//!   unknown names get a decoy verifier, so the SCRAM exchange runs the same way.
//! - A CancelRequest reaches only the connection whose BackendKeyData (process id and secret
//!   key, sent by pgwire at startup) it carries, and stops only that connection's running
//!   upstream statement ([`Cancels`]); a wrong key does nothing. A client that goes away
//!   mid-statement has its upstream statement cancelled too ([`watch_client`]). Either way the
//!   charge stands.

use std::collections::HashMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt};
use pgwire::api::auth::sasl::scram::{gen_salted_password, ScramAuth, ScramSecret};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{AuthSource, LoginInfo, Password, ServerParameterProvider};
use pgwire::api::cancel::CancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::startup::SecretKey;
use pgwire::messages::PgWireBackendMessage;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use crate::backend::{Cancel, CancelReason};

use crate::classify::{self, Statement};
use crate::error::Error;
use crate::policy::{Credential, Policy};
use crate::session::{self, Cell, CellType, OutColumn, Outcome, Session, Shared};

/// Accepts connections forever, one task per connection.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    let handlers = Arc::new(Handlers::new(shared.clone()));
    let connections = Arc::new(tokio::sync::Semaphore::new(crate::limits::CONNECTIONS_MAX));
    loop {
        let (socket, peer) = listener.accept().await?;
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "refusing connection: too many connections");
            drop(socket);
            continue;
        };
        let handlers = handlers.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let (socket, watcher) = match watch_client(socket, handlers.cancels.open(peer)) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot watch the client connection");
                    handlers.cancels.close(peer);
                    return;
                }
            };
            if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers.clone()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            watcher.abort();
            handlers.cancels.close(peer);
        });
    }
}

/// The handlers of all connections. Per-connection state lives in pgwire's session extensions.
pub struct Handlers {
    shared: Arc<Shared>,
    query: Arc<QueryHandler>,
    startup: Arc<SASLAuthStartupHandler<Parameters>>,
    cancels: Arc<Cancels>,
}

impl Handlers {
    /// Handlers for a server.
    pub fn new(shared: Arc<Shared>) -> Handlers {
        let credentials = Credentials::new(&shared.policy);
        let scram = ScramAuth::new(Arc::new(credentials));
        let startup = SASLAuthStartupHandler::new(Arc::new(Parameters {
            shared: shared.clone(),
        }))
        .with_scram(scram);
        let cancels = Arc::new(Cancels::default());
        Handlers {
            query: Arc::new(QueryHandler {
                shared: shared.clone(),
                parser: Arc::new(Parser {
                    shared: shared.clone(),
                    cancels: cancels.clone(),
                }),
                cancels: cancels.clone(),
            }),
            startup: Arc::new(startup),
            shared,
            cancels,
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.query.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.query.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        let _ = &self.shared;
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        self.cancels.clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation: CancelRequest, and clients that go away mid-statement
// ---------------------------------------------------------------------------------------------

/// The [`Cancel`] of every open client connection, by peer address, with the key pgwire sent
/// it in BackendKeyData once its session exists.
#[derive(Default)]
pub struct Cancels {
    by_peer: std::sync::Mutex<HashMap<SocketAddr, CancelEntry>>,
}

struct CancelEntry {
    cancel: Arc<Cancel>,
    key: Option<(i32, SecretKey)>,
}

impl Cancels {
    /// Registers a new connection.
    fn open(&self, peer: SocketAddr) -> Arc<Cancel> {
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
    fn close(&self, peer: SocketAddr) {
        if let Ok(mut by_peer) = self.by_peer.lock() {
            by_peer.remove(&peer);
        }
    }

    /// The connection's [`Cancel`], now reachable with its BackendKeyData.
    fn attach(&self, peer: SocketAddr, pid: i32, key: SecretKey) -> Arc<Cancel> {
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
fn same_key(a: &SecretKey, b: &SecretKey) -> bool {
    let (a, b) = (a.to_bytes(), b.to_bytes());
    a.len() == b.len() && a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[async_trait]
impl CancelHandler for Cancels {
    async fn on_cancel_request(&self, request: CancelRequest) {
        match self.find(request.pid, &request.secret_key) {
            Some(cancel) => {
                let running = cancel.request(CancelReason::UserRequest).await;
                tracing::info!(pid = request.pid, running, "cancel request");
            }
            None => tracing::info!(
                pid = request.pid,
                "cancel request with an unknown key ignored"
            ),
        }
    }
}

/// How often a client's socket is looked at again while it holds bytes pgdp has not read yet.
const CLIENT_WATCH_INTERVAL_MS: u64 = 200;

/// Watches `socket` for the client going away, through a duplicate of its descriptor (pgwire
/// owns the original): when the client closes or resets the connection, `cancel` stops the
/// upstream statement it was waiting for. Returns the socket for pgwire and the watcher task.
/// While the client has sent bytes pgdp has not read yet (pipelined messages), the end of the
/// stream cannot be seen behind them; the watcher then looks again every
/// [`CLIENT_WATCH_INTERVAL_MS`].
fn watch_client(
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
                    tokio::time::sleep(std::time::Duration::from_millis(CLIENT_WATCH_INTERVAL_MS))
                        .await
                }
            }
        }
    });
    Ok((socket, watcher))
}

// ---------------------------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------------------------

/// Analyst credentials from the policy, in the form SCRAM needs.
struct Credentials {
    database: String,
    secrets: HashMap<String, StoredSecret>,
    decoy_key: [u8; 32],
}

enum StoredSecret {
    Verifier {
        salt: Vec<u8>,
        iterations: usize,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    },
    Salted {
        salt: Vec<u8>,
        salted_password: Vec<u8>,
    },
}

impl Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("analysts", &self.secrets.len())
            .finish()
    }
}

impl Credentials {
    fn new(policy: &Policy) -> Credentials {
        let mut decoy_key = [0u8; 32];
        rand::fill(&mut decoy_key);
        let secrets = policy
            .analysts
            .values()
            .map(|a| {
                let secret = match &a.credential {
                    Credential::Verifier {
                        salt,
                        iterations,
                        stored_key,
                        server_key,
                    } => StoredSecret::Verifier {
                        salt: salt.clone(),
                        iterations: *iterations,
                        stored_key: stored_key.clone(),
                        server_key: server_key.clone(),
                    },
                    Credential::Password(pw) => {
                        let mut salt = vec![0u8; 16];
                        rand::fill(salt.as_mut_slice());
                        let salted_password = gen_salted_password(pw, &salt, 4096);
                        StoredSecret::Salted {
                            salt,
                            salted_password,
                        }
                    }
                };
                (a.name.clone(), secret)
            })
            .collect();
        Credentials {
            database: policy.database.clone(),
            secrets,
            decoy_key,
        }
    }

    /// A verifier for an unknown user: deterministic per user (so retries look alike) and never
    /// matching any password.
    fn decoy(&self, user: &str) -> ScramSecret {
        let digest = |label: &[u8]| {
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
            ctx.update(&self.decoy_key);
            ctx.update(label);
            ctx.update(user.as_bytes());
            ctx.finish().as_ref().to_vec()
        };
        ScramSecret::Verifier {
            salt: digest(b"salt")[..16].to_vec(),
            iterations: 4096,
            stored_key: digest(b"stored"),
            server_key: digest(b"server"),
        }
    }
}

#[async_trait]
impl AuthSource for Credentials {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        Err(PgWireError::InvalidPassword(
            login.user().unwrap_or_default().to_owned(),
        ))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let user = login.user().unwrap_or_default();
        let database = login.database().unwrap_or(user);
        if database != self.database {
            return Err(user_error(&Error::UnknownDatabase {
                name: database.to_string(),
            }));
        }
        let secret = match self.secrets.get(user) {
            Some(StoredSecret::Verifier {
                salt,
                iterations,
                stored_key,
                server_key,
            }) => ScramSecret::Verifier {
                salt: salt.clone(),
                iterations: *iterations,
                stored_key: stored_key.clone(),
                server_key: server_key.clone(),
            },
            Some(StoredSecret::Salted {
                salt,
                salted_password,
            }) => ScramSecret::SaltedPassword {
                salt: salt.clone(),
                salted_password: salted_password.clone(),
            },
            None => self.decoy(user),
        };
        Ok((secret, None))
    }
}

/// ParameterStatus values sent at startup.
struct Parameters {
    shared: Arc<Shared>,
}

impl ServerParameterProvider for Parameters {
    fn server_parameters<C>(&self, client: &C) -> Option<HashMap<String, String>>
    where
        C: ClientInfo,
    {
        let version = self
            .shared
            .backend
            .cached_server_version()
            .unwrap_or_else(|| "15.0".into());
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let application = client
            .metadata()
            .get("application_name")
            .cloned()
            .unwrap_or_default();
        let mut p = HashMap::new();
        for (k, v) in [
            ("server_version", version.as_str()),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("IntervalStyle", "postgres"),
            ("TimeZone", "UTC"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("is_superuser", "off"),
            ("default_transaction_read_only", "on"),
            ("in_hot_standby", "off"),
            ("session_authorization", user.as_str()),
            ("application_name", application.as_str()),
        ] {
            p.insert(k.to_string(), v.to_string());
        }
        Some(p)
    }
}

// ---------------------------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------------------------

/// Per-connection state, kept in pgwire's session extensions.
#[derive(Default)]
struct Connection {
    session: Mutex<Option<Session>>,
}

/// A statement prepared with Parse: classified once, its result schema known for Describe.
#[derive(Debug, Clone)]
pub struct Prepared {
    statement: Option<Statement>,
    columns: Option<Vec<OutColumn>>,
    parameter_types: Vec<Type>,
}

/// Handles simple and extended queries.
pub struct QueryHandler {
    shared: Arc<Shared>,
    parser: Arc<Parser>,
    cancels: Arc<Cancels>,
}

/// Parses and classifies statements of the extended protocol.
pub struct Parser {
    shared: Arc<Shared>,
    cancels: Arc<Cancels>,
}

fn connection<C: ClientInfo>(client: &C) -> Arc<Connection> {
    client
        .session_extensions()
        .get_or_insert_with(Connection::default)
}

/// Creates the session on first use (after authentication, the user is a known analyst).
fn ensure_session<'a, C: ClientInfo>(
    slot: &'a mut Option<Session>,
    client: &C,
    shared: &Shared,
    cancels: &Cancels,
) -> Result<&'a mut Session, Error> {
    if slot.is_none() {
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let analyst = shared
            .policy
            .analysts
            .get(&user)
            .cloned()
            .ok_or(Error::Authentication { user })?;
        let version = shared
            .backend
            .cached_server_version()
            .unwrap_or_else(|| "15.0".into());
        let (pid, key) = client.pid_and_secret_key();
        let cancel = cancels.attach(client.socket_addr(), pid, key);
        *slot = Some(Session::new(shared, analyst, version, pid, cancel)?);
    }
    slot.as_mut()
        .ok_or_else(|| Error::internal("session missing after creation"))
}

fn error_info(e: &Error) -> ErrorInfo {
    let mut info = ErrorInfo::new(
        "ERROR".to_owned(),
        e.sqlstate().code().to_owned(),
        e.to_string(),
    );
    info.hint = e.hint().map(str::to_owned);
    info
}

fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

fn pg_type(ty: CellType) -> Type {
    match ty {
        CellType::Int8 => Type::INT8,
        CellType::Int4 => Type::INT4,
        CellType::Float8 => Type::FLOAT8,
        CellType::Text => Type::TEXT,
        CellType::Bool => Type::BOOL,
        CellType::Raw(oid) => Type::from_oid(oid).unwrap_or(Type::TEXT),
    }
}

fn parameter_pg_type(ty: crate::policy::ColumnType, declared: Option<&str>) -> Type {
    use crate::policy::ColumnType as C;
    match declared {
        Some("integer" | "int" | "int4") => return Type::INT4,
        Some("smallint" | "int2") => return Type::INT2,
        _ => {}
    }
    match ty {
        C::Integer => Type::INT8,
        // Drivers bind floats more easily than numerics; pgdp casts to numeric itself.
        C::Numeric | C::Float => Type::FLOAT8,
        C::Text => Type::TEXT,
        C::Date => Type::DATE,
        C::Timestamp => Type::TIMESTAMP,
        C::Boolean => Type::BOOL,
    }
}

/// Encodes a catalog value (PostgreSQL text output) in the requested format.
fn encode_raw(
    encoder: &mut DataRowEncoder,
    oid: u32,
    value: Option<String>,
    format: FieldFormat,
) -> PgWireResult<()> {
    let ty = Type::from_oid(oid).unwrap_or(Type::TEXT);
    let options = pgwire::types::format::FormatOptions::default();
    if format == FieldFormat::Text {
        // The text is already PostgreSQL's output; write it as is (no array re-quoting).
        return encoder.encode_field_with_type_and_format(&value, &Type::TEXT, format, &options);
    }
    let type_name = ty.name().to_string();
    let bad = || {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            "0A000".into(),
            format!(
                "binary format for catalog columns of type {type_name} is not supported by pgdp"
            ),
        )))
    };
    let parse_err = |_| bad();
    match ty.clone() {
        t if t == Type::INT2 => {
            let v = value
                .map(|x| x.parse::<i16>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::INT4 => {
            let v = value
                .map(|x| x.parse::<i32>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::INT8 => {
            let v = value
                .map(|x| x.parse::<i64>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::OID => {
            let v = value
                .map(|x| x.parse::<u32>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::BOOL => {
            let v = value.map(|x| x == "t");
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::CHAR => {
            // The single-byte "char" (pg_class.relkind and friends): its binary form is the byte.
            let v = value
                .map(|x| match x.as_bytes() {
                    [] => Ok(0i8),
                    [b] => Ok(i8::from_ne_bytes([*b])),
                    _ => Err(()),
                })
                .transpose()
                .map_err(|()| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::FLOAT4 => {
            let v = value
                .map(|x| x.parse::<f32>())
                .transpose()
                .map_err(|_| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::FLOAT8 => {
            let v = value
                .map(|x| x.parse::<f64>())
                .transpose()
                .map_err(|_| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::TEXT || t == Type::VARCHAR || t == Type::NAME || t == Type::BPCHAR => {
            encoder.encode_field_with_type_and_format(&value, &Type::TEXT, format, &options)
        }
        _ => Err(bad()),
    }
}

fn fields(columns: &[OutColumn], format: &Format) -> Vec<FieldInfo> {
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            FieldInfo::new(
                c.name.clone(),
                None,
                None,
                pg_type(c.ty),
                format.format_for(i),
            )
        })
        .collect()
}

fn encode_rows(
    columns: &[OutColumn],
    rows: Vec<Vec<Cell>>,
    format: &Format,
) -> PgWireResult<QueryResponse> {
    let schema = Arc::new(fields(columns, format));
    let mut encoder = DataRowEncoder::new(schema.clone());
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        for (i, (cell, column)) in row.into_iter().zip(columns).enumerate() {
            match (column.ty, cell) {
                (CellType::Raw(oid), cell) => {
                    let value = match cell {
                        Cell::Null => None,
                        Cell::Text(t) => Some(t),
                        Cell::Int(x) => Some(x.to_string()),
                        Cell::Float(x) => Some(x.to_string()),
                        Cell::Bool(b) => Some(if b { "t" } else { "f" }.to_string()),
                    };
                    encode_raw(&mut encoder, oid, value, format.format_for(i))?
                }
                (CellType::Int8, Cell::Int(i)) => encoder.encode_field(&Some(i))?,
                (CellType::Int4, Cell::Int(i)) => {
                    encoder.encode_field(&Some(i32::try_from(i).unwrap_or(i32::MAX)))?
                }
                (CellType::Float8, Cell::Float(f)) => encoder.encode_field(&Some(f))?,
                (CellType::Float8, Cell::Int(i)) => encoder.encode_field(&Some(i as f64))?,
                (CellType::Bool, Cell::Bool(b)) => encoder.encode_field(&Some(b))?,
                (CellType::Text, Cell::Text(t)) => encoder.encode_field(&Some(t))?,
                (CellType::Int8, _) => encoder.encode_field(&None::<i64>)?,
                (CellType::Int4, _) => encoder.encode_field(&None::<i32>)?,
                (CellType::Float8, _) => encoder.encode_field(&None::<f64>)?,
                (CellType::Bool, _) => encoder.encode_field(&None::<bool>)?,
                (CellType::Text, other) => match other {
                    Cell::Null => encoder.encode_field(&None::<String>)?,
                    Cell::Int(i) => encoder.encode_field(&Some(i.to_string()))?,
                    Cell::Float(f) => encoder.encode_field(&Some(f.to_string()))?,
                    Cell::Bool(b) => {
                        encoder.encode_field(&Some(if b { "t" } else { "f" }.to_string()))?
                    }
                    Cell::Text(t) => encoder.encode_field(&Some(t))?,
                },
            }
        }
        out.push(Ok(encoder.take_row()));
    }
    Ok(QueryResponse::new(schema, stream::iter(out)))
}

/// Sends notices and parameter changes, and turns an outcome into a pgwire response.
async fn respond<C>(client: &mut C, outcome: Outcome, format: &Format) -> PgWireResult<Response>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    Ok(match outcome {
        Outcome::Command { tag, reported } => {
            if let Some((name, value)) = reported {
                client
                    .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                        name, value,
                    )))
                    .await?;
            }
            Response::Execution(Tag::new(&tag))
        }
        Outcome::TransactionStart => Response::TransactionStart(Tag::new("BEGIN")),
        Outcome::TransactionEnd { tag } => Response::TransactionEnd(Tag::new(&tag)),
        Outcome::Rows {
            columns,
            rows,
            notices,
        } => {
            for n in notices {
                let info = ErrorInfo::new("NOTICE".to_owned(), "00000".to_owned(), n.message);
                client
                    .feed(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                        info,
                    )))
                    .await?;
            }
            Response::Query(encode_rows(&columns, rows, format)?)
        }
    })
}

fn log_statement(analyst: &str, kind: &str, result: &Result<Outcome, Error>, started: Instant) {
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(_) => tracing::info!(analyst, kind, outcome = "ok", duration_ms, "statement"),
        Err(e) => tracing::info!(
            analyst,
            kind,
            outcome = "refused",
            sqlstate = e.sqlstate().code(),
            duration_ms,
            "statement"
        ),
    }
}

/// Whether the transaction is in the failed state, where only COMMIT/ROLLBACK are accepted.
fn in_failed_transaction<C: ClientInfo>(client: &C) -> bool {
    matches!(
        client.transaction_status(),
        pgwire::messages::response::TransactionStatus::Error
    )
}

fn aborted_transaction() -> Error {
    Error::Transaction {
        what: "current transaction is aborted, commands ignored until end of transaction block"
            .into(),
    }
}

#[async_trait]
impl SimpleQueryHandler for QueryHandler {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let conn = connection(client);
        let mut slot = conn.session.lock().await;
        let session = ensure_session(&mut slot, client, &self.shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let started = Instant::now();
        let statements = match classify::classify(query) {
            Ok(s) => s,
            Err(e) => {
                let result = Err(e);
                log_statement(&session.analyst.name, "message", &result, started);
                let Err(e) = result else { unreachable!() };
                return Ok(vec![Response::Error(Box::new(error_info(&e)))]);
            }
        };
        let mut failed = in_failed_transaction(client);
        let mut responses = Vec::with_capacity(statements.len());
        for statement in statements {
            let started = Instant::now();
            let result = if failed && !matches!(statement, Statement::Commit | Statement::Rollback)
            {
                Err(aborted_transaction())
            } else {
                session.execute(&self.shared, &statement, &[]).await
            };
            log_statement(&session.analyst.name, statement.kind(), &result, started);
            match result {
                Ok(outcome) => {
                    if let Statement::Deallocate { name: Some(n) } = &statement {
                        client.portal_store().rm_statement(n);
                    }
                    let outcome = match (failed, outcome) {
                        (true, Outcome::TransactionEnd { .. }) => {
                            failed = false;
                            Outcome::TransactionEnd {
                                tag: "ROLLBACK".into(),
                            }
                        }
                        (_, o) => o,
                    };
                    responses.push(respond(client, outcome, &Format::UnifiedText).await?);
                }
                Err(e) => {
                    responses.push(Response::Error(Box::new(error_info(&e))));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

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
        let mut statements = classify::classify(sql).map_err(|e| user_error(&e))?;
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
        let session = ensure_session(&mut slot, client, &self.shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let columns = session::describe(&self.shared, session, &statement)
            .await
            .map_err(|e| user_error(&e))?;
        // Client-declared types win; otherwise the type analysis inferred from the context.
        let inferred = session::parameter_types(&self.shared, session, &statement);
        let count = inferred
            .iter()
            .map(|(i, _, _)| *i)
            .max()
            .unwrap_or(0)
            .max(types.len());
        let parameter_types = (1..=count)
            .map(|i| {
                types.get(i - 1).cloned().flatten().unwrap_or_else(|| {
                    inferred
                        .iter()
                        .find(|(j, _, _)| *j == i)
                        .map(|(_, t, declared)| parameter_pg_type(*t, declared.as_deref()))
                        .unwrap_or(Type::TEXT)
                })
            })
            .collect();
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

/// A binary `date` (days since 2000-01-01) as `YYYY-MM-DD` (Hinnant's civil-from-days).
fn date_from_days(days_since_2000: i32) -> String {
    let z = i64::from(days_since_2000) + 10_957 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Bound parameters as text, decoding binary formats of the common scalar types.
fn parameters_as_text(portal: &Portal<Prepared>) -> Result<Vec<Option<String>>, Error> {
    let types = &portal.statement.statement.parameter_types;
    portal
        .parameters
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let Some(bytes) = raw else { return Ok(None) };
            if portal.parameter_format.is_text(i) {
                return String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| Error::Protocol {
                        what: "parameter is not valid UTF-8".into(),
                    });
            }
            let ty = types.get(i).cloned().unwrap_or(Type::TEXT);
            let b = bytes.as_ref();
            let text = match ty {
                t if t == Type::INT2 && b.len() == 2 => {
                    i16::from_be_bytes([b[0], b[1]]).to_string()
                }
                t if t == Type::INT4 && b.len() == 4 => {
                    i32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::INT8 && b.len() == 8 => {
                    i64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad int8".into(),
                    })?)
                    .to_string()
                }
                t if t == Type::FLOAT8 && b.len() == 8 => {
                    f64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad float8".into(),
                    })?)
                    .to_string()
                }
                t if t == Type::FLOAT4 && b.len() == 4 => {
                    f32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::DATE && b.len() == 4 => {
                    date_from_days(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                }
                t if t == Type::BOOL && b.len() == 1 => {
                    if b[0] != 0 { "true" } else { "false" }.to_string()
                }
                t if t == Type::TEXT
                    || t == Type::VARCHAR
                    || t == Type::UNKNOWN
                    || t == Type::NAME =>
                {
                    String::from_utf8(b.to_vec()).map_err(|_| Error::Protocol {
                        what: "parameter is not valid UTF-8".into(),
                    })?
                }
                other => {
                    return Err(Error::unsupported(
                        format!("binary parameters of type {}", other.name()),
                        "Send this parameter in text format.",
                    ))
                }
            };
            Ok(Some(text))
        })
        .collect()
}

/// The row limit pgdp applies to one Execute asking for `requested` rows (0: all).
fn rows_per_execute(requested: i32) -> i32 {
    let cap = i32::try_from(crate::limits::ROWS_PER_EXECUTE_MAX).unwrap_or(i32::MAX);
    if requested <= 0 {
        0
    } else {
        requested.min(cap)
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
        let session = ensure_session(&mut slot, client, &self.shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let started = Instant::now();
        let result = if in_failed_transaction(client)
            && !matches!(statement, Statement::Commit | Statement::Rollback)
        {
            Err(aborted_transaction())
        } else {
            // Rows must match what Describe announced at Parse (a SET in between, e.g. of
            // pgdp.accuracy, can change them), as PostgreSQL insists for cached plans; checked
            // before running, so the refusal costs nothing.
            let described = &portal.statement.statement.columns;
            let shape = match (&statement, described) {
                (Statement::Query(_), Some(before)) => {
                    match session::describe(&self.shared, session, &statement).await {
                        Ok(Some(now)) if now != *before => Err(Error::unsupported(
                            "a prepared statement whose result columns changed since it was prepared",
                            "Prepare the statement again after changing pgdp.accuracy.",
                        )),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                _ => Ok(()),
            };
            match (shape, parameters_as_text(portal)) {
                (Err(e), _) | (Ok(()), Err(e)) => Err(e),
                (Ok(()), Ok(params)) => session.execute(&self.shared, &statement, &params).await,
            }
        };
        log_statement(&session.analyst.name, statement.kind(), &result, started);
        drop(slot);
        match result {
            Ok(outcome) => {
                if let Statement::Deallocate { name: Some(n) } = &statement {
                    client.portal_store().rm_statement(n);
                }
                let outcome = match (in_failed_transaction(client), outcome) {
                    (true, Outcome::TransactionEnd { .. }) => Outcome::TransactionEnd {
                        tag: "ROLLBACK".into(),
                    },
                    (_, o) => o,
                };
                respond(client, outcome, &portal.result_column_format).await
            }
            Err(e) => Err(user_error(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn binary_dates_decode() {
        assert_eq!(super::date_from_days(0), "2000-01-01");
        assert_eq!(super::date_from_days(-1), "1999-12-31");
        assert_eq!(super::date_from_days(8_918), "2024-06-01");
    }

    #[test]
    fn execute_row_limits_are_made_safe_for_pgwire() {
        use super::rows_per_execute;
        assert_eq!(rows_per_execute(0), 0, "zero: all rows");
        assert_eq!(
            rows_per_execute(-1),
            0,
            "negative: all rows, as in PostgreSQL"
        );
        assert_eq!(rows_per_execute(i32::MIN), 0);
        assert_eq!(rows_per_execute(3), 3);
        let cap = i32::try_from(crate::limits::ROWS_PER_EXECUTE_MAX).expect("fits");
        assert_eq!(rows_per_execute(i32::MAX), cap, "no huge preallocation");
    }
}
