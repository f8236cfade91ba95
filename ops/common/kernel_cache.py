"""The one compile entry of every kernel seam, with an optional on-disk store of compiled kernels.

``compile(kernel, *fake_args, variant=None)`` returns the callable a seam launches: the kernel compiled by
``cute.compile(kernel, *fake_args, options=COMPILE_OPTIONS)``. Each seam keeps its own in-process ``_CACHE`` in front
of it; this module only decides where the compiled code comes from.

The store (off unless ``PADDLE_DSA_KERNEL_CACHE`` names a directory): compiling a variant costs seconds of host time
(sparse attention backward 4.8 s on the CI machine: ~1.1 s tracing the Python kernel into MLIR, the rest the MLIR
pipeline, ptxas and the host-code link), paid again by every process: each training job's first steps, and every
test or compute-sanitizer process on the device. With the store on, a compiled kernel is written once and every later
process loads it (same kernel: 1.6 s, tracing only).

Key: tracing still runs, and the key is the traced MLIR module itself (printed without source locations, so the
checkout's path does not matter) plus what else reaches the compiled code: the DSL's compile-affecting settings (its
own cache key: arch, compiler options, debug / line info, ...; not the runtime libraries' path, which the object code
does not contain), the compile options, the DSL version and the machine type. Whatever changes the traced code (a
source edit, a class-attribute knob, a module constant or environment variable read while tracing) changes the key; a
hit is the code a compile would give. Nothing about the call (shapes, pointers) is in it: the kernels are compiled for
symbolic shapes. An entry records the CPU features its host code may use and is used only where all of them are
present (ForeignEntry: compiled here, the entry replaced). On x86-64 the entry's host code is compiled for a portable
baseline, x86-64-v3 (AVX2, FMA, BMI; PORTABLE_FEATURES), whatever CPU builds it: every defined function of a copy of
the module gets that target CPU and feature list before the export, so a store built on an AMD EPYC loads on the
device's Intel Xeon (LLVM's native target, which the DSL's own JIT path keeps, used AVX-512 zmm registers on that
EPYC, and may use AMD-only extensions such as SSE4A). A host without the whole baseline, or another architecture,
records and compiles for its own features.

Entry ``<key>.o``: a header (magic, the entry function's name, the CPU features its host code may use, the body's
sha256) and the object code the DSL itself links for its JIT path (``export_module_to_bytes``, same flags). A hit
loads it the way the DSL does (JITLink ``BinaryExecutionEngine``, ``__tvm_ffi_<name>``): the same entry function,
which checks every argument (count, dtype, device, rank, alignment) before a launch as the JIT one does. It is
positional-only (no keyword wrapper): every seam passes all arguments positionally. Written to a temporary file and
renamed, so concurrent processes never see half an entry. A corrupt or unreadable entry, or an unwritable directory: one warning, then the plain compile.
``CUTE_DSL_KEEP`` set (PTX / cubin dumps): the store is bypassed, so a dump always comes from a real compile.

Manifest ``manifest.jsonl``: one line per entry written by a seam that names its variant
(``variant=(module, function, args)``), so ``tests/gpu/prebuild_kernels.py`` can compile a list of variants in
parallel processes before a test run.
"""
import functools
import hashlib
import json
import os
import platform
import re
import threading
import warnings

ENV = "PADDLE_DSA_KERNEL_CACHE"
MAGIC = b"paddle_dsa kernel 2\n"
MANIFEST = "manifest.jsonl"

_LOCK = threading.Lock()
_WARNED = set()
STATS = {"hits": 0, "stored": 0, "compiled": 0}


class _Hit(Exception):
    """Raised inside the DSL's compile step when the store has the traced module's code (never leaves compile())."""

    def __init__(self, path, name):
        super().__init__(path)
        self.path, self.name = path, name


def cache_dir():
    d = os.environ.get(ENV, "")
    return d or None


def _warn_once(what, err):
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(f"paddle_dsa kernel cache ({ENV}): {what}: {type(err).__name__}: {err}; compiling instead",
                      RuntimeWarning, stacklevel=3)


