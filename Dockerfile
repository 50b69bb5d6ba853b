# syntax=docker/dockerfile:1
# The `likes` image, for users with a Docker engine (`docker build -t likes .`). The same
# image is built here without one by `make image` (buildah): both assemble the runtime root
# filesystem with image/rootfs.sh from a release binary built on Debian 12 (bookworm).
#
# Runtime: the binary, exactly its shared libraries, CA certificates and user likes (10001);
# no shell, no package manager. Entrypoint `likes`; the command names the process
# (`api`, `relay`, `dedupe`, `count`, `migrate`, `topics`, `drift`, ...). See k8s/.

FROM docker.io/library/rust:1.88-bookworm AS build
# bindgen (rocksdb) needs libclang; librdkafka builds from source; Maven fetches the prebuilt
# RocksDB (stack/rocksdb.sh, docs/building.md) and python3 unpacks it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev build-essential perl make ca-certificates \
      maven python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN stack/rocksdb.sh
# The same workspace build as `make image` and `make bench` (one feature set).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace --bins \
 && image/rootfs.sh target/release/likes /rootfs

FROM scratch
COPY --from=build /rootfs/ /
USER 10001:10001
WORKDIR /data
ENV RUST_LOG_STYLE=never
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/likes"]
CMD ["--help"]
