#!/usr/bin/env python3
"""After a kernel fault in the primary context, does cuDevicePrimaryCtxReset recover the process?
(ctypes driver API + NVRTC + numpy, on the GPU machine)

Each case runs in a fresh child process (this script with --child CASE):
  a  __trap()               then cuDevicePrimaryCtxReset_v2, retain again, fresh work
  b  illegal store (0x10)   then cuDevicePrimaryCtxReset_v2, retain again, fresh work
  c  __trap()               no reset: is the error sticky (cuCtxSynchronize, cuMemAlloc, ... after 1 s)?
  c2 illegal store          no reset, likewise
Recorded: the error each call returns after the fault, whether the reset succeeds, whether fresh
work (HtoD of random bytes, a kernel adding 1 to each byte, DtoH, compared with numpy) is right,
whether a post-reset allocation reuses a pre-fault address (then a stale cuMemFree of the old value
frees live memory: tested), and what cuDevicePrimaryCtxRelease_v2 returns for the pre-reset retain.
Usage: python3 sticky_reset.py [out.json]
"""
import ctypes, glob, json, os, subprocess, sys, time
from ctypes import POINTER as P, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
import numpy as np

N = 1 << 20
CASES = {"a": ("trap_k", True), "b": ("illegal_k", True), "c": ("trap_k", False), "c2": ("illegal_k", False)}
SRC = (b'extern "C" __global__ void trap_k(){ __trap(); }\n'
       b'extern "C" __global__ void illegal_k(){ *(volatile int*)0x10 = 1; }\n'
       b'extern "C" __global__ void add1(unsigned char* p, unsigned n){'
       b' unsigned i = blockIdx.x*blockDim.x+threadIdx.x; if(i<n) p[i]+=1; }\n')
PV, PU, PI, PS = P(c_void_p), P(c_uint64), P(c_int), P(c_size_t)

def log(*a):  # progress goes to stderr; stdout of a child carries only its RESULT line
    print(*a, file=sys.stderr, flush=True)

def bind(lib, sigs):
    for n, a in sigs.items():
        getattr(lib, n).argtypes, getattr(lib, n).restype = a, c_int

def load_cuda():
    cu = ctypes.CDLL("libcuda.so.1")
    bind(cu, {
        "cuInit": [c_uint], "cuDeviceGet": [PI, c_int], "cuDevicePrimaryCtxRetain": [PV, c_int],
        "cuDevicePrimaryCtxRelease_v2": [c_int], "cuDevicePrimaryCtxReset_v2": [c_int],
        "cuDevicePrimaryCtxGetState": [c_int, P(c_uint), PI], "cuCtxSetCurrent": [c_void_p],
        "cuCtxGetCurrent": [PV], "cuCtxSynchronize": [], "cuMemAlloc_v2": [PU, c_size_t], "cuMemFree_v2": [c_uint64],
        "cuModuleLoadData": [PV, c_void_p], "cuModuleGetFunction": [PV, c_void_p, c_char_p],
        "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, PV, PV],
        "cuStreamCreate": [PV, c_uint], "cuStreamSynchronize": [c_void_p], "cuStreamQuery": [c_void_p],
        "cuMemcpyHtoDAsync_v2": [c_uint64, c_void_p, c_size_t, c_void_p],
        "cuMemcpyDtoHAsync_v2": [c_void_p, c_uint64, c_size_t, c_void_p], "cuGetErrorName": [c_int, P(c_char_p)]})
    return cu

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
                   "nvrtcGetCUBINSize": [c_void_p, PS], "nvrtcGetCUBIN": [c_void_p, c_void_p]})
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [c_int], c_char_p
        return lib
    raise RuntimeError("libnvrtc.so.13 not found (LD_LIBRARY_PATH=/usr/local/cuda/lib64, or NVRTC_LIB=path)")

def compile_image(nv, src, arch):
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

