#!/usr/bin/env bash
# Build qwen-tui's worker image from Debian's packages and qwen-tui's own wheel, into podman. Nothing is pulled
# from a container registry: the root filesystem comes from a Debian mirror (debootstrap, or mmdebstrap where
# installed), the Python packages from this machine's pip (its index and cache). docs/containers.md says how
# to use the image; containers/Containerfile is the same recipe for machines that can pull debian:bookworm-slim.
#
#   sudo containers/build-image.sh                       # -> localhost/qwen-tui-worker:<version>
#   sudo containers/build-image.sh --tag NAME --store DIR --wheel dist/qwen_tui-X-py3-none-any.whl
#
# Two layers, each cached, so that a change of qwen-tui's code costs seconds:
# - localhost/qwen-tui-deps:<key>: Debian, python3 and the worker's dependencies (torch and the extras'
#   requirements, read from the wheel's metadata); rebuilt only when they change. Its Debian root filesystem
#   is kept under CACHE/base-<suite>-<hash of the package list>/ for the next one;
# - the image itself: that layer plus qwen-tui's wheel, with the label qwen-tui.key (a hash of this recipe, the
#   dependencies and the wheel); an image of the tag whose key matches is kept as it is.
# The image holds iproute2 beside Python: the probe reads the addresses and the route to the master with `ip`.
# Prints the image's tag on its last line. Needs root (debootstrap and chroot), a python3 of the image's Python
# version (3.11 for bookworm) to build the wheelhouse, and podman.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/qwen_tui/__init__.py")
tag="localhost/qwen-tui-worker:${version:-dev}"
wheel=""
torch_spec="torch==2.13.0"
extras="train"
suite="bookworm"
mirror="http://deb.debian.org/debian"
packages="python3,python3-pip,ca-certificates,iproute2"
cache="${QWEN_TUI_IMAGE_CACHE:-/var/cache/qwen-tui/image}"
store=""
prune=0

usage() {
  cat <<EOF
usage: $0 [options]
  --tag NAME        the image's name (default $tag)
  --wheel FILE      the qwen-tui wheel to install (default: built from this checkout)
  --torch SPEC      the torch requirement (default $torch_spec; pip's index and cache decide the build:
                    PyPI's default wheel carries CUDA, a local +cpu wheel does not)
  --extras LIST     qwen-tui's extras to install with it (default $extras; e.g. train,gpu)
  --suite NAME      Debian suite (default $suite)
  --mirror URL      Debian mirror (default $mirror)
  --packages LIST   Debian packages in the image, comma-separated (default $packages; add g++ for
                    DeepSpeed's CPU Adam op)
  --cache DIR       where the Debian root filesystem is kept between builds (default \$QWEN_TUI_IMAGE_CACHE or
                    /var/cache/qwen-tui/image)
  --store DIR       podman storage (its graphroot) to build into (default podman's own)
  --prune           remove this tag's older images and unused dependency layers from that storage
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --wheel) wheel=$2; shift 2 ;;
    --torch) torch_spec=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --packages) packages=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --prune) prune=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$0: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

