# syntax=docker/dockerfile:1
# Multi-stage build of the materializer: a Rust builder (librdkafka, zstd, zlib and libcurl are
# built from source by the rdkafka crate, hence cmake, g++ and perl), then a slim non-root runtime
# image running the daemon with a stripped binary. `docker run IMAGE demo` runs the embedded demo.
#
#   docker build -t mailbox-materializer .
#
# Build arguments:
#   RUNTIME_BASE   the runtime's Debian bookworm base (scripts/build-image uses a debootstrapped
#                  one where no registry is reachable)
#   BINARY_SOURCE  build (default: compile here) or prebuilt (take dist/materializer from the
#                  build context: a release binary built and tested outside, already stripped)
#   REVISION       the source revision (git rev-parse --short=12 HEAD): `materializer --version`,
#                  materializer_build_info{revision} and the image's OCI revision label
#   VERSION        the crate's version, for the image's OCI version label

ARG RUNTIME_BASE=debian:bookworm-slim
ARG BINARY_SOURCE=build
ARG REVISION=unknown
ARG VERSION=unknown

FROM rust:1.88-slim-bookworm AS build
WORKDIR /src
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config libssl-dev cmake make g++ perl \
 && rm -rf /var/lib/apt/lists/*
ARG REVISION
# build.rs names the revision from MATERIALIZER_REVISION: the build context has no .git.
ENV MATERIALIZER_REVISION=${REVISION}
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY lua ./lua
COPY benches ./benches
# Stripped: the release profile keeps line tables for local profiling, which the image does not
# need (about two thirds of the file).
RUN cargo build --release --locked --bin materializer \
 && mkdir -p /out \
 && strip --strip-all -o /out/materializer target/release/materializer

FROM scratch AS prebuilt
COPY dist/materializer /out/materializer

# The binary of the chosen source.
FROM ${BINARY_SOURCE} AS binary

FROM ${RUNTIME_BASE} AS runtime
ARG REVISION
ARG VERSION
LABEL org.opencontainers.image.title="mailbox-materializer" \
      org.opencontainers.image.source="https://github.com/example/mailbox-materializer" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}"
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin materializer
COPY --from=binary /out/materializer /usr/local/bin/materializer
# The man pages and the bash completion, generated from the binary's own command line.
RUN /usr/local/bin/materializer man --dir /usr/local/share/man/man1 >/dev/null \
 && mkdir -p /usr/share/bash-completion/completions \
 && /usr/local/bin/materializer completions bash >/usr/share/bash-completion/completions/materializer
COPY config/materializer.example.toml /etc/materializer/materializer.toml
# The shipped configuration listens on every interface (a probe comes from outside the
# container). In the file, not in the environment: the environment overrides the file, so an
# image variable would override every mounted configuration's http.listen.
RUN sed -i 's/^listen = "127.0.0.1:9898"$/listen = "0.0.0.0:9898"/' /etc/materializer/materializer.toml \
 && grep -q '^listen = "0.0.0.0:9898"$' /etc/materializer/materializer.toml
USER 10001:10001
# /metrics, /healthz, /readyz
EXPOSE 9898
# Mount the real configuration over this file (see deploy/); secrets come from the environment.
ENTRYPOINT ["/usr/local/bin/materializer"]
CMD ["run", "--config", "/etc/materializer/materializer.toml"]
