"""Owns ``lightning-dos bench sizes``: the largest GPT each strategy trains on this host, and how fast.

Growing sizes (``n_layer x n_embd``, ``n_head = n_embd / head_dim``) of the recipe's model, each under every row of a
row table (default ``configs/bench/sizes.yaml``), each (size, row) in its own worker. A run that fails (killed by the
kernel for host memory or by another signal, out of device memory, refused with an error, past its time limit) is a row
with its reason, and its strategy is not run at larger sizes; the study stops once every strategy has stopped.
``--resume`` reuses every run that finished, failures included, so the study continues over several invocations.
sizes.json, sizes.md and sizes.png (tokens/s, host and GPU memory against the parameters) after every size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dos.bench.chart import plt, save, workload_title
from lightning_dos.bench.report import Table, count, num
from lightning_dos.bench.results import aggregate
from lightning_dos.bench.rows import load_rows, make_run, table_path
from lightning_dos.bench.runner import FINISHED, Runner
from lightning_dos.bench.settings import slug
from lightning_dos.bench.stats import finite
from lightning_dos.planning.placement import RESIDENT_TIER

#: Sizes tried from ``--from`` upward (2.8B to 65B parameters at the GPT-2 shape of ``recipes/gpt-2.7b.yaml``).
LADDER = ("32x2560", "40x3200", "32x4096", "40x4096", "48x4096", "40x5120", "48x5120", "56x5120", "48x6144",
          "56x6144", "64x6144", "64x7168", "64x8192", "80x8192")
#: Statuses that stop a strategy: it is not run at larger sizes.
FAILED = tuple(status for status in FINISHED if status != "ok")
MEASURED = ("tokens/s: tokens per iteration / the median end-to-end iteration; model TFLOP/s: 6 x parameters "
            "(embeddings included) x tokens/s, attention, recomputation not counted; peak GPU: max_memory_allocated; "
            "host in use: the whole host's MemTotal - MemAvailable (driver-pinned pages included) less before the "
            "run, at its highest while the worker ran (peak: sampled every 0.1 s, start and end included) and at the "
            "end of any iteration (training); process RSS: the worker's peak resident set")


@dataclass(frozen=True)
class Size:
    n_layer: int
    n_embd: int

    @property
    def shape(self) -> str:
        return f"{self.n_layer}x{self.n_embd}"

    def sets(self, head_dim: int) -> dict[str, int]:
        return {"model.n_layer": self.n_layer, "model.n_embd": self.n_embd, "model.n_head": self.n_embd // head_dim}


def parse_size(text: str) -> Size:
    """``"40x3200"`` -> ``Size(40, 3200)``; ``ValueError`` otherwise."""
    layers, sep, embd = str(text).strip().lower().partition("x")
    if not (sep and layers.isdigit() and embd.isdigit() and int(layers) > 0 and int(embd) > 0):
        raise ValueError(f"size {text!r}: give n_layer x n_embd, e.g. 40x3200")
    return Size(int(layers), int(embd))


@dataclass
class SizeSettings:
    sizes: list[str] | None = None  # the sizes, in order; None: the ladder from ``start``
    start: str | None = None  # the first size of the ladder's climb (it need not be on the ladder)
    head_dim: int = 128  # n_head = n_embd / head_dim

    def ladder(self) -> list[Size]:
        if self.sizes:
            return [parse_size(text) for text in self.sizes]
        first = parse_size(self.start or LADDER[0])
        above = [size for size in map(parse_size, LADDER) if size.n_layer * size.n_embd**2
                 > first.n_layer * first.n_embd**2]
        return [first, *above]

    def problems(self) -> list[str]:
        if self.sizes and self.start:
            return ["--sizes and --from: give one (a list of sizes, or the ladder's climb from a size)"]
        try:
            sizes = self.ladder()
        except ValueError as err:
            return [str(err)]
        return [f"size {s.shape}: n_embd {s.n_embd} is not a multiple of --head-dim {self.head_dim}" for s in sizes
                if self.head_dim < 1 or s.n_embd % self.head_dim]

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "start": self.start, "head_dim": self.head_dim}


def entry(size: Size, model: dict[str, Any], result: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """One (size, row) of sizes.json from its raw result and its figures (:func:`aggregate`)."""
    params = model["params"]
    tokens_per_s = figures["e2e_tokens_per_s"] or figures["tokens_per_s"]
    return {"shape": size.shape, "n_layer": size.n_layer, "n_embd": size.n_embd, "n_head": model.get("n_head"),
            "params": params, "label": result["label"].split("/", 1)[1], "strategy": figures["strategy"],
            "strategy_config": figures["strategy_config"], "strategy_args": figures["strategy_args"],
            "status": result["status"], "reason": result.get("reason"),
            "e2e_iteration_ms": figures["e2e_iteration_ms"], "iteration_ms": figures["iteration_ms"],
            "tokens_per_s": tokens_per_s,
            "model_tflops_per_s": 6 * params * tokens_per_s / 1e12 if params and tokens_per_s else None,
            "peak_gpu_gib": figures["peak_gpu_gib"], "host_in_use_gib": result.get("host_in_use_gib"),
            "host_in_use_training_gib": training_host_in_use(result),
            "host_in_use_before_gib": result.get("host_in_use_before_gib"), "process_rss_gib": figures["peak_host_gib"],
            "final_loss": figures["final_loss"], "elapsed_s": result.get("elapsed_s"), "log": result.get("log"),
            "memory_plan": ((result.get("dos") or {}).get("memory_plans") or [None])[-1],  # DOS: the one in force
            "reused": bool(result.get("reused"))}


def training_host_in_use(result: dict[str, Any]) -> float | None:
    """The most host memory in use at the end of any iteration, less what was in use before the run (GiB), or None
    for a run that trained no iteration."""
    readings = finite((result.get("iterations") or {}).get("host_in_use_gib") or [])
    before = result.get("host_in_use_before_gib")
    return max(readings) - before if readings and before is not None else None


def run_sizes(runner: Runner, settings: SizeSettings) -> dict[str, Any]:
    """Every size under every row not stopped yet; write sizes.json, sizes.md and sizes.png after every size."""
    s = runner.settings
    rows = load_rows(table_path("sizes", s.rows), s.only)
    sizes = settings.ladder()
    windows = {"steps": s.steps, "warmup": s.warmup, "e2e_steps": s.e2e_steps}
    stopped: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []
    doc: dict[str, Any] = {}
    runner.stage("sizes", "run", len(sizes) * len(rows))
    for size in sizes:
        if len(stopped) == len(rows):
            break
        sets = size.sets(settings.head_dim)
        _, model, _ = runner.describe(sets)
        measured.append({"shape": size.shape, "params": model["params"]})
        for row in rows:
            spec = make_run(row, runner.overrides, f"{size.shape}/{row.label}", s.devices[0], sets=sets, **windows)
            if row.label in stopped:
                result = {**spec.to_dict(), "status": "stopped", "reason": stopped[row.label]}
            else:
                result = runner.run(spec, runner.out_dir / "runs" / size.shape / slug(row.label), reuse=FINISHED)
                if result["status"] in FAILED or spec.skip is not None:
                    stopped[row.label] = f"{result['status']} at {size.shape}"
            entries.append(entry(size, model, result, aggregate(spec, [result], runner.tokens, model)))
            e = entries[-1]
            runner.done(f"{size.shape} ({count(e['params'])}) {row.label}", result,
                        tokens_per_s=num(e["tokens_per_s"], 0), model_TFLOP_per_s=num(e["model_tflops_per_s"]),
                        GPU_GiB=num(e["peak_gpu_gib"]), host_in_use_GiB=num(e["host_in_use_gib"]))
        doc = runner.write("size_sweep", {"figures": MEASURED, **settings.to_dict()},
                           ("sizes.json", "sizes.png", "sizes.md"), render, tables, sizes=measured,
                           sizes_planned=[size.shape for size in sizes],
                           rows=[{"label": row.label, "strategy": row.strategy, "fragment": row.fragment,
                                  "cannot_run": row.cannot_run} for row in rows],
                           runs=entries, largest=largest(entries, [row.label for row in rows]))
    return doc


#: Figures of a row's largest size that ``largest`` repeats (the results tables read them there).
AT_LARGEST = ("tokens_per_s", "model_tflops_per_s", "peak_gpu_gib", "host_in_use_training_gib", "host_in_use_gib")


def largest(entries: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """Per row: the largest size it trained (None: none) with its figures there, and why it stopped (None: it did
    not)."""
    out = {}
    for label in labels:
        mine = [e for e in entries if e["label"] == label]
        ok = [e for e in mine if e["status"] == "ok"]
        failed = next((e for e in mine if e["status"] != "ok"), None)
        top = ok[-1] if ok else {}
        out[label] = {"shape": top.get("shape"), "params": top.get("params"),
                      **{key: top.get(key) for key in AT_LARGEST},
                      "stopped": None if failed is None else f"{failed['status']} at {failed['shape']}: "
                                                             f"{failed['reason']}"}
    return out


def resident(entry: dict[str, Any]) -> str:
    """A DOS run's optimizer state on the GPU under its memory plan in force ("" for other strategies)."""
    tiers = (entry.get("memory_plan") or {}).get("tiers") or []
    tier = next((t for t in tiers if t["home"] == RESIDENT_TIER), None)
    return "" if tier is None else f"{count(tier['params'])}, {tier['gib']:.1f} GiB"


