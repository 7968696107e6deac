"""Probe: which memory domains and transports the UCX inside NIXL's wheel loads on this machine.

NIXL's UCX backend moved pinned host memory to device memory at under 1 GB/s on the H200
(bench/results/2026-12-03b-h200/), and UCX_PROTO_INFO printed nothing. This asks UCX itself,
through its C API (ctypes; the wheel ships no ucx_info): the configuration it read from the
environment, the context's resources (memory domains and transports: is cuda_copy there?) and a
worker's. Run with the same UCX_* variables as the transfer, e.g.

    UCX_TLS=cuda_copy,cuda_ipc,sm,self python3 scripts/probes/ucx_resources.py /tmp/nixl-site
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

UCP_PARAM_FIELD_FEATURES = 1 << 0
UCP_FEATURE_RMA = 1 << 1
UCP_FEATURE_AM = 1 << 6
UCS_CONFIG_PRINT_CONFIG = 1 << 0


def main() -> None:
    site = sys.argv[1] if len(sys.argv) > 1 else "/tmp/nixl-site"
    found = glob.glob(os.path.join(site, "nixl_cu13.libs", "libucp-*.so*"))
    if not found:
        sys.exit(f"no libucp under {site}/nixl_cu13.libs: give the folder the NIXL wheel was unpacked into")
    ucp = ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.fflush.argtypes = [ctypes.c_void_p]
    out = libc.fdopen(os.dup(1), b"w")

    major, minor, release = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    ucp.ucp_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(release))
    print(f"UCX {major.value}.{minor.value}.{release.value} from {found[0]}", flush=True)

    config = ctypes.c_void_p()
    status = ucp.ucp_config_read(None, None, ctypes.byref(config))
    if status != 0:
        sys.exit(f"ucp_config_read failed: status {status}")
    ucp.ucp_config_print.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    ucp.ucp_config_print(config, out, b"configuration", UCS_CONFIG_PRINT_CONFIG)
    libc.fflush(out)

    # ucp_params_t starts with field_mask and features (u64 each); the rest stays zero.
    params = (ctypes.c_uint64 * 64)()
    params[0] = UCP_PARAM_FIELD_FEATURES
    params[1] = UCP_FEATURE_RMA | UCP_FEATURE_AM
    context = ctypes.c_void_p()
    ucp.ucp_init_version.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p]
    status = ucp.ucp_init_version(major.value, minor.value, params, config, ctypes.byref(context))
    if status != 0:
        sys.exit(f"ucp_init failed: status {status}")
    ucp.ucp_context_print_info.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    ucp.ucp_context_print_info(context, out)
    libc.fflush(out)

    worker_params = (ctypes.c_uint64 * 64)()  # field_mask 0: the defaults
    worker = ctypes.c_void_p()
    ucp.ucp_worker_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    status = ucp.ucp_worker_create(context, worker_params, ctypes.byref(worker))
    if status != 0:
        sys.exit(f"ucp_worker_create failed: status {status}")
    ucp.ucp_worker_print_info.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    ucp.ucp_worker_print_info(worker, out)
    libc.fflush(out)


if __name__ == "__main__":
    main()
