#!/usr/bin/env bash
# `make image`: the `likes` image built without a Docker engine, then run.
#
#   1. the release binary (cargo), 2. its root filesystem (image/rootfs.sh, the recipe the
#   Dockerfile's build stage runs too), 3. packed by buildah as an image from scratch with a
#   non-root user and `likes` as entrypoint, saved as an OCI archive, 4. smoke-run: the
#   container's `likes --version`, then `likes api` in it answering /healthz on the host's
#   loopback. Where this machine cannot run a container, step 4 says why (the runtime's own
#   error) and runs the image's root filesystem with the same entrypoint and user instead
#   (chroot), so the bytes that ship are still the bytes that ran.
#
# Needs: buildah (Debian package; stack/prereqs.sh deploy), podman to run it (optional),
# Kafka and Cassandra up for step 4 (`make up`). LIKES_IMAGE names the image;
# LIKES_IMAGE_RUN=rootfs skips the container and runs the root filesystem (the fallback).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${LIKES_CACHE:-$HOME/.cache/likes}
target=${CARGO_TARGET_DIR:-$cache/target}
version=$(awk -F'"' '/^version/ {print $2; exit}' Cargo.toml)
image=${LIKES_IMAGE:-localhost/likes:$version}
out=$cache/image
rootfs=$out/rootfs
archive=$out/likes-$version.oci.tar
say() { printf 'image: %s\n' "$*"; }

say "building the release binary"
# The same build `make bench` does (one feature set, so the two share compiled crates),
# linking the prebuilt RocksDB (docs/building.md) that the root filesystem then carries.
stack/rocksdb.sh
cargo build --release --locked --workspace --bins
image/rootfs.sh "$target/release/likes" "$rootfs"

say "packing $image with buildah (from scratch)"
c=$(buildah from scratch)
trap 'buildah rm "$c" >/dev/null 2>&1 || true' EXIT
buildah copy --quiet "$c" "$rootfs" / >/dev/null
buildah config \
  --user 10001:10001 --workingdir /data \
  --entrypoint '["/usr/local/bin/likes"]' --cmd '["--help"]' \
  --env RUST_LOG_STYLE=never --port 8080 --port 9464 \
  --label org.opencontainers.image.title=likes \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  --label org.opencontainers.image.source=Dockerfile+image/rootfs.sh \
  "$c"
buildah commit --quiet --rm "$c" "$image" >/dev/null
trap - EXIT
rm -f "$archive"
buildah push --quiet "$image" "oci-archive:$archive"
say "$image saved as $archive ($(du -h "$archive" | cut -f1))"
buildah inspect --type image --format '  user {{.OCIv1.Config.User}}, entrypoint {{.OCIv1.Config.Entrypoint}}{{"\n"}}' "$image"

# --- smoke run -----------------------------------------------------------------------------
# `likes --version`: the binary's version, then the RocksDB it loaded, from where the image
# puts it (/usr/lib, image/rootfs.sh), not the builder's cache.
rocksdb_version=$(cat "$(stack/rocksdb.sh --dir)/VERSION")
version_ok() {
  local want1="likes $version" want2="RocksDB $rocksdb_version (/usr/lib/librocksdb.so)"
  [[ "$(sed -n 1p <<<"$1")" == "$want1" && "$(sed -n 2p <<<"$1")" == "$want2" ]] && return 0
  say "expected '$want1' then '$want2'"
  return 1
}
port=${LIKES_IMAGE_PORT:-18089}
key=image-smoke-session-key-0123456789abcdef
health() {
  local i
  for i in $(seq 1 60); do
    if body=$(curl -fsS "http://127.0.0.1:$port/healthz" 2>/dev/null); then
      say "/healthz on 127.0.0.1:$port answered: $body"
      return 0
    fi
    sleep 1
  done
  say "/healthz on 127.0.0.1:$port did not answer in 60 s"
  return 1
}
# Its own keyspace, made by the image's own `likes migrate` (the migrate Job's command).
vars=("LIKES__API__LISTEN=127.0.0.1:$port" "LIKES__API__SESSION_KEY=$key"
  "LIKES__CQL__KEYSPACE=likes_image_smoke" "LIKES__API__RELAY=false")