# /proc/cpuinfo flags that name no instruction a compiler could emit (timers, mitigations, OS and VM features)
_NOT_ISA = frozenset("hypervisor constant_tsc nonstop_tsc tsc_known_freq tsc_deadline_timer tsc_adjust xtopology "
                     "cpuid_fault arat md_clear flush_l1d arch_capabilities ssbd ibrs ibpb stibp ibrs_enhanced "
                     "bus_lock_detect umip smep smap".split())


@functools.lru_cache(maxsize=1)
def host_features():
    """The CPU features of this host an entry's host code may use (LLVM compiles it for the build host): the
    /proc/cpuinfo flags less the non-instruction ones; empty where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        line = ""
    return frozenset(line.partition(":")[2].split()) - _NOT_ISA


def _settings(dsl):
    """The DSL's own cache key of its compile settings, less the runtime libraries' install path: the object code does
    not contain it (the libraries are linked when an entry is loaded, from the loading process's DSL, whose version is
    in the key), and it differs between checkouts and machines."""
    return re.sub(r"shared_libs=[^;]*;", "", dsl.envar.cache_key_str())


def module_key(dsl, module, function_name):
    """The store key of a traced module (see the module docstring)."""
    import cutlass
    h = hashlib.sha256()
    for part in (function_name, module.operation.get_asm(enable_debug_info=False), _settings(dsl),
                 dsl.compile_options.to_str(), getattr(cutlass, "__version__", "?"), platform.machine()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


class ForeignEntry(ValueError):
    """An entry built on a CPU with features this host lacks (``missing``): compiled here instead, the entry replaced."""

    def __init__(self, missing):
        super().__init__(f"built on a CPU with {' '.join(sorted(missing))}, which this one lacks")
        self.missing = frozenset(missing)


def _read_entry(path):
    """(entry function name, body) of a whole, intact entry whose host code this CPU can run."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise ValueError("not an entry of this format")
    name, features, digest, body = data[len(MAGIC):].split(b"\n", 3)
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("checksum mismatch")
    missing = set(features.decode().split()) - host_features()
    if missing:
        raise ForeignEntry(missing)
    return name.decode(), body


def _write_entry(path, name, body):
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC + name.encode() + b"\n" + " ".join(sorted(entry_features())).encode() + b"\n"
                + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    os.replace(tmp, path)


def _load(name, body):
    """The entry's function, loaded as the DSL loads a fresh compile (tvm_ffi_provider._create_tvm_ffi_function)."""
    import tvm_ffi
    from cutlass._mlir._mlir_libs._cutlass_ir._execution_engine import BinaryExecutionEngine
    from cutlass.base_dsl.env_manager import get_prefix_dsl_libs
    libs = get_prefix_dsl_libs("CUTE_DSL")
    engine = BinaryExecutionEngine(body, libs.split(os.pathsep) if libs else [], True)
    ptr = engine.lookup("__tvm_ffi_" + name)
    if not ptr:
        raise ValueError(f"no entry function __tvm_ffi_{name} in the object")
    return tvm_ffi.Function.__from_extern_c__(ptr, keep_alive_object=engine)


# the portable host target of an entry on x86-64 (x86-64-v3), as LLVM names it and as /proc/cpuinfo names its features
PORTABLE_CPU = "x86-64-v3"
PORTABLE_LLVM_FEATURES = ("avx avx2 bmi bmi2 cmov cx16 cx8 f16c fma fxsr lzcnt mmx movbe popcnt sahf sse sse2 sse3 "
                          "sse4.1 sse4.2 ssse3 xsave").split()
PORTABLE_FEATURES = frozenset("avx avx2 bmi1 bmi2 cmov cx16 cx8 f16c fma fxsr abm mmx movbe popcnt lahf_lm sse sse2 "
                              "pni sse4_1 sse4_2 ssse3 xsave".split())


def portable():
    """True where entries are built for the portable baseline: an x86-64 host that has all of it."""
    return platform.machine() in ("x86_64", "AMD64") and PORTABLE_FEATURES <= host_features()


def entry_features():
    """The CPU features an entry written here records: the baseline's, or this host's own."""
    return PORTABLE_FEATURES if portable() else host_features()