say() { echo "build-image: $*" >&2; }
die() { echo "build-image: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot build the root filesystem); see docs/containers.md"
command -v podman >/dev/null || die "podman is not installed (apt-get install podman runc)"
if command -v mmdebstrap >/dev/null; then bootstrap=mmdebstrap
elif command -v debootstrap >/dev/null; then bootstrap=debootstrap
else die "neither mmdebstrap nor debootstrap is installed (apt-get install debootstrap)"; fi

pm=(podman)
if [ -n "$store" ]; then
  mkdir -p "$store"
  # a storage of its own, its run root beside it: this build never touches podman's default one
  pm=(podman --root "$store" --runroot "$store.run")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/qwen-tui-image.XXXXXX")
cleanup() {
  # a chroot's /proc must be unmounted before the tree goes
  if mountpoint -q "$work/rootfs/proc" 2>/dev/null; then umount -l "$work/rootfs/proc"; fi
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- the wheel and the keys
if [ -z "$wheel" ]; then
  # from a clean copy of the checkout (tracked and new files, not ignored ones): a stale build/ directory
  # never leaks into the wheel; a fixed SOURCE_DATE_EPOCH makes the same sources give the same bytes
  git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 || die "$repo is not a git checkout: give the wheel (--wheel)"
  mkdir -p "$work/src" "$work/dist"
  (cd "$repo" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - --) | tar -C "$work/src" -xf -
  SOURCE_DATE_EPOCH=315532800 python3 -m pip wheel -q --no-deps -w "$work/dist" "$work/src" >&2
  wheel=$(ls "$work/dist"/qwen_tui-*.whl)
fi
[ -f "$wheel" ] || die "no wheel at $wheel"
wheel_name=$(basename "$wheel")
wheel_version=$(echo "$wheel_name" | cut -d- -f2)
requires=$(python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
print("\n".join(sorted(ln for ln in z.read(meta).decode().splitlines() if ln.startswith("Requires-Dist:"))))' "$wheel")
recipe_sha=$(sha256sum "$0" | cut -d' ' -f1)
deps_key=$(printf '%s\n' "$recipe_sha" "$torch_spec" "$extras" "$suite" "$mirror" "$packages" "$requires" \
           | sha256sum | cut -c1-16)
wheel_sha=$(sha256sum "$wheel" | cut -d' ' -f1)
key=$(printf '%s\n' "$deps_key" "$wheel_sha" | sha256sum | cut -c1-16)
deps="localhost/qwen-tui-deps:$deps_key"

have=$("${pm[@]}" image inspect --format '{{index .Labels "qwen-tui.key"}}' "$tag" 2>/dev/null || true)
if [ "$have" = "$key" ]; then
  say "$tag is up to date (key $key)"
  echo "$tag"
  exit 0
fi

# ---------------------------------------------------------------- the Debian root filesystem (cached)
base_key=$(printf '%s\n' "$bootstrap" "$suite" "$mirror" "$packages" | sha256sum | cut -c1-12)
base="$cache/base-$suite-$base_key"
if [ ! -f "$base/done" ]; then
  say "bootstrapping Debian $suite from $mirror with $bootstrap (once per package list)"
  mkdir -p "$cache"
  rm -rf "$base.tmp"
  mkdir -p "$base.tmp"
  if [ "$bootstrap" = mmdebstrap ]; then
    mmdebstrap --variant=minbase --include="$packages" "$suite" "$base.tmp/rootfs" "$mirror" >&2
  else
    debootstrap --variant=minbase --include="$packages" "$suite" "$base.tmp/rootfs" "$mirror" >&2
  fi
  rm -rf "$base.tmp/rootfs/var/lib/apt/lists/"* "$base.tmp/rootfs/var/cache/apt/"*.bin
  touch "$base.tmp/done"
  rm -rf "$base"
  mv "$base.tmp" "$base"
fi

image_py=$(chroot "$base/rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
host_py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$image_py" = "$host_py" ] || die "the image's Python is $image_py but this machine's python3 is $host_py: the \
wheelhouse must be built by a Python $image_py (activate one), or build with containers/Containerfile"

# Debian's python3 is "externally managed": the image is ours, its system Python the one to install into, so
# that `python3` finds torch and the worker under every runtime, whatever PATH the runtime passes
# (run with an environment of its own: this machine's PIP_* settings are not the image's)
pip_in=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
        python3 -m pip install -q --no-index --no-cache-dir --break-system-packages --root-user-action=ignore)

# ---------------------------------------------------------------- the dependencies' layer (cached)
if ! "${pm[@]}" image exists "$deps"; then
  say "collecting wheels: $torch_spec and what $wheel_name[$extras] requires (this machine's pip index and cache)"
  mkdir -p "$work/wheels"
  cp "$wheel" "$work/wheels/"
  # DeepSpeed ships as source only: its wheel is built here without its compiled ops (they build on first use)
  DS_BUILD_OPS=0 python3 -m pip wheel -q -w "$work/wheels" "$torch_spec" "$work/wheels/$wheel_name[$extras]" >&2
  say "installing them into Debian's Python (layer $deps)"
  cp -a "$base/rootfs" "$work/rootfs"
  mkdir -p "$work/rootfs/tmp/wheels"
  cp "$work/wheels/"*.whl "$work/rootfs/tmp/wheels/"
  mount -t proc proc "$work/rootfs/proc"
  chroot "$work/rootfs" "${pip_in[@]}" --find-links /tmp/wheels "$torch_spec" "/tmp/wheels/$wheel_name[$extras]" >&2
  chroot "$work/rootfs" python3 -c 'import torch, transformers, peft' \
    || die "the image's Python cannot import torch, transformers and peft"
  # the layer holds the dependencies only: qwen-tui itself comes in the next one (no stale file of an older
  # version can then stay behind under a newer one)
  chroot "$work/rootfs" python3 -m pip uninstall -q -y --break-system-packages --root-user-action=ignore qwen-tui >&2
  versions=$(chroot "$work/rootfs" python3 -c 'from importlib import metadata as m
print(" ".join(f"{p}={m.version(p)}" for p in ("torch", "transformers", "peft", "deepspeed")))')
  umount "$work/rootfs/proc"
  rm -rf "$work/rootfs/tmp/wheels" "$work/rootfs/root/.cache"
  say "importing the layer ($versions)"
  tar --numeric-owner -C "$work/rootfs" -cf - . | "${pm[@]}" import \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV PYTHONUNBUFFERED=1" \
    --change "LABEL qwen-tui.deps=$deps_key" \
    --change "LABEL qwen-tui.versions=$versions" \
    --change 'CMD ["python3"]' \
    --message "qwen-tui worker dependencies: Debian $suite, $versions" - "$deps" >/dev/null
  rm -rf "$work/rootfs"
fi
versions=$("${pm[@]}" image inspect --format '{{index .Labels "qwen-tui.versions"}}' "$deps")

# ---------------------------------------------------------------- qwen-tui's layer
say "adding $wheel_name to $deps as $tag (key $key)"
stage="tmp/qwen-tui-stage.$$"
mkdir -p "$base/rootfs/tmp/wheels.$$"
cp "$wheel" "$base/rootfs/tmp/wheels.$$/"
# staged by Debian's own pip, so the files land where the image's python3 looks (/usr/local/.../dist-packages)
chroot "$base/rootfs" "${pip_in[@]}" --no-deps --no-warn-script-location --root "/$stage" "/tmp/wheels.$$/$wheel_name" >&2
mkdir -p "$work/layer"
mv "$base/rootfs/$stage" "$work/layer/files"
rm -rf "$base/rootfs/tmp/wheels.$$"
mkdir -p "$work/layer/files/etc"
printf 'key=%s\nwheel=%s\nwheel_sha256=%s\n%s\n' "$key" "$wheel_name" "$wheel_sha" "$versions" | tr ' ' '\n' \
  >"$work/layer/files/etc/qwen-tui-image"
cat >"$work/layer/Containerfile" <<EOF
FROM $deps
COPY files/ /
LABEL qwen-tui.key=$key qwen-tui.wheel=$wheel_name qwen-tui.versions="qwen-tui=$wheel_version $versions"
EOF
old=$("${pm[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
"${pm[@]}" build -q --pull=never -t "$tag" -f "$work/layer/Containerfile" "$work/layer" >/dev/null
if [ "$prune" = 1 ]; then
  if [ -n "$old" ]; then
    "${pm[@]}" rmi "$old" >/dev/null 2>&1 || say "the older image $old is still in use; left in place"
  fi
  for d in $("${pm[@]}" images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/qwen-tui-deps:' || true); do
    if [ "$d" != "$deps" ]; then "${pm[@]}" rmi "$d" >/dev/null 2>&1 || true; fi
  done
fi
echo "$tag"
