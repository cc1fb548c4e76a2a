//! Fuzz target: arbitrary PostgreSQL frontend message streams against a running pgdp.
//!
//! Shared by `fuzz/fuzz_targets/wire.rs` and `tests/integration/fuzz_smoke.rs` (through `#[path]`); both
//! declare the test harness as `crate::harness`. The server is an in-process pgdp
//! ([`pgdp::server::start`]) over the demo dataset with a ledger database of its own, listening
//! on a free port; each input is one TCP connection.
//!
//! An input's first byte chooses how the rest is sent:
//! - `0`: the rest as raw bytes (startup packets, SSLRequest, CancelRequest, garbage);
//! - `1`: a valid StartupMessage for the demo analyst, then raw bytes (the SASL exchange);
//! - otherwise: a full SCRAM-SHA-256 login as the demo analyst, then the rest read as frames
//!   `[tag: u8][length: u16 little-endian][payload]`, each sent as a well-formed message
//!   `tag, length + 4 (big-endian u32), payload`, followed by Sync and
//!   `Query("SELECT 987654321")`.
//!
//! Invariants checked (a violation is an `Err`, which the fuzz target turns into a panic):
//! - pgdp never panics (the fuzz target's panic hook aborts on a panic in any thread; the smoke
//!   test records them with its own hook).
//! - After a framed stream, pgdp either closes the connection or answers the final Sync and
//!   query with ReadyForQuery, within [`ANSWER_TIMEOUT`]: no stream leaves it hanging.
//! - A framed stream with a structurally malformed message ([`first_malformed`]: fields that
//!   do not exactly fill the payload, an unknown type) is answered with FATAL 08P01 and closed,
//!   and nothing after that message runs; a stream without one never gets FATAL 08P01. After a
//!   valid StartupMessage, a complete but malformed SASLInitialResponse gets FATAL 08P01 too.
//! - pgdp keeps accepting connections and answering `SELECT 1` ([`alive`]).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness;

/// The demo policy's database, analyst and password.
pub const DATABASE: &str = "pgdp_demo";
pub const ANALYST: &str = "analyst";
pub const PASSWORD: &str = "analyst";

/// How long pgdp may take to answer the closing Sync and query of a framed stream. DP queries on
/// the demo data take a second or two; a stream can hold a few.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a raw stream is given before the connection is dropped.
const RAW_READ: Duration = Duration::from_millis(100);

/// Largest message pgdp is sent in one frame (the input bounds it anyway).
const FRAME_BYTES_MAX: usize = u16::MAX as usize;

/// A running pgdp for the target, and what is needed to log in.
pub struct Target {
    pub addr: SocketAddr,
    pub running: pgdp::server::Running,
    pub ledger: harness::TestDb,
}

/// Starts pgdp over the demo dataset with a fresh ledger and a budget large enough that the
/// fuzzer rarely exhausts it (exhaustion is a refusal like any other).
pub async fn start() -> Target {
    let upstream = harness::demo_database(1).await.dsn().to_string();
    let ledger = harness::fresh_database("fuzzwire").await;
    let text = include_str!("../../policies/demo.yaml")
        .replace("      epsilon: 10\n", "      epsilon: 100000\n");
    let policy = pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("fuzz policy: {e}"));
    let running = pgdp::server::start(pgdp::server::Config {
        policy,
        upstream,
        ledger: Some(ledger.dsn().to_string()),
        listen: "127.0.0.1:0".into(),
        noise_seed: Some([7; 32]),
    })
    .await
    .unwrap_or_else(|e| panic!("pgdp did not start: {e}"));
    Target {
        addr: running.addr,
        running,
        ledger,
    }
}

impl Target {
    /// Stops the server and drops its ledger database.
    pub async fn stop(self) {
        drop(self.running);
        self.ledger.drop_db().await;
    }
}

/// Sends one input over a new connection and checks the invariants. Inputs that hit a known,
/// unfixed bug ([`known_bug`]) are not sent (the ignored regression tests send them).
pub async fn exchange(addr: SocketAddr, data: &[u8]) -> Result<(), String> {
    if known_bug(data).is_some() {
        return Ok(());
    }
    exchange_unfiltered(addr, data).await
}