def _object_code(fn):
    """The object code of a compiled kernel's host module (its cubin embedded), for the portable baseline where
    portable(): a copy of the module whose defined functions carry the target CPU and features (LLVM takes a
    function's target-cpu / target-features over the target machine's native ones)."""
    from cutlass._mlir import ir
    from cutlass._mlir._mlir_libs._cutlass_ir import _aot_support
    module = fn.ir_module
    if portable():
        with module.context:
            module = ir.Module.parse(module.operation.get_asm(enable_debug_info=False))
            cpu = ir.StringAttr.get(PORTABLE_CPU)
            features = ir.Attribute.parse("#llvm.target_features<[%s]>"
                                          % ", ".join(f'"+{f}"' for f in PORTABLE_LLVM_FEATURES))
            for op in module.body.operations:
                if op.operation.name == "llvm.func" and len(op.regions[0].blocks):
                    op.attributes["target_cpu"] = cpu
                    op.attributes["target_features"] = features
    return _aot_support.export_module_to_bytes(module, format="o", opt_level=3, enable_pic=True)


def _note(directory, variant):
    if variant is None:
        return
    module, function, args = variant
    line = json.dumps({"module": module, "function": function, "args": list(args)}) + "\n"
    with open(os.path.join(directory, MANIFEST), "a") as f:   # one short write: atomic with O_APPEND
        f.write(line)


def compile(kernel, *args, variant=None):  # noqa: A001  (the module's one verb)
    """cute.compile(kernel, *args, options=COMPILE_OPTIONS), through the store when it is on."""
    import cutlass.cute as cute
    from .tensors import COMPILE_OPTIONS
    directory = cache_dir()
    if directory is None:
        return cute.compile(kernel, *args, options=COMPILE_OPTIONS)
    if not host_features():
        _warn_once("no CPU feature list (/proc/cpuinfo) to check entries against", OSError("store off"))
        return cute.compile(kernel, *args, options=COMPILE_OPTIONS)
    try:
        from cutlass.cutlass_dsl.cutlass import CutlassBaseDSL
        original = CutlassBaseDSL.compile_and_cache       # the DSL step after tracing (nvidia-cutlass-dsl 4.8.1)
    except (ImportError, AttributeError) as e:
        _warn_once("this DSL version has no hook for it", e)
        return cute.compile(kernel, *args, options=COMPILE_OPTIONS)
    seen, owner = {}, threading.get_ident()

    def through_store(dsl, module, module_hash, function_name, *rest, **kw):
        # only this call's compile (another thread's compile passes through), and never for a PTX / cubin dump
        if threading.get_ident() == owner and not dsl.envar.keep_tokens and "path" not in seen:
            try:
                path = os.path.join(directory, module_key(dsl, module, function_name) + ".o")
            except Exception as e:  # noqa: BLE001
                _warn_once("cannot key the traced module", e)
            else:
                seen.update(path=path, name=function_name)
                if os.path.exists(path):
                    raise _Hit(path, function_name)
        return original(dsl, module, module_hash, function_name, *rest, **kw)

    with _LOCK:
        CutlassBaseDSL.compile_and_cache = through_store
        try:
            fn = cute.compile(kernel, *args, options=COMPILE_OPTIONS)
        except _Hit as hit:
            fn, seen["hit"] = None, hit
        finally:
            CutlassBaseDSL.compile_and_cache = original
    if fn is None:
        hit = seen["hit"]
        try:
            name, body = _read_entry(hit.path)
            if name != hit.name:
                raise ValueError(f"entry names {name!r}, the traced module {hit.name!r}")
            loaded = _load(name, body)
            STATS["hits"] += 1
            return loaded
        except ForeignEntry as e:
            _warn_once("entries from another CPU", e)
            fn = cute.compile(kernel, *args, options=COMPILE_OPTIONS)
        except Exception as e:  # noqa: BLE001  (any unusable entry: compile as if absent, then overwrite it)
            _warn_once(f"entry {os.path.basename(hit.path)} unusable", e)
            fn = cute.compile(kernel, *args, options=COMPILE_OPTIONS)
    STATS["compiled"] += 1
    if "path" in seen:
        try:
            os.makedirs(directory, exist_ok=True)
            _write_entry(seen["path"], seen["name"], _object_code(fn))
            _note(directory, variant)
            STATS["stored"] += 1
        except Exception as e:  # noqa: BLE001
            _warn_once(f"cannot write to {directory}", e)
    return fn
