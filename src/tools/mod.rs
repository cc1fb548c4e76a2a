//! Tooling that is not part of what a client of the proxy observes: budget administration from
//! the command line ([`admin`]), the deterministic demo dataset ([`demo`]), throwaway
//! PostgreSQL clusters ([`cluster`]) for `pgdp demo` and the tests, and the demo dataset on a
//! coordinator with `postgres_fdw` shards ([`shards`]) for the tests and the shard bench, or on
//! Citus ([`citus`], where it is installed) for the Citus suite, and the
//! data team's report of which caps and bounds cost how much accuracy ([`suggest`]). Nothing in the proxy's core
//! depends on these modules.

pub mod admin;
pub mod citus;
pub mod cluster;
pub mod demo;
pub mod shards;
pub mod suggest;

/// A statement of a tool's set-up that failed, with what was being done.
#[derive(Debug)]
pub(crate) struct FailedStep {
    /// What was being done.
    pub step: String,
    /// The error.
    pub source: tokio_postgres::Error,
}

fn failed(step: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> FailedStep {
    let step = step.into();
    move |source| FailedStep { step, source }
}

/// Connects to `dsn` and drives the connection on the current runtime.
pub(crate) async fn connect(dsn: &str) -> Result<tokio_postgres::Client, FailedStep> {
    let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .map_err(failed("connecting"))?;
    // The connection task ends by itself once the client is dropped.
    tokio::spawn(connection);
    Ok(client)
}

/// Streams the rows of `select` on `from` into `demo.<table>` on `to` with COPY, in the format
/// `options` names (`(FORMAT binary)`, or `""` for text).
pub(crate) async fn copy_rows(
    from: &tokio_postgres::Client,
    select: &str,
    to: &tokio_postgres::Client,
    table: &str,
    options: &str,
) -> Result<(), FailedStep> {
    use futures::{SinkExt, StreamExt};
    let out = from
        .copy_out(format!("COPY ({select}) TO STDOUT {options}").as_str())
        .await
        .map_err(failed(format!("reading demo.{table}")))?;
    let sink = to
        .copy_in(format!("COPY demo.{table} FROM STDIN {options}").as_str())
        .await
        .map_err(failed(format!("writing demo.{table}")))?;
    let mut out = std::pin::pin!(out);
    let mut sink = std::pin::pin!(sink);
    while let Some(chunk) = out.next().await {
        let chunk = chunk.map_err(failed(format!("reading demo.{table}")))?;
        sink.send(chunk)
            .await
            .map_err(failed(format!("writing demo.{table}")))?;
    }
    sink.as_mut()
        .finish()
        .await
        .map_err(failed(format!("writing demo.{table}")))?;
    Ok(())
}