/// Like [`exchange`], without looking for known bugs first.
pub async fn exchange_unfiltered(addr: SocketAddr, data: &[u8]) -> Result<(), String> {
    let Some((&mode, rest)) = data.split_first() else {
        return Ok(());
    };
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    match mode {
        0 => {
            let _ = stream.write_all(rest).await;
            drain(&mut stream, RAW_READ).await;
        }
        1 => {
            let _ = stream.write_all(&startup_message()).await;
            let _ = stream.write_all(rest).await;
            let reply = drain(&mut stream, RAW_READ).await;
            if malformed_sasl_initial_response(rest) && !has_protocol_violation(&reply) {
                return Err(format!(
                    "a malformed SASLInitialResponse was not refused with FATAL 08P01: {reply:?}"
                ));
            }
        }
        _ => {
            authenticate(&mut stream).await?;
            let frames = frames(rest);
            let malformed = first_malformed(&frames);
            let mut out = Vec::new();
            for (tag, payload) in frames {
                push_message(&mut out, tag, payload);
            }
            push_message(&mut out, b'S', &[]);
            push_message(&mut out, b'Q', FINAL_QUERY);
            let _ = stream.write_all(&out).await;
            let answer = tokio::time::timeout(ANSWER_TIMEOUT, until_ready_after_query(&mut stream))
                .await
                .map_err(|_| "pgdp neither answered nor closed the connection".to_string())?;
            match malformed {
                Structure::Malformed(i) if !answer.violation || answer.final_query => {
                    return Err(format!(
                        "frame {i} is malformed, but pgdp answered {answer:?} instead of FATAL \
                         08P01 and nothing more"
                    ))
                }
                Structure::WellFormed if answer.violation => {
                    return Err("a well-formed stream was refused with FATAL 08P01".to_string())
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Whether pgdp accepts a new connection and answers `SELECT 1` through tokio-postgres.
pub async fn alive(addr: SocketAddr) -> Result<(), String> {
    let dsn = format!(
        "host={} port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} sslmode=disable connect_timeout=10",
        addr.ip(),
        addr.port()
    );
    let (client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("pgdp no longer accepts connections: {e}"))?;
    let task = tokio::spawn(connection);
    let rows = client
        .simple_query("SELECT 1")
        .await
        .map_err(|e| format!("pgdp no longer answers SELECT 1: {e}"))?;
    drop(client);
    let _ = task.await;
    if rows.len() < 2 {
        return Err(format!("SELECT 1 answered {} message(s)", rows.len()));
    }
    Ok(())
}

/// Whether an input hits a known bug that is not fixed yet, and which. Callers skip such inputs
/// so that the fuzzer keeps exploring; the inputs themselves are kept under
/// `fuzz/regressions/wire/` and sent by ignored tests. Add a clause for a new bug, remove it with
/// its fix. None is open: pgwire 0.42's two decoding bugs (a SASLInitialResponse without its
/// length panicked; bytes after a message's fields were read as the next message) are caught by
/// pgdp's message checks before pgwire decodes anything.
pub fn known_bug(_data: &[u8]) -> Option<&'static str> {
    None
}

/// Whether `rest`, sent after a valid StartupMessage, starts with a complete `p` message that is
/// not a well-formed SASLInitialResponse (mechanism, length, exactly that many bytes).
fn malformed_sasl_initial_response(rest: &[u8]) -> bool {
    let Some((&b'p', after)) = rest.split_first() else {
        return false;
    };
    let Some(len) = after.get(..4) else {
        return false;
    };
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if !(4..=(1 << 20)).contains(&len) {
        return false;
    }
    let Some(body) = after.get(4..len) else {
        // Not complete: pgdp is still waiting for the rest of it.
        return false;
    };
    let mut r = FieldReader { rest: body };
    let ok = r.cstring()
        && match r.int32() {
            Some(-1) => true,
            Some(n) => usize::try_from(n).is_ok_and(|n| r.take(n)),
            None => false,
        };
    !(ok && r.rest.is_empty())
}

/// Whether the backend bytes hold an ErrorResponse with severity FATAL and SQLSTATE 08P01.
fn has_protocol_violation(mut reply: &[u8]) -> bool {
    while let [tag, l0, l1, l2, l3, rest @ ..] = reply {
        let len = (u32::from_be_bytes([*l0, *l1, *l2, *l3]) as usize).saturating_sub(4);
        let Some(body) = rest.get(..len) else {
            return false;
        };
        if *tag == b'E' && is_fatal_protocol_violation(body) {
            return true;
        }
        reply = &rest[len..];
    }
    false
}

/// Whether an ErrorResponse body says FATAL 08P01.
fn is_fatal_protocol_violation(body: &[u8]) -> bool {
    let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
    fields.contains(&&b"SFATAL"[..]) && fields.contains(&&b"C08P01"[..])
}

/// What pgdp must make of a framed stream's structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    /// Every frame is well formed.
    WellFormed,
    /// Frame `i` is the first malformed one.
    Malformed(usize),
    /// A frame that may end the session (Terminate, or a password message after login) comes
    /// before any malformed one.
    Undecided,
}

/// Judges the frames' structure as PostgreSQL reads messages.
pub fn first_malformed(frames: &[(u8, &[u8])]) -> Structure {
    for (i, (tag, payload)) in frames.iter().enumerate() {
        if matches!(tag, b'X' | b'p') {
            return Structure::Undecided;
        }
        if !fields_fill_payload(*tag, payload) {
            return Structure::Malformed(i);
        }
    }
    Structure::WellFormed
}

/// Whether the fields of a frontend message of this tag use exactly its payload, as PostgreSQL
/// reads them; unknown tags are malformed. (Written apart from `src/wire.rs`'s check, as an
/// oracle for it.)
fn fields_fill_payload(tag: u8, payload: &[u8]) -> bool {
    let mut r = FieldReader { rest: payload };
    let ok = match tag {
        b'p' | b'd' => return true,
        b'Q' | b'f' => r.cstring(),
        b'P' => r.cstring() && r.cstring() && r.counted(4),
        b'B' => r.cstring() && r.cstring() && r.counted(2) && r.values() && r.counted(2),
        b'D' | b'C' => matches!(r.rest.first(), Some(b'S' | b'P')) && r.take(1) && r.cstring(),
        b'E' => r.cstring() && r.take(4),
        b'S' | b'H' | b'c' => true,
        _ => false,
    };
    ok && r.rest.is_empty()
}

struct FieldReader<'a> {
    rest: &'a [u8],
}

impl FieldReader<'_> {
    fn take(&mut self, n: usize) -> bool {
        match self.rest.get(n..) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn cstring(&mut self) -> bool {
        match self.rest.iter().position(|b| *b == 0) {
            Some(i) => self.take(i + 1),
            None => false,
        }
    }

    fn uint16(&mut self) -> Option<usize> {
        let v = self
            .rest
            .get(..2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))?;
        self.take(2).then_some(v)
    }

    fn int32(&mut self) -> Option<i32> {
        let v = self
            .rest
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))?;
        self.take(4).then_some(v)
    }

    /// A 16-bit count followed by that many items of `size` bytes.
    fn counted(&mut self, size: usize) -> bool {
        self.uint16().is_some_and(|n| self.take(n * size))
    }

    /// Bind's parameter values: a 16-bit count, then each a 32-bit length (-1 for NULL) and
    /// that many bytes.
    fn values(&mut self) -> bool {
        let Some(n) = self.uint16() else {
            return false;
        };
        (0..n).all(|_| match self.int32() {
            Some(-1) => true,
            Some(len) => usize::try_from(len).is_ok_and(|len| self.take(len)),
            None => false,
        })
    }
}

