"""Profile the forward, the backward or the step of one training iteration under a bench strategy (plain, no offload,
ZeRO-3 offload, DOS).

Builds exactly what a ``lightning-dos bench`` worker builds (``recipes/gpt-2.7b.yaml`` with the flags set over it,
the strategy's fragment of ``configs/strategy/``, through the LightningCLI of ``lightning-dos fit``:
``lightning_dos.bench.compose``), trains ``--steps`` iterations, times one window of every iteration and runs
``torch.profiler`` over the *last* iteration's window only. ``--phase`` picks the window, the same spans as the
bench's ``fwd_ms``, ``bwd_ms`` and ``step_ms``:

* ``forward``: from ``on_train_batch_start`` to ``on_before_backward``, i.e. the engine's forward and the loss
  (with Lightning's ``zero_grad``, which runs between the two);
* ``backward`` (the default): from ``on_before_backward`` to ``on_after_backward``, i.e. ``engine.backward`` with
  its gradient hooks, reduce-scatter, gradient partitioning and epilogue;
* ``step``: from ``on_before_optimizer_step`` to ``on_train_batch_end``, the bench's ``step_ms`` (DOS's dispatch, the
  clipping, the update phase, the parameter upload, the scheduler). CPU Adam's worker threads show in the trace;
  the tables are the training thread's view.

On a GPU the device is synchronised at both ends (outside the timed window at the start, inside it at the end), so
the window holds every kernel the phase queued and its wall time is comparable to the bench's figure. ``--strategy
plain`` (no ZeRO, everything on the device) is the floor the others are measured against.

Written to ``--out``:

* ``summary.json``: the phase and its wall time in every iteration (the profiled one separately, the profiler
  costs a little), every synchronising CUDA runtime call (count and total host time, with the operators that
  issued it), kernel launches, device kernels / copies by kind, busy time per stream and device idle time in the
  window, the number of calls of the operators that matter for per-parameter gradient work and the ZeRO-3
  optimizer's settings as it runs them (None under ``plain``, which has no ZeRO-3 optimizer);
* ``ops_by_self_cpu.txt`` and, on a GPU, ``ops_by_self_device.txt``: ``key_averages`` tables, top rows;
* ``trace.json.gz``: the Chrome trace of the window (open it in Perfetto or chrome://tracing).

A short summary table goes to stdout. On a CPU-only machine it runs too (DeepSpeed's CPU accelerator): the
CUDA figures are then zero and the operator counts still show the per-parameter work.

GPU host examples::

    python scripts/profile_phase.py --model gpt-2.7b --strategy dos --plan device --out runs/profile/dos-device
    python scripts/profile_phase.py --model gpt-2.7b --strategy plain --phase forward --out runs/profile/plain-fwd
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

#: ``--strategy`` choices and the bench strategy kind each one runs.
STRATEGY_KINDS = {"plain": "plain", "no_offload": "no_offload", "zero3_offload": "zero3_offload",
                  "dos": "deep_optimizer_states"}
#: ``--phase`` choices: the Lightning hooks that open and close each window.
PHASE_WINDOWS = {"forward": ("on_train_batch_start", "on_before_backward"),
                 "backward": ("on_before_backward", "on_after_backward"),
                 "step": ("on_before_optimizer_step", "on_train_batch_end")}
#: CUDA runtime calls after which the host has waited for the device (``cudaStreamWaitEvent`` only orders
#: streams, it is counted because every cross-stream dependency of ZeRO-3 goes through it).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaStreamWaitEvent")
#: Runtime calls that launch one kernel each.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel")
#: Other runtime calls worth counting: asynchronous copies and allocator traffic (``cudaFree`` synchronises).
OTHER_CALLS = ("cudaMemcpyAsync", "cudaMemsetAsync", "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaEventRecord",
               "cudaEventQuery")
#: Operators whose call counts show per-parameter gradient work (norms, dtype conversions, copies, host reads).
OPS_OF_INTEREST = ("aten::linalg_vector_norm", "aten::norm", "aten::_foreach_norm", "aten::pow", "aten::_to_copy",
                   "aten::copy_", "aten::_foreach_copy_", "aten::cat", "aten::div_", "aten::empty",
                   "aten::record_stream", "aten::item", "aten::_local_scalar_dense")
#: Idle gaps on a stream at least this long are listed (milliseconds).
GAP_MS = 0.5


# ---------------------------------------------------------------------------------------------- command line
#: The defaults of the flags: recipes/gpt-2.7b.yaml's (a GPU host), subgroups of 1e8 parameters.
DEFAULTS = {"model": "gpt-2.7b", "seq_len": 2048, "micro_batch": 4, "precision": "bf16-mixed", "accelerator": "auto",
            "sub_group_size": 100_000_000, "seed": 1234}


def build_parser() -> argparse.ArgumentParser:
    """Flags; model, batch and precision default to the bench's (a GPU host running gpt-2.7b)."""
    from types import SimpleNamespace

    from lightning_dos.models.gpt import PRESETS

    defaults = SimpleNamespace(**DEFAULTS)
    p = argparse.ArgumentParser(
        description="Profile the last iteration's forward, backward or step under one bench strategy.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=defaults.model, choices=sorted(PRESETS), help="model preset")
    p.add_argument("--strategy", default="dos", choices=sorted(STRATEGY_KINDS),
                   help="plain (no ZeRO, everything on the device: the floor), no_offload (ZeRO-3), zero3_offload "
                   "(vanilla optimizer offload) or dos")
    p.add_argument("--phase", nargs="+", default=["backward"], choices=sorted(PHASE_WINDOWS),
                   help="the window(s) timed every iteration and profiled in the last one (several: one profile each, "
                   "in folders named after them): forward "
                   "(on_train_batch_start -> on_before_backward: forward and loss), backward "
                   "(on_before_backward -> on_after_backward) or step (on_before_optimizer_step -> "
                   "on_train_batch_end: the update phase)")
    p.add_argument("--plan", default="auto", help="DOS plan (auto, host, device, a fraction, stride:K, lanes "
                   "joined by commas); used by dos only, ignored by the other strategies")
    p.add_argument("--seq-len", type=int, default=defaults.seq_len, help="tokens per sequence")
    p.add_argument("--micro-batch", type=int, default=defaults.micro_batch, help="sequences per iteration")
    p.add_argument("--precision", default=defaults.precision, help="Lightning precision, e.g. bf16-mixed, 32-true")
    p.add_argument("--steps", type=int, default=4, help="iterations to train; the last one's phase is profiled")
    p.add_argument("--accelerator", default=defaults.accelerator, help="auto, gpu/cuda or cpu")
    p.add_argument("--sub-group-size", type=float, default=defaults.sub_group_size,
                   help="parameters per optimizer-state subgroup")
    p.add_argument("--n-layer", type=int, default=None, help="override the preset's transformer blocks")
    p.add_argument("--n-embd", type=int, default=None, help="override the preset's hidden size")
    p.add_argument("--n-head", type=int, default=None, help="override the preset's query heads")
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary")
    p.add_argument("--no-activation-checkpointing", action="store_true", help="keep block activations")
    p.add_argument("--seed", type=int, default=defaults.seed, help="model and data seed")
    p.add_argument("--zero", action="append", default=[], metavar="KEY=VALUE",
                   help="set zero_optimization.KEY in the strategy's DeepSpeed config (JSON value), e.g. "
                   "reduce_bucket_size=5e8 or reduce_scatter=false; repeatable, applied to any strategy but "
                   "plain (which has no DeepSpeed config)")
    p.add_argument("--max-reduce-events", type=int, default=None, metavar="N",
                   help="reduce buckets ZeRO-3 may queue before backward waits for the oldest "
                   "(max_param_reduce_events, DeepSpeed's default 2); not with plain (no ZeRO-3 optimizer)")
    p.add_argument("--devices", type=int, default=1, metavar="N",
                   help="data-parallel ranks (one process per device, as Lightning starts them); above 1 each rank "
                   "writes its own profile under rank<R>/")
    p.add_argument("--dos", action="append", default=[], metavar="KEY=VALUE",
                   help="an argument of DeepOptimizerStatesStrategy (JSON value), e.g. leaf_blocks=true, "
                   "resident_gib=8 or overlap=true; repeatable, dos only")
    p.add_argument("--with-stack", action="store_true", help="record Python stacks (bigger trace; names the "
                   "source line behind each synchronising call)")
    p.add_argument("--rows", type=int, default=40, help="rows of each operator table")
    p.add_argument("--out", required=True, help="output directory")
    return p


def bench_run(args: argparse.Namespace) -> Any:
    """The bench's run for the flags: the default recipe with the flags set over it, the strategy's fragment (DOS:
    serial, no resident subgroups, ``--dos`` on top)."""
    from lightning_dos.bench.rows import Row, make_run
    from lightning_dos.bench.settings import STRATEGY_ARG
    from lightning_dos.bench.sweep.config import plan_argument
    from lightning_dos.models.gpt import PRESETS, GPTConfig

    kind = STRATEGY_KINDS[args.strategy]
    dos = kind == "deep_optimizer_states"
    sub_group_size = float(args.sub_group_size)
    if sub_group_size != int(sub_group_size):
        raise SystemExit(f"--sub-group-size: {args.sub_group_size} is not a whole number of parameters")
    vocab = args.vocab_size or PRESETS.get(args.model, {}).get("vocab_size", GPTConfig.vocab_size)
    sets = {"model.name": args.model, "data.vocab_size": vocab, "data.seq_len": args.seq_len,
            "data.batch_size": args.micro_batch, "trainer.precision": args.precision,
            "trainer.accelerator": args.accelerator, "seed_everything": args.seed,
            "model.activation_checkpointing": not args.no_activation_checkpointing,
            **{f"model.{key}": getattr(args, key) for key in ("n_layer", "n_embd", "n_head")
               if getattr(args, key) is not None}}
    extra = zero_overrides(args.dos, flag="--dos") if dos else {}
    dos_args = {"plan": plan_argument(args.plan), "overlap": False, "resident_gib": 0.0, **extra} if dos else {}
    fragment = {"deep_optimizer_states": "dos_auto"}.get(kind, kind)
    row = Row(f"dos({args.plan})" if dos else kind, fragment, kind,
              {STRATEGY_ARG + key: value for key, value in dos_args.items()})
    run = make_run(row, [(STRATEGY_ARG + "sub_group_size", int(sub_group_size))], devices=args.devices, sets=sets,
                   steps=args.steps, warmup=max(0, min(3, args.steps - 1)))
    run.plan = args.plan if dos else run.plan  # as given
    return run


def zero_overrides(pairs: list[str], flag: str = "--zero") -> dict[str, Any]:
    """``KEY=VALUE`` flags as a dict; values parsed as JSON (``5e8``, ``false``), whole floats made ints."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag}: {pair!r} is not KEY=VALUE, e.g. reduce_bucket_size=5e8")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------- the profiler hook
def is_zero3(optimizer: Any) -> bool:
    """Whether ``optimizer`` is DeepSpeed's ZeRO-3 optimizer (or a subclass: DOS's): it has the reduce-event knob."""
    return optimizer is not None and hasattr(optimizer, "max_param_reduce_events")


def _phase_profiler_class() -> type:
    """The Lightning callback class (built lazily so ``--help`` does not import torch)."""
    import lightning.pytorch as pl
    import torch

    class PhaseProfiler(pl.Callback):
        """Times one phase's window (:data:`PHASE_WINDOWS`) of every iteration and runs ``torch.profiler`` over the
        ``profile_at``-th one (1-based)."""

        def __init__(self, phase: str, profile_at: int, with_stack: bool,
                     max_reduce_events: int | None = None) -> None:
            if phase not in PHASE_WINDOWS:
                raise ValueError(f"phase: {phase!r} is not one of {', '.join(PHASE_WINDOWS)}")
            self.phase = phase
            self.profile_at = profile_at
            self.with_stack = with_stack
            self.max_reduce_events = max_reduce_events
            self.calls = 0
            self.phase_ms: list[float] = []
            self.profiled_ms: float | None = None
            self.prof: Any = None
            self._started: float | None = None
            self._device: torch.device | None = None

        def _sync(self) -> None:
            if self._device is not None and self._device.type == "cuda":
                torch.cuda.synchronize(self._device)

        def _open(self) -> None:
            """The window's start: the device synchronised first (outside it), the profiler started if it is the
            one to profile."""
            self.calls += 1
            self._sync()
            if self.calls == self.profile_at:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if self._device is not None and self._device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.prof = torch.profiler.profile(activities=activities, with_stack=self.with_stack)
                self.prof.start()
            self._started = time.perf_counter()

        def _close(self) -> None:
            """The window's end: the device synchronised inside it (the phase is over when its kernels are)."""
            if self._started is None:
                return  # the closing hook without its opening one (cannot happen in one Lightning iteration)
            self._sync()
            elapsed_ms = (time.perf_counter() - self._started) * 1e3
            self._started = None
            if self.prof is not None and self.profiled_ms is None:
                self.prof.stop()
                self.profiled_ms = elapsed_ms
            else:
                self.phase_ms.append(elapsed_ms)

        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._device = trainer.strategy.root_device
            if self.max_reduce_events is not None:  # the engine exists now; its ZeRO-3 optimizer reads it per bucket
                optimizer = getattr(trainer.strategy.model, "optimizer", None)
                if not is_zero3(optimizer):
                    raise RuntimeError("--max-reduce-events: the engine's optimizer is not DeepSpeed's ZeRO-3 one")
                optimizer.max_param_reduce_events = self.max_reduce_events

        def _at(self, hook: str) -> None:
            """Lightning reached ``hook``: it opens or closes the phase's window (:data:`PHASE_WINDOWS`), or neither."""
            opening, closing = PHASE_WINDOWS[self.phase]
            if hook == closing:
                self._close()
            if hook == opening:
                self._open()

        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                 batch_idx: int) -> None:
            self._at("on_train_batch_start")

        def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
            self._at("on_before_backward")

        def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._at("on_after_backward")

        def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
            self._at("on_before_optimizer_step")

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            self._at("on_train_batch_end")

    return PhaseProfiler


