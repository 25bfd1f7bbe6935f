"""The committed reports under docs/benchmarks and what the README and the docs quote from them.

``QUOTES`` holds, for every committed report, the sentences and table cells that quote it (in the README, the docs,
the benchmarks index and the report's own page) as templates: ``{expression:format}`` is a figure computed from the
report's JSON (a ratio, a difference, a field) and printed as the docs print it. The test renders each template from
the JSON and asserts that the text stands in that file (line breaks and runs of spaces read as one space). A figure
edited in the docs, a report regenerated without its docs, or a sentence reworded without its template fails here,
naming the file and the text expected. The figures themselves are written only in the docs and the JSON.

Where a report comes with the raw records it summarises, the summary is recomputed from them too: the plan sweeps'
per-update records through the bench's own summary and the planner's trial rule, run L's per-iteration samples, the
converging runs' logs.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from statistics import median
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.recipe_run import series
from tests.support.recipe_run import summary as log_summary
from tests.support.script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "docs" / "benchmarks"

# where the templates are looked for: "index" is docs/benchmarks/README.md, "page" the report's own .md
README, INDEX, PAGE = "README.md", "docs/benchmarks/README.md", "page"
OSM, STRATEGY, PERF = "docs/optimizer-state-manager.md", "docs/strategy.md", "docs/performance-model.md"
MULTI, ACT, REL, CONV = "docs/multi-node.md", "docs/activation-offload.md", "docs/reliability.md", "docs/converging.md"
RECIPES, DOS = "docs/recipes.md", "deep_optimizer_states"

# row labels and claim names, short
V, S, D, O, P, T, N = ("zero3_offload", "static_split(0.5)", "dos(auto)", "dos(auto,overlap)", "plain",  # noqa: E741
                       "torchao_offload", "no_offload")
V4, D4, O4 = "zero3_offload@dp4", "dos(auto)@dp4", "dos(auto,overlap)@dp4"  # the rows at four ranks
V2, O2 = "zero3_offload@dp2", "dos(auto,overlap)@dp2"  # and at two
N4, F, F4 = "no_offload@dp4", "fsdp_offload", "fsdp_offload@dp4"
R3, RO3 = "dos(auto,resident=3.85GiB)", "dos(auto,overlap,resident=3.85GiB)"
R5, RO5 = "dos(auto,resident=5.05GiB)", "dos(auto,overlap,resident=5.05GiB)"
E2E = "end-to-end iteration vs zero3_offload"
TORCHAO = "end-to-end iteration vs torchao_offload at <= 60% its peak GPU memory"
FB, IT, STEP = "forward + backward vs plain", "iteration vs zero3_offload", "update phase (step) vs zero3_offload"
SPLIT = "iteration vs static_split 0.5 at lower peak GPU memory"
AUTO_VS_BEST, PREDICTION = "auto within 5% of the best swept plan", "median prediction error <= 10%"
STRIDES = "auto beats every stride:K"
# reports whose figures another report's sentences quote too
L_TABLE, L_VANILLA = "gpt-2.7b_H200_2026-11-21_runL_table", "gpt-2.7b_H200_2026-11-21_runL_vanilla"
RUN_S, RUN_T, RUN_U = "gpt-2.7b_H200_2026-11-25_runS", "gpt-2.7b_H200_2026-11-25_runT", "gpt-2.7b_H200_2026-11-25_runU"
RUN_W, RUN_X, RUN_Y = "gpt-2.7b_H200_2026-11-25_runW", "gpt-2.7b_H200_2026-11-25_runX", "gpt-2.7b_H200_2026-11-25_runY"
RUN_Z = "gpt-2.7b_H200_2026-11-26_runZ"
RUN_AC, RUN_AD = "gpt-2.7b_H100x4_2026-11-27_runAC", "gpt-2.7b_H100x4_2026-11-27_runAD"
RUN_AE, RUN_AF = "gpt-13b_H100x4_2026-11-28_runAE", "gpt-2.7b_H100x4_2026-11-28_runAF"
S4 = "static_split(0.5)@dp4"
RUN_AG = "sweep_gpt-2.7b_H100x4_2026-11-28_runAG"
RUN_AH, RUN_AI = "gpt-4b_H100_2026-11-28_runAH", "gpt-5b_H100_2026-11-28_runAI"
RUN_AJ, RUN_AK = "gpt-2.7b_H100_2026-11-28_runAJ", "gpt-2.7b_H200_2026-11-28_runAK"
RUN_AL, RUN_AM = "gpt-2.7b_H200x2_2026-11-28_runAL", "gpt-2.7b_H200x2_2026-11-28_runAM"
D2 = "dos(auto)@dp2"
RESIDENT_GIB = "row(D).dos.resident_params*12/1024**3"  # fp32 master and both moments of the resident subgroups

#: report (its JSON's stem, or its folder for converging and soak) -> [(file, template)]
QUOTES: dict[str, list[tuple[str, str]]] = {
    "gpt-1b_H200_2026-11-21_runF": [
        (README, "| gpt-1b ({model.params/1e9:.2f}B) | H200 | {it(V):.0f} ms, {gpu(V):.1f} GiB | {it(S):.0f} ms, "
                 "{gpu(S):.1f} GiB | {it(D):.0f} ms, {gpu(D):.1f} GiB | {it(V)/it(D):.2f}x |"),
        (OSM, "| {it(V):.0f} ms, {gpu(V):.1f} GiB | {it(S):.0f} ms, {gpu(S):.1f} GiB | {it(D):.0f} ms, "
              "{gpu(D):.1f} GiB | {claim(IT).value:.2f}x | {claim(SPLIT).value:.2f}x |"),
        (INDEX, "DOS `auto` **{claim(IT).value:.2f}x** vanilla ({it(D):.0f} vs {it(V):.0f} ms); "
                "**{claim(SPLIT).value:.2f}x** the split at {gpu(D):.1f} vs {gpu(S):.1f} GiB"),
    ],
    "gpt-2.7b_H200_2026-11-21_runH": [
        (OSM, "| gpt-2.7b ({model.params/1e9:.2f}B) | [run H](benchmarks/gpt-2.7b_H200_2026-11-21_runH.md) | "
              "{it(V):.0f} ms, {gpu(V):.1f} GiB | {it(S):.0f} ms, {gpu(S):.1f} GiB | {it(D):.0f} ms, {gpu(D):.1f} GiB "
              "| **{claim(IT).value:.2f}x** | **{claim(SPLIT).value:.2f}x** |"),
        (OSM, "In run H the update phase (`step`) of DOS `auto` took {step(D):.0f} ms against vanilla's "
              "{step(V):.0f} ms ({claim(STEP).value:.1f}x), final losses agreed within "
              "{e(claim('final loss vs zero3_offload').value)} (relative), and DOS's peak host memory was "
              "{1-host(D)/host(V):.1%} below vanilla's."),
        (OSM, "The host lane ({1-row(D).dos.device_fraction:.0%} of the parameters) is CPU Adam without a gap, "
              "{row(D).dos.host_busy_ms:.0f} ms"),
        (OSM, "The two lanes end within about 50 ms of each other ({upd(D):.0f} ms)"),
        (INDEX, "DOS `auto` **{claim(IT).value:.2f}x** vanilla's iteration ({it(D):.0f} vs {it(V):.0f} ms); "
                "**{claim(SPLIT).value:.2f}x** the split at {gpu(D):.1f} vs {gpu(S):.1f} GiB; update phase "
                "{claim(STEP).value:.1f}x vanilla's step"),
    ],
    "gpt-4b_H200_2026-11-21_runH": [
        (OSM, "| {it(V):.0f} ms, {gpu(V):.1f} GiB | {it(S):.0f} ms, {gpu(S):.1f} GiB | {it(D):.0f} ms, "
              "{gpu(D):.1f} GiB | **{claim(IT).value:.2f}x** | **{claim(SPLIT).value:.2f}x** |"),
        (INDEX, "DOS `auto` **{claim(IT).value:.2f}x** vanilla ({it(D):.0f} vs {it(V):.0f} ms); "
                "**{claim(SPLIT).value:.2f}x** the split at {gpu(D):.1f} vs {gpu(S):.1f} GiB"),
    ],
    "gpt-2.7b_H200_2026-11-21_runL_table": [
        # the plan table of docs/optimizer-state-manager.md: the vanilla row is run L's own invocation of vanilla
        *[(OSM, f"| {name} | {{fwd({label!r}):.0f}} | {{bwd({label!r}):.0f}} | {{step({label!r}):.0f}} | "
                f"{{upd({label!r}):.0f}} | {{it({label!r}):.0f}} | {{gpu({label!r}):.1f}} | {{host({label!r}):.1f}} |")
          for name, label in (("DOS plan=host", "dos(host)"), ("DOS plan=device", "dos(device)"),
                              ("DOS plan=0.25", "dos(0.25)"), ("DOS plan=0.5", "dos(0.5)"),
                              ("DOS plan=0.75 (second machine)", "dos(0.75)"))],
        (OSM, "| no offload | {fwd(N):.0f} | {bwd(N):.0f} | {step(N):.0f} | – | {it(N):.0f} | {gpu(N):.1f} | "
              "{host(N):.1f} |"),
        (OSM, "| vanilla ZeRO-3 offload | {run(L_VANILLA).fwd(V):.0f} | "
              "{run(L_VANILLA).bwd(V):.0f} | {vanilla.step(V):.0f} | – | "
              "{vanilla.it(V):.0f} | {vanilla.gpu(V):.1f} | {vanilla.host(V):.1f} |"),
        (OSM, "| DOS plan=auto ({row(D).dos.device_fraction:.0%} of the parameters on the device) | {fwd(D):.0f} | "
              "{bwd(D):.0f} | **{step(D):.0f}** | **{upd(D):.0f}** | **{it(D):.0f}** | {gpu(D):.1f} | {host(D):.1f} |"),
        (OSM, "`auto` has the fastest update phase and iteration on this machine, {vanilla.it(V)/it(D):.2f}x "
              "vanilla's iteration; even plan=host, CPU Adam alone on pinned state, steps "
              "{vanilla.step(V)/step('dos(host)'):.1f}x faster than vanilla ({step('dos(host)'):.0f} against "
              "{vanilla.step(V):.0f} ms). Final losses: {min(losses):.4f}-{max(losses):.4f} for every configuration "
              "(vanilla {vanilla.row(V).final_loss:.4f})."),
        (OSM, "the link carries {row('dos(device)').dos.h2d_gb:.1f} GB each way in a {upd('dos(device)'):.0f} ms "
              "update phase: {row('dos(device)').dos.h2d_gb/upd('dos(device)')*1e3:.0f} GB/s per direction"),
        (OSM, "(run L, `auto`: {fb(D):.0f} of {it(D):.0f} ms)"),
        (INDEX, "`auto` {it(D):.0f} ms per iteration, update phase {upd(D):.0f} ms, the fastest step of every plan "
                "({step(D):.0f} ms)"),
    ],
    "gpt-2.7b_H200_2026-11-21_runL_vanilla": [
        (INDEX, "{it(V):.0f} ms per iteration, step {step(V):.0f} ms: DOS `auto` of the plan table "
                "**{it(V)/run(L_TABLE).it(D):.2f}x**"),
    ],
    "gpt-2.7b_H200_2026-11-21_runL_backward": [
        (OSM, "over {len(pooled('dos_auto_r'))} iterations each: no offload {bwd(N):.0f} ms, DOS `auto` {bwd(D):.0f} "
              "ms, **{bwd(D)/bwd(N):.2f}x**."),
        (INDEX, "backward **{bwd(D)/bwd(N):.2f}x** no offload's ({bwd(D):.0f} vs {bwd(N):.0f} ms)"),
    ],
    "gpt-2.7b_H200_2026-11-25_runP": [
        (PAGE, "({gpu(O):.1f} GiB peak)"),
        (INDEX, "end to end: DOS `auto` **{claim(E2E).value:.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms); "
                "torchao's offload {e2e(T):.0f} ms at {gpu(T):.2f} GiB, **{e2e(D)/e2e(T):.2f}x** faster than DOS at "
                "{gpu(T)/gpu(D):.1f}x its GPU memory; plain {e2e(P):.0f} ms; SuperOffload {e2e('superoffload'):.0f} ms;"
                " ZenFlow out of host memory; {n('missed')} of the {claims} claims missed"),
    ],
    "gpt-2.7b_H200_2026-11-25_runP2": [
        (PAGE, "Overlap's GPU memory no longer grows ({gpu(O):.1f} GiB peak, the update's slots beside the next "
               "forward's activations), but it is still {e2e(O)/e2e(D)-1:.0%} slower end to end ({e2e(O):.0f} vs "
               "{e2e(D):.0f} ms): the forward waits for the update ({fwd(O):.0f} vs {fwd(D):.0f} ms, synchronised)"),
        (PAGE, "and the step keeps {step(O):.0f} ms of synchronous work"),
        (INDEX, "overlap exact, GPU memory flat ({gpu(O):.1f} GiB peak), but **{e2e(O)/e2e(D)-1:.0%} slower** end to "
                "end ({e2e(O):.0f} vs {e2e(D):.0f} ms)"),
    ],
    "gpt-2.7b_H200_2026-11-25_runS": [
        (STRATEGY, "forward {fwd(D):.0f} -> {run(RUN_T).fwd(D):.0f} ms, backward "
                   "{bwd(D):.0f} -> {run(RUN_T).bwd(D):.0f} ms"),
        (STRATEGY, "end to end {e2e(D):.0f} -> {run(RUN_T).e2e(D):.0f} ms"),
        (PAGE, "hooking the blocks cut the synchronised backward from {bwd('dos(auto,layer-hooks)'):.0f} to "
               "{bwd(D):.0f} ms (median; {row('dos(auto,layer-hooks)').spread.bwd_ms.min:.0f} to "
               "{row(D).spread.bwd_ms.min:.0f} ms at the minimum) and left the forward where it was "
               "({fwd('dos(auto,layer-hooks)'):.0f} vs {fwd(D):.0f} ms). End to end, the blocks' row was slower "
               "({e2e(D):.0f} vs {e2e('dos(auto,layer-hooks)'):.0f} ms): its update phase took {step(D):.0f} against "
               "{step('dos(auto,layer-hooks)'):.0f} ms"),
        (INDEX, "blocks: backward **{bwd(D):.0f} vs {bwd('dos(auto,layer-hooks)'):.0f} ms** (synchronised median), "
                "forward unchanged, end to end {e2e(D):.0f} vs {e2e('dos(auto,layer-hooks)'):.0f} ms (update-phase "
                "spread); DOS **{e2e(V)/e2e(D):.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms), torchao "
                "{e2e(T):.0f} ms: targets {all_missed('end-to-end')}"),
    ],
    "gpt-2.7b_H200_2026-11-25_runT": [
        (OSM, "({e2e(O):.0f} vs {e2e(D):.0f} ms in [run T](benchmarks/gpt-2.7b_H200_2026-11-25_runT.md))"),
        (STRATEGY, "(synchronised medians; plain PyTorch: {fwd(P):.0f} and {bwd(P):.0f})"),
        (PAGE, "DOS's forward is now plain's ({fwd(D):.0f} vs {fwd(P):.0f} ms synchronised; "
               "{run(RUN_S).fwd(D):.0f} in run S) and so is its backward ({bwd(D):.0f} vs "
               "{bwd(P):.0f} ms; {run(RUN_S).bwd(D):.0f} in run S): forward + backward "
               "{claim(FB).value:.2f}x plain's. End to end DOS takes {e2e(D):.0f} ms, {claim(TORCHAO).value:.2f}x "
               "torchao's {e2e(T):.0f} ms at {gpu(D)/gpu(T):.0%} of its GPU memory (asked: 0.8x, missed by "
               "{claim(TORCHAO).value/0.8-1:.1%}), and {claim(E2E).value:.2f}x faster than vanilla ZeRO-3 offload "
               "(asked: 3.5x, {claim(E2E).status})"),
        (PAGE, "The time left is the update phase: {upd(D):.0f} ms of the {step(D):.0f} ms synchronised step (CPU Adam "
               "on the host lane is the longer lane, {row(D).dos.host_busy_ms:.0f} ms busy)"),
        (PAGE, "`overlap` is slower ({e2e(O):.0f} ms): the forward waits for the update ({fwd(O):.0f} ms)"),
        (PAGE, "this file and its JSON carry the rule's {claim(STEP).value:.2f}x"),
        (INDEX, "end to end: DOS `auto` **{claim(E2E).value:.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms), "
                "**{claim(TORCHAO).value:.2f}x** torchao's time at {gpu(D)/gpu(T):.0%} of its GPU memory (0.8x aimed, "
                "{claim(TORCHAO).status}); forward + backward **{claim(FB).value:.2f}x** plain's ({fb(D):.0f} vs "
                "{fb(P):.0f} ms); `overlap` slower ({e2e(O):.0f} ms)"),
    ],
    "gpt-2.7b_H200_2026-11-25_runU": [
        (STRATEGY, "the time from the step's start to the update phase's start went from "
                   "{preamble(run(RUN_T).row(D))[0]:.1f} ms (run T) to "
                   "{preamble(row(D))[0]:.1f} ms."),
        (STRATEGY, "(serial DOS {run(RUN_W).claim(TORCHAO).value:.2f}x torchao's time there, "
                   "{claim(TORCHAO).value:.2f}x in run U on another host)"),
        (PAGE, "from the step's start to the update phase's start now takes {preamble(row(D))[0]:.1f} ms "
               "({row(D).iteration_timeline.marks_ms.step_start:.1f} -> {row(D).iteration_timeline.update.start_ms:.1f}"
               " ms in the last synchronised iteration's timeline; run T, on another host: "
               "{preamble(run(RUN_T).row(D))[0]:.1f} ms), and from the update's end to the "
               "step's end {preamble(row(D))[1]:.1f} ms (run T: "
               "{preamble(run(RUN_T).row(D))[1]:.1f}). End to end DOS takes {e2e(D):.1f} ms:"
               " **{claim(E2E).value:.2f}x** faster than vanilla ZeRO-3 offload (asked: 3.5x, {claim(E2E).status}) and "
               "**{claim(TORCHAO).value:.2f}x** torchao's {e2e(T):.1f} ms at {gpu(D)/gpu(T):.0%} of its GPU memory "
               "(asked: 0.8x, {claim(TORCHAO).status}). torchao's step is faster on this host than in run T "
               "({step(T):.1f} vs {run(RUN_T).step(T):.1f} ms synchronised) while DOS's "
               "update phase is not ({upd(D):.1f} vs {run(RUN_T).upd(D):.1f} ms)"),
        (PAGE, "DOS's forward + backward is plain's ({claim(FB).value:.3f}x). The time left is the update phase, "
               "{upd(D):.0f} of the {step(D):.0f} ms synchronised step. In the last synchronised iteration's timeline "
               "(plan [{row(D).iteration_timeline.update.lanes}], run T's; `auto` was still trying it against "
               "[{row(D).dos.lanes[-2]}], iteration by iteration) the device lane is the longer one on this host (busy "
               "to {lane_end(row(D), 'device'):.1f} ms, its copies {row(D).dos.h2d_gb:.1f} GB to the device and "
               "{row(D).dos.d2h_gb:.1f} GB back per update, medians), the host lane's last CPU Adam ended at "
               "{lane_end(row(D), 'host'):.1f} ms"),
        (INDEX, "end to end: DOS `auto` **{claim(E2E).value:.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms, 3.5x "
                "aimed: {claim(E2E).status}), **{claim(TORCHAO).value:.2f}x** torchao's time ({e2e(T):.0f} ms on this "
                "host) at {gpu(D)/gpu(T):.0%} of its GPU memory (0.8x aimed, {claim(TORCHAO).status}); step start to "
                "update start {preamble(row(D))[0]:.1f} ms (run T: "
                "{preamble(run(RUN_T).row(D))[0]:.1f})"),
    ],
    "gpt-2.7b_H200_2026-11-25_runW": [
        (OSM, "(run W peaked at {gpu(O):.2f} GiB before it)"),
        (PAGE, "end to end, serial DOS takes {e2e(D):.1f} ms and overlapped DOS **{e2e(O):.1f} ms**: for the first "
               "time `overlap` is the faster of the two (run T: {run(RUN_T).e2e(O):.0f} vs {run(RUN_T).e2e(D):.0f} "
               "ms), at {gpu(O):.2f} GiB against {gpu(D):.2f}. Against vanilla ZeRO-3 offload's {e2e(V):.1f} ms that "
               "is **{e2e(V)/e2e(D):.2f}x** serial and **{e2e(V)/e2e(O):.2f}x** overlapped (asked: 3.5x, "
               "{claim(E2E).status}). Against torchao's {e2e(T):.1f} ms it is **{e2e(D)/e2e(T):.3f}x** serial at "
               "{gpu(D)/gpu(T):.0%} of torchao's {gpu(T):.2f} GiB (asked: 0.8x at most 60%: {claim(TORCHAO).status}) "
               "and {e2e(O)/e2e(T):.3f}x overlapped, at {gpu(O)/gpu(T):.0%} of its memory, outside the target's "
               "memory bound. Serial DOS's forward + backward is {fb(D)/fb(P):.3f}x plain's (synchronised, "
               "{fb(D):.1f} vs {fb(P):.1f} ms: {claim(FB).status})."),
        (PAGE, "(torchao's synchronised step {step(T):.1f} vs {run(RUN_U).step(T):.1f} ms; "
               "DOS's update phase {upd(D):.1f} vs {run(RUN_U).upd(D):.1f} ms)"),
        (PAGE, "In the serial timeline the update phase starts {preamble(row(D))[0]:.1f} ms after the step and ends "
               "{preamble(row(D))[1]:.1f} ms before the step's end; the rest is the update phase itself (host lane "
               "busy {row(D).dos.host_busy_ms:.1f} ms, device lane {row(D).dos.device_busy_ms:.1f} ms, "
               "{row(D).dos.h2d_gb:.1f} GB to the device and {row(D).dos.d2h_gb:.1f} GB back)."),
        (INDEX, "end to end: DOS serial **{e2e(V)/e2e(D):.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms), overlapped "
                "**{e2e(V)/e2e(O):.2f}x** ({e2e(O):.0f} ms, {gpu(O):.2f} GiB: faster than serial for the first time); "
                "vs torchao's {e2e(T):.0f} ms **{e2e(D)/e2e(T):.2f}x** at {gpu(D)/gpu(T):.0%} of its GPU memory (0.8x "
                "aimed, {claim(TORCHAO).status}), {e2e(O)/e2e(T):.2f}x overlapped at {gpu(O)/gpu(T):.0%}"),
    ],
    "gpt-2.7b_H200_2026-11-25_runX": [
        (OSM, "overlap cost {gpu(O)-gpu(D):.1f} GiB ({gpu(O):.2f} vs {gpu(D):.2f})"),
        # run X's rows do not record the residents' parameter count: run Z's, of the same subgroups of the same model
        (OSM, "`resident_gib=3.85` (subgroups {span(row(R3).dos.resident_subgroups)}, "
              "{run(RUN_Z).row(R3).dos.resident_params/1e6:.1f}M parameters) took the update phase from {upd(D):.0f} "
              "to {upd(R3):.0f} ms and the iteration from {e2e(D):.0f} to {e2e(R3):.0f} ms end to end, at "
              "{gpu(R3):.2f} GiB against {gpu(D):.2f}."),
        (PAGE, "keeping {12*run(RUN_Z).row(R3).dos.resident_params/2**30:.2f} GiB of optimizer state on the GPU "
               "takes serial DOS from {e2e(D):.1f} to **{e2e(R3):.1f} ms** end to end (update phase {upd(D):.1f} to "
               "{upd(R3):.1f} ms) at {gpu(R3):.2f} GiB against {gpu(D):.2f}. Against torchao's {e2e(T):.1f} ms at "
               "{gpu(T):.2f} GiB that is **{e2e(R3)/e2e(T):.3f}x at {gpu(R3)/gpu(T):.1%} of its memory**"),
        (PAGE, "the claim below therefore weighs `dos(auto)`, {claim(TORCHAO).value:.3f}x at {gpu(D)/gpu(T):.0%}. "
               "Overlapped with residents DOS takes **{e2e(RO3):.1f} ms** ({e2e(RO3)/e2e(T):.3f}x torchao, "
               "{e2e(V)/e2e(RO3):.2f}x vanilla's {e2e(V):.1f} ms) but at {gpu(RO3):.2f} GiB, {gpu(RO3)/gpu(T):.0%} of "
               "torchao's. Vanilla ratios: serial {e2e(V)/e2e(D):.2f}x"),
        (PAGE, "serial with residents {e2e(V)/e2e(R3):.2f}x, overlapped {e2e(V)/e2e(O):.2f}x. Forward + backward of "
               "`dos(auto,resident=3.85GiB)` is {fb(R3)/fb(P):.3f}x plain's ({fb(R3):.1f} vs {fb(P):.1f} ms "
               "synchronised). Where the rest goes: the serial update phase with residents is {upd(R3):.1f} ms (host "
               "lane busy {row(R3).dos.host_busy_ms:.1f} ms, device lane {row(R3).dos.device_busy_ms:.1f} ms, "
               "{row(R3).dos.h2d_gb:.1f} GB to the device and {row(R3).dos.d2h_gb:.1f} GB back)"),
        (PAGE, "plus their 16-bit gradients, which stay on the device through the backward "
               "({2*run(RUN_Z).row(R3).dos.resident_params/2**30:.2f} GiB)"),
        (INDEX, "end to end: with residents serial DOS **{e2e(R3):.0f} ms** ({e2e(D):.0f} without), "
                "**{e2e(R3)/e2e(T):.2f}x** torchao's {e2e(T):.0f} ms at {gpu(R3)/gpu(T):.0%} of its GPU memory (0.8x "
                "at 60% aimed: missed, narrowly); overlapped with residents **{e2e(RO3):.0f} ms**, "
                "{e2e(V)/e2e(RO3):.2f}x vanilla, at {gpu(RO3)/gpu(T):.0%}"),
    ],
    "gpt-2.7b_H200_2026-11-25_runY": [
        (PAGE, "DOS `auto` peaks at **{gpu(D):.2f} GiB** (run X, with the gradient row: {run(RUN_X).gpu(D):.2f}) at "
               "{e2e(D):.1f} ms end to end. Against torchao's {e2e(T):.1f} ms at {gpu(T):.2f} GiB: "
               "`resident_gib=3.85` takes **{e2e(R3):.1f} ms at {gpu(R3):.2f} GiB, {e2e(R3)/e2e(T):.3f}x at "
               "{gpu(R3)/gpu(T):.0%} of its memory**, and `resident_gib=5.05` **{e2e(R5):.1f} ms at {gpu(R5):.2f} "
               "GiB, {e2e(R5)/e2e(T):.3f}x at {gpu(R5)/gpu(T):.0%}**. The target, at most 0.8x at most 60%, is "
               "**{claim(TORCHAO).status}**"),
        (PAGE, "host lane busy {row(R3).dos.host_busy_ms:.1f} ms, device lane {row(R3).dos.device_busy_ms:.1f}, "
               "{row(R3).dos.h2d_gb:.1f} GB to the device against "
               "{run(RUN_X).row(R3).dos.h2d_gb:.1f}), so its update phase took "
               "{upd(R3):.1f} ms against run X's {run(RUN_X).upd(R3):.1f}"),
        (PAGE, "and 5.05 (subgroups {span(row(R5).dos.resident_subgroups[:-1])}, "
               "{row(R5).dos.resident_params/1e6:.1f}M)"),
        (INDEX, "DOS `auto` at **{gpu(D):.2f} GiB** ({run(RUN_X).gpu(D):.2f} with the row); "
                "vs torchao's {e2e(T):.0f} ms: residents 3.85 GiB **{e2e(R3)/e2e(T):.2f}x** at {gpu(R3)/gpu(T):.0%} of "
                "its memory, 5.05 GiB **{e2e(R5)/e2e(T):.2f}x** at {gpu(R5)/gpu(T):.0%} (0.8x at 60% aimed: "
                "{claim(TORCHAO).status})"),
    ],
    "gpt-2.7b_H200_2026-11-26_runZ": [
        (OSM, "and with three resident subgroups {e2e(RO3):.0f} vs {e2e(R3):.0f} ms at {gpu(RO3):.2f} vs {gpu(R3):.2f} "
              "GiB ([run Z](benchmarks/gpt-2.7b_H200_2026-11-26_runZ.md))"),
        # the docs subtract the rounded figures they quote
        (OSM, "the forward beside the update tops it by those {round(gpu(RO3), 2)-round(gpu(R3), 2):.2f} GiB"),
        (OSM, "measured, in one invocation against torchao's offload ({e2e(T):.1f} ms at {gpu(T):.2f} GiB): "
              "`resident_gib=3.85` at {e2e(R3):.1f} ms and {gpu(R3):.2f} GiB serial ({e2e(R3)/e2e(T):.3f}x) and "
              "{e2e(RO3):.1f} ms and {gpu(RO3):.2f} GiB with `overlap` (**{claim(TORCHAO).value:.3f}x at "
              "{gpu(RO3)/gpu(T):.0%} of its memory**: the target of 0.8x at 60% {claim(TORCHAO).status})"),
        (PAGE, "DOS with residents and overlap takes **{e2e(RO3):.1f} ms at {gpu(RO3):.2f} GiB: "
               "{claim(TORCHAO).value:.3f}x torchao's {e2e(T):.1f} ms at {gpu(RO3)/gpu(T):.0%} of its {gpu(T):.2f} "
               "GiB** (0.8x at 60% aimed), **{claim(E2E).value:.2f}x vanilla** ({e2e(V):.1f} ms; 3.5x aimed), faster "
               "than every other offloading row; DOS's forward + backward (serial row, synchronised) take "
               "**{claim(FB).value:.3f}x plain's** ({fwd(R3):.1f} + {bwd(R3):.1f} vs {fwd(P):.1f} + {bwd(P):.1f} ms; "
               "1.15x aimed). Serial, the same residents give {e2e(R3):.1f} ms ({e2e(R3)/e2e(T):.3f}x torchao"),
        (PAGE, "`overlap` now costs {round(gpu(RO3), 2)-round(gpu(R3), 2):.2f} GiB of peak ({gpu(RO3):.2f} vs "
               "{gpu(R3):.2f}; run X: {run(RUN_X).gpu(RO3):.2f} vs {run(RUN_X).gpu(R3):.2f}): the update's device "
               "buffers (the slots that take pieces, the scratch and the host lane's upload buffers) take "
               "{row(R3).dos.device_buffer_gib:.2f} GiB"),
        (PAGE, "the update phase is {upd(R3):.0f} ms of CPU Adam and PCIe copies (timeline, DOS update phase table); "
               "with `overlap` the step returns in {step(RO3):.1f} ms (synchronised) and the next forward waits for "
               "the subgroups it reads, so its synchronised forward reads {fwd(RO3):.1f} ms against the serial "
               "{fwd(R3):.1f}."),
        (INDEX, "overlapped {e2e(RO3):.0f} ms at {gpu(RO3):.2f} GiB: **{claim(TORCHAO).value:.2f}x** torchao's "
                "{e2e(T):.0f} ms at {gpu(RO3)/gpu(T):.0%} of its memory, **{claim(E2E).value:.2f}x** vanilla, "
                "forward + backward **{claim(FB).value:.2f}x** plain's: every target {all_met('end-to-end', FB)}"),
    ],
    "gpt-2.7b_H200_2026-11-26_runZ1": [
        (OSM, "`resident_gib=5.05` ([run Z1](benchmarks/gpt-2.7b_H200_2026-11-26_runZ1.md)) is faster still but peaks "
              "at {gpu(R5):.2f} GiB, {gpu(R5)/gpu(T):.0%} of torchao's: the peak is now the backward's, not the "
              "update's ({row(R5).peak_gpu_gib_by_phase.step:.2f} GiB)"),
        (PAGE, "serial {e2e(R5):.1f} ms at {gpu(R5):.2f} GiB (run Y: {run(RUN_Y).e2e(R5):.1f} at "
               "{run(RUN_Y).gpu(R5):.2f}), overlapped {e2e(RO5):.1f} ms at {gpu(RO5):.2f} GiB, against torchao's "
               "{e2e(T):.1f} ms at {gpu(T):.2f} GiB: {e2e(R5)/e2e(T):.3f}x and {e2e(RO5)/e2e(T):.3f}x, both at "
               "**{gpu(R5)/gpu(T):.0%} of its memory, {gpu(R5)-0.6*gpu(T):.2f} GiB over the 60% bound** "
               "({0.6*gpu(T):.2f} GiB). The pieces brought the update phase's peak to "
               "{row(R5).peak_gpu_gib_by_phase.step:.2f} GiB, but the whole-run peak is now the backward's "
               "({row(R5).peak_gpu_gib_by_phase.bwd:.2f} GiB, with five resident subgroups"),
        (INDEX, "{e2e(R5):.0f} / {e2e(RO5):.0f} ms at {gpu(R5):.2f} / {gpu(RO5):.2f} GiB: **{e2e(R5)/e2e(T):.2f}x / "
                "{e2e(RO5)/e2e(T):.2f}x** torchao's {e2e(T):.0f} ms but at {gpu(RO5)/gpu(T):.0%} of its memory (60% "
                "aimed: {claim(TORCHAO).status}); the backward, not the update, sets the peak"),
    ],
    "gpt-2.7b_H200_2026-11-26_runZ2": [
        (PAGE, "overlapped {e2e(RO3):.1f} ms at {gpu(RO3):.2f} GiB, **{claim(TORCHAO).value:.3f}x torchao's "
               "{e2e(T):.1f} ms at {gpu(RO3)/gpu(T):.0%} of its memory**, {claim(E2E).value:.2f}x vanilla "
               "({e2e(V):.1f} ms); serial {e2e(R3):.1f} ms at {gpu(R3):.2f} GiB ({e2e(R3)/e2e(T):.3f}x)."),
        (INDEX, "overlapped {e2e(RO3):.0f} ms at {gpu(RO3):.2f} GiB: **{claim(TORCHAO).value:.2f}x** torchao's "
                "{e2e(T):.0f} ms at {gpu(RO3)/gpu(T):.0%} of its memory, {claim(E2E).value:.2f}x vanilla"),
    ],
    "gpt-2.7b_H200_2026-11-26_runZ3": [
        (OSM, "faster end to end for "
              "{gpu(O)-gpu(D):.2f}-{round(run(RUN_Z).gpu(RO3), 2)-round(run(RUN_Z).gpu(R3), 2):.2f} GiB of peak: "
              "{e2e(O):.0f} vs {e2e(D):.0f} ms at {gpu(O):.2f} vs {gpu(D):.2f} GiB"),
        (PAGE, "overlapped {e2e(O):.1f} ms at {gpu(O):.2f} GiB against serial {e2e(D):.1f} ms at {gpu(D):.2f}: "
               "**{1-e2e(O)/e2e(D):.0%} faster for {gpu(O)-gpu(D):.2f} GiB** (run X, before: "
               "{run(RUN_X).e2e(O):.0f} vs {run(RUN_X).e2e(D):.0f}"
               " ms at {run(RUN_X).gpu(O):.2f} vs "
               "{run(RUN_X).gpu(D):.2f} GiB)"),
        (PAGE, "the update phase's own peak is {row(D).peak_gpu_gib_by_phase.step:.2f} GiB, with "
               "{row(D).dos.device_buffer_gib:.2f} GiB of update buffers"),
        (INDEX, "overlap {e2e(O):.0f} vs {e2e(D):.0f} ms at {gpu(O):.2f} vs {gpu(D):.2f} GiB: {1-e2e(O)/e2e(D):.0%} "
                "faster for {gpu(O)-gpu(D):.2f} GiB (run X: +{run(RUN_X).gpu(O)-run(RUN_X).gpu(D):.1f} GiB)"),
    ],
    "gpt-2.7b_H200_2026-11-27_runAA": [
        (OSM, "([run AA](benchmarks/gpt-2.7b_H200_2026-11-27_runAA.md)) it took {e2e(O):.0f} ms at {gpu(O):.2f} GiB, "
              "{claim(E2E).value:.2f}x vanilla and {claim(TORCHAO).value:.2f}x torchao's offload: the update phase "
              "({upd(O):.0f} ms) outlasts the forward and backward"),
        (PAGE, "the default DOS row takes **{e2e(O):.1f} ms at {gpu(O):.2f} GiB end to end: {claim(E2E).value:.2f}x "
               "vanilla** ({e2e(V):.1f} ms; 3.5x aimed) and the fastest offloading row, but only "
               "**{claim(TORCHAO).value:.3f}x torchao's {e2e(T):.1f} ms** (at {gpu(O)/gpu(T):.0%} of its {gpu(T):.2f} "
               "GiB; 0.8x aimed: **{claim(TORCHAO).status}**"),
        (PAGE, "the update phase ({upd(O):.0f} ms, median of the synchronised iterations; host lane busy "
               "{row(O).dos.host_busy_ms:.0f} ms) is longer than the forward and backward together, so the next "
               "forward waits for the subgroups it reads (synchronised forward {fwd(O):.1f} ms against plain's "
               "{fwd(P):.1f})"),
        (INDEX, "end to end: DOS **{claim(E2E).value:.2f}x** vanilla ({e2e(O):.0f} vs {e2e(V):.0f} ms) at {gpu(O):.2f} "
                "GiB, the fastest offloading row, but **{claim(TORCHAO).value:.2f}x** torchao's {e2e(T):.0f} ms (0.8x "
                "aimed: {claim(TORCHAO).status} without residents; the update phase, {upd(O):.0f} ms, outlasts forward "
                "+ backward); static split {e2e(S):.0f} ms at {gpu(S):.2f} GiB"),
    ],
    "gpt-2.7b_H100x4_2026-11-27_runAB": [
        (OSM, "four H100s took {e2e(O4):.0f} ms end to end against {e2e(D4):.0f} serial"),
        (OSM, "{12*row(D).dos.resident_params/2**30:.2f} GiB at one GPU, {12*row(D4).dos.resident_params/2**30:.2f}"
              " GiB per rank at four"),
        (INDEX, "end to end: DOS with no options **{e2e(V)/e2e(O):.2f}x** vanilla at one GPU ({e2e(O):.0f} vs "
                "{e2e(V):.0f} ms, every subgroup resident, {gpu(O):.2f} GiB) and **{e2e(V4)/e2e(O4):.2f}x** "
                "at four ({e2e(O4):.0f} vs {e2e(V4):.0f} ms, {gpu(O4):.2f} GiB); four GPUs give "
                "**{tps(O4)/tps(O):.2f}x** one GPU's tokens/s and keep "
                "{(e2e(V4)/e2e(O4))/(e2e(V)/e2e(O)):.0%} of its ratio"),
        (MULTI, "on four H100s the step went from {step(D4):.1f} ms (serial, run AB)"),
        (MULTI, "Earlier the same day four GPUs gave DOS {e2e(O4):.0f} ms (run AB, before the gather per subgroup)"),
    ],
    "gpt-2.7b_H100x4_2026-11-27_runAC": [
        (MULTI, "to {step(O4):.1f} ms (run AC,"),
        (MULTI, "measured DOS at {e2e(O2):.1f} ms against vanilla's {e2e(V2):.1f} ms: "
                "**{(e2e(V2)/e2e(O2))/(e2e(V)/e2e(O)):.0%}** of its one-GPU ratio kept (90% aimed: met)"),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(O):.2f}x** vanilla at one GPU ({e2e(O):.0f} vs {e2e(V):.0f} ms), "
                "**{e2e(V2)/e2e(O2):.2f}x** at two ({e2e(O2):.0f} vs {e2e(V2):.0f} ms, "
                "{(e2e(V2)/e2e(O2))/(e2e(V)/e2e(O)):.0%} kept) and **{e2e(V4)/e2e(O4):.2f}x** at four "
                "({e2e(O4):.0f} vs {e2e(V4):.0f} ms, {(e2e(V4)/e2e(O4))/(e2e(V)/e2e(O)):.0%} kept: 85% aimed, "
                "missed); four GPUs give **{tps(O4)/tps(O):.2f}x** one GPU's tokens/s"),
    ],
    RUN_AD: [
        (README, "Vanilla's one-GPU row is an example: {run(RUN_AF).e2e(V):.0f} ms end to end in run AF, "
                 "{run(RUN_AF).it(V):.0f} ms there with the phases synchronised, and {e2e(V):.0f} ms end to end in "
                 "run AD on another host of the same kind."),
        (README, "In run AD, on one H100, that ran at plain PyTorch's speed ({e2e(D):.0f} against {e2e(P):.0f} ms, "
                 "at {gpu(D):.2f} against {gpu(P):.2f} GiB), against ZeRO-3 without offload's {e2e(N):.0f} ms, "
                 "torchao's `CPUOffloadOptimizer`'s {e2e(T):.0f} ms at {gpu(T):.2f} GiB (its update, torch's AdamW on "
                 "the host's CPU, took {step(T)/1000:.1f} s on that host's CPU) and FSDP with CPU offload's "
                 "{e2e(F):.0f} ms; at four GPUs ZeRO-3 without offload took {e2e(N4):.0f} ms and FSDP with CPU "
                 "offload {e2e(F4):.0f} ms."),
        (MULTI, "| DOS, no options | {e2e(D):.1f} ms ({fwd(D):.1f} / {bwd(D):.1f} / {step(D):.1f} ms) | "
                "{e2e(D4):.1f} ms ({fwd(D4):.1f} / {bwd(D4):.1f} / {step(D4):.1f} ms) | | {tps(D4):,.0f} "
                "({tps(D4)/tps(D):.2f}x) | {gpu(D4):.2f} GiB |"),
        (MULTI, "| vanilla ZeRO-3 offload | {e2e(V):.1f} ms | {e2e(V4):.1f} ms | {e2e(V4)/e2e(D4):.2f}x | "
                "{tps(V4):,.0f} ({tps(V4)/tps(V):.2f}x) | {gpu(V4):.2f} GiB |"),
        (MULTI, "| ZeRO-3 without offload | {e2e(N):.1f} ms | {e2e(N4):.1f} ms | {e2e(N4)/e2e(D4):.2f}x | "
                "{tps(N4):,.0f} ({tps(N4)/tps(N):.2f}x) | {gpu(N4):.2f} GiB |"),
        (MULTI, "| FSDP with CPU offload | {e2e(F):.1f} ms | {e2e(F4):.1f} ms | {e2e(F4)/e2e(D4):.2f}x | "
                "{tps(F4):,.0f} ({tps(F4)/tps(F):.2f}x) | {gpu(F4):.2f} GiB |"),
        (MULTI, "| plain PyTorch (one GPU only) | {e2e(P):.1f} ms |"),
        (MULTI, "| torchao `CPUOffloadOptimizer` (one GPU only) | {e2e(T):.1f} ms |"),
        (MULTI, "Losses after 10 steps, DOS against vanilla: {row(D).final_loss:.4f} / {row(V).final_loss:.4f} at "
                "one GPU, {row(D4).final_loss:.4f} / {row(V4).final_loss:.4f} at four."),
        (MULTI, "DOS at four GPUs is **{e2e(V4)/e2e(D4):.2f}x** vanilla at four (3.0x aimed: met), gives "
                "**{tps(D4)/tps(D):.2f}x** its one-GPU tokens/s (3.4x aimed: met), and is faster than ZeRO-3 without "
                "offload (**{e2e(N4)/e2e(D4):.2f}x**: met) and **{e2e(F4)/e2e(D4):.2f}x** FSDP with CPU offload at "
                "four (2x aimed: met). It keeps **{(e2e(V4)/e2e(D4))/(e2e(V)/e2e(D)):.0%}** of its one-GPU ratio "
                "({e2e(V)/e2e(D):.2f}x → {e2e(V4)/e2e(D4):.2f}x; 85% aimed: **missed**)"),
        (MULTI, "vanilla's iteration falls to {e2e(V4)/e2e(V):.0%} at four GPUs (its update is CPU Adam over a "
                "quarter of the state: {step(V):.0f} → {step(V4):.0f} ms of step), so even if four GPUs cost DOS "
                "nothing it would keep {e2e(V4)/e2e(V):.0%};"),
        (MULTI, "already runs at plain PyTorch's speed ({e2e(D):.1f} vs {e2e(P):.1f} ms). Four GPUs cost DOS "
                "{e2e(D4)-e2e(D):.0f} ms per iteration: {fwd(D4)-fwd(D):.0f} ms of forward, {bwd(D4)-bwd(D):.0f} of "
                "backward"),
        (MULTI, "and {step(D4)-step(D):.0f} of step"),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(D):.2f}x** vanilla at one GPU ({e2e(D):.0f} vs {e2e(V):.0f} ms, as "
                "fast as plain PyTorch's {e2e(P):.0f} ms) and **{e2e(V4)/e2e(D4):.2f}x** at four ({e2e(D4):.0f} vs "
                "{e2e(V4):.0f} ms, {(e2e(V4)/e2e(D4))/(e2e(V)/e2e(D)):.0%} kept: 85% aimed, missed, and bounded by "
                "vanilla's own {e2e(V4)/e2e(V):.0%}); at four GPUs **{e2e(N4)/e2e(D4):.2f}x** ZeRO-3 without "
                "offload ({e2e(N4):.0f} ms) and **{e2e(F4)/e2e(D4):.2f}x** FSDP with CPU offload ({e2e(F4):.0f} ms); "
                "four GPUs give **{tps(D4)/tps(D):.2f}x** one GPU's tokens/s; torchao's offload {e2e(T):.0f} ms at "
                "one GPU"),
    ],
    RUN_AF: [
        (README, "| gpt-2.7b ({model.params/1e9:.2f}B) | H100 | {e2e(V):.0f} ms, {gpu(V):.2f} GiB | {e2e(S):.0f} ms, "
                 "{gpu(S):.2f} GiB | {e2e(D):.0f} ms, {gpu(D):.2f} GiB (no options: all state resident, `overlap`) | "
                 "{e2e(V)/e2e(D):.2f}x |"),
        (README, "| gpt-2.7b, 4 GPUs (data parallel) | 4 x H100 | {e2e(V4):.0f} ms, {gpu(V4):.2f} GiB | "
                 "{e2e(S4):.0f} ms, {gpu(S4):.2f} GiB | {e2e(D4):.0f} ms, {gpu(D4):.2f} GiB ({tps(D4):,.0f} tokens/s: "
                 "{tps(D4)/tps(D):.2f}x one GPU's) | {e2e(V4)/e2e(D4):.2f}x |"),
        (PAGE, "four GPUs give DOS {tps(D4)/tps(D):.2f}x the tokens/s of one, and DOS stays {e2e(V4)/e2e(D4):.2f}x "
               "vanilla at four (end to end); the share of its one-GPU lead kept at four is "
               "{(e2e(V4)/e2e(D4))/(e2e(V)/e2e(D)):.2f} end to end ({(it(V4)/it(D4))/(it(V)/it(D)):.2f} "
               "synchronised), against 0.85 aimed. At one GPU DOS with no options keeps all of gpt-2.7b's state "
               "resident and runs an iteration in {e2e(D):.0f} ms, while vanilla's update runs on the CPU (here "
               "{e2e(V):,.0f} ms end to end, {it(V):,.0f} ms with the phases synchronised"),
        (PAGE, "Keeping 0.85 of the one-GPU lead would need DOS's four-GPU iteration at "
               "{e2e(D)*(e2e(V4)/e2e(V))/0.85:.0f} ms, below its own forward and backward at four "
               "({fwd(D4)+bwd(D4):.0f} ms synchronised). The static split, no overlap and half its state streamed, "
               "ran {e2e(S):,.0f} ms at one GPU and {e2e(S4):,.0f} ms at four, at {gpu(S):.2f} and {gpu(S4):.2f} GiB: "
               "DOS is {e2e(S)/e2e(D):.2f}x and {e2e(S4)/e2e(D4):.2f}x faster, at more GPU memory (its residents: "
               "{gpu(D):.2f} and {gpu(D4):.2f} GiB)"),
        (MULTI, "| DOS, no options | {e2e(D):.1f} ms | {e2e(D4):.1f} ms | | {tps(D4):,.0f} ({tps(D4)/tps(D):.2f}x) | "
                "{gpu(D4):.2f} GiB |"),
        (MULTI, "| vanilla ZeRO-3 offload | {e2e(V):.1f} ms | {e2e(V4):.1f} ms | {e2e(V4)/e2e(D4):.2f}x | "
                "{tps(V4):,.0f} ({tps(V4)/tps(V):.2f}x) | {gpu(V4):.2f} GiB |"),
        (MULTI, "| static split 0.5 | {e2e(S):.1f} ms | {e2e(S4):.1f} ms | {e2e(S4)/e2e(D4):.2f}x | "
                "{tps(S4):,.0f} ({tps(S4)/tps(S):.2f}x) | {gpu(S4):.2f} GiB |"),
        (MULTI, "streamed, shortens its iteration by {1-e2e(S4)/e2e(S):.0%} at four GPUs where vanilla's halves"),
        (MULTI, "Again DOS keeps less of its one-GPU lead than aimed ({(e2e(V4)/e2e(D4))/(e2e(V)/e2e(D)):.2f} end to "
                "end, {(it(V4)/it(D4))/(it(V)/it(D)):.2f} synchronised): on this host vanilla's unsynchronised one-GPU "
                "iterations were slower than its synchronised ones ({e2e(V):,.0f} against {it(V):,.0f} ms)"),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(D):.2f}x** vanilla at one GPU ({e2e(D):.0f} vs {e2e(V):.0f} ms) and "
                "**{e2e(V4)/e2e(D4):.2f}x** at four ({e2e(D4):.0f} vs {e2e(V4):.0f} ms; "
                "{(e2e(V4)/e2e(D4))/(e2e(V)/e2e(D)):.0%} kept, 85% aimed: missed); the split {e2e(S):.0f} and "
                "{e2e(S4):.0f} ms at {gpu(S):.2f} and {gpu(S4):.2f} GiB (DOS {e2e(S)/e2e(D):.2f}x and "
                "{e2e(S4)/e2e(D4):.2f}x faster, at more GPU memory); four GPUs give **{tps(D4)/tps(D):.2f}x** one "
                "GPU's tokens/s"),
    ],
    RUN_AG: [
        (PAGE, "with no budget `auto` ran {budget('unlimited').b.auto.update_ms:.1f} ms against the best fixed plan's "
               "{budget('unlimited').b.best.update_ms:.1f} ms (plan {budget('unlimited').b.best.plan}; "
               "{budget('unlimited').target(AUTO_VS_BEST).value:+.1%}, within 5%: "
               "{budget('unlimited').target(AUTO_VS_BEST).status}); at the quarter budget "
               "({budget('quarter').b.budget.gib:.2f} GiB a rank) {budget('quarter').b.auto.update_ms:.1f} ms against "
               "plan {budget('quarter').b.best.plan}'s {budget('quarter').b.best.update_ms:.1f} ms "
               "({budget('quarter').target(AUTO_VS_BEST).value:+.2%}: {budget('quarter').target(AUTO_VS_BEST).status}, "
               "by {100*budget('quarter').target(AUTO_VS_BEST).value-5:.2f} points), where it chose a device fraction "
               "of {budget('quarter').b.auto.device_fraction:.2f} that ran between plans 0.5 and 0.6 "
               "({budget('quarter').plan('0.5').update_ms:.1f} and {budget('quarter').plan('0.6').update_ms:.1f} ms); "
               "each fixed plan's median is of "
               "{one(*[p['measured_steps'] for b in per_budget for p in budget(b).b.plans])} "
               "update phases. The fixed plans' median prediction errors were "
               "{budget('unlimited').b.prediction_error_median:.1%} and "
               "{budget('quarter').b.prediction_error_median:.1%} "
               "(10% aimed: {one(*[budget(b).target(PREDICTION).status for b in per_budget])}), no process ran out of "
               "memory, and `auto` beat every `stride:K` at both budgets."),
        (MULTI, "`auto` ran {budget('unlimited').b.auto.update_ms:.1f} ms against the best fixed plan's "
                "{budget('unlimited').b.best.update_ms:.1f} ms with no budget "
                "({budget('unlimited').target(AUTO_VS_BEST).value:+.1%}: "
                "{budget('unlimited').target(AUTO_VS_BEST).status}) "
                "and {budget('quarter').b.auto.update_ms:.1f} against {budget('quarter').b.best.update_ms:.1f} ms at "
                "the quarter budget ({budget('quarter').target(AUTO_VS_BEST).value:+.2%}: "
                "**{budget('quarter').target(AUTO_VS_BEST).status}** by "
                "{100*budget('quarter').target(AUTO_VS_BEST).value-5:.2f} "
                "points)"),
        (INDEX, "`auto` {budget('unlimited').target(AUTO_VS_BEST).value:+.1%} from the best fixed plan with no budget "
                "(met) and {budget('quarter').target(AUTO_VS_BEST).value:+.2%} at the quarter budget (5% aimed: "
                "missed by {100*budget('quarter').target(AUTO_VS_BEST).value-5:.2f} points); prediction errors "
                "{budget('unlimited').b.prediction_error_median:.1%} and "
                "{budget('quarter').b.prediction_error_median:.1%}"),
        (MULTI, "An update phase of a quarter of gpt-2.7b's state, all of it through the lanes, took "
                "{budget('unlimited').b.auto.update_ms:.0f} ms at four GPUs: the host lane alone (plan 0.0) "
                "{budget('unlimited').plan('0.0').update_ms:.0f} ms, every subgroup through the device lane (plan 1.0) "
                "{budget('unlimited').plan('1.0').update_ms:.0f} ms."),
        (MULTI, "each fixed plan's median is of two update phases, and plans 0.5 and 0.6, on either side of `auto`'s "
                "choice, ran {budget('quarter').plan('0.5').update_ms:.1f} and "
                "{budget('quarter').plan('0.6').update_ms:.1f} ms"),
    ],
    RUN_AE: [
        (README, "| gpt-13b ({model.params/1e9:.1f}B), 4 GPUs (data parallel) | 4 x H100 | {e2e(V4):.0f} ms, "
                 "{gpu(V4):.2f} GiB | not run | {e2e(D4):.0f} ms, {gpu(D4):.2f} GiB (all state resident; ZeRO-3 "
                 "without offload: {e2e(N4):.0f} ms) | {e2e(V4)/e2e(D4):.2f}x |"),
        (MULTI, "| DOS, no options | {e2e(D4):.1f} ms | | {tps(D4):,.0f} | {gpu(D4):.2f} GiB |"),
        (MULTI, "| vanilla ZeRO-3 offload | {e2e(V4):.1f} ms | {e2e(V4)/e2e(D4):.2f}x | {tps(V4):,.0f} | "
                "{gpu(V4):.2f} GiB |"),
        (MULTI, "| ZeRO-3 without offload | {e2e(N4):.1f} ms | {e2e(N4)/e2e(D4):.2f}x | {tps(N4):,.0f} | "
                "{gpu(N4):.2f} GiB |"),
        (MULTI, "| FSDP with CPU offload | {e2e(F4):.1f} ms | {e2e(F4)/e2e(D4):.2f}x | {tps(F4):,.0f} | "
                "{gpu(F4):.2f} GiB |"),
        (MULTI, "Targets for a model of about 13B at four GPUs: DOS **{e2e(V4)/e2e(D4):.2f}x** vanilla (2.5x aimed: "
                "met) and **{e2e(F4)/e2e(D4):.2f}x** FSDP with CPU offload (1.5x aimed: met). Losses after 6 steps, "
                "DOS against vanilla: {row(D4).final_loss:.4f} / {row(V4).final_loss:.4f}. The model's "
                "{model.params/1e9:.1f} B parameters"),
        (MULTI, "DOS with no options kept all of it resident ({row(D4).dos.resident_params*12/1024**3:.2f} GiB)"),
        (INDEX, "end to end: DOS **{e2e(V4)/e2e(D4):.2f}x** vanilla ({e2e(D4):.0f} vs {e2e(V4):.0f} ms), "
                "**{e2e(N4)/e2e(D4):.2f}x** ZeRO-3 without offload ({e2e(N4):.0f} ms) and "
                "**{e2e(F4)/e2e(D4):.2f}x** FSDP with CPU offload ({e2e(F4):.0f} ms); every rank kept its whole "
                "partition of the state resident ({row(D4).dos.resident_params*12/1024**3:.2f} GiB)"),
        (PAGE, "so DOS with no options kept every subgroup resident "
               "({row(D4).dos.resident_params*12/1024**3:.2f} GiB) and offloaded nothing; ZeRO-3 without offload "
               "fits too ({gpu(N4):.2f} GiB)"),
    ],
    RUN_AH: [
        (README, "| gpt-4b ({model.params/1e9:.2f}B) | H100 | {e2e(V):.0f} ms, {gpu(V):.2f} GiB | not run | "
                 "{e2e(D):.0f} ms, {gpu(D):.2f} GiB (all state resident) | {e2e(V)/e2e(D):.2f}x |"),
        (PAGE, "DOS with no options ran an iteration in {e2e(D):.0f} ms end to end against vanilla ZeRO-3 offload's "
               "{e2e(V):,.0f} ms, {e2e(V)/e2e(D):.2f}x (3.5x aimed: met). gpt-4b's optimizer state fits this GPU "
               "beside the training: `resident_gib=\"auto\"` kept all "
               "{one(len(row(D).dos.resident_subgroups), row(D).dos.subgroups)} subgroups resident "
               "({" + RESIDENT_GIB + ":.2f} GiB, {gpu(D):.2f} GiB peak)"),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(D):.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms, 3.5x aimed: met); "
                "every subgroup resident ({" + RESIDENT_GIB + ":.2f} GiB)"),
    ],
    RUN_AI: [
        (README, "| gpt-5b ({model.params/1e9:.2f}B) | H100 | {e2e(V):.0f} ms, {gpu(V):.2f} GiB | not run | "
                 "{e2e(D):.0f} ms, {gpu(D):.2f} GiB ({len(row(D).dos.resident_subgroups)} of {row(D).dos.subgroups} "
                 "subgroups resident, the rest offloaded) | {e2e(V)/e2e(D):.2f}x |"),
        (PAGE, "DOS with no options ran an iteration in {e2e(D):.0f} ms end to end against vanilla ZeRO-3 offload's "
               "{e2e(V):,.0f} ms, {e2e(V)/e2e(D):.2f}x (3.5x aimed: met). This model's state does not fit the GPU: "
               "`resident_gib=\"auto\"` kept {len(row(D).dos.resident_subgroups)} of its {row(D).dos.subgroups} "
               "subgroups resident ({" + RESIDENT_GIB + ":.2f} GiB) and `auto` shared the other "
               "{row(D).dos.subgroups-len(row(D).dos.resident_subgroups)} between the host's CPU Adam and the device "
               "lane, an update phase of {upd(D):.0f} ms (synchronised median) overlapped with the next forward. Host "
               "memory bounds the model size on this host: DOS peaked at {host(D):.2f} GiB of host memory and vanilla "
               "at {host(V):.2f}"),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(D):.2f}x** vanilla ({e2e(D):.0f} vs {e2e(V):.0f} ms, 3.5x aimed: met); "
                "{len(row(D).dos.resident_subgroups)} of {row(D).dos.subgroups} subgroups resident "
                "({" + RESIDENT_GIB + ":.2f} GiB), the rest offloaded; host memory {host(D):.2f} GiB at its peak"),
    ],
    RUN_AK: [
        (README, "(in run AK, 6.0 GiB on one H200: gpt-2.7b ran {e2e(D):.0f} ms at {gpu(D):.2f} GiB peak, torchao's "
                 "offload {e2e(T):.0f} ms at {gpu(T):.2f} GiB)"),
        (PAGE, "with `memory_budget_gib` 6.0 DOS ran an iteration in {e2e(D):,.0f} ms end to end at {gpu(D):.2f} GiB "
               "peak, torchao's offload {e2e(T):,.0f} ms at {gpu(T):.2f} GiB: {e2e(D)/e2e(T):.2f}x torchao's time at "
               "{gpu(D)/gpu(T):.0%} of its peak GPU memory (at most 0.85x at 60% aimed: **missed** on this host). "
               "Where the time went: the budget kept {len(row(D).dos.resident_subgroups)} subgroups resident "
               "({" + RESIDENT_GIB + ":.2f} GiB). The probe's mixed step now ran its device lane with both buffer "
               "slots and {'none' if updates(D)[2].demoted_subgroups == 0 else updates(D)[2].demoted_subgroups} of "
               "its subgroups demoted ({updates(D)[2].update_ms:.0f} ms against {updates(D)[2].predicted_ms:.0f} "
               "predicted), and `auto` then chose {'one slot' if updates(D)[3].buffers == 1 else 'slots'} with the "
               "gradients of its device subgroups kept on the GPU, the device lane taking "
               "{updates(D)[3].device_fraction:.0%} of the other subgroups' parameters: updates 4-{len(updates(D))} "
               "ran {min(u.update_ms for u in updates(D)[3:]):.0f}-{max(u.update_ms for u in updates(D)[3:]):.0f} ms "
               "against {min(u.predicted_ms for u in updates(D)[3:]):.0f}-"
               "{max(u.predicted_ms for u in updates(D)[3:]):.0f} ms predicted, the host lane waiting "
               "{min(u.host_busy_ms - u.host_compute_ms for u in updates(D)[3:]):.0f}-"
               "{max(u.host_busy_ms - u.host_compute_ms for u in updates(D)[3:]):.0f} ms beyond its CPU Adam for the "
               "link its uploads share with the device lane's prefetches. The update phase ({upd(D):.0f} ms, "
               "synchronised median) outlasts the next forward it overlaps, so DOS's forward took {fwd(D):.0f} ms "
               "against torchao's {fwd(T):.0f} ms"),
        (INDEX, "end to end: DOS {e2e(D):.0f} ms at {gpu(D):.2f} GiB, torchao {e2e(T):.0f} ms at {gpu(T):.2f} GiB: "
                "**{e2e(D)/e2e(T):.2f}x** its time at {gpu(D)/gpu(T):.0%} of its peak GPU memory (0.85x at 60% aimed: "
                "missed); the probe measured both lanes this time, and `auto`'s plans ran "
                "{min(u.update_ms / u.predicted_ms for u in updates(D)[3:]):.2f}-"
                "{max(u.update_ms / u.predicted_ms for u in updates(D)[3:]):.2f}x their predicted update phase"),
    ],
    RUN_AL: [
        (PAGE, "End to end DOS ran an iteration in {e2e(D):.0f} ms at one GPU and {e2e(D2):.0f} ms at two: "
               "**{e2e(V)/e2e(D):.2f}x** vanilla at one and **{e2e(V2)/e2e(D2):.2f}x** at two, "
               "{(e2e(V2)/e2e(D2))/(e2e(V)/e2e(D)):.2f} of its one-GPU lead kept ({(it(V2)/it(D2))/(it(V)/it(D)):.2f} "
               "synchronised; 0.9 aimed at two GPUs: **missed**), and two GPUs gave DOS {tps(D2)/tps(D):.2f}x the "
               "tokens/s of one (vanilla {tps(V2)/tps(V):.2f}x). Where the time went: vanilla's own iteration fell "
               "only to {e2e(V2)/e2e(V):.0%} at two GPUs ({e2e(V):,.0f} → {e2e(V2):,.0f} ms), so even a second GPU "
               "that cost DOS nothing would keep {e2e(V2)/e2e(V):.2f} of the lead; it cost DOS {e2e(D2)-e2e(D):.0f} ms "
               "per iteration end to end, {it(D2)-it(D):.0f} ms synchronised: {fwd(D2)-fwd(D):.0f} ms of forward, "
               "{bwd(D2)-bwd(D):.0f} of backward (where the gradients' reduce-scatter runs) and {step(D2)-step(D):.0f} "
               "of step (where the gather per subgroup and the gradient norm's all-reduce run). Every subgroup stayed "
               "resident at both rank counts ({len(row(D).dos.resident_subgroups)} and "
               "{len(row(D2).dos.resident_subgroups)}; {gpu(D):.2f} and {gpu(D2):.2f} GiB peak): no state crossed the "
               "host."),
        (MULTI, "| DOS, no options (every subgroup resident) | {e2e(D):.1f} ms | {e2e(D2):.1f} ms | | {tps(D2):,.0f} "
                "({tps(D2)/tps(D):.2f}x) | {gpu(D2):.2f} GiB |"),
        (MULTI, "| vanilla ZeRO-3 offload (same invocation) | {e2e(V):.1f} ms | {e2e(V2):.1f} ms | "
                "{e2e(V2)/e2e(D2):.2f}x | {tps(V2):,.0f} ({tps(V2)/tps(V):.2f}x) | {gpu(V2):.2f} GiB |"),
        (MULTI, "With nothing streamed DOS keeps {(e2e(V2)/e2e(D2))/(e2e(V)/e2e(D)):.2f} of its one-GPU lead at two "
                "GPUs (0.9 aimed: **missed**): a second GPU costs it {e2e(D2)-e2e(D):.0f} ms per iteration (the "
                "gathers and reduce-scatters of data parallelism) while vanilla's iteration falls only to "
                "{e2e(V2)/e2e(V):.0%}."),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(D):.2f}x** vanilla at one GPU ({e2e(D):.0f} vs {e2e(V):.0f} ms, every "
                "subgroup resident) and **{e2e(V2)/e2e(D2):.2f}x** at two ({e2e(D2):.0f} vs {e2e(V2):.0f} ms; "
                "{(e2e(V2)/e2e(D2))/(e2e(V)/e2e(D)):.0%} kept, 90% aimed: missed); two GPUs give "
                "**{tps(D2)/tps(D):.2f}x** one GPU's tokens/s"),
    ],
    RUN_AM: [
        (PAGE, "End to end DOS ran an iteration in {e2e(D):.0f} ms at one GPU and {e2e(D2):.0f} ms at two: "
               "**{e2e(V)/e2e(D):.2f}x** vanilla at one and **{e2e(V2)/e2e(D2):.2f}x** at two, "
               "{(e2e(V2)/e2e(D2))/(e2e(V)/e2e(D)):.2f} of its one-GPU lead kept ({(it(V2)/it(D2))/(it(V)/it(D)):.2f} "
               "synchronised; 0.9 aimed: met), and two GPUs gave DOS {tps(D2)/tps(D):.2f}x the tokens/s of one "
               "(vanilla {tps(V2)/tps(V):.2f}x). With the state streaming the update shrinks with the partition: its "
               "update phase (synchronised median) took {upd(D):.0f} ms at one GPU and {upd(D2):.0f} ms at two, with "
               "{row(D).dos.h2d_gb:.2f} and {row(D2).dos.h2d_gb:.2f} GB host-to-device per rank; the budget kept "
               "{len(row(D).dos.resident_subgroups)} and {len(row(D2).dos.resident_subgroups)} subgroups resident. "
               "Where the time went at two GPUs: the update no longer overlaps the next forward. On one GPU the "
               "forward waits for it subgroup by subgroup (forward {fwd(D):.0f} ms, step {step(D):.0f} ms, "
               "synchronised); on two the gather per subgroup after the step issues every subgroup's all-gather on the "
               "training stream, each waiting for its subgroup's update, so the step holds the whole update (step "
               "{step(D2):.0f} ms, forward {fwd(D2):.0f} ms)."),
        (MULTI, "| DOS, `memory_budget_gib` 6.0 (state streamed) | {e2e(D):.1f} ms | {e2e(D2):.1f} ms | | "
                "{tps(D2):,.0f} ({tps(D2)/tps(D):.2f}x) | {gpu(D2):.2f} GiB |"),
        (MULTI, "| vanilla ZeRO-3 offload (same invocation) | {e2e(V):.1f} ms | {e2e(V2):.1f} ms | "
                "{e2e(V2)/e2e(D2):.2f}x | {tps(V2):,.0f} ({tps(V2)/tps(V):.2f}x) | {gpu(V2):.2f} GiB |"),
        (MULTI, "With the state streamed it keeps {(e2e(V2)/e2e(D2))/(e2e(V)/e2e(D)):.2f} (met): the update shrinks "
                "with the partition (update phase {upd(D):.0f} → {upd(D2):.0f} ms, {row(D).dos.h2d_gb:.2f} → "
                "{row(D2).dos.h2d_gb:.2f} GB host-to-device per rank;"),
        (MULTI, "there the update runs inside the step ({step(D2):.0f} ms, synchronised), not beside the next forward "
                "as on one GPU"),
        (INDEX, "end to end: DOS **{e2e(V)/e2e(D):.2f}x** vanilla at one GPU ({e2e(D):.0f} vs {e2e(V):.0f} ms) and "
                "**{e2e(V2)/e2e(D2):.2f}x** at two ({e2e(D2):.0f} vs {e2e(V2):.0f} ms; "
                "{(e2e(V2)/e2e(D2))/(e2e(V)/e2e(D)):.0%} kept); two GPUs give **{tps(D2)/tps(D):.2f}x** one GPU's "
                "tokens/s; update phase {upd(D):.0f} → {upd(D2):.0f} ms, but at two ranks it runs inside the step, not "
                "beside the next forward"),
    ],
    "hf-llama-1b_H200_2026-11-28": [
        (RECIPES, "| `deep_optimizer_states` (`plan: auto`) | {r(DOS).iteration_ms:.1f} ms | "
                  "{r(DOS).tokens_per_s:,.0f} | {r(DOS).update_ms:.1f} ms | {r(DOS).peak_gpu_gib:.2f} GiB | "
                  "{r(DOS).peak_host_gib:.2f} GiB |"),
        (RECIPES, "| `zero3_offload` | {r(V).iteration_ms:,.1f} ms | {r(V).tokens_per_s:,.0f} | | "
                  "{r(V).peak_gpu_gib:.2f} GiB | {r(V).peak_host_gib:.2f} GiB |"),
        (RECIPES, "DOS ran an iteration in {r(V).iteration_ms/r(DOS).iteration_ms:.2f}x less time than vanilla ZeRO-3 "
                  "offload; after {r(DOS).steps} steps both reached the same validation loss "
                  "({r(DOS).val_loss_last:.3f} and {r(V).val_loss_last:.3f}) and train loss "
                  "({r(DOS).train_loss_last:.3f} and {r(V).train_loss_last:.3f})"),
        (INDEX, "DOS {r(DOS).iteration_ms:.0f} ms, vanilla ZeRO-3 offload {r(V).iteration_ms:,.0f} ms: "
                "**{r(V).iteration_ms/r(DOS).iteration_ms:.2f}x**"),
    ],
    RUN_AJ: [
        (PAGE, "with `memory_budget_gib` 4.5 DOS ran an iteration in {e2e(D):,.0f} ms end to end at {gpu(D):.2f} GiB "
               "peak, torchao's offload {e2e(T):,.0f} ms at {gpu(T):.2f} GiB: {e2e(D)/e2e(T):.2f}x torchao's time at "
               "{gpu(D)/gpu(T):.0%} of its peak GPU memory (at most 0.85x at 60% aimed: **missed** on this host). "
               "Where the time went: the budget kept {len(row(D).dos.resident_subgroups)} subgroups resident "
               "({" + RESIDENT_GIB + ":.2f} GiB) and left the device lane one buffer slot; the host's CPU Adam updated "
               "{1-row(D).dos.device_fraction:.0%} of the other subgroups' parameters and the device lane streamed the "
               "rest through that slot. The update phase ({upd(D):.0f} ms, synchronised median) outlasts the next "
               "forward it overlaps, so DOS's forward took {fwd(D):.0f} ms against torchao's {fwd(T):.0f} ms"),
        (PAGE, "its probe's mixed step ran with all {updates(D)[2].demoted_subgroups} of its device-lane subgroups "
               "demoted to the host (two buffer slots, each counted as a whole subgroup, did not fit the budget), so "
               "`auto` chose before it had measured the device lane, and updates 4-9 ran "
               "{min(u.update_ms for u in updates(D)[3:9]):.0f}-"
               "{max(u.update_ms for u in updates(D)[3:9]):.0f} ms against "
               "{min(u.predicted_ms for u in updates(D)[3:9]):.0f}-{max(u.predicted_ms for u in updates(D)[3:9]):.0f} "
               "ms predicted, {'the device' if min(u.device_busy_ms - u.host_busy_ms for u in updates(D)[3:9]) > 0 "
               "else 'no'} lane ending last in each"),
        (INDEX, "end to end: DOS {e2e(D):.0f} ms at {gpu(D):.2f} GiB, torchao {e2e(T):.0f} ms at {gpu(T):.2f} GiB: "
                "**{e2e(D)/e2e(T):.2f}x** its time at {gpu(D)/gpu(T):.0%} of its peak GPU memory (0.85x at 60% aimed: "
                "missed; `auto` chose before it had measured the device lane)"),
    ],
    "rok_gpt-1b_H200_2026-11-25_runV": [
        (ACT, "`\"host\"` cut peak activation memory by {pl('offload-host').reduction_vs_keep:.0%} against keeping "
              "everything ({pl('offload-host').peak_activation_gib:.2f} vs {pl('keep').peak_activation_gib:.1f} GiB) "
              "at +{pl('offload-host').overhead_vs_keep:.0%} iteration time ({pl('offload-host').headline_ms:.1f} vs "
              "{pl('keep').headline_ms:.1f} ms end to end; run R: +41%), slower than activation checkpointing at the "
              "same peak ({pl('recompute').headline_ms:.1f} ms)"),
        (ACT, "keeping everything fits micro-batch {search('keep').largest_micro_batch} "
              "({search('keep').tokens_per_s:,.0f} tokens/s), `\"host\"` and recompute fit "
              "{search('offload-host').largest_micro_batch} ({search('offload-host').tokens_per_s:,.0f} and "
              "{search('recompute').tokens_per_s:,.0f} tokens/s)"),
        (PAGE, "within {budget.budget_gib:g} GiB of peak activation memory, keep fits micro-batch "
               "{search('keep').largest_micro_batch} ({search('keep').tokens_per_s:,.0f} tokens/s), recompute and "
               "offload-host both fit {search('recompute').largest_micro_batch}: recompute "
               "{search('recompute').tokens_per_s:,.0f} tokens/s, offload-host "
               "{search('offload-host').tokens_per_s:,.0f}, **{claims[2].value:.2f}x keep's** (the budget claim, "
               "{claims[2].status}"),
        (PAGE, "offload-host cuts peak activation memory by {claims[0].value:.0%} at "
               "+{pl('offload-host').overhead_vs_keep:.0%} iteration time ({pl('offload-host').headline_ms:.1f} vs "
               "{pl('keep').headline_ms:.1f} ms end to end) and is slower than recompute "
               "({pl('recompute').headline_ms:.1f} ms, +{pl('recompute').overhead_vs_keep:.0%}) at the same peak: "
               "the first two claims are {claims[0].status}"),
        (INDEX, "within {budget.budget_gib:g} GiB: keep micro-batch {search('keep').largest_micro_batch} at "
                "{search('keep').tokens_per_s:,.0f} tokens/s, recompute and offload-host "
                "{search('recompute').largest_micro_batch} at **{search('recompute').tokens_per_s:,.0f}** and "
                "**{search('offload-host').tokens_per_s:,.0f}** tokens/s (budget claim {claims[2].status}); at "
                "micro-batch {pl('keep').micro_batch} offload-host {claims[0].value:.0%} below keep's peak at "
                "**+{pl('offload-host').overhead_vs_keep:.0%}** time, slower than recompute "
                "(+{pl('recompute').overhead_vs_keep:.0%}): both curve claims {claims[0].status}"),
    ],
    "rok_gpt-1b_H200_2026-11-25_runV_nvme": [
        (ACT, "finished at {pl('offload-nvme').headline_ms:,.0f} ms per iteration on that host's disk "
              "({disk.write_mb_s/1e3:.1f} GB/s write, {disk.read_mb_s/1e3:.1f} GB/s read"),
        (PAGE, "{pl('offload-nvme').headline_ms:,.1f} ms per iteration end to end, "
               "{pl('offload-nvme').tokens_per_s:.0f} tokens/s, at the same "
               "{pl('offload-nvme').peak_activation_gib:.2f} GiB peak activation memory as offload-host"),
        (PAGE, "measured bandwidth is {disk.write_mb_s:,.0f} MB/s write and {disk.read_mb_s:,.0f} MB/s read"),
        (INDEX, "offload-nvme {pl('offload-nvme').headline_ms:,.0f} ms per iteration on a {disk.read_mb_s/1e3:.1f} "
                "GB/s disk"),
    ],
    **{stem: [(INDEX, "({report}.md) | {model}, {b.budget.label} | {b.best.plan}: {b.best.update_ms:.1f} | "
                      "{b.auto.update_ms:.1f} | **{target(AUTO_VS_BEST).value:+.1%}** | "
                      "{b.prediction_error_median:.1%} | {n('met')} of {targets} met |")]
       for stem in ("sweep_gpt-1b_H200_2026-11-21_runQ", "sweep_gpt-1b_H200_2026-11-21_runQ_quarter",
                    "sweep_gpt-2.7b_H200_2026-11-21_runQ", "sweep_gpt-2.7b_H200_2026-11-21_runQ_quarter",
                    "sweep_gpt-1b_H200_2026-11-21_runQ2", "sweep_gpt-1b_H200_2026-11-21_runQ2_quarter",
                    "sweep_gpt-2.7b_H200_2026-11-21_runQ2_quarter", "sweep_gpt-1b_H200_2026-11-21_runQ3")},
    "converging_gpt2-124m_H100_2026-11-25_full/converging": [
        (README, "| gpt2-124m (real text) | H100 | {log('vanilla').iteration_ms:.0f} ms, "
                 "{log('vanilla').peak_gpu_gib:.1f} GiB | not run | {log('dos-auto').iteration_ms:.0f} ms, "
                 "{log('dos-auto').peak_gpu_gib:.1f} GiB | "
                 "{log('vanilla').iteration_ms/log('dos-auto').iteration_ms:.2f}x |"),
        *[(CONV, f"| {loss} | {pair} | {{s[{key!r}].{name}.steps}} | {{s[{key!r}].{name}.max:.2e}} | "
                 f"{{s[{key!r}].{name}.mean:.2e}} | {{windows(s[{key!r}].{name})}} |")
          for loss, key, pair, name in (
              ("train", "train/loss", "DOS vs vanilla", "dos_vs_vanilla"),
              ("train", "train/loss", "vanilla vs vanilla (control)", "vanilla_vs_vanilla"),
              ("validation (20 batches)", "val/loss", "DOS vs vanilla, steps 99, 199, 299", "dos_vs_vanilla"),
              ("validation (20 batches)", "val/loss", "vanilla vs vanilla, steps 99, 199, 299", "vanilla_vs_vanilla"))],
        (CONV, "End of the run (step 299): train loss {s.final['dos-auto']['train/loss']:.4f} (DOS), "
               "{s.final.vanilla['train/loss']:.4f} (vanilla), {s.final['vanilla-control']['train/loss']:.4f} "
               "(control); validation loss {s.final['dos-auto']['val/loss']:.4f}, {s.final.vanilla['val/loss']:.4f}, "
               "{s.final['vanilla-control']['val/loss']:.4f}. Speed in the same call (medians after the first 3 "
               "steps, `perf/*`): DOS {log('dos-auto').tokens_per_s/1e3:.1f}k tokens/s "
               "({log('dos-auto').iteration_ms:.0f} ms per iteration, update phase {log('dos-auto').update_ms:.0f} "
               "ms with {log_median('dos-auto', 'dos/device_fraction'):.0%} of the parameters on the GPU lane), "
               "vanilla {log('vanilla').tokens_per_s/1e3:.1f}k tokens/s ({log('vanilla').iteration_ms:.0f} ms); peak "
               "GPU {log('dos-auto').peak_gpu_gib:.1f} vs {log('vanilla').peak_gpu_gib:.1f} GiB."),
        (CONV, "Over all {s['train/loss'].dos_vs_vanilla.steps} steps the mean distance is "
               "{e(s['train/loss'].dos_vs_vanilla.mean, 2)} for DOS against "
               "{e(s['train/loss'].vanilla_vs_vanilla.mean, 2)} for the control "
               "({s['train/loss'].dos_vs_vanilla.mean/s['train/loss'].vanilla_vs_vanilla.mean:.1f}x)."),
        (CONV, "steps 0-74 give {e(s['train/loss'].dos_vs_vanilla.windows[0]['mean'])} against "
               "{e(s['train/loss'].vanilla_vs_vanilla.windows[0]['mean'])} "
               "({s['train/loss'].dos_vs_vanilla.windows[0]['mean']/s['train/loss'].vanilla_vs_vanilla.windows[0]['me"
               "an']:.1f}x)"),
        (INDEX, "mean abs delta train loss: DOS vs vanilla **{e(s['train/loss'].dos_vs_vanilla.mean, 2)}**, control "
                "{e(s['train/loss'].vanilla_vs_vanilla.mean, 2)} (last quarter "
                "{e(s['train/loss'].dos_vs_vanilla.windows[3]['mean'])} vs "
                "{e(s['train/loss'].vanilla_vs_vanilla.windows[3]['mean'])}); validation within the control's "
                "distance; DOS {log('dos-auto').tokens_per_s/1e3:.1f}k tokens/s vs vanilla "
                "{log('vanilla').tokens_per_s/1e3:.1f}k"),
    ],
    "converging_gpt2-124m_H100_2026-11-25/converging": [
        (INDEX, "mean abs delta train loss over steps 0-{s['train/loss'].vanilla_vs_vanilla.steps - 1}: DOS vs vanilla "
                "**{e(s['train/loss'].dos_vs_vanilla_on_control_steps.mean)}**, vanilla vs vanilla "
                "{e(s['train/loss'].vanilla_vs_vanilla.mean)}; DOS {log('dos-auto').tokens_per_s/1e3:.1f}k tokens/s vs "
                "vanilla {log('vanilla').tokens_per_s/1e3:.1f}k "
                "(**{log('dos-auto').tokens_per_s/log('vanilla').tokens_per_s:.2f}x**)"),
    ],
    "soak_H200_2026-11-25/soak": [
        *[(REL, f"| {name} | +{{r({run!r}).rss_gib.slope_per_1000_steps:.4f}} GiB | {reserved} | 0 | "
                f"{{r({run!r}).os_threads.first}} -> {{r({run!r}).os_threads.last}}")
          for name, run, reserved in (
              ("DOS, random plan", "dos-random-plan",
               "+{r('dos-random-plan').gpu_reserved_gib.slope_per_1000_steps:.4f} GiB"),
              ("DOS, random plan, overlap", "dos-random-plan-overlap",
               "+{r('dos-random-plan-overlap').gpu_reserved_gib.slope_per_1000_steps:.4f} GiB"),
              ("vanilla", "vanilla", "{r('vanilla').gpu_reserved_gib.slope_per_1000_steps:.0f}"))],
        (REL, "Both DOS runs changed plans {r('dos-random-plan').plan_changes:,} times "
              "({r('dos-random-plan').distinct_plans} distinct plans); their losses equal each other and stay within "
              "{loss('dos-random-plan').max_abs_diff:.3f} of vanilla's (mean |delta| "
              "{loss('dos-random-plan').mean_abs_diff:.4f}, bf16)"),
        (INDEX, "per 1,000 steps: host RSS +{r('dos-random-plan').rss_gib.slope_per_1000_steps:.3f} GiB (DOS, both) vs "
                "+{r('vanilla').rss_gib.slope_per_1000_steps:.3f} (vanilla), GPU reserved "
                "+{r('dos-random-plan').gpu_reserved_gib.slope_per_1000_steps:.3f} GiB, page-locked host 0, threads "
                "constant; losses within {loss('dos-random-plan').max_abs_diff:.3f} of vanilla's (mean "
                "{loss('dos-random-plan').mean_abs_diff:.4f})"),
    ],
}
# the sentences of docs/performance-model.md about single sweeps, and those about all eight (checked with run Q's first)
QUOTES["sweep_gpt-1b_H200_2026-11-21_runQ3"] += [
    (PERF, "(in run Q3, gpt-1b: plans 0.4 and 0.5 predicted {one(-signed('0.4'), -signed('0.5'), spec='.0%')} short, "
           "`stride:2` {-signed('stride:2'):.0%} short, plans 0.7-1.0 "
           "{between([signed(p) for p in ('0.7', '0.8', '0.9', '1.0')], 0)} long"),
]
QUOTES["sweep_gpt-1b_H200_2026-11-21_runQ2_quarter"] += [
    (PERF, "[Q2, gpt-1b quarter](benchmarks/sweep_gpt-1b_H200_2026-11-21_runQ2_quarter.md), {b.auto.update_ms:.1f} ms "
           "against plan {b.best.plan}'s {b.best.update_ms:.1f})"),
]
QUOTES["sweep_gpt-1b_H200_2026-11-21_runQ"] += [
    (PERF, "eight sweeps of gpt-1b and gpt-2.7b at the `unlimited` and `quarter` budgets, met all "
           "{sum(s['n']('met') for s in every_sweep)} targets"),
    (PERF, "`auto` ran {min(s['target'](AUTO_VS_BEST).value for s in every_sweep):+.1%} to "
           "{max(s['target'](AUTO_VS_BEST).value for s in every_sweep):+.1%} from the best of {len(b.plans)} swept "
           "fixed plans"),
    (PERF, "median prediction errors of the fixed plans' update phases "
           "{between([s['b'].prediction_error_median for s in every_sweep], 1)} (the highest"),
    (PERF, "but at gpt-2.7b's quarter budget by "
           "{between([1 - s['target'](STRIDES).value for s in every_sweep if s['b'].budget.name == 'quarter' and s['m"
           "odel'] == 'gpt-2.7b'], 1)} only"),
    (PERF, "{sum(phases == 4 for s in every_sweep for phases, _ in s['trials'])} of the "
           "{sum(len(s['trials']) for s in every_sweep)} trials ended after two turns of each side, the rest after "
           "three; {between([s['b'].auto.trial_phases for s in every_sweep], None)} of `auto`'s "
           "{one(*[s['b'].auto.measured_steps for s in every_sweep])} measured update phases were candidates' turns"),
]


# ------------------------------------------------------------------------------------------- the test itself
class Obj:
    """A JSON object whose keys read as attributes (nested objects too) or items, for templates."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return Obj(value) if isinstance(value, dict) else value