/// Splits the framed part of an input into (tag, payload) pairs.
pub fn frames(mut data: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while let [tag, lo, hi, rest @ ..] = data {
        let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(rest.len());
        let len = len.min(FRAME_BYTES_MAX);
        out.push((*tag, &rest[..len]));
        data = &rest[len..];
    }
    out
}

/// Encodes (tag, payload) pairs as the framed part of an input (the inverse of [`frames`]).
pub fn encode_frames(messages: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![2u8];
    for (tag, payload) in messages {
        let len = payload.len().min(FRAME_BYTES_MAX);
        out.push(*tag);
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&payload[..len]);
    }
    out
}

fn push_message(out: &mut Vec<u8>, tag: u8, payload: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&((payload.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A StartupMessage (protocol 3.0) for the demo analyst.
pub fn startup_message() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196_608u32.to_be_bytes());
    for (k, v) in [("user", ANALYST), ("database", DATABASE)] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Reads until the peer closes or `idle` passes without data; returns the first 64 KiB read.
async fn drain(stream: &mut TcpStream, idle: Duration) -> Vec<u8> {
    let mut buf = [0u8; 4096];
    let mut kept = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(idle, stream.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        if kept.len() < 64 * 1024 {
            kept.extend_from_slice(&buf[..n]);
        }
    }
    kept
}

/// Reads one backend message: (tag, body). `None` when the connection ends.
async fn read_message(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let tag = stream.read_u8().await.ok()?;
    let len = stream.read_u32().await.ok()? as usize;
    let mut body = vec![0u8; len.checked_sub(4)?];
    stream.read_exact(&mut body).await.ok()?;
    Some((tag, body))
}

/// The query that closes every framed stream, and the end of the DataRow it is answered with: a
/// value the fuzzer is unlikely to ask for itself.
const FINAL_QUERY: &[u8] = b"SELECT 987654321\0";
const FINAL_ROW: &[u8] = b"\x00\x01\x00\x00\x00\x09987654321";

/// What pgdp answered to a framed stream.
#[derive(Debug, Default)]
struct Answer {
    /// The row of the final query arrived.
    final_query: bool,
    /// An ErrorResponse with FATAL 08P01 arrived.
    violation: bool,
}

/// Reads until the ReadyForQuery that follows the final query (the second ReadyForQuery
/// after the trailing Sync, counting the Sync's), or until the connection ends.
async fn until_ready_after_query(stream: &mut TcpStream) -> Answer {
    // Earlier frames may produce ReadyForQuery messages of their own (simple queries, Syncs), so
    // wait for the row of the final query and the ReadyForQuery after it; an error response
    // (an aborted transaction block) followed by ReadyForQuery counts too, as does the end.
    let mut answer = Answer::default();
    while let Some((tag, body)) = read_message(stream).await {
        match tag {
            b'D' if body.ends_with(FINAL_ROW) => answer.final_query = true,
            b'E' if is_fatal_protocol_violation(&body) => answer.violation = true,
            b'Z' if answer.final_query => return answer,
            _ => {}
        }
    }
    answer
}

/// Logs in as the demo analyst with SCRAM-SHA-256 (RFC 5802 / RFC 7677).
async fn authenticate(stream: &mut TcpStream) -> Result<(), String> {
    stream
        .write_all(&startup_message())
        .await
        .map_err(|e| format!("startup: {e}"))?;
    let (tag, body) = read_message(stream)
        .await
        .ok_or("no authentication request")?;
    if tag != b'R' || body.get(..4) != Some(&10u32.to_be_bytes()[..]) {
        return Err(format!("expected AuthenticationSASL, got {}", tag as char));
    }
    let client_nonce = "fuzzclientnonce0123456789";
    let client_first_bare = format!("n=,r={client_nonce}");
    let client_first = format!("n,,{client_first_bare}");
    let mut initial = b"SCRAM-SHA-256\0".to_vec();
    initial.extend_from_slice(&(client_first.len() as u32).to_be_bytes());
    initial.extend_from_slice(client_first.as_bytes());
    let mut out = Vec::new();
    push_message(&mut out, b'p', &initial);
    stream
        .write_all(&out)
        .await
        .map_err(|e| format!("SASLInitialResponse: {e}"))?;

    let (tag, body) = read_message(stream).await.ok_or("no SASL continue")?;
    if tag != b'R' || body.get(..4) != Some(&11u32.to_be_bytes()[..]) {
        return Err(format!(
            "expected AuthenticationSASLContinue, got {}",
            tag as char
        ));
    }
    let server_first = String::from_utf8(body[4..].to_vec()).map_err(|_| "server-first")?;
    let mut nonce = None;
    let mut salt = None;
    let mut iterations = None;
    for part in server_first.split(',') {
        match part.split_at_checked(2) {
            Some(("r=", v)) => nonce = Some(v.to_string()),
            Some(("s=", v)) => salt = base64::engine::general_purpose::STANDARD.decode(v).ok(),
            Some(("i=", v)) => iterations = v.parse::<u32>().ok().and_then(NonZeroU32::new),
            _ => {}
        }
    }
    let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
        return Err(format!("malformed server-first {server_first:?}"));
    };
    let mut salted = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        iterations,
        &salt,
        PASSWORD.as_bytes(),
        &mut salted,
    );
    let salted_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &salted);
    let client_key = ring::hmac::sign(&salted_key, b"Client Key");
    let stored_key = ring::digest::digest(&ring::digest::SHA256, client_key.as_ref());
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    let signature = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, stored_key.as_ref()),
        auth_message.as_bytes(),
    );
    let proof: Vec<u8> = client_key
        .as_ref()
        .iter()
        .zip(signature.as_ref())
        .map(|(a, b)| a ^ b)
        .collect();
    let client_final = format!(
        "{without_proof},p={}",
        base64::engine::general_purpose::STANDARD.encode(proof)
    );
    let mut out = Vec::new();
    push_message(&mut out, b'p', client_final.as_bytes());
    stream
        .write_all(&out)
        .await
        .map_err(|e| format!("SASLResponse: {e}"))?;
    loop {
        let (tag, body) = read_message(stream)
            .await
            .ok_or("connection closed during login")?;
        match tag {
            b'Z' => return Ok(()),
            b'E' => return Err(format!("login refused: {}", String::from_utf8_lossy(&body))),
            _ => {}
        }
    }
}

