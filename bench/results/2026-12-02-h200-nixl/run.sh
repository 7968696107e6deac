#!/usr/bin/env bash
# On the H200: unpack the slimmed nixl-cu13 wheel into a folder (a wheel is a zip; no pip
# needed), then run bench/peers/nixl_link.py with it. Usage: run.sh explore | sweep TLS MODE
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
site=/tmp/nixl-site
date -u
python3 -V
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 - "$root"/.whl/nixl/nixl_cu13-*.whl "$site" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
PYTHONPATH=$site python3 "$here/nixl_link.py" "$@"