# ---------------------------------------------------------------------------------------------- analysis
def runtime_name(name: str) -> str:
    """A CUDA runtime call's name without CUPTI's version and per-thread-stream suffixes."""
    return re.sub(r"(_v\d+|_ptsz|_ptds)+$", "", name)


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of ``(start_us, end_us)`` intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e3


def _gaps_ms(intervals: list[tuple[float, float]], minimum_ms: float) -> list[float]:
    """Idle gaps (ms) of at least ``minimum_ms`` between consecutive busy intervals."""
    gaps, end = [], None
    for start, stop in sorted(intervals):
        if end is not None and (start - end) / 1e3 >= minimum_ms:
            gaps.append((start - end) / 1e3)
        end = stop if end is None else max(end, stop)
    return gaps


def _issuer(event: Any) -> str:
    """Who issued a runtime call: its nearest CPU ancestors (operators, or Python frames with ``--with-stack``)."""
    names, frame = [], None
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if len(names) < 3:
            names.append(parent.name)
        if frame is None:
            frame = next((f for f in (getattr(parent, "stack", None) or []) if "site-packages/torch/" not in f), None)
        if len(names) >= 3 and frame is not None:
            break
        parent = getattr(parent, "cpu_parent", None)
    where = " <- ".join(names) if names else "(no operator)"
    return f"{where} @ {frame}" if frame else where