def _load(stem: str) -> Any:
    return json.loads((BENCHMARKS / f"{stem}.json").read_text())


def _comparison(doc: dict) -> dict[str, Any]:
    rows = {r["label"]: Obj(r) for r in doc["results"]}
    claims = {c["claim"]: Obj(c) for c in doc.get("claims", [])}

    def field(key: str) -> Callable[[str], Any]:
        return lambda label: rows[label][key]

    def statuses(*prefixes: str) -> set[str]:
        return {c.status for name, c in claims.items() if name.startswith(prefixes)}

    def the(status: str) -> Callable[..., str]:
        """``status`` if every claim whose name starts with one of ``prefixes`` has it (else what they have)."""
        return lambda *prefixes: status if statuses(*prefixes) == {status} else str(sorted(statuses(*prefixes)))

    return {"row": rows.__getitem__, "claim": claims.__getitem__, "model": Obj(doc["model"]),
            "n": lambda status: sum(c["status"] == status for c in claims.values()), "claims": len(claims),
            "all_met": the("met"), "all_missed": the("missed"),
            "e2e": field("e2e_iteration_ms"), "it": field("iteration_ms"), "fwd": field("fwd_ms"),
            "bwd": field("bwd_ms"), "step": field("step_ms"), "gpu": field("peak_gpu_gib"),
            "host": field("peak_host_gib"), "fb": lambda label: rows[label]["fwd_ms"] + rows[label]["bwd_ms"],
            "upd": lambda label: rows[label]["dos"]["update_ms"], "tps": field("e2e_tokens_per_s")}


