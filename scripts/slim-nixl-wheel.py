#!/usr/bin/env python3
"""A nixl-cu13 (or nixl-cu12) wheel slimmed to what host and device transfers need, small
enough to travel with a run's files to the GPU machine.

    scripts/slim-nixl-wheel.py IN.whl OUT.whl

Removed: the ``nixl_ep_*`` PyTorch extensions, the scripts and headers, the plugins other
than UCX, POSIX, GDS, GDS_MT and LIBFABRIC (and the telemetry exporters, UCX's perftest
modules), then every bundled library that nothing kept still needs (followed through the ELF
``NEEDED`` entries, with readelf). RECORD is written again for what is left.
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

KEPT_PLUGINS = {"UCX", "POSIX", "GDS", "GDS_MT", "LIBFABRIC"}


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\).*\[(.*)\]", out)


def slim(root):
    """Removes what is not needed from the unpacked wheel at ``root``."""
    for name in os.listdir(root):
        full = os.path.join(root, name)
        if name.startswith("nixl_ep_") or name.endswith(".scripts"):
            shutil.rmtree(full)
        elif name.endswith(".data"):
            for part in ("headers", "scripts"):
                shutil.rmtree(os.path.join(full, part), ignore_errors=True)
    libs = [name for name in os.listdir(root) if name.endswith(".libs") and not name.startswith(".")]
    for top, _, names in os.walk(root):
        for name in names:
            plugin = re.match(r"libplugin_(.+)\.so$", name)
            if (plugin and plugin.group(1) not in KEPT_PLUGINS) or name.startswith(("libtelemetry_",
                                                                                     "libucx_perftest")):
                os.remove(os.path.join(top, name))
    for name in ("libobj_utils.so", "libnixl_test_utils.so"):
        for top, _, names in os.walk(root):
            if name in names:
                os.remove(os.path.join(top, name))
    # The bundled libraries at the top of <pkg>.libs/ go unless something kept needs them.
    files = {}
    for top, _, names in os.walk(root):
        for name in names:
            if ".so" in name:
                files[name] = os.path.join(top, name)
    bundled = {path for lib in libs for path in files.values() if os.path.dirname(path) == os.path.join(root, lib)}
    seen, todo = set(), [path for path in files.values() if path not in bundled]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(files[dep] for dep in needed(path) if dep in files)
    for path in bundled - seen:
        os.remove(path)


def rezip(root, out):
    info = next(name for name in os.listdir(root) if name.endswith(".dist-info"))
    record = f"{info}/RECORD"
    paths = sorted(os.path.relpath(os.path.join(top, name), root) for top, _, names in os.walk(root)
                   for name in names)
    paths = [path for path in paths if path != record]
    rows = []
    for path in paths:
        with open(os.path.join(root, path), "rb") as file:
            data = file.read()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(data)}")
    rows.append(f"{record},,")
    with open(os.path.join(root, record), "w") as file:
        file.write("\n".join(rows) + "\n")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for path in paths + [record]:
            archive.write(os.path.join(root, path), path)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: slim-nixl-wheel.py IN.whl OUT.whl")
    with tempfile.TemporaryDirectory() as root:
        with zipfile.ZipFile(sys.argv[1]) as archive:
            archive.extractall(root)
        slim(root)
        rezip(root, sys.argv[2])
    print(f"{sys.argv[2]}: {os.path.getsize(sys.argv[2]) / 1e6:.1f} MB (from {os.path.getsize(sys.argv[1]) / 1e6:.1f})")


if __name__ == "__main__":
    main()
