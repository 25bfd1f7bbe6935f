"""scripts/converging.py: the three runs of docs/converging.md and the distances between their loss curves."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.support.script_loader import load_script

converging = load_script("converging")


def _write_run(out: Path, label: str, train: dict[int, float], val: dict[int, float]) -> None:
    folder = out / label / "version_0"
    folder.mkdir(parents=True)
    with open(folder / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "train/loss", "val/loss"])
        writer.writeheader()
        for step in sorted(set(train) | set(val)):
            writer.writerow({"step": step, "train/loss": train.get(step, ""), "val/loss": val.get(step, "")})


def test_distances_between_runs_and_the_control(tmp_path: Path) -> None:
    steps = range(8)
    _write_run(tmp_path, "vanilla", {s: 10.0 - s for s in steps}, {3: 7.5, 7: 3.5})
    _write_run(tmp_path, "vanilla-control", {s: 10.0 - s + 0.01 for s in steps}, {3: 7.5, 7: 3.52})
    _write_run(tmp_path, "dos-auto", {s: 10.0 - s + 0.001 * s for s in steps}, {3: 7.49, 7: 3.5})
    summary = converging.analyse(tmp_path)
    train = summary["train/loss"]
    assert train["dos_vs_vanilla"]["max"] == pytest.approx(0.007)
    assert train["dos_vs_vanilla"]["mean"] == pytest.approx(0.0035)
    assert train["vanilla_vs_vanilla"]["max"] == pytest.approx(0.01)
    assert [w["steps"] for w in train["dos_vs_vanilla"]["windows"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert summary["val/loss"]["vanilla_vs_vanilla"]["max"] == pytest.approx(0.02)
    assert summary["final"]["dos-auto"]["train/loss"] == pytest.approx(3.007)
    assert (tmp_path / "converging.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "converging.json").read_text())["train/loss"]["dos_vs_vanilla"]["steps"] == 8
    assert "| train/loss | DOS vs vanilla | 8 | 7.00e-03 |" in converging.table(summary)


def test_a_missing_run_is_named(tmp_path: Path) -> None:
    _write_run(tmp_path, "vanilla", {0: 1.0}, {})
    with pytest.raises(FileNotFoundError, match="no run 'dos-auto'"):
        converging.analyse(tmp_path)


@pytest.mark.slow
def test_three_runs_of_the_debug_recipe_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe's relative log folders land here
    recipe = Path(converging.ROOT) / "recipes" / "debug.yaml"
    assert converging.main(["--recipe", str(recipe), "--out", str(tmp_path / "conv"), "--trainer.max_steps", "3"]) == 0
    summary = json.loads((tmp_path / "conv" / "converging.json").read_text())
    # fp32 on the CPU: vanilla is reproducible, and DOS (plan auto) follows it to rounding
    assert summary["train/loss"]["vanilla_vs_vanilla"]["max"] == 0.0
    assert summary["train/loss"]["dos_vs_vanilla"]["steps"] == 3
    assert summary["train/loss"]["dos_vs_vanilla"]["max"] < 1e-4


def test_the_committed_gpu_run_gives_the_figures_docs_converging_quotes(tmp_path: Path) -> None:
    """The first GPU run's figures (its control stopped at step 142; the index's superseded row quotes them),
    re-derived from the three runs' committed logs."""
    import shutil

    committed = Path(converging.ROOT) / "docs" / "benchmarks" / "converging_gpt2-124m_H100_2026-11-25"
    for label in converging.RUNS:
        shutil.copytree(committed / label, tmp_path / label)
    summary = converging.analyse(tmp_path)
    train = summary["train/loss"]
    assert (train["dos_vs_vanilla_on_control_steps"]["steps"], train["vanilla_vs_vanilla"]["steps"]) == (142, 142)
    assert f"{train['dos_vs_vanilla_on_control_steps']['mean']:.2e}" == "7.88e-03"
    assert f"{train['vanilla_vs_vanilla']['mean']:.2e}" == "7.13e-03"
    assert f"{train['dos_vs_vanilla']['mean']:.2e}" == "7.82e-03" and train["dos_vs_vanilla"]["steps"] == 300
    assert f"{summary['val/loss']['dos_vs_vanilla']['max']:.2e}" == "2.00e-02"
    final = summary["final"]
    assert (round(final["dos-auto"]["train/loss"], 4), round(final["vanilla"]["train/loss"], 4)) == (4.4019, 4.4033)
    assert (round(final["dos-auto"]["val/loss"], 4), round(final["vanilla"]["val/loss"], 4)) == (3.8846, 3.8853)
    from tests.support.recipe_run import summary as run_summary

    def figures(label: str) -> dict:
        with open(committed / label / "version_0" / "metrics.csv", newline="") as handle:
            return run_summary(list(csv.DictReader(handle)))

    dos, vanilla = figures("dos-auto"), figures("vanilla")
    assert (round(dos["tokens_per_s"] / 1e3, 1), round(vanilla["tokens_per_s"] / 1e3, 1)) == (33.7, 25.3)
    assert (round(dos["iteration_ms"]), round(vanilla["iteration_ms"])) == (243, 323)
    assert (round(dos["peak_gpu_gib"], 1), round(vanilla["peak_gpu_gib"], 1)) == (7.7, 7.6)


