"""``lightning-dos bench sizes`` with real worker processes on the CPU (the host stands in for the GPU): growing tiny
GPTs under seven rows, of which one trains every size, one reports CUDA running out of memory and one is killed by a
signal (as the kernel's out-of-memory killer kills) from the second size up, one is killed after its steps have run
and one raises there (their figures kept), one refuses the first size with a clear error, and one cannot run at all.
Every failure is a row with its reason, a failed strategy is not run again, and the study runs over two invocations as
on a GPU host with a time limit per call: the second (``--resume``) reuses every run that finished, failures included,
and adds the third size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_dos.bench import main, sizes
from tests.support.bench import PNG_SIGNATURE, TINY, WINDOWS, fault, rows_file


def test_sizes_until_each_strategy_fails_over_two_invocations(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rows = rows_file(tmp_path / "rows.yaml", {
        "zero3_offload": {"fragment": "zero3_offload"},
        "plain": {"fragment": "plain", "set": {"trainer.callbacks+": fault(128, "cuda-oom")}},
        "killed": {"fragment": "plain", "set": {"trainer.callbacks+": fault(128, "kill")}},
        "killed_after": {"fragment": "plain", "set": {"trainer.callbacks+": fault(128, "kill-after-training")}},
        "raised_after": {"fragment": "plain", "set": {"trainer.callbacks+": fault(128, "raise-after-training")}},
        "refused": {"fragment": "static_split_0.5", "strategy": "static_split",
                    "set": {"trainer.callbacks+": fault(64, "refuse")}},
        "offload_opt_states": {"cannot_run": "needs engine.compile()"}})
    out = tmp_path / "sizes"
    argv = ["sizes", "--set", *TINY, *WINDOWS, "--rows", str(rows), "--head-dim", "32", "--out", str(out)]
    assert main([*argv, "--sizes", "2x64,2x128"]) == 0
    assert "8/11 runs completed" in capsys.readouterr().out
    first = json.loads((out / "sizes.json").read_text())
    assert first["kind"] == "size_sweep" and first["sizes_planned"] == ["2x64", "2x128"]

    assert main([*argv, "--sizes", "2x64,2x128,2x256", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "2x64 (" in printed and "zero3_offload (reused): ok" in printed and "killed (reused): OOM" in printed
    assert "11/14 runs completed" in printed  # eleven reused; the third size's zero3_offload, *_after
    doc = json.loads((out / "sizes.json").read_text())
    runs = {(e["shape"], e["label"]): e for e in doc["runs"]}
    assert [e["params"] for e in doc["sizes"]] == sorted(e["params"] for e in doc["sizes"])
    for shape in ("2x64", "2x128", "2x256"):
        ok = runs[(shape, "zero3_offload")]
        assert ok["status"] == "ok" and ok["n_embd"] == int(shape[2:]) and ok["n_head"] == int(shape[2:]) // 32
        assert ok["tokens_per_s"] > 0 and ok["model_tflops_per_s"] == pytest.approx(
            6 * ok["params"] * ok["tokens_per_s"] / 1e12)
        assert ok["process_rss_gib"] > 0.05 and ok["host_in_use_gib"] is not None and ok["peak_gpu_gib"] is None
        assert isinstance(ok["host_in_use_training_gib"], float)  # read at the end of every iteration
    assert runs[("2x64", "plain")]["status"] == runs[("2x64", "killed")]["status"] == "ok"
    assert runs[("2x128", "plain")]["status"] == "oom"
    assert runs[("2x128", "plain")]["reason"].startswith("OutOfMemoryError: CUDA out of memory")
    killed = runs[("2x128", "killed")]
    assert killed["status"] == "oom" and killed["reason"].startswith("killed by SIGKILL")
    assert killed["host_in_use_gib"] is not None  # sampled by the parent until the kill
    assert killed["host_in_use_training_gib"] is None  # no iteration's reading came back
    # killed or raising after its steps ran (in Lightning's teardown, as torchao's module moved to the host): its
    # figures stand
    for shape in ("2x128", "2x256"):
        for label, ended in (("killed_after", "killed by SIGKILL"), ("raised_after", "RuntimeError: teardown")):
            late = runs[(shape, label)]
            assert late["status"] == "ok" and late["tokens_per_s"] > 0 and late["host_in_use_training_gib"] is not None
            assert late["reason"].startswith(f"trained its {WINDOWS[1]} steps, then ended: {ended}")
    assert runs[("2x64", "killed_after")]["reason"] is runs[("2x64", "raised_after")]["reason"] is None
    refused = runs[("2x64", "refused")]
    assert refused["status"] == "failed" and "ValueError: memory plan: n_embd 64 does not fit" in refused["reason"]
    assert runs[("2x64", "offload_opt_states")]["status"] == "skipped"
    # a strategy that failed is not run again: marked stopped at every larger size, the third size included
    assert {label for (shape, label), e in runs.items() if e["status"] == "stopped"} == {
        "plain", "killed", "refused", "offload_opt_states"}
    assert runs[("2x256", "killed")]["reason"] == "oom at 2x128"
    top = runs[("2x256", "zero3_offload")]
    assert doc["largest"]["zero3_offload"] == {"shape": "2x256", "stopped": None,
                                               **{key: top[key] for key in ("params", *sizes.AT_LARGEST)}}
    assert doc["largest"]["killed"]["shape"] == "2x64" and doc["largest"]["refused"]["shape"] is None
    report = (out / "sizes.md").read_text()
    for text in ("## Largest size each strategy trains", "| zero3_offload | 2x256 |", "needs engine.compile()",
                 "## Every run", "](sizes.png)"):
        assert text in report, text
    assert (out / "sizes.png").read_bytes()[:8] == PNG_SIGNATURE
    assert not (out / "runs" / "2x256" / "plain").exists()  # never launched
