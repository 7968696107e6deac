#!/usr/bin/env python3
"""Which driver calls block while a resident kernel spins? (ctypes driver API + NVRTC, on the GPU machine)

A one-thread kernel spins on a flag in mapped pinned host memory, on a non-blocking stream of the
primary context. Each operation below is then called from a fresh thread (which first makes the
primary context current). If it has not returned after 1.5 s it BLOCKS: the kernel is released and
we time how long after the release the call returned. Each operation is also timed once with no
kernel running (idle). Usage: python3 resident_calls.py [out.json]
"""
import ctypes, glob, json, mmap, os, sys, threading, time
from ctypes import POINTER as P, byref, c_char_p, c_int, c_size_t, c_ubyte, c_uint, c_uint64, c_void_p

MiB, REG = 1 << 20, 2 << 20
TIMEOUT, JOIN_AFTER, WAIT = 1.5, 10.0, 5.0
now = time.perf_counter
PV, PU, PI, PS = P(c_void_p), P(c_uint64), P(c_int), P(c_size_t)

def log(*a):
    print(*a, flush=True)

def bind(lib, sigs):
    for n, a in sigs.items():
        getattr(lib, n).argtypes, getattr(lib, n).restype = a, c_int

cu = ctypes.CDLL("libcuda.so.1")
bind(cu, {
    "cuInit": [c_uint], "cuDeviceGet": [PI, c_int], "cuDeviceGetName": [c_char_p, c_int, c_int],
    "cuDriverGetVersion": [PI], "cuDevicePrimaryCtxRetain": [PV, c_int],
    "cuDevicePrimaryCtxRelease_v2": [c_int], "cuCtxSetCurrent": [c_void_p], "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [PU, c_size_t], "cuMemFree_v2": [c_uint64], "cuMemAllocManaged": [PU, c_size_t, c_uint],
    "cuMemHostAlloc": [PV, c_size_t, c_uint], "cuMemFreeHost": [c_void_p],
    "cuMemHostGetDevicePointer_v2": [PU, c_void_p, c_uint], "cuMemHostRegister_v2": [c_void_p, c_size_t, c_uint],
    "cuMemHostUnregister": [c_void_p], "cuMemGetInfo_v2": [PS, PS],
    "cuModuleLoadData": [PV, c_void_p], "cuModuleUnload": [c_void_p], "cuModuleGetFunction": [PV, c_void_p, c_char_p],
    "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, PV, PV],
    "cuStreamCreate": [PV, c_uint], "cuStreamDestroy_v2": [c_void_p], "cuStreamSynchronize": [c_void_p],
    "cuStreamQuery": [c_void_p], "cuEventCreate": [PV, c_uint], "cuEventDestroy_v2": [c_void_p],
    "cuEventRecord": [c_void_p, c_void_p], "cuEventSynchronize": [c_void_p],
    "cuMemcpyHtoDAsync_v2": [c_uint64, c_void_p, c_size_t, c_void_p], "cuMemcpyHtoD_v2": [c_uint64, c_void_p, c_size_t],
    "cuMemsetD8Async": [c_uint64, c_ubyte, c_size_t, c_void_p], "cuGetErrorName": [c_int, P(c_char_p)]})

def name(rc):
    s = c_char_p()
    return s.value.decode() if cu.cuGetErrorName(rc, byref(s)) == 0 and s.value else "CUresult(%d)" % rc

def check(rc, what):
    if rc != 0:
        raise RuntimeError("%s failed: %s (%d)" % (what, name(rc), rc))

