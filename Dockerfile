# pgdp container image.
#
# Build stage: the Rust toolchain on Debian bookworm, the same Debian release as the runtime
# stage, so that the binary's glibc requirement matches the runtime's glibc.
FROM rust:1-bookworm AS builder
WORKDIR /src
# Only what the build needs: the sources and the demo policy the binary embeds
# (`pgdp demo`), not a local target/ directory. `.ci/docker-context` checks in CI that these
# COPYs hold every file the build reads.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY policies ./policies
RUN cargo build --release --locked

# Runtime stage: the binary, CA certificates (TLS to an upstream) and psql for operators.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates postgresql-client \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /src/target/release/pgdp /usr/local/bin/pgdp
RUN useradd --system --no-create-home --shell /usr/sbin/nologin pgdp
USER pgdp
EXPOSE 6432
# The default serves a policy mounted at /etc/pgdp/policy.yaml; docker-compose.yml runs the demo.
CMD ["pgdp", "serve", "--policy", "/etc/pgdp/policy.yaml", "--listen", "0.0.0.0:6432"]