def tables(doc: dict[str, Any]) -> list[Table]:
    return [Table("Largest size each strategy trains", ("strategy", "largest size", "parameters", "stopped by"),
                  [(label, e["shape"] or "none", count(e["params"]),
                    e["stopped"] or "(not stopped)") for label, e in doc["largest"].items()]),
            Table("Every run", ("size", "parameters", "strategy", "status", "tokens/s", "model TFLOP/s",
                                "peak GPU GiB", "state resident on the GPU", "host in use, training GiB",
                                "host in use, peak GiB", "process RSS GiB", "reason"),
                  [(e["shape"], count(e["params"]), e["label"], e["status"],
                    num(e["tokens_per_s"], 0), num(e["model_tflops_per_s"]), num(e["peak_gpu_gib"]), resident(e),
                    num(e.get("host_in_use_training_gib")), num(e["host_in_use_gib"]), num(e["process_rss_gib"]),
                    e["reason"] or "")
                   for e in doc["runs"]], doc["measurement"]["figures"] + ".")]


def stop_mark(entries: list[dict[str, Any]]) -> tuple[float, float | None, str] | None:
    """Where one strategy's line stops: the parameters (billions) of the first size that failed, the host memory in use
    its worker reached there (the parent samples it, so a run the kernel killed has it too) and its status."""
    failed = next((e for e in entries if e["status"] in FAILED and e["params"]), None)
    return None if failed is None else (failed["params"] / 1e9, failed["host_in_use_gib"], failed["status"])