def load_nvrtc():
    for path in [os.environ.get("NVRTC_LIB"), "libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13"]:
        if path and path.startswith("/"):  # let libnvrtc find its builtins without LD_LIBRARY_PATH
            for b in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
                try:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
        try:
            lib = ctypes.CDLL(path) if path else None
        except OSError:
            lib = None
        if lib is None:
            continue
        bind(lib, {"nvrtcCreateProgram": [PV, c_char_p, c_char_p, c_int, c_void_p, c_void_p],
                   "nvrtcCompileProgram": [c_void_p, c_int, P(c_char_p)], "nvrtcDestroyProgram": [PV],
                   "nvrtcGetProgramLogSize": [c_void_p, PS], "nvrtcGetProgramLog": [c_void_p, c_void_p],
                   "nvrtcGetPTXSize": [c_void_p, PS], "nvrtcGetPTX": [c_void_p, c_void_p],
                   "nvrtcGetCUBINSize": [c_void_p, PS], "nvrtcGetCUBIN": [c_void_p, c_void_p],
                   "nvrtcVersion": [PI, PI]})
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [c_int], c_char_p
        return lib, path
    raise RuntimeError("libnvrtc.so.13 not found (LD_LIBRARY_PATH=/usr/local/cuda/lib64, or NVRTC_LIB=path)")

nv, NVRTC_PATH = load_nvrtc()

