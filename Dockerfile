# syntax=docker/dockerfile:1
# backlinks as a container (README "Docker").
#   docker build -t backlinks .
#   docker run -p 8080:8080 -v backlinks-data:/var/lib/backlinks backlinks
# Two stages: the Rust toolchain builds the release binary; the runtime image holds only the
# binary and CA certificates and runs it as an unprivileged user, with the data dir a volume.

# Build stage. The registry and target caches survive between builds (BuildKit cache mounts), so
# only changed code is recompiled; the binary is copied out of the cached target dir.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY lexicons ./lexicons
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin backlinks \
    && install -m 0755 target/release/backlinks /usr/local/bin/backlinks

# Runtime stage: Debian slim, no compiler, no shell tools beyond the base image.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/backlinks --create-home \
       --shell /usr/sbin/nologin backlinks
COPY --from=build /usr/local/bin/backlinks /usr/local/bin/backlinks
COPY config/backlinks.example.toml /usr/local/share/doc/backlinks/backlinks.example.toml
USER backlinks
WORKDIR /var/lib/backlinks
# Everything the service writes lives here: mount a volume (or a host directory owned by uid
# 10001) to keep the index across containers.
VOLUME ["/var/lib/backlinks"]
ENV BACKLINKS_DATA_DIR=/var/lib/backlinks/data \
    BACKLINKS_LISTEN=0.0.0.0:8080
EXPOSE 8080
# The binary stops cleanly on SIGTERM (what `docker stop` sends).
STOPSIGNAL SIGTERM
ENTRYPOINT ["backlinks"]
CMD ["serve"]
