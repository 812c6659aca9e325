#!/usr/bin/env bash
# Build qwen-tui's worker image from Debian's packages and qwen-tui's own wheel, and import it into podman.
# Nothing is pulled from a container registry: the root filesystem comes from a Debian mirror (debootstrap,
# or mmdebstrap where installed), the Python packages from this machine's pip (its index and cache), and
# `podman import` makes the image. docs/containers.md says how to use it; containers/Containerfile is the same
# recipe for machines that can pull debian:bookworm-slim.
#
#   sudo containers/build-image.sh                       # -> localhost/qwen-tui-worker:<version>
#   sudo containers/build-image.sh --tag NAME --store DIR --wheel dist/qwen_tui-X-py3-none-any.whl
#
# Cached twice, so a second run costs seconds:
# - the Debian root filesystem, under CACHE/base-<suite>-<hash of its package list>/ (rebuilt only when the
#   suite, mirror or package list changes);
# - the image itself: it carries the label qwen-tui.key, a hash of this recipe, the wheel, the torch
#   requirement and the extras; an image of that tag whose key matches is kept as it is.
# Prints the image's tag on its last line. Needs root (debootstrap and chroot), python3 of the image's
# Python version (3.11 for bookworm) to build the wheelhouse, and podman.
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
packages="python3,python3-pip,ca-certificates"
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
  --store DIR       podman storage (its graphroot) to import into (default podman's own)
  --prune           remove the older images of the same name from that storage once the new one is in
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
  # a storage of its own: its run root beside it, so this build never touches podman's default one
  pm=(podman --root "$store" --runroot "$store.run")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/qwen-tui-image.XXXXXX")
cleanup() {
  # a chroot's /proc and /dev must be unmounted before the tree goes
  for m in "$work/rootfs/proc" "$work/rootfs/dev"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m"; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- the wheel and the key
if [ -z "$wheel" ]; then
  # from a clean copy of the checkout (tracked and new files, not ignored ones): a stale build/ directory
  # never leaks into the wheel; a fixed SOURCE_DATE_EPOCH makes the same sources give the same bytes
  mkdir -p "$work/src" "$work/dist"
  (cd "$repo" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - --) | tar -C "$work/src" -xf -
  SOURCE_DATE_EPOCH=315532800 python3 -m pip wheel -q --no-deps -w "$work/dist" "$work/src" >&2
  wheel=$(ls "$work/dist"/qwen_tui-*.whl)
fi
[ -f "$wheel" ] || die "no wheel at $wheel"
wheel_sha=$(sha256sum "$wheel" | cut -d' ' -f1)
recipe_sha=$(sha256sum "$0" | cut -d' ' -f1)
key=$(printf '%s\n' "$recipe_sha" "$wheel_sha" "$torch_spec" "$extras" "$suite" "$mirror" "$packages" \
      | sha256sum | cut -c1-16)

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

# ---------------------------------------------------------------- the Python packages
say "collecting wheels: $torch_spec, $(basename "$wheel")[$extras] (this machine's pip index and cache)"
mkdir -p "$work/wheels"
cp "$wheel" "$work/wheels/"
# DeepSpeed ships as source only: its wheel is built here without its compiled ops (they build on first use)
DS_BUILD_OPS=0 python3 -m pip wheel -q -w "$work/wheels" "$torch_spec" "$work/wheels/$(basename "$wheel")[$extras]" >&2

say "installing them into the image (key $key)"
cp -a "$base/rootfs" "$work/rootfs"
mkdir -p "$work/rootfs/tmp/wheels"
cp "$work/wheels/"*.whl "$work/rootfs/tmp/wheels/"
mount -t proc proc "$work/rootfs/proc"
# Debian's python3 is "externally managed": the image is ours, its system Python is the one to install into,
# so `python3` finds torch and the worker under every runtime whatever PATH it passes
chroot "$work/rootfs" python3 -m pip install -q --no-index --find-links /tmp/wheels --no-cache-dir \
  --break-system-packages --root-user-action=ignore "$torch_spec" "/tmp/wheels/$(basename "$wheel")[$extras]" >&2
chroot "$work/rootfs" python3 -c 'import torch, training.finetune, qwen_tui' \
  || die "the image's Python cannot import torch and qwen-tui's worker"
versions=$(chroot "$work/rootfs" python3 -c 'from importlib import metadata as m
print(" ".join(f"{p}={m.version(p)}" for p in ("qwen-tui", "torch", "transformers", "peft", "deepspeed")))')
umount "$work/rootfs/proc"
rm -rf "$work/rootfs/tmp/wheels" "$work/rootfs/root/.cache"
printf 'key=%s\nwheel_sha256=%s\n%s\n' "$key" "$wheel_sha" "$versions" | tr ' ' '\n' >"$work/rootfs/etc/qwen-tui-image"

say "importing it as $tag ($versions)"
old=$("${pm[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
tar --numeric-owner -C "$work/rootfs" -cf - . | "${pm[@]}" import \
  --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV PYTHONUNBUFFERED=1" \
  --change "LABEL qwen-tui.key=$key" \
  --change "LABEL qwen-tui.versions=$versions" \
  --change 'CMD ["python3"]' \
  --message "qwen-tui worker: Debian $suite, $versions" - "$tag" >/dev/null
if [ "$prune" = 1 ] && [ -n "$old" ]; then
  "${pm[@]}" rmi "$old" >/dev/null 2>&1 || say "the older image $old is still in use; left in place"
fi
echo "$tag"
