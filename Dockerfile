# syntax=docker/dockerfile:1
# Multi-stage build of the materializer: a Rust builder, then a slim non-root runtime image.

FROM rust:1.88-slim-bookworm AS build
WORKDIR /src
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config libssl-dev cmake make g++ \
 && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY lua ./lua
COPY benches ./benches
RUN cargo build --release --locked --bin materializer

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin materializer
COPY --from=build /src/target/release/materializer /usr/local/bin/materializer
COPY config/materializer.example.toml /etc/materializer/materializer.toml
USER 10001
# /metrics, /healthz, /readyz
EXPOSE 9898
ENTRYPOINT ["/usr/local/bin/materializer"]
CMD ["--config", "/etc/materializer/materializer.toml", "demo"]