def compile_image(src, arch):
    prog, n = c_void_p(), c_size_t()
    def ck(rc, what):
        if rc != 0:
            raise RuntimeError("%s failed: %s" % (what, nv.nvrtcGetErrorString(rc).decode()))
    ck(nv.nvrtcCreateProgram(byref(prog), src, b"probe.cu", 0, None, None), "nvrtcCreateProgram")
    rc = nv.nvrtcCompileProgram(prog, 1, (c_char_p * 1)(b"--gpu-architecture=" + arch))
    if rc != 0:
        nv.nvrtcGetProgramLogSize(prog, byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        nv.nvrtcGetProgramLog(prog, buf)
        log("NVRTC log:\n" + buf.value.decode(errors="replace"))
        ck(rc, "nvrtcCompileProgram")
    cubin = arch.startswith(b"sm_")
    ck((nv.nvrtcGetCUBINSize if cubin else nv.nvrtcGetPTXSize)(prog, byref(n)), "nvrtcGet*Size")
    buf = ctypes.create_string_buffer(n.value)
    ck((nv.nvrtcGetCUBIN if cubin else nv.nvrtcGetPTX)(prog, buf), "nvrtcGet*")
    nv.nvrtcDestroyProgram(byref(prog))
    return buf.raw

def load_module(src):
    """PTX for compute_90 first; if the driver refuses it (PTX newer than the driver), an sm_90 cubin."""
    for arch in (b"compute_90", b"sm_90"):
        img, mod = compile_image(src, arch), c_void_p()
        rc = cu.cuModuleLoadData(byref(mod), img)
        if rc == 0:
            return mod, img, arch.decode()
        log("cuModuleLoadData(%s) failed: %s; trying the next form" % (arch.decode(), name(rc)))
    raise RuntimeError("could not load module")

def function(mod, fname):
    f = c_void_p()
    check(cu.cuModuleGetFunction(byref(f), mod, fname), "cuModuleGetFunction " + fname.decode())
    return f

SPIN = (b'extern "C" __global__ void spin(volatile unsigned* flag){ if(threadIdx.x==0){ flag[1]=1;'
        b' __threadfence_system(); while(flag[0]==0){} flag[2]=1; } }')
ADD1 = (b'extern "C" __global__ void add1(unsigned char* p, unsigned n){'
        b' unsigned i = blockIdx.x*blockDim.x+threadIdx.x; if(i<n) p[i]+=1; }')

check(cu.cuInit(0), "cuInit")
dev, ctx, ver, nvmaj, nvmin = c_int(), c_void_p(), c_int(), c_int(), c_int()
check(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
check(cu.cuDevicePrimaryCtxRetain(byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
devname = ctypes.create_string_buffer(256)
check(cu.cuDeviceGetName(devname, 256, dev), "cuDeviceGetName")
check(cu.cuDriverGetVersion(byref(ver)), "cuDriverGetVersion")
nv.nvrtcVersion(byref(nvmaj), byref(nvmin))
mod_spin, _, kind = load_module(SPIN)
mod_add, ADD_IMG, _ = load_module(ADD1)
f_spin, f_add = function(mod_spin, b"spin"), function(mod_add, b"add1")
log("device %s, driver %d, NVRTC %d.%d (%s), kernels loaded as %s" % (
    devname.value.decode(), ver.value, nvmaj.value, nvmin.value, NVRTC_PATH, kind))

flag_h, flag_d = c_void_p(), c_uint64()
check(cu.cuMemHostAlloc(byref(flag_h), 4096, 2 | 1), "cuMemHostAlloc flag page (DEVICEMAP|PORTABLE)")
check(cu.cuMemHostGetDevicePointer_v2(byref(flag_d), flag_h, 0), "cuMemHostGetDevicePointer")
flag = (ctypes.c_uint32 * 1024).from_address(flag_h.value)
s_spin, s2, hbuf, dbuf = c_void_p(), c_void_p(), c_void_p(), c_uint64()
check(cu.cuStreamCreate(byref(s_spin), 1), "cuStreamCreate spin")
check(cu.cuStreamCreate(byref(s2), 1), "cuStreamCreate second")
check(cu.cuMemHostAlloc(byref(hbuf), MiB, 0), "cuMemHostAlloc staging")
check(cu.cuMemAlloc_v2(byref(dbuf), MiB), "cuMemAlloc staging")
spin_arg, add_p, add_n = c_uint64(flag_d.value), c_uint64(dbuf.value), c_uint(MiB)
spin_params = (c_void_p * 1)(ctypes.addressof(spin_arg))
add_params = (c_void_p * 2)(ctypes.addressof(add_p), ctypes.addressof(add_n))

def wait_word(i, timeout):
    t = now()
    while flag[i] == 0:
        if now() - t > timeout:
            return False
        time.sleep(0.0002)
    return True

def launch_spin():
    for i in range(4):
        flag[i] = 0
    check(cu.cuLaunchKernel(f_spin, 1, 1, 1, 1, 1, 1, 0, s_spin, spin_params, None), "cuLaunchKernel spin")
    if not wait_word(1, WAIT):
        raise RuntimeError("spin kernel did not start within %.0f s" % WAIT)

# Resources an operation makes or frees: kind -> (handle type, create(h, st), destroy(h, st)).
RES = {
    "dev": (c_uint64, lambda h, st: cu.cuMemAlloc_v2(byref(h), MiB), lambda h, st: cu.cuMemFree_v2(h)),
    "host": (c_void_p, lambda h, st: cu.cuMemHostAlloc(byref(h), MiB, 0), lambda h, st: cu.cuMemFreeHost(h)),
    "hostmap": (c_void_p, lambda h, st: cu.cuMemHostAlloc(byref(h), MiB, 2 | 1), lambda h, st: cu.cuMemFreeHost(h)),
    "reg": (c_void_p, lambda h, st: cu.cuMemHostRegister_v2(st["addr"], REG, 2),
            lambda h, st: cu.cuMemHostUnregister(st["addr"])),
    "managed": (c_uint64, lambda h, st: cu.cuMemAllocManaged(byref(h), MiB, 1), lambda h, st: cu.cuMemFree_v2(h)),
    "module": (c_void_p, lambda h, st: cu.cuModuleLoadData(byref(h), ADD_IMG), lambda h, st: cu.cuModuleUnload(h)),
    "stream": (c_void_p, lambda h, st: cu.cuStreamCreate(byref(h), 1), lambda h, st: cu.cuStreamDestroy_v2(h)),
    "event": (c_void_p, lambda h, st: cu.cuEventCreate(byref(h), 2), lambda h, st: cu.cuEventDestroy_v2(h))}

def create(st, kind):  # the timed call stores the handle in st; the cleanup frees it
    h = RES[kind][0]()
    rc = RES[kind][1](h, st)
    if rc == 0:
        st[kind] = h
    return rc

def destroy(st, kind):
    h = st.pop(kind, None)
    return 0 if h is None else RES[kind][2](h, st)

def map_region(st):  # 2 MiB anonymous mmap, not registered
    st["mm"] = mmap.mmap(-1, REG, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    st["cbuf"] = ctypes.c_char.from_buffer(st["mm"])
    st["addr"] = ctypes.addressof(st["cbuf"])

def unmap_region(st):
    st.pop("cbuf", None)
    st.pop("mm").close()

def chain(*calls):  # first failing CUresult, or 0
    for c in calls:
        rc = c()
        if rc != 0:
            return rc
    return 0

def nothing(st):
    pass

def made(kind, first=nothing):  # prepare: the resource already exists when the timed call runs
    return lambda st: (first(st), check(create(st, kind), "prepare " + kind))

MAKE, FREE = (lambda k: lambda st: create(st, k)), (lambda k: lambda st: destroy(st, k))
OPS = [  # label, prepare (before the kernel), timed call, cleanup (after the kernel)
    ("cuMemAlloc 1 MiB", nothing, MAKE("dev"), FREE("dev")),
    ("cuMemFree", made("dev"), FREE("dev"), nothing),
    ("cuMemHostAlloc 1 MiB flags 0", nothing, MAKE("host"), FREE("host")),
    ("cuMemHostAlloc 1 MiB DEVICEMAP|PORTABLE", nothing, MAKE("hostmap"), FREE("hostmap")),
    ("cuMemFreeHost", made("host"), FREE("host"), nothing),
    ("cuMemHostRegister 2 MiB DEVICEMAP", map_region, MAKE("reg"), lambda st: (destroy(st, "reg"), unmap_region(st))),
    ("cuMemHostUnregister", made("reg", map_region), FREE("reg"), unmap_region),
    ("cuMemAllocManaged 1 MiB GLOBAL", nothing, MAKE("managed"), FREE("managed")),
    ("cuModuleLoadData (small kernel)", nothing, MAKE("module"), FREE("module")),
    ("cuModuleUnload", made("module"), FREE("module"), nothing),
    ("cuStreamCreate NON_BLOCKING", nothing, MAKE("stream"), FREE("stream")),
    ("cuStreamDestroy", made("stream"), FREE("stream"), nothing),
    ("cuEventCreate DISABLE_TIMING", nothing, MAKE("event"), FREE("event")),
    ("cuEventDestroy", made("event"), FREE("event"), nothing),
    ("cuEventRecord(s2) + cuEventSynchronize", made("event"), lambda st: chain(
        lambda: cu.cuEventRecord(st["event"], s2), lambda: cu.cuEventSynchronize(st["event"])), FREE("event")),
    ("cuMemcpyHtoDAsync(s2, pinned) + sync", nothing, lambda st: chain(
        lambda: cu.cuMemcpyHtoDAsync_v2(dbuf, hbuf, MiB, s2), lambda: cu.cuStreamSynchronize(s2)), nothing),
    ("cuMemcpyHtoD_v2 from pinned", nothing, lambda st: cu.cuMemcpyHtoD_v2(dbuf, hbuf, MiB), nothing),
    ("cuMemsetD8Async(s2) + sync", nothing, lambda st: chain(
        lambda: cu.cuMemsetD8Async(dbuf, 0, MiB, s2), lambda: cu.cuStreamSynchronize(s2)), nothing),
    ("cuLaunchKernel add1 (s2) + sync", nothing, lambda st: chain(
        lambda: cu.cuLaunchKernel(f_add, MiB // 256, 1, 1, 256, 1, 1, 0, s2, add_params, None),
        lambda: cu.cuStreamSynchronize(s2)), nothing),
    ("cuStreamQuery(spinning stream)", nothing, lambda st: cu.cuStreamQuery(s_spin), nothing),
    ("cuMemGetInfo_v2", nothing, lambda st: cu.cuMemGetInfo_v2(byref(c_size_t()), byref(c_size_t())), nothing),
    ("cuCtxSynchronize", nothing, lambda st: cu.cuCtxSynchronize(), nothing)]

def in_thread(call, st):
    res = {}
    def body():
        res["ctx"] = cu.cuCtxSetCurrent(ctx)
        res["t0"] = now()
        try:
            res["rc"] = call(st)
        except Exception as e:  # report it; never let the probe hang on a dead thread
            res["rc"], res["exc"] = -1, repr(e)
        res["t1"] = now()
    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th, res

def outcome(res):
    ms = round((res["t1"] - res["t0"]) * 1e3, 3)
    if res["ctx"] != 0:
        return ms, "cuCtxSetCurrent: " + name(res["ctx"])
    return ms, res.get("exc") or name(res["rc"])

rows, aborted = [], False
for op, prep, call, clean in OPS:
    row, st = {"op": op}, {}
    prep(st)
    th, res = in_thread(call, st)
    th.join(JOIN_AFTER)
    if th.is_alive():
        row.update(resident="skipped", note="STUCK %.0f s with no kernel running" % JOIN_AFTER)
        rows.append(row)
        aborted = True
        break
    row["idle_ms"], row["idle_result"] = outcome(res)
    clean(st)
    st = {}
    prep(st)
    launch_spin()
    th, res = in_thread(call, st)
    th.join(TIMEOUT)
    if th.is_alive():
        row["kernel_running_at_release"] = flag[2] == 0
        t_rel = now()
        flag[0] = 1
        th.join(JOIN_AFTER)
        if th.is_alive():
            row.update(resident="STUCK", note="still in the call %.0f s after the kernel's release" % JOIN_AFTER)
            rows.append(row)
            aborted = True
            break
        row["resident"], row["after_release_ms"] = "BLOCKS", round((res["t1"] - t_rel) * 1e3, 3)
    else:
        row["resident"], row["kernel_running_at_return"] = "returns", flag[2] == 0
        flag[0] = 1
    row["ms"], row["result"] = outcome(res)
    if not wait_word(2, WAIT):
        row["note"] = "spin kernel did not report its end within %.0f s of release" % WAIT
    check(cu.cuStreamSynchronize(s_spin), "cuStreamSynchronize spin")
    clean(st)
    rows.append(row)
    log("%-40s %-8s %s" % (op, row["resident"], row["result"]))

log("\n%-40s | %9s | %-8s | %-40s | %-24s | %s" % (
    "operation", "idle ms", "blocks?", "time with the kernel spinning", "result", "idle result"))
for r in rows:
    if r["resident"] == "BLOCKS":
        t = "%.1f ms total, %.2f ms after release" % (r["ms"], r["after_release_ms"])
    elif r["resident"] == "returns":
        t = "%.3f ms%s" % (r["ms"], "" if r["kernel_running_at_return"] else " (but kernel had ENDED)")
    else:
        t = r.get("note", "")
    idle = "%.3f" % r["idle_ms"] if "idle_ms" in r else "-"
    log("%-40s | %9s | %-8s | %-40s | %-24s | %s" % (r["op"], idle, r["resident"], t,
                                                     r.get("result", "-"), r.get("idle_result", "-")))
out = {"device": devname.value.decode(), "driver_version": ver.value, "nvrtc": "%d.%d" % (nvmaj.value, nvmin.value),
       "kernel_image": kind, "timeout_s": TIMEOUT, "aborted": aborted, "rows": rows}
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)
    log("wrote " + sys.argv[1])
if aborted:
    log("ABORTED: a call never returned; exiting without cleanup")
    os._exit(2)
flag[0] = 1
check(cu.cuCtxSynchronize(), "final cuCtxSynchronize")
for what, rc in (("free dbuf", cu.cuMemFree_v2(dbuf)), ("free hbuf", cu.cuMemFreeHost(hbuf)),
                 ("destroy s2", cu.cuStreamDestroy_v2(s2)), ("destroy spin stream", cu.cuStreamDestroy_v2(s_spin)),
                 ("unload add1", cu.cuModuleUnload(mod_add)), ("unload spin", cu.cuModuleUnload(mod_spin)),
                 ("free flag page", cu.cuMemFreeHost(flag_h)), ("release", cu.cuDevicePrimaryCtxRelease_v2(dev))):
    check(rc, what)
log("done")
