# syntax=docker/dockerfile:1
# Multi-stage build of the materializer: a Rust builder (librdkafka and libcurl are built from
# source by the rdkafka crate, hence cmake, g++ and perl), then a slim non-root runtime image
# running the daemon. `docker run IMAGE demo` runs the embedded demo instead.

FROM rust:1.88-slim-bookworm AS build
WORKDIR /src
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config libssl-dev cmake make g++ perl \
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
# Mount the real configuration over this file (see deploy/); secrets come from the environment.
ENV MATERIALIZER_HTTP_LISTEN=0.0.0.0:9898
ENTRYPOINT ["/usr/local/bin/materializer"]
CMD ["run", "--config", "/etc/materializer/materializer.toml"]