def test_the_full_length_gpu_run_gives_the_figures_docs_converging_quotes() -> None:
    """docs/converging.md's table, from the committed converging.json; DOS vs vanilla and the speeds re-derived from
    the two committed logs (the control's log was not brought back from the GPU host)."""
    committed = Path(converging.ROOT) / "docs" / "benchmarks" / "converging_gpt2-124m_H100_2026-11-25_full"
    summary = json.loads((committed / "converging.json").read_text())
    train, val = summary["train/loss"], summary["val/loss"]
    assert train["dos_vs_vanilla"]["steps"] == train["vanilla_vs_vanilla"]["steps"] == 300
    quoted = {"dos_vs_vanilla": ("9.57e-02", "1.06e-02", ["8.78e-03", "1.81e-02", "1.00e-02", "5.52e-03"]),
              "vanilla_vs_vanilla": ("4.93e-02", "6.64e-03", ["2.51e-03", "1.12e-02", "8.05e-03", "4.81e-03"])}
    for pair, (top, mean, windows) in quoted.items():
        assert (f"{train[pair]['max']:.2e}", f"{train[pair]['mean']:.2e}") == (top, mean), pair
        assert [f"{w['mean']:.2e}" for w in train[pair]["windows"]] == windows, pair
    assert [f"{w['mean']:.2e}" for w in val["dos_vs_vanilla"]["windows"]] == ["8.69e-03", "5.72e-03", "1.66e-03"]
    assert [f"{w['mean']:.2e}" for w in val["vanilla_vs_vanilla"]["windows"]] == ["1.77e-02", "3.50e-03", "1.06e-03"]
    final = {label: (round(v["train/loss"], 4), round(v["val/loss"], 4)) for label, v in summary["final"].items()}
    assert final == {"dos-auto": (4.4032, 3.8881), "vanilla": (4.4013, 3.8865), "vanilla-control": (4.3985, 3.8875)}
    runs = {label: converging.read_run(committed, label) for label in ("dos-auto", "vanilla")}
    again = converging.distances(runs["dos-auto"]["train/loss"], runs["vanilla"]["train/loss"])
    assert again["mean"] == pytest.approx(train["dos_vs_vanilla"]["mean"], rel=1e-12)
    from tests.support.recipe_run import summary as run_summary

    def figures(label: str) -> dict:
        with open(committed / label / "version_0" / "metrics.csv", newline="") as handle:
            return run_summary(list(csv.DictReader(handle)))

    dos, vanilla = figures("dos-auto"), figures("vanilla")
    assert (round(dos["iteration_ms"]), round(vanilla["iteration_ms"])) == (248, 317)
    assert (round(dos["tokens_per_s"] / 1e3, 1), round(vanilla["tokens_per_s"] / 1e3, 1)) == (33.0, 25.8)
    assert (round(dos["peak_gpu_gib"], 1), round(vanilla["peak_gpu_gib"], 1)) == (7.7, 7.6)