env_args=()
for v in "${vars[@]}"; do env_args+=(-e "$v"); done

# How this machine runs a container: podman's defaults first; where those fail (a sandbox
# without CAP_SYS_RESOURCE or with cgroup v1 only, as this project's CI machine is), runc
# with limits at or below the caller's own. Each failure is shown.
run_err=$out/podman-run.err
: >"$run_err"
nofile=$(ulimit -Hn); [[ "$nofile" == unlimited || "$nofile" -gt 65536 ]] && nofile=65536
ways=("" "--runtime runc")
limits=("" "--ulimit nofile=$nofile:$nofile --ulimit nproc=4096:4096")
podman_args=()
got=
if [[ "${LIKES_IMAGE_RUN:-}" == rootfs ]]; then
  echo "LIKES_IMAGE_RUN=rootfs: not trying a container" >"$run_err"
elif command -v podman >/dev/null; then
  for i in "${!ways[@]}"; do
    # shellcheck disable=SC2206 # word splitting of the flag strings is intended
    global=(${ways[$i]}) local_=(${limits[$i]})
    if got=$(podman "${global[@]}" run --rm --network host "${local_[@]}" "$image" --version 2>>"$run_err"); then
      podman_args=("${global[@]}" run --network host "${local_[@]}")
      say "container runs with: podman ${podman_args[*]}"
      break
    fi
    say "podman ${ways[$i]:-(defaults)} could not run it: $(tail -1 "$run_err")"
  done
fi
if ((${#podman_args[@]})); then
  say "container: likes --version -> $(tr '\n' ' ' <<<"$got")"
  version_ok "$got" || exit 1
  name=likes-image-smoke
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman "${podman_args[@]}" --rm --read-only "${env_args[@]}" "$image" migrate >"$out/migrate.log" 2>&1 ||
    { tail -20 "$out/migrate.log"; exit 1; }
  say "container: likes migrate done"
  podman "${podman_args[@]}" -d --name "$name" --read-only "${env_args[@]}" "$image" api >/dev/null
  trap 'podman logs --tail 20 "$name" 2>&1 | sed "s/^/  api: /"; podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
  health
  say "OK: the image ran in a container (podman ${podman_args[*]}, read-only root, user 10001)"
  exit 0
fi

say "this machine cannot run the container; the runtime said:"
sed 's/^/  | /' "$run_err" 2>/dev/null || echo "  | podman is not installed"
say "running the image's root filesystem with the same entrypoint and user instead (chroot)"
mnt_c=$(buildah from "$image")
trap 'buildah umount "$mnt_c" >/dev/null 2>&1; buildah rm "$mnt_c" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$mnt_c")
chroot=$(command -v chroot)
got=$(env -i "$chroot" --userspec=10001:10001 "$root" /usr/local/bin/likes --version)
say "rootfs: likes --version -> $(tr '\n' ' ' <<<"$got")"
version_ok "$got" || exit 1
env -i "${vars[@]}" HOME=/data "$chroot" --userspec=10001:10001 "$root" /usr/local/bin/likes migrate \
  >"$out/migrate.log" 2>&1 || { tail -20 "$out/migrate.log"; exit 1; }
say "rootfs: likes migrate done"
env -i "${vars[@]}" HOME=/data \
  "$chroot" --userspec=10001:10001 "$root" /usr/local/bin/likes api >"$out/api.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; tail -5 "$out/api.log" | sed "s/^/  api: /";
  buildah umount "$mnt_c" >/dev/null 2>&1; buildah rm "$mnt_c" >/dev/null 2>&1 || true' EXIT
health
say "OK: the image's root filesystem ran (chroot, user 10001); see the runtime error above"