def analyse(events: Any, window_ms: float) -> dict[str, Any]:
    """Synchronising calls, launches, device work per stream and operator counts of one profiled window, which took
    ``window_ms`` of wall time (the device is idle for the rest of it)."""
    from torch.autograd import DeviceType

    sync: dict[str, dict[str, Any]] = {name: {"count": 0, "total_ms": 0.0, "issuers": Counter()} for name in SYNC_CALLS}
    other: dict[str, dict[str, float]] = {name: {"count": 0, "total_ms": 0.0} for name in OTHER_CALLS}
    launches = 0
    ops: Counter[str] = Counter()
    device_kinds: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "total_ms": 0.0})
    streams: dict[int, list[tuple[float, float]]] = defaultdict(list)
    kernels_per_stream: Counter[int] = Counter()
    for event in events:
        start, end = event.time_range.start, event.time_range.end
        if event.device_type == DeviceType.CUDA:
            kind = "memcpy " + event.name.split("(")[-1].rstrip(")") if event.name.startswith("Memcpy") else (
                "memset" if event.name.startswith("Memset") else "kernel")
            device_kinds[kind]["count"] += 1
            device_kinds[kind]["total_ms"] += (end - start) / 1e3
            stream = int(getattr(event, "device_resource_id", 0))
            streams[stream].append((start, end))
            if kind == "kernel":
                kernels_per_stream[stream] += 1
            continue
        name = runtime_name(event.name)
        if name in sync:
            sync[name]["count"] += 1
            sync[name]["total_ms"] += (end - start) / 1e3
            sync[name]["issuers"][_issuer(event)] += 1
        elif name in other:
            other[name]["count"] += 1
            other[name]["total_ms"] += (end - start) / 1e3
        elif name in LAUNCH_CALLS:
            launches += 1
        elif event.name in OPS_OF_INTEREST:
            ops[event.name] += 1
    all_intervals = [iv for ivs in streams.values() for iv in ivs]
    busy_ms = _union_ms(all_intervals)
    per_stream = {
        str(stream): {
            "kernels": kernels_per_stream[stream],
            "busy_ms": _union_ms(ivs),
            "gaps_over_0.5ms": len(_gaps_ms(ivs, GAP_MS)),
            "gap_ms_total": sum(_gaps_ms(ivs, GAP_MS)),
        }
        for stream, ivs in sorted(streams.items(), key=lambda item: -_union_ms(item[1]))
    }
    for entry in sync.values():
        entry["issuers"] = dict(entry["issuers"].most_common(8))
    return {
        "sync_calls": sync,
        "other_runtime_calls": other,
        "kernel_launches": launches,
        "device_work": dict(device_kinds),
        "device_busy_ms": busy_ms,
        "device_idle_ms": max(0.0, window_ms - busy_ms) if all_intervals else None,
        "streams": per_stream,
        "op_counts": {name: ops[name] for name in OPS_OF_INTEREST},
    }


