"""The JIT build of FlashInfer's SM90 CUTLASS fused-MoE module for `moe_flashinfer.py`: `build`
(its build step: the module, then the autotuner's helper), `build_jit` (the trimmed module of
`flashinfer_fp8_jit.py`, or FlashInfer's stock one; or a prebuilt .so put in FlashInfer's AOT
folder), `build_resumable` (the build itself: the commands of its build.ninja, run here rather than
by ninja, MAX_JOBS jobs, cut short at a deadline and resumed from the objects left),
`build_tuner_helper` (the autotuner's `trtllm_utils` module), and `log`, which both files use.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# The costliest translation units first (their nvcc time, not their count, bounds the build).
_HEAVY = (
    "flashinfer_cutlass_fused_moe_binding",
    "cutlass_fused_moe_instantiation",
    "moe_gemm_kernels_",
    "fp8_kernels_",
    "fp8_blockscale",
    "stub_",
)


def _cost_rank(cmd: str) -> int:
    return next((i for i, k in enumerate(_HEAVY) if k in cmd), len(_HEAVY))


def build_resumable(spec, log_path: Path, deadline: float | None) -> bool:
    """Build `spec`'s .so from the commands of its build.ninja (`ninja -t commands`), run here
    rather than by ninja so that a build cut short resumes from the objects it left, whatever
    their timestamps: each object is compiled to a temporary name and renamed when complete, and
    an object already there is not compiled again. MAX_JOBS parallel jobs; at `deadline`
    (time.monotonic()) the running jobs are killed. True when the .so is linked."""
    spec.write_ninja()
    cmds = subprocess.run(
        ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-t", "commands"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    *compiles, link = [c for c in cmds if c.strip()]
    todo = sorted(
        (c for c in compiles if not Path(re.search(r" -o (\S+)", c)[1]).exists()), key=_cost_rank
    )
    total, jobs = len(compiles), int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
    log(f"  {total - len(todo)} of {total} objects already there, {len(todo)} to compile, "
        f"{jobs} jobs")  # fmt: skip
    t0, done, failed, running = time.monotonic(), total - len(todo), [], {}
    with open(log_path, "a") as log_file:
        while todo or running:
            while (
                todo and len(running) < jobs and (deadline is None or time.monotonic() < deadline)
            ):
                cmd = todo.pop(0)
                obj = re.search(r" -o (\S+)", cmd)[1]
                with open(f"{obj}.out", "w") as out:  # a file, not a pipe: nvcc can say a lot
                    proc = subprocess.Popen(cmd.replace(f" -o {obj}", f" -o {obj}.part"),
                                            shell=True, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
                running[proc] = obj
            if deadline is not None and time.monotonic() >= deadline:
                for proc in running:
                    os.killpg(proc.pid, signal.SIGKILL)
                log(f"  deadline: stopped with {done} of {total} objects, {len(running)} killed")
                return False
            time.sleep(0.5)
            for proc, obj in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[proc]
                out = Path(f"{obj}.out").read_text(errors="replace")
                log_file.write(f"=== {obj} rc {proc.returncode}\n{out}")
                if proc.returncode:
                    failed.append(obj)
                    print("\n".join(out.splitlines()[:30]), flush=True)
                    todo.clear()  # let the others finish, start no more
                    continue
                os.replace(f"{obj}.part", obj)
                done += 1
                log(f"  [{done}/{total}] {time.monotonic() - t0:6.0f} s  {Path(obj).name}")
    if failed:
        raise RuntimeError(f"nvcc failed on {failed}; see {log_path}")
    so = re.search(r" -o (\S+)", link)[1]
    subprocess.run(link.replace(f" -o {so}", f" -o {so}.part"), shell=True, check=True)
    os.replace(f"{so}.part", so)
    return True


def build_jit(mode: str, prebuilt: str | None, build_log: str, deadline: float | None) -> dict:
    """Build (or load from the cache, or from FlashInfer's AOT folder) its SM90 CUTLASS MoE
    module: mode "trimmed" (flashinfer_fp8_jit: the FP8 kernels only) or "stock" (FlashInfer's
    own, every kernel: about an hour on 16 cores). `prebuilt`: a trimmed module's .so built
    earlier, copied into the AOT folder (flashinfer/data/aot/NAME/NAME.so), where FlashInfer
    loads it from without nvcc. Returns what the JSON records about it."""
    import shutil

    from flashinfer.fused_moe.core import get_cutlass_fused_moe_module
    from flashinfer.jit import env as jit_env

    from benchmarks.kernels import flashinfer_fp8_jit as trim

    t0 = time.perf_counter()
    if mode == "trimmed":
        spec, kernels = trim.spec()
        trim.install(spec)
    else:
        from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module

        spec, kernels = gen_cutlass_fused_moe_sm90_module(), None
    if prebuilt:
        aot = jit_env.FLASHINFER_AOT_DIR / spec.name / f"{spec.name}.so"
        aot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(prebuilt, aot)
    info = {"module": spec.name, "mode": mode, "kernels": kernels, "sources": len(spec.sources)}
    if spec.is_aot:
        info["so"] = str(spec.get_library_path())
        log(f"JIT {spec.name}: prebuilt, {info['so']}")
    else:
        info["so"] = str(spec.jit_library_path)
        log(
            f"JIT {spec.name}: start ({len(spec.sources)} sources, cache {jit_env.FLASHINFER_JIT_DIR}, "
            f"MAX_JOBS={os.environ.get('MAX_JOBS', 'ninja default')}; full log {build_log})"
        )
        if not build_resumable(spec, Path(build_log), deadline):
            info["build_s"] = round(time.perf_counter() - t0, 1)
            return info | {"complete": False}
        info["build_s"] = round(time.perf_counter() - t0, 1)
        log(
            f"JIT {spec.name}: built in {info['build_s']:.1f} s, "
            f"{spec.jit_library_path.stat().st_size / 2**20:.1f} MiB"
        )
        # FlashInfer loads a module from its AOT folder as is (its ninja would rebuild objects
        # it has no log of, as after a resumed build)
        aot = jit_env.FLASHINFER_AOT_DIR / spec.name / f"{spec.name}.so"
        aot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.jit_library_path, aot)
    info["prebuilt"] = bool(prebuilt) or "build_s" not in info
    get_cutlass_fused_moe_module("90")  # loads the module from the AOT folder
    info["build_and_load_s"] = round(time.perf_counter() - t0, 1)
    log(f"FlashInfer {spec.name} loaded after {info['build_and_load_s']:.1f} s")
    return info | {"complete": True}


def build_tuner_helper() -> float:
    """The autotuner's delay-kernel module (`trtllm_utils`, a few small sources): JIT-built on its
    first profiling without CUPTI; built here so that its time shows. Seconds taken."""
    from flashinfer.tllm_utils import get_trtllm_utils_module

    t0 = time.perf_counter()
    log("JIT trtllm_utils (the autotuner's delay kernel): start")
    get_trtllm_utils_module()
    log(f"JIT trtllm_utils: done in {time.perf_counter() - t0:.1f} s")
    return round(time.perf_counter() - t0, 1)


def build(args, t_start: float) -> dict:
    """`moe_flashinfer.py`'s build step: the MoE module (`build_jit`; exit 3 when cut short by
    `--build-deadline`, seconds from `t_start`) and, unless `--no-autotune`, the tuner's helper
    (when that fails, `args.no_autotune` is set). Returns what the JSON records about them."""
    deadline = None if args.build_deadline is None else t_start + args.build_deadline
    jit = build_jit(args.jit, args.prebuilt, args.build_log, deadline)
    if not jit["complete"]:
        log("build incomplete: run again with the objects in the JIT cache to resume")
        sys.exit(3)
    if not args.no_autotune:
        try:
            jit["trtllm_utils_s"] = build_tuner_helper()
        except Exception as e:  # noqa: BLE001 (no delay kernel: time without the tuner)
            log(f"trtllm_utils failed ({type(e).__name__}: {str(e)[:200]}); no autotune")
            args.no_autotune, jit["trtllm_utils"] = True, f"{type(e).__name__}: {str(e)[:200]}"
    return jit