def _recipe_pair(doc: dict) -> dict[str, Any]:
    """A recipe trained under two strategies (the hf recipe's GPU test): ``r(strategy)`` is one run's figures."""
    runs = {r["strategy"]: Obj(r) for r in doc["runs"]}
    return {"r": runs.__getitem__}


def _rok(doc: dict) -> dict[str, Any]:
    placements = {p["placement"]: Obj(p) for p in doc["placements"]}
    searches = {s["placement"]: Obj(s) for s in (doc["budget"] or {"searches": []})["searches"]}
    return {"pl": placements.__getitem__, "search": searches.__getitem__, "budget": Obj(doc["budget"] or {}),
            "claims": [Obj(c) for c in doc["claims"]], "disk": Obj(doc["disk"])}


def _sweep(doc: dict) -> dict[str, Any]:
    """A sweep's figures: ``budget(name)`` for each budget's (``b``, ``target``, ``plan``, ``signed``, ``n``), and those
    names themselves where the sweep has one budget."""
    per = {b["budget"]["name"]: _sweep_budget(b, doc["config"]["model"]) for b in doc["budgets"]}
    names: dict[str, Any] = {"model": doc["config"]["model"], "per_budget": per,
                             "budget": lambda name: SimpleNamespace(**per[name])}
    if len(per) == 1:
        names.update(next(iter(per.values())))
    return names