def zero3_settings(optimizer: Any) -> dict[str, Any] | None:
    """The ZeRO-3 optimizer's backward-relevant settings as it runs them (read back, not from the config); None for
    a strategy without one (``plain``)."""
    if not is_zero3(optimizer):
        return None
    names = ("reduce_bucket_size", "max_param_reduce_events", "contiguous_gradients", "reduce_scatter",
             "offload_optimizer", "gradient_accumulation_dtype", "communication_data_type",
             "master_weights_and_grads_dtype")
    settings = {name: getattr(optimizer, name) for name in names if hasattr(optimizer, name)}
    settings["optimizer"] = type(optimizer).__name__
    return {key: value if isinstance(value, (bool, int, float, str)) else str(value) for key, value in settings.items()}


def write_tables(prof: Any, out: Path, rows: int, on_cuda: bool) -> list[str]:
    """``key_averages`` tables sorted by self CPU time and, on a GPU, by self device time; the files written."""
    written = []
    averages = prof.key_averages()
    path = out / "ops_by_self_cpu.txt"
    path.write_text(averages.table(sort_by="self_cpu_time_total", row_limit=rows) + "\n", encoding="utf-8")
    written.append(path.name)
    if on_cuda:
        for key in ("self_device_time_total", "self_cuda_time_total"):  # newer torch / older torch
            try:
                table = averages.table(sort_by=key, row_limit=rows)
            except (AttributeError, KeyError, ValueError):
                continue
            path = out / "ops_by_self_device.txt"
            path.write_text(table + "\n", encoding="utf-8")
            written.append(path.name)
            break
    return written