def render(doc: dict[str, Any], path: str | Path) -> Path:
    """sizes.png: tokens/s against the parameters, and beside it host in use (solid) and peak GPU memory (dashed), one
    line per strategy ending where it stopped; an x marks the size that stopped it, on the memory side at the host
    memory in use it reached there, under a dotted line at the host's RAM."""
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(13.0, 5.0))
    for index, label in enumerate(doc["largest"]):
        colour = f"C{index % 10}"
        mine = [e for e in doc["runs"] if e["label"] == label and e["params"]]
        ok = [e for e in mine if e["status"] == "ok"]
        for ax, key, style in ((speed, "tokens_per_s", "-"), (memory, "host_in_use_gib", "-"),
                               (memory, "peak_gpu_gib", "--")):
            points = [(e["params"] / 1e9, e[key]) for e in ok if e[key] is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", linestyle=style, color=colour,
                    label=label if key == "tokens_per_s" else None)
        mark = stop_mark(mine)
        if mark is not None:
            x, host, status = mark
            for ax, y, text in ((speed, 0.0, status), (memory, host or 0.0,
                                                        status if host is None else f"{status}, host {host:.1f} GiB")):
                ax.scatter([x], [y], marker="x", s=80, color=colour, zorder=3)
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(3, 6 + 9 * index), fontsize="x-small",
                            color=colour)
    speed.set(xlabel="parameters (B)", ylabel="tokens/s (end to end)", title="throughput (x: stopped)")
    memory.set(xlabel="parameters (B)", ylabel="GiB", title="host memory in use (solid), peak GPU memory (dashed)")
    for ax in (speed, memory):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ram = doc["hardware"].get("host_ram_gib")
    if ram:
        memory.axhline(ram, linestyle=":", color="grey", linewidth=1)
        memory.annotate("host RAM", (0, ram), xycoords=("axes fraction", "data"), textcoords="offset points",
                        xytext=(4, 3), fontsize="x-small", color="grey")
        memory.set_ylim(top=max(memory.get_ylim()[1], ram * 1.1))
    if doc["runs"]:
        speed.legend(loc="best", fontsize="small")
    fig.suptitle(f"GPT sizes, the blocks of {workload_title(doc)}", wrap=True)
    return save(fig, path)