def _sweep_budget(budget: dict, model: str) -> dict[str, Any]:
    targets = {t["target"]: Obj(t) for t in _budget_targets(budget)}
    plans = {p["plan"]: Obj(p) for p in budget["plans"]}
    return {"b": Obj(budget), "target": targets.__getitem__, "plan": plans.__getitem__, "model": model,
            "signed": lambda plan: plans[plan]["predicted_ms"] / plans[plan]["update_ms"] - 1,
            "n": lambda status: sum(t["status"] == status for t in targets.values()), "targets": len(targets)}


def _budget_targets(budget: dict) -> list[dict[str, Any]]:
    """A budget's targets: as its JSON holds them (reports from before the targets left the package), else from
    scripts/targets.py, the project's targets outside the package."""
    return budget.get("targets") or load_script("targets").budget_targets(budget)


def _records(report: str, budget: str) -> dict[str, Any]:
    """The per-update records a sweep report summarises (``..._run<X>_updates.json``, one key per budget). Where every
    rank's records were kept (``per_rank``, a sweep on several devices), each iteration is the slowest rank's: the
    ranks meet at the next collective, so the rank whose update phase took longest sets the pace."""
    from lightning_dos.bench.sweep.worker import slowest_rank  # the bench's own rule, as for its summary below

    raw = dict(_load(f"{report.removesuffix('_quarter')}_updates")[budget])
    if "per_rank" in raw:
        per_rank = raw.pop("per_rank")
        ranks = [r["iterations"] for r in per_rank]
        assert len({tuple(it["plan"] for it in its) for its in ranks}) == 1, "the ranks ran different plans"
        raw["iterations"], raw["ranks"] = slowest_rank(per_rank)["iterations"], ranks
    return raw