def write_trace(prof: Any, out: Path) -> str:
    """The Chrome trace, gzipped; returns the file name."""
    raw = out / "trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return "trace.json.gz"


def print_summary(summary: dict[str, Any]) -> None:
    """A short table on stdout."""
    a, phase = summary["analysis"], summary["phase"]
    lines = [
        f"{phase} profile: {summary['label']} on {summary['device']}"
        + (f" (rank {summary['rank']} of {summary['devices']})" if summary.get("devices", 1) > 1 else "")
        + f" ({summary['model']}, "
        f"{summary['param_tensors']} parameter tensors)",
        f"  {phase + ' (profiled)':<34}{summary['phase_ms']:>10.1f} ms",
        f"  {phase + ' (earlier, median)':<34}{_fmt_ms(summary['phase_ms_unprofiled_median'])}",
        f"  {'device busy / idle in window':<34}{_fmt_ms(a['device_busy_ms'])} / {_fmt_ms(a['device_idle_ms'])}",
        f"  {'kernel launches':<34}{a['kernel_launches']:>10d}",
    ]
    for name, entry in a["sync_calls"].items():
        label = "cudaMemcpy (sync)" if name == "cudaMemcpy" else name
        lines.append(f"  {label:<34}{entry['count']:>10d} calls {entry['total_ms']:>9.1f} ms")
    counts = ", ".join(f"{name.split('::')[-1]} {n}" for name, n in a["op_counts"].items() if n)
    lines.append(f"  ops: {counts or '-'}")
    lines.append(f"  written to {summary['out']}: {', '.join(summary['files'])}")
    print("\n".join(lines))


