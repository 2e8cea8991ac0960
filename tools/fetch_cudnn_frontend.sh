#!/usr/bin/env bash
# Puts cudnn-frontend's C++ headers (header-only; from the PyPI wheel
# nvidia-cudnn-frontend, which holds them under include/) into build-deps/, an ignored
# folder the CUDA build reads (CMake: SEAM_CUDNN_FRONTEND_INCLUDE). Only the CUDA build
# needs them; the binaries built with them run anywhere cuDNN 9 is.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${SEAM_CUDNN_FRONTEND_VERSION:-1.32.0}
dest=build-deps/cudnn-frontend
if [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/version" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$version" -d "$tmp"
python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
rm -rf "$dest" && mkdir -p "$dest"
mv "$tmp/x/include" "$dest/include"
echo "$version" > "$dest/version"
echo "cudnn-frontend $version headers in $dest/include"