def _sweep_from_records(names: dict[str, Any], doc: dict, report: str) -> None:
    """Summarised again from its update records by the bench's own summary, each budget of a sweep gives the committed
    report's figures; and ``auto``'s trials, replayed through the trial rule, end where the records say (``trials``,
    in each budget's names)."""
    from lightning_dos.bench.sweep.config import SweepSettings, resolve_budget, sweep_schedule
    from lightning_dos.bench.sweep.results import summarize_budget

    for committed in doc["budgets"]:
        name = committed["budget"]["name"]
        raw = _records(report, name)
        plans, rounds, auto_steps = raw["plans"], raw["steps_per_plan"], raw["auto_steps"]
        assert [it["plan"] for it in raw["iterations"]] == sweep_schedule(plans, rounds, auto_steps)  # as run
        iterations = [{"iteration": i, "plan": it["plan"], "records": it["records"],
                       "lanes": it["records"][0]["lanes"], "device_fraction": it["records"][0]["device_fraction"],
                       "plan_index": None if it["plan"] == "auto" else plans.index(it["plan"])}
                      for i, it in enumerate(raw["iterations"])]
        sweep = SweepSettings(plans=plans, steps_per_plan=rounds, budgets=[name], auto_steps=auto_steps, warmup=3)
        result = {"status": "ok", "sweep": {"plans": plans, "resolved": [], "iterations": iterations}}
        again = summarize_budget(resolve_budget(name, doc["model"]["params"]), result, sweep)
        assert again["best"]["plan"] == committed["best"]["plan"], name
        for key in ("best", "auto"):
            assert again[key]["update_ms"] == pytest.approx(committed[key]["update_ms"], abs=0.01), (name, key)
        assert again["prediction_error_median"] == pytest.approx(committed["prediction_error_median"], abs=1e-4)
        assert again["auto"]["trial_phases"] == committed["auto"]["trial_phases"], name
        targets = load_script("targets").budget_targets(again)  # the project's targets, outside the package
        assert [(t["target"], t["status"], pytest.approx(t["value"], abs=1e-4)) for t in targets] == [
            (t["target"], t["status"], t["value"]) for t in _budget_targets(committed)], name
        # each rank runs its own auto and its own trials: replayed rank by rank (one list of trials per rank)
        trials = [_replay_trials([r for it in its if it["plan"] == "auto" for r in it["records"]])
                  for its in raw.get("ranks", [raw["iterations"]])]
        trials = trials[0] if len(trials) == 1 else trials
        names["per_budget"][name]["trials"] = trials
        if len(doc["budgets"]) == 1:
            names["trials"] = trials
        assert sum(1 for r in raw["iterations"] if r["plan"] == "auto") == auto_steps