def child(case, r):
    fault, reset = CASES[case]
    r.update(fault=fault, reset=reset)
    cu, nv = load_cuda(), load_nvrtc()

    def name(rc):
        s = c_char_p()
        return s.value.decode() if cu.cuGetErrorName(rc, byref(s)) == 0 and s.value else "CUresult(%d)" % rc

    def rec(key, rc):
        r[key] = name(rc)
        log("  [%s] %-34s %s" % (case, key, r[key]))
        return rc

    def check(rc, what):
        if rc != 0:
            raise RuntimeError("%s failed: %s (%d)" % (what, name(rc), rc))

    def state(key):
        flags, active = c_uint(), c_int()
        rc = cu.cuDevicePrimaryCtxGetState(dev, byref(flags), byref(active))
        r[key] = {"active": active.value, "flags": flags.value} if rc == 0 else {"error": name(rc)}
        log("  [%s] %-34s %s" % (case, key, r[key]))

    def load(img_kind=None):  # (module, function dict, image kind) or (None, {}, CUresult)
        for arch in ([img_kind] if img_kind else ["compute_90", "sm_90"]):
            mod = c_void_p()
            rc = cu.cuModuleLoadData(byref(mod), compile_image(nv, SRC, arch.encode()))
            if rc == 0:
                fns = {}
                for f in ("trap_k", "illegal_k", "add1"):
                    fns[f] = c_void_p()
                    check(cu.cuModuleGetFunction(byref(fns[f]), mod, f.encode()), "cuModuleGetFunction " + f)
                return mod, fns, arch
            log("  [%s] cuModuleLoadData(%s): %s" % (case, arch, name(rc)))
        return None, {}, rc

    def launch(fn, stream, params=None, grid=1, block=1):
        return cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, None)

    def work(fns, stream, ptr):  # HtoD random bytes, +1 kernel, DtoH, compare with numpy
        src = np.random.default_rng().integers(0, 256, N, dtype=np.uint8)
        out, want = np.zeros(N, np.uint8), ((src.astype(np.uint16) + 1) & 0xFF).astype(np.uint8)
        a_p, a_n = c_uint64(ptr), c_uint(N)
        params = (c_void_p * 2)(ctypes.addressof(a_p), ctypes.addressof(a_n))
        for step, call in (("HtoD", lambda: cu.cuMemcpyHtoDAsync_v2(ptr, src.ctypes.data, N, stream)),
                           ("launch add1", lambda: launch(fns["add1"], stream, params, N // 256, 256)),
                           ("DtoH", lambda: cu.cuMemcpyDtoHAsync_v2(out.ctypes.data, ptr, N, stream)),
                           ("sync", lambda: cu.cuStreamSynchronize(stream))):
            rc = call()
            if rc != 0:
                return {"ok": False, "failed_at": step, "error": name(rc)}
        bad = int(np.count_nonzero(out != want))
        return {"ok": bad == 0, "mismatched_bytes": bad}

    def alloc(key):
        p = c_uint64()
        rc = rec(key, cu.cuMemAlloc_v2(byref(p), N))
        r[key + "_addr"] = hex(p.value) if rc == 0 else None
        return p.value if rc == 0 else None

    check(cu.cuInit(0), "cuInit")
    dev, ctx, s = c_int(), c_void_p(), c_void_p()
    check(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    r["ctx_before"] = hex(ctx.value)
    mod, fns, kind = load()
    check(0 if mod else kind, "cuModuleLoadData")
    r["image"] = kind
    check(cu.cuStreamCreate(byref(s), 1), "cuStreamCreate")
    old_a, old_b = alloc("alloc_old_a"), alloc("alloc_old_b")
    check(0 if old_a and old_b else 1, "pre-fault cuMemAlloc")
    r["work_before_fault"] = work(fns, s, old_b)
    log("  [%s] work_before_fault %s" % (case, r["work_before_fault"]))
    rec("launch_fault", launch(fns[fault], s))
    rec("stream_sync_after_fault", cu.cuStreamSynchronize(s))
    p = alloc("alloc_before_reset")
    if p:
        rec("free_of_that_alloc", cu.cuMemFree_v2(p))
    rec("free_prefault_old_a_before_reset", cu.cuMemFree_v2(old_a))
    rec("ctx_sync_before_reset", cu.cuCtxSynchronize())
    if not reset:
        time.sleep(1.0)
        rec("ctx_sync_after_1s", cu.cuCtxSynchronize())
        p = alloc("alloc_after_1s")
        rec("stream_query_after_1s", cu.cuStreamQuery(s))
        s_new = c_void_p()
        rec("stream_create_after_1s", cu.cuStreamCreate(byref(s_new), 1))
        r["work_without_reset"] = work(fns, s, old_b)
        log("  [%s] work_without_reset %s" % (case, r["work_without_reset"]))
        state("state_no_reset")
        return
    state("state_before_reset")
    rec("reset_call", cu.cuDevicePrimaryCtxReset_v2(dev))
    state("state_after_reset")
    cur = c_void_p()
    rec("get_current_after_reset", cu.cuCtxGetCurrent(byref(cur)))
    r["current_after_reset"] = hex(cur.value or 0)
    # The old context stays current on this thread after the reset: unbind it first, then
    # retain again, a few times, since the first call may report the error still pending.
    rec("unbind_after_reset", cu.cuCtxSetCurrent(None))
    ctx2 = c_void_p()
    for attempt in range(3):
        code = cu.cuDevicePrimaryCtxRetain(byref(ctx2), dev)
        rec("retain_after_reset_%d" % attempt, code)
        if code == 0:
            break
    rec("retain_after_reset", code)
    r["ctx_after"], r["same_ctx_handle"] = hex(ctx2.value or 0), ctx2.value == ctx.value
    rec("set_current_after_reset", cu.cuCtxSetCurrent(ctx2))
    state("state_after_retain")
    rec("ctx_sync_after_reset", cu.cuCtxSynchronize())
    mod2, fns2, kind2 = load(kind)  # same order as before the fault: module, stream, allocations
    r["module_load_after_reset"] = "CUDA_SUCCESS" if mod2 else name(kind2)
    s2 = c_void_p()
    rec("stream_create_after_reset", cu.cuStreamCreate(byref(s2), 1))
    new_1, new_2 = alloc("alloc_new_1"), alloc("alloc_new_2")
    olds, news = {old_a, old_b}, {new_1, new_2} - {None}
    r["old_addr_reused"] = sorted(hex(x) for x in olds & news)
    log("  [%s] old %s %s, new %s %s, reused %s" % (case, r["alloc_old_a_addr"], r["alloc_old_b_addr"],
                                                   r["alloc_new_1_addr"], r["alloc_new_2_addr"], r["old_addr_reused"]))
    if mod2 and new_1:
        r["work_after_reset"] = work(fns2, s2, new_1)
        log("  [%s] work_after_reset %s" % (case, r["work_after_reset"]))
    # Stale frees of the pre-fault values: if a value was handed out again, does freeing it free the
    # new allocation (so that the later free of that new allocation fails)?
    stale = {old_a: rec("stale_free_old_a", cu.cuMemFree_v2(old_a))}
    stale[old_b] = rec("stale_free_old_b", cu.cuMemFree_v2(old_b))
    after = {}
    for key, ptr in (("free_new_1", new_1), ("free_new_2", new_2)):
        if ptr:
            after[ptr] = rec(key, cu.cuMemFree_v2(ptr))
    r["stale_free_freed_live_allocation"] = any(stale[o] == 0 and after.get(o, 0) != 0 for o in stale)
    for i in (1, 2, 3):  # 1 = the pre-reset retain, 2 = the post-reset retain, 3 = one too many
        rec("release_%d" % i, cu.cuDevicePrimaryCtxRelease_v2(dev))
        state("state_after_release_%d" % i)

def summarize(r):
    g = lambda k: r.get(k, "-")  # noqa: E731
    w = lambda k: "-" if k not in r else "ok" if r[k].get("ok") else "FAILED %s" % r[k]  # noqa: E731
    out = ["exit %s%s" % (g("child_exit"), ", ERROR %s" % r["error"] if "error" in r else ""),
           "after fault: stream sync %s | cuMemAlloc %s | cuMemFree(pre-fault) %s | cuCtxSynchronize %s" % (
               g("stream_sync_after_fault"), g("alloc_before_reset"), g("free_prefault_old_a_before_reset"),
               g("ctx_sync_before_reset")),
           "work before fault: %s" % w("work_before_fault")]
    if r.get("reset"):
        out += ["reset %s | state after %s | retain %s (same handle %s) | set current %s | ctx sync %s" % (
                    g("reset_call"), g("state_after_reset"), g("retain_after_reset"), g("same_ctx_handle"),
                    g("set_current_after_reset"), g("ctx_sync_after_reset")),
                "after reset: stream create %s | module load %s | work %s" % (
                    g("stream_create_after_reset"), g("module_load_after_reset"), w("work_after_reset")),
                "addresses: old %s %s, new %s %s, reused %s" % (
                    g("alloc_old_a_addr"), g("alloc_old_b_addr"), g("alloc_new_1_addr"), g("alloc_new_2_addr"),
                    g("old_addr_reused")),
                "stale cuMemFree old a %s, old b %s; then free new 1 %s, new 2 %s; freed a live allocation: %s" % (
                    g("stale_free_old_a"), g("stale_free_old_b"), g("free_new_1"), g("free_new_2"),
                    g("stale_free_freed_live_allocation")),
                "releases (pre-reset retain, post-reset retain, one too many): %s / %s / %s; active after: %s" % (
                    g("release_1"), g("release_2"), g("release_3"),
                    [(r.get("state_after_release_%d" % i) or {"active": "?"}).get("active", "?") for i in (1, 2, 3)])]
    else:
        out += ["after 1 s, no reset: cuCtxSynchronize %s | cuMemAlloc %s | cuStreamQuery %s | cuStreamCreate %s"
                " | work %s" % (g("ctx_sync_after_1s"), g("alloc_after_1s"), g("stream_query_after_1s"),
                                g("stream_create_after_1s"), w("work_without_reset"))]
    for line in out:
        print("   " + line, flush=True)

def parent():
    results = []
    for case, (fault, reset) in CASES.items():
        print("== case %s: %s, %s" % (case, fault, "reset" if reset else "no reset"), flush=True)
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", case],
                               stdout=subprocess.PIPE, universal_newlines=True, timeout=300)
            lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            r = json.loads(lines[-1][7:]) if lines else {"case": case, "error": "no RESULT line"}
            r["child_exit"] = p.returncode
        except subprocess.TimeoutExpired:
            r = {"case": case, "error": "child timed out after 300 s"}
        results.append(r)
        summarize(r)
    print("\n%-4s %-10s %-5s | %-28s | %-28s | %-14s | %-8s | %-14s | %s" % (
        "case", "fault", "reset", "stream sync after fault", "cuMemAlloc before reset", "reset", "work ok",
        "old addr reused", "stale free hit live"), flush=True)
    for r in results:
        w = r.get("work_after_reset", r.get("work_without_reset", {}))
        print("%-4s %-10s %-5s | %-28s | %-28s | %-14s | %-8s | %-14s | %s" % (
            r["case"], r.get("fault", "?"), r.get("reset", "?"), r.get("stream_sync_after_fault", r.get("error")),
            r.get("alloc_before_reset", "-"), r.get("reset_call", "not called"),
            w.get("ok", "-"), ",".join(r.get("old_addr_reused", [])) or "no",
            r.get("stale_free_freed_live_allocation", "-")), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump(results, fh, indent=1)
        print("wrote " + sys.argv[1], flush=True)

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        res = {"case": sys.argv[2]}
        try:
            child(sys.argv[2], res)
        except Exception as e:  # still report what was recorded
            res["error"] = repr(e)
            log("  [%s] ERROR %r" % (sys.argv[2], e))
        print("RESULT " + json.dumps(res), flush=True)
        os._exit(1 if "error" in res else 0)
    parent()
