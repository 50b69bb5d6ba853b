#!/usr/bin/env bash
# The runtime root filesystem of the `likes` image, assembled from a built binary: the binary,
# exactly the shared libraries it loads (from the builder's Debian; RocksDB's from
# stack/rocksdb.sh, in /usr/lib), CA certificates, and a non-root user. Nothing else: no shell, no package manager.
#
#   image/rootfs.sh BINARY OUT
#
# The Dockerfile runs this in its build stage; `make image` runs it on the host (Debian 12,
# as the build stage is), then packs OUT with buildah. One recipe, so both images agree.
set -euo pipefail
bin=${1:?usage: image/rootfs.sh BINARY OUT}
out=${2:?usage: image/rootfs.sh BINARY OUT}
[[ -x "$bin" ]] || { echo "rootfs: $bin is not an executable" >&2; exit 1; }
certs=/etc/ssl/certs/ca-certificates.crt
[[ -f "$certs" ]] || { echo "rootfs: $certs missing (Debian package ca-certificates)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"/{usr/local/bin,etc/ssl/certs,tmp,data}
install -m 0755 "$bin" "$out/usr/local/bin/likes"

# Debian's /lib and /lib64 are links into /usr: the same links first, so that each library
# and the loader land where the loader looks, by the paths ldd names.
for d in lib lib64; do
  if [[ -L /$d ]]; then mkdir -p "$out/usr/$d"; ln -sfn "usr/$d" "$out/$d"; fi
done
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
for lib in $libs; do
  case "$(basename "$lib")" in
    # The prebuilt RocksDB (docs/building.md), not at the builder's cache path but in /usr/lib,
    # where the loader looks by default: the rpath's $ORIGIN needs /proc, which a chroot run
    # of this root filesystem does not have.
    librocksdb.so*) dest=/usr/lib/$(basename "$lib") ;;
    *) dest=$lib ;;
  esac
  mkdir -p "$out$(dirname "$dest")"
  cp -L "$lib" "$out$dest"
done

cp -L "$certs" "$out/etc/ssl/certs/ca-certificates.crt"
# uid 10001: not root, and not a uid a host user is likely to hold.
printf 'root:x:0:0:root:/nonexistent:/sbin/nologin\nlikes:x:10001:10001:likes:/data:/sbin/nologin\n' \
  > "$out/etc/passwd"
printf 'root:x:0:\nlikes:x:10001:\n' > "$out/etc/group"
printf 'hosts: files dns\n' > "$out/etc/nsswitch.conf"
chmod 1777 "$out/tmp"
chown 10001:10001 "$out/data" 2>/dev/null || true
echo "rootfs: $out ($(du -sh "$out" | cut -f1)): likes, $(wc -w <<<"$libs") libraries, CA certificates, user likes (10001)"