def _replay_trials(auto: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    """``auto``'s update records fed to the trial rule (``PlanTrials`` with its defaults): each trial starts as soon as
    the rule allows, runs the turns it gives and ends where it decides, and the plan that runs next is the verdict's;
    a re-plan flag marks the trials won and the re-plans on drift (never while a trial runs; the trials start over from
    the plan adopted). Returns each trial's update phases and whether the candidate won."""
    from lightning_dos.planning.plan import Lane, Plan
    from lightning_dos.planning.trials import PlanTrials

    def plan(letters: str) -> Plan:
        return Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in letters))

    assert [r["source"] for r in auto[:2]] in (["probe", "probe"], ["probe", "probe+demoted"])
    assert auto[1]["replanned"] and auto[2]["source"] == "auto"
    trials, lengths, started = PlanTrials(), [], 0
    trials.start(plan(auto[2]["lanes"]))
    for k, record in enumerate(auto[2:], start=2):
        if record["source"] == "trial" and not trials.running:
            assert trials.ready() and auto[k - 1]["source"] == "auto"  # at once: nothing waits
            trials.next_challenger([(plan(record["lanes"]), 0.0)], 1.0)
            started = k
        assert trials.next_plan().lanes == plan(record["lanes"]).lanes  # the turn the rule gives
        verdict = trials.observe(plan(record["lanes"]), record["update_ms"] / 1e3)
        won = verdict is not None and verdict.challenger_won
        drift = record["replanned"] and not won  # a re-plan on drift: checked only while no trial runs
        assert not drift or not trials.running
        if verdict is not None:
            lengths.append((k - started + 1, won))
        if drift:  # the planner's choice is in force from the next update phase and the trials start over from it
            if k + 1 < len(auto):
                trials.start(plan(auto[k + 1]["lanes"]))
        elif verdict is not None:
            after = next((r for r in auto[k + 1:] if r["source"] == "auto"), None)
            assert after is None or after["lanes"] == verdict.kept.lane_letters()
    assert not trials.running or len(auto) - started < 6  # the sweep may end inside a trial
    return lengths