/// Seeds: SQL texts sent as simple queries and through Parse/Bind/Describe/Execute/Sync, plus
/// raw startup variants.
pub fn seeds(sqls: &[String]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // Raw: SSLRequest, GSSENCRequest, CancelRequest, an old protocol version, a truncated
    // startup, a huge length.
    let ssl = [0, 0, 0, 8, 4, 210, 22, 47];
    let gss = [0, 0, 0, 8, 4, 210, 22, 48];
    let mut cancel = vec![0, 0, 0, 16, 4, 210, 22, 46];
    cancel.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]);
    let mut old = startup_message();
    old[4..8].copy_from_slice(&131_072u32.to_be_bytes());
    let startup = startup_message();
    for raw in [
        ssl.to_vec(),
        gss.to_vec(),
        cancel,
        old,
        startup[..startup.len() / 2].to_vec(),
        vec![0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0],
        [ssl.to_vec(), startup.clone()].concat(),
    ] {
        let mut seed = vec![0u8];
        seed.extend_from_slice(&raw);
        out.push(seed);
    }
    // A well-formed SASLInitialResponse with a wrong mechanism, after a valid startup.
    out.push([vec![1u8], b"p\0\0\0\x12PLAIN\0\0\0\0\x04junk".to_vec()].concat());
    for sql in sqls {
        let mut q = sql.as_bytes().to_vec();
        q.push(0);
        out.push(encode_frames(&[(b'Q', q)]));
        let mut parse = vec![0u8];
        parse.extend_from_slice(sql.as_bytes());
        parse.extend_from_slice(&[0, 0, 0]);
        let bind = vec![0, 0, 0, 0, 0, 0, 0, 0];
        out.push(encode_frames(&[
            (b'P', parse),
            (b'B', bind),
            (b'D', vec![b'P', 0]),
            (b'E', vec![0, 0, 0, 0, 0]),
            (b'S', vec![]),
        ]));
    }
    out
}