def _fmt_ms(value: float | None) -> str:
    return f"{'-':>10}   " if value is None else f"{value:>10.1f} ms"


# ---------------------------------------------------------------------------------------------- run
def main(argv: list[str] | None = None) -> int:
    """Train, profile the last iteration's phase(s), write the files and print the summaries; 0 on success."""
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps: profile at least one iteration")
    if args.devices < 1:
        raise SystemExit(f"--devices: {args.devices}; set 1 or more")
    if args.strategy == "plain" and args.max_reduce_events is not None:
        raise SystemExit("--max-reduce-events: plain has no ZeRO-3 optimizer; use it with no_offload, zero3_offload "
                         "or dos")
    if args.strategy == "plain" and args.zero:
        raise SystemExit("--zero: plain has no DeepSpeed config; use it with no_offload, zero3_offload or dos")
    if args.strategy != "dos" and args.dos:
        raise SystemExit("--dos: only the dos strategy takes DeepOptimizerStatesStrategy arguments")
    phases = [name for name in PHASE_WINDOWS if name in args.phase]  # one profiler each, in the iteration's order
    spec = bench_run(args)
    dos_kwargs = zero_overrides(args.dos, flag="--dos")
    out = Path(args.out)

    import torch

    from lightning_dos.bench.compose import build, fit_args
    from lightning_dos.bench.settings import DEFAULT_RECIPE

    overrides = zero_overrides(args.zero)
    cls = _phase_profiler_class()
    profilers = [cls(phase=phase, profile_at=spec.steps, with_stack=args.with_stack,
                     max_reduce_events=args.max_reduce_events if k == 0 else None) for k, phase in enumerate(phases)]
    cli = build(fit_args(DEFAULT_RECIPE, spec, out), callbacks=profilers)
    trainer, module = cli.trainer, cli.model
    if overrides:  # never under plain (refused above): it has no DeepSpeed config
        trainer.strategy.config["zero_optimization"].update(overrides)
    trainer.fit(module, datamodule=cli.datamodule)
    rank_out = out / f"rank{trainer.global_rank}" if args.devices > 1 else out
    device = trainer.strategy.root_device
    on_cuda = device.type == "cuda"
    for profiler in profilers:
        if profiler.prof is None or profiler.profiled_ms is None:
            raise SystemExit(f"the {profiler.phase} of iteration {spec.steps} never ran ({profiler.calls} "
                             f"{profiler.phase} windows opened)")
        dest = rank_out / profiler.phase if len(phases) > 1 else rank_out
        dest.mkdir(parents=True, exist_ok=True)
        files = write_tables(profiler.prof, dest, args.rows, on_cuda)
        files.append(write_trace(profiler.prof, dest))
        earlier = sorted(profiler.phase_ms)
        summary = {
            "label": spec.label,
            "strategy": spec.strategy,
            "plan": spec.plan,
            "dos_arguments": dos_kwargs,
            "model": args.model,
            "device": str(torch.cuda.get_device_name(device)) if on_cuda else "cpu",
            "devices": args.devices,
            "rank": trainer.global_rank,
            "torch": torch.__version__,
            "config": spec.to_dict(),
            "zero_overrides": overrides,
            "max_reduce_events": args.max_reduce_events,
            "zero_optimization": (getattr(trainer.strategy, "config", None) or {}).get("zero_optimization"),
            "zero3_in_effect": zero3_settings(getattr(trainer.strategy.model, "optimizer", None)),
            "param_tensors": sum(1 for p in module.parameters() if p.requires_grad),
            "phase": profiler.phase,
            "window": " -> ".join(PHASE_WINDOWS[profiler.phase]),
            "phase_ms": profiler.profiled_ms,
            "phase_ms_unprofiled": profiler.phase_ms,
            "phase_ms_unprofiled_median": earlier[len(earlier) // 2] if earlier else None,
            "analysis": analyse(profiler.prof.events(), profiler.profiled_ms),
            "out": str(dest),
            "files": ["summary.json", *files],
        }
        (dest / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
        print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