def _run_l_table(names: dict[str, Any], doc: dict) -> None:
    """The plan table's medians are those of its committed per-iteration samples (after the warm-up)."""
    names["vanilla"] = SimpleNamespace(**names_for("gpt-2.7b_H200_2026-11-21_runL_vanilla"))
    names["losses"] = [r["final_loss"] for r in doc["results"]]
    samples = _load("gpt-2.7b_H200_2026-11-21_runL_table_iterations")["workers"]
    warmup = doc["config"]["warmup"]
    for worker, it in samples.items():
        label = "no_offload" if worker.startswith("no_offload") else f"dos({worker[4:-3]})"
        for key in ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms"):
            assert median(it[key][warmup:]) == pytest.approx(names["row"](label)[key]), (worker, key)


def _run_l_backward(names: dict[str, Any], doc: dict) -> None:
    """Three interleaved processes of each configuration: the report's backward is the median of all their samples."""
    samples = _load("gpt-2.7b_H200_2026-11-21_runL_backward_iterations")["workers"]
    warmup = doc["config"]["warmup"]

    def pooled(prefix: str) -> list[float]:
        return [v for worker, it in samples.items() if worker.startswith(prefix) for v in it["bwd_ms"][warmup:]]

    names["pooled"] = pooled
    for label, prefix in (("no_offload", "no_offload_r"), ("dos(auto)", "dos_auto_r")):
        assert median(pooled(prefix)) == pytest.approx(names["bwd"](label)), label


