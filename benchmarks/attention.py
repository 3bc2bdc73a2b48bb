"""Attention speed and memory: full SDPA vs the dense-bias and sparse paths of each pattern.

    python -m benchmarks.attention --sizes 81,256,1024,4096 --repeats 5 --json results/attention_benchmark/cpu.json

Setup: batch 8, 8 heads, head dim 32, float32; N tokens = an HxW patch grid (a perfect square
N gives a square grid, ``HxW`` gives any grid), plus one CLS token with ``--cls`` (default: no
CLS, so N is exactly the grid size). Every pattern implementation goes through
``policies.vision.attention.attend`` (the code path the ViT uses).

Implementations (``--impls``, comma separated, default all):

* ``full``                      SDPA without a mask.
* ``fibottention-dense``        modified Fibottention (the policy default, w_max = P // 3): dense
                                (heads, N, N) bias + SDPA. ``-sparse``: ``impl="sparse"``,
                                ``-auto``: ``impl="auto"``. ``fibottention-std-*``: standard variant.
* ``lookhere-dense``            LookHere-90 dense bias + SDPA; ``lookhere-efficient`` the sparse
                                path; ``lookhere-auto``; ``lookhere45-*``: the 45-degree variant.

Timing: each implementation is warmed up once (this also builds the cached dense bias or sparse
plan, as in training), then the implementations are run round-robin ``--repeats`` times so that
load from other processes hits all of them alike. One sample is the mean over enough inner
iterations to last >= ``--min-time`` seconds. Reported: median over samples of wall-clock time
(``fwd_ms``, ``fwdbwd_ms``) and of process CPU time (``fwd_cpu_ms``, ``fwdbwd_cpu_ms``; equal to
the wall time on an idle machine with one thread, and much less sensitive to other jobs).
Forward is timed under ``torch.no_grad()``; forward+backward computes the gradients of q, k, v
for a fixed random output gradient.

Memory (``peak_mb``): one forward+backward in a fresh subprocess (so caches such as the dense
bias are built inside the measurement, as they are resident during training), q/k/v and the
output gradient allocated before. On CPU the peak of the running sum of all tensor
allocations/frees reported by ``torch.profiler`` (profile_memory=True; exact allocator
accounting, unlike RSS); on CUDA ``torch.cuda.max_memory_allocated``. It includes the output
and the three input gradients (4 x B*heads*N*d floats, the same for every implementation);
``workspace_mb`` is the peak minus those four tensors, i.e. what the method itself needs.

Bound (``visible``): the fraction of (query, key) pairs the pattern lets through, over all heads.
An exact method that computes only those pairs, each at full attention's cost per pair, is at
most ``1 / visible`` times faster than full attention: the table's last column. For LookHere
this is what caps the speed-up: its undirected heads (a third of them) see every key.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import torch

from policies.vision.attention import AttentionConfig, attend
from policies.vision.sparse import AttentionCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
IMPLS = (
    "full",
    "fibottention-dense",
    "fibottention-sparse",
    "fibottention-auto",
    "fibottention-std-dense",
    "fibottention-std-sparse",
    "lookhere-dense",
    "lookhere-efficient",
    "lookhere-auto",
    "lookhere45-dense",
    "lookhere45-efficient",
)


def make_case(impl: str, heads: int):
    """(pattern, attend impl) of a benchmark implementation name."""
    family, _, how = impl.rpartition("-")
    if impl == "full":
        return AttentionConfig(kind="full").pattern(heads, 0, 1), "dense"
    settings = {  # every other setting: AttentionConfig's default
        "fibottention": dict(kind="fibottention", modified=True),
        "fibottention-std": dict(kind="fibottention", modified=False),
        "lookhere": dict(kind="lookhere", variant="90"),
        "lookhere45": dict(kind="lookhere", variant="45"),
    }
    hows = {"dense": "dense", "sparse": "sparse", "efficient": "sparse", "auto": "auto"}
    if family not in settings or how not in hows:
        raise ValueError(f"unknown implementation {impl!r}; known: {', '.join(IMPLS)}")
    return AttentionConfig(**settings[family]).pattern(heads, 0, 1), hows[how]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_size(text: str) -> tuple[int, int]:
    if "x" in text.lower():
        h, w = (int(t) for t in text.lower().split("x"))
        return h, w
    n = int(text)
    side = math.isqrt(n)
    if side * side != n:
        raise argparse.ArgumentTypeError(f"size {n} is not a perfect square; give the grid as HxW")
    return side, side


def make_inputs(args, grid, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1] + (1 if args.cls else 0)
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v, g = (torch.randn(shape, generator=gen).to(device=device, dtype=DTYPES[args.dtype]) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, g


def runner(impl, args, grid, tensors):
    pattern, how = make_case(impl, args.heads)
    q, k, v, g = tensors
    n_pre = 1 if args.cls else 0
    cache = AttentionCache()  # what an Attention module keeps: the bias / sparse plan, built once

    def fwd():
        with torch.no_grad():
            return attend(q, k, v, pattern, grid, n_pre, how, cache=cache)

    def fwdbwd():
        out = attend(q, k, v, pattern, grid, n_pre, how, cache=cache)
        return torch.autograd.grad(out, (q, k, v), g)

    return fwd, fwdbwd


def visible_fraction(impl: str, heads: int, grid: tuple[int, int], cls: bool) -> float:
    """Share of (query, key) pairs over all heads that the pattern of ``impl`` does not mask."""
    pattern, _ = make_case(impl, heads)
    bias = pattern.dense_bias(grid, 1 if cls else 0)  # (heads, N, N), or None for full attention
    return 1.0 if bias is None else torch.isfinite(bias).double().mean().item()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample(fn, iters, device):
    _sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - w0) / iters * 1e3, (time.process_time() - c0) / iters * 1e3


def time_size(args, grid, device, impls):
    tensors = make_inputs(args, grid, device)
    fns = {impl: runner(impl, args, grid, tensors) for impl in impls}
    iters, failed = {}, {}
    for impl, (fwd, fwdbwd) in fns.items():  # warm-up: caches, allocator, inner-loop sizing
        try:
            for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                fn()
                wall, _ = sample(fn, 1, device)
                iters[impl, name] = max(1, min(1000, math.ceil(args.min_time * 1e3 / max(wall, 1e-3))))
        except (RuntimeError, ValueError, NotImplementedError) as err:  # e.g. a kernel without this dtype or device
            failed[impl] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            print(f"{impl} N={tensors[0].shape[2]}: skipped, {failed[impl]}", flush=True)
    fns = {impl: fn for impl, fn in fns.items() if impl not in failed}
    samples = {key: [] for key in iters}
    for _ in range(args.repeats):
        for impl, (fwd, fwdbwd) in fns.items():
            for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                samples[impl, name].append(sample(fn, iters[impl, name], device))
    rows = [{"impl": impl, "N": tensors[0].shape[2], "grid": f"{grid[0]}x{grid[1]}", "error": failed[impl]} for impl in failed]
    for impl in fns:
        row = {"impl": impl, "N": tensors[0].shape[2], "grid": f"{grid[0]}x{grid[1]}"}
        for name in ("fwd", "fwdbwd"):
            s = samples[impl, name]
            row[f"{name}_ms"] = statistics.median(w for w, _ in s)
            row[f"{name}_cpu_ms"] = statistics.median(c for _, c in s)
            row[f"{name}_iters"] = iters[impl, name]
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------
# memory: one forward+backward in a fresh process
# ------------------------------------------------------------------------------------------


def measure_memory(args, grid, device, impl) -> dict:
    """Peak MB allocated during the first and during a second forward+backward (this process;
    call via subprocess), and the MB still held between them (caches: dense bias, sparse plan)."""
    tensors = make_inputs(args, grid, device)
    _, fwdbwd = runner(impl, args, grid, tensors)
    mb = 2.0**20
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        grads = fwdbwd()
        del grads
        torch.cuda.synchronize(device)
        first = torch.cuda.max_memory_allocated(device) - base
        resident = torch.cuda.memory_allocated(device) - base
        torch.cuda.reset_peak_memory_stats(device)
        grads = fwdbwd()
        del grads
        torch.cuda.synchronize(device)
        steady = torch.cuda.max_memory_allocated(device) - base
        return {"peak_mb": first / mb, "steady_peak_mb": steady / mb, "resident_mb": resident / mb}
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        grads = fwdbwd()
        del grads
        with torch.profiler.record_function("__second_call__"):
            grads = fwdbwd()
            del grads
    events = list(prof.profiler.kineto_results.events())
    marker = min(e.start_ns() for e in events if e.name() == "__second_call__")
    memory = [e for e in events if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    running = first = steady = 0
    resident = None
    for e in sorted(memory, key=lambda e: e.start_ns()):
        if e.start_ns() >= marker and resident is None:
            resident = running
        running += e.nbytes()
        if resident is None:
            first = max(first, running)
        else:
            steady = max(steady, running)
    resident = running if resident is None else resident
    return {"peak_mb": first / mb, "steady_peak_mb": steady / mb, "resident_mb": resident / mb}


def memory_in_subprocess(args, grid, device, impl) -> dict | None:
    cmd = [
        sys.executable, "-m", "benchmarks.attention", "--_memory-child", impl,
        "--sizes", f"{grid[0]}x{grid[1]}", "--device", str(device), "--threads", str(args.threads),
        "--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--dtype", args.dtype,
    ] + (["--cls"] if args.cls else [])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY "):
            return json.loads(line[len("MEMORY "):])
    print(f"memory measurement failed for {impl} {grid}: {proc.stderr[-2000:]}", file=sys.stderr)
    return None


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------


def ratio_table(rows) -> str:
    """Markdown table with time ratios to full attention and memory ratios to the dense path."""
    by = {(r["impl"], r["N"]): r for r in rows}
    dense_of = {
        "fibottention-sparse": "fibottention-dense",
        "fibottention-auto": "fibottention-dense",
        "fibottention-std-sparse": "fibottention-std-dense",
        "lookhere-efficient": "lookhere-dense",
        "lookhere-auto": "lookhere-dense",
        "lookhere45-efficient": "lookhere45-dense",
    }

    def f(x, fmt="{:.1f}"):
        return "" if x is None else fmt.format(x)

    def ratio(a, b):
        return a / b if a is not None and b else None

    lines = [
        "| impl | N (grid) | fwd ms | fwd+bwd ms | fwd+bwd CPU ms | full/this fwd+bwd (wall, CPU) | this/dense fwd+bwd "
        "| peak MB first / steady | workspace MB first / steady | dense/this peak (first, steady) | dense/this workspace (first, steady) "
        "| pairs visible | bound: 1/visible |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['N']} ({r['grid']}) | skipped: {r['error']} |" + " |" * 10)
            continue
        full = by.get(("full", r["N"]), {})
        dense = by.get((dense_of.get(r["impl"], ""), r["N"]), {})
        sp = (ratio(full.get("fwdbwd_ms"), r["fwdbwd_ms"]), ratio(full.get("fwdbwd_cpu_ms"), r["fwdbwd_cpu_ms"]))
        vs_dense = ratio(r["fwdbwd_ms"], dense.get("fwdbwd_ms"))
        mem = [ratio(dense.get(k), r.get(k)) for k in ("peak_mb", "steady_peak_mb", "workspace_mb", "steady_workspace_mb")]
        speed = "" if sp[0] is None else f"{sp[0]:.2f}x, {sp[1]:.2f}x"
        lines.append(
            f"| {r['impl']} | {r['N']} ({r['grid']}) | {f(r['fwd_ms'], '{:.2f}')} | {f(r['fwdbwd_ms'], '{:.2f}')} "
            f"| {f(r['fwdbwd_cpu_ms'], '{:.2f}')} | {speed} | {f(vs_dense, '{:.2f}x')} "
            f"| {f(r.get('peak_mb'))} / {f(r.get('steady_peak_mb'))} | {f(r.get('workspace_mb'))} / {f(r.get('steady_workspace_mb'))} "
            f"| {'' if mem[0] is None else f'{mem[0]:.1f}x, {mem[1]:.1f}x'} | {'' if mem[2] is None else f'{mem[2]:.1f}x, {mem[3]:.1f}x'} "
            f"| {f(r.get('visible'), '{:.3f}')} | {f(ratio(1.0, r.get('visible')), '{:.2f}x')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="81,256,1024,4096", help="token counts (perfect squares) or HxW grids, comma separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per implementation (median reported)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per sample (inner iterations)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--cls", action="store_true", help="add one CLS token (N = grid + 1)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="of q, k, v (and so of the bias)")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--json", help="write results to this JSON file")
    parser.add_argument("--markdown", help="write the results table (with ratios) to this markdown file")
    parser.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    grids = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.memory_child:
        print("MEMORY " + json.dumps(measure_memory(args, grids[0], device, args.memory_child)))
        return 0
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for impl in impls:
        make_case(impl, args.heads)  # validate names early

    meta = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "batch": args.batch,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "cls": bool(args.cls),
        "repeats": args.repeats,
        "min_time_s": args.min_time,
        "timing": "median over round-robin samples; fwd under no_grad; fwd+bwd = grads of q, k, v",
        "memory": "peak of torch allocations during one fwd+bwd in a fresh process (profiler on CPU, "
        "max_memory_allocated on CUDA), includes output + input grads and the dense bias / sparse plan caches",
        "fibottention": "modified (policy default) unless '-std-', w_min=5, w_max=P//3, layer 0",
        "lookhere": "LH-90 (lookhere-*) / LH-45 (lookhere45-*), layer 0 of depth 1",
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    print(f"# {meta['device_name']}, {meta['threads']} thread(s), torch {meta['torch']}, B={args.batch} heads={args.heads} d={args.head_dim}, CLS={args.cls}", flush=True)
    results = []
    for grid in grids:
        t0 = time.time()
        rows = time_size(args, grid, device, impls)
        visible = {}  # pattern -> share of visible pairs (one N x N bias built per pattern)
        mandatory_mb = 4 * args.batch * args.heads * rows[0]["N"] * args.head_dim * DTYPES[args.dtype].itemsize / 2**20
        for row in rows:
            pattern = make_case(row["impl"], args.heads)[0]  # the dense/sparse/auto rows of one pattern share it
            if pattern not in visible:
                visible[pattern] = visible_fraction(row["impl"], args.heads, grid, args.cls)
            row["visible"] = visible[pattern]
            if "error" in row:
                results.append(row)
                continue
            if not args.no_memory:
                row.update(memory_in_subprocess(args, grid, device, row["impl"]) or {})
                if "peak_mb" in row:
                    row["workspace_mb"] = row["peak_mb"] - mandatory_mb
                    row["steady_workspace_mb"] = row["steady_peak_mb"] - mandatory_mb
            results.append(row)
            print(
                f"{row['impl']:<26} N={row['N']:<5} fwd {row['fwd_ms']:9.2f} ms  fwd+bwd {row['fwdbwd_ms']:9.2f} ms"
                f"  (cpu {row['fwd_cpu_ms']:9.2f} / {row['fwdbwd_cpu_ms']:9.2f})"
                f"  peak {row.get('peak_mb') or float('nan'):8.1f} MB (steady {row.get('steady_peak_mb') or float('nan'):.1f})",
                flush=True,
            )
        print(f"# grid {grid[0]}x{grid[1]} done in {time.time() - t0:.0f} s", flush=True)
    meta["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    table = ratio_table(results)
    print(table)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump({"metadata": meta, "results": results}, fh, indent=1)
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
