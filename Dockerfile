# Build stage: compile the release binary.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY benches ./benches
RUN cargo build --release --locked --bin backlinks

# Runtime stage: a small image running as an unprivileged user.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/backlinks --create-home backlinks
COPY --from=build /src/target/release/backlinks /usr/local/bin/backlinks
USER backlinks
WORKDIR /var/lib/backlinks
VOLUME ["/var/lib/backlinks"]
ENV BACKLINKS_DATA_DIR=/var/lib/backlinks/data BACKLINKS_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["backlinks"]
CMD ["serve"]