def _converging(names: dict[str, Any], doc: dict, report: str) -> None:
    """A converging run's distances follow from its committed logs (scripts/converging.py's own analysis; where the
    control's log was not brought back, DOS against vanilla); ``log(label)`` is a run's figures from its log."""
    converging = load_script("converging")
    folder = (BENCHMARKS / report).parent
    labels = [label for label in converging.RUNS if (folder / label).is_dir()]
    if len(labels) == len(converging.RUNS):
        with tempfile.TemporaryDirectory() as out:
            for label in labels:
                shutil.copytree(folder / label, Path(out) / label)
            assert json.loads(json.dumps(converging.analyse(Path(out)))) == doc
    else:
        runs = {label: converging.read_run(folder, label) for label in ("dos-auto", "vanilla")}
        again = converging.distances(runs["dos-auto"]["train/loss"], runs["vanilla"]["train/loss"])
        again.pop("per_step")
        assert json.loads(json.dumps(again)) == doc["train/loss"]["dos_vs_vanilla"]

    def rows(label: str) -> list[dict[str, str]]:
        with open(folder / label / "version_0" / "metrics.csv", newline="") as handle:
            return list(csv.DictReader(handle))

    names["s"] = Obj(doc)
    names["log"] = lambda label: Obj(log_summary(rows(label)))
    names["log_median"] = lambda label, key: median(v for step, v in series(rows(label), key).items() if step >= 3)


def windows(pair: Obj) -> str:
    """A pair's mean distance per window of steps, as docs/converging.md's table lists them."""
    return ", ".join(f"{w['mean']:.2e}" for w in pair.windows)


def names_for(report: str) -> dict[str, Any]:
    """What a template of ``report`` may use besides the short names above: its figures, ``run(stem)`` for another
    report's, and the helpers below."""
    doc = _load(report)
    kind = "comparison" if "results" in doc else doc.get("kind") or report.split("_")[0]
    names = {"comparison": _comparison, "rok_curve": _rok, "plan_sweep": _sweep,
             "recipe_pair": _recipe_pair}.get(kind, lambda d: {})(doc)
    if report.startswith("converging_"):
        _converging(names, doc, report)
    if report.startswith("soak_"):
        names.update(r=lambda run: Obj(doc["runs"][run]), loss=lambda run: Obj(doc["loss"][run]))
    records = BENCHMARKS / f"{report}_updates.json"
    if kind == "comparison" and records.exists():  # a comparison's update records: one list per DOS row
        by_label = json.loads(records.read_text())
        names["updates"] = lambda label: [Obj(u) for u in by_label[label]]
    names["run"] = lambda stem: SimpleNamespace(**names_for(stem))
    names["report"] = report
    {"gpt-2.7b_H200_2026-11-21_runL_table": _run_l_table,
     "gpt-2.7b_H200_2026-11-21_runL_backward": _run_l_backward}.get(report, lambda n, d: None)(names, doc)
    if kind == "plan_sweep":
        _sweep_from_records(names, doc, report)
        if report == "sweep_gpt-1b_H200_2026-11-21_runQ":
            others = [stem for stem in committed_reports()  # the eight sweeps of one GPU that day
                      if stem.startswith("sweep_") and "_H200_2026-11-21_" in stem and stem != report]
            names["every_sweep"] = [names, *map(names_for, others)]
    return names


def preamble(row: dict) -> tuple[float, float]:
    """From a row's last synchronised iteration: step start -> update start, update end -> step end (ms)."""
    marks, update = row["iteration_timeline"]["marks_ms"], row["iteration_timeline"]["update"]
    return update["start_ms"] - marks["step_start"], marks["end"] - (update["start_ms"] + update["total_ms"])


def lane_end(row: dict, lane: str) -> float:
    """When a lane's last work ended in a row's timeline: the device lane's last flush, the host lane's last Adam."""
    events = [e for e in row["iteration_timeline"]["update"]["events"] if e["lane"] == lane]
    return max(e["flush" if lane == "device" else "adam"][1] for e in events)


def span(ids: list[int]) -> str:
    """Consecutive ids as the docs write them: ``0-2``."""
    assert ids == list(range(ids[0], ids[-1] + 1)), ids
    return f"{ids[0]}-{ids[-1]}"


def one(*values: Any, spec: str = "") -> str:
    """One figure the docs quote for several values: each must print the same."""
    printed = {format(v, spec) for v in values}
    assert len(printed) == 1, f"the docs quote one figure for {sorted(printed)}"
    return printed.pop()


def between(values: list[float], digits: int | None) -> str:
    """A range as the docs write it: ``6.0-9.6%`` (fractions, ``digits`` decimals) or ``3-9`` (``digits`` None)."""
    low, high = min(values), max(values)
    if digits is None:
        return f"{low}-{high}"
    return f"{100 * low:.{digits}f}-{100 * high:.{digits}f}%"


def e(value: float, digits: int = 1) -> str:
    """Scientific notation as the docs write it: 1.4e-6."""
    mantissa, exponent = f"{value:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def render(template: str, names: dict[str, Any]) -> str:
    """``template`` with each ``{expression:format}`` replaced by the expression's value, formatted (the format after
    the first ``:`` outside brackets and quotes, so an expression may hold ``'stride:2'``)."""
    scope = {**globals(), **names, "__builtins__": SAFE_BUILTINS}
    out, i = [], 0
    while (start := template.find("{", i)) >= 0:
        out.append(template[i:start])
        depth, quote, colon, j = 0, "", None, start + 1
        while quote or depth or template[j] != "}":
            c = template[j]
            if quote:
                quote = "" if c == quote else quote
            elif c in "'\"":
                quote = c
            elif c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif c == ":" and not depth and colon is None:
                colon = j
            j += 1
        expression = template[start + 1:colon if colon is not None else j]
        spec = template[colon + 1:j] if colon is not None else ""
        out.append(format(eval(expression, scope), spec))  # noqa: S307  (the templates below, nothing else)
        i = j + 1
    return "".join(out) + template[i:]


SAFE_BUILTINS = {"round": round, "min": min, "max": max, "sum": sum, "len": len, "abs": abs, "median": median,
                 "sorted": sorted, "set": set, "list": list}


def _fold(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _missing_quotes(report: str) -> list[str]:
    names = names_for(report)
    missing = []
    for where, template in QUOTES[report]:
        path = BENCHMARKS / f"{report}.md" if where == PAGE else ROOT / where
        expected = _fold(render(template, names))
        if expected not in _fold(path.read_text()):
            missing.append(f"{path.relative_to(ROOT)}: {expected!r}")
    return missing


def committed_reports() -> list[str]:
    """Every report under docs/benchmarks: each JSON but the raw records beside some (per-update, per-iteration)."""
    found = [str(p.relative_to(BENCHMARKS).with_suffix("")) for p in BENCHMARKS.rglob("*.json")]
    return sorted(stem for stem in found if not stem.endswith(("_updates", "_iterations")))


@pytest.mark.parametrize("report", committed_reports())
def test_the_docs_quote_what_the_committed_report_holds(report: str) -> None:
    assert QUOTES.get(report), f"{report}: no sentence of the docs is checked against it; add what quotes it to QUOTES"
    missing = _missing_quotes(report)
    assert not missing, "not found as the report's JSON gives it:\n" + "\n".join(missing)
