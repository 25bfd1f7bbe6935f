"""The bench's rows run what a user runs: each is the recipe, a strategy fragment of ``configs/strategy/`` and the row's
and the invocation's LightningCLI overrides, built by the LightningCLI of ``lightning-dos fit``; rows are data (the
tables of ``configs/bench/``); the command line of every study, and its usage errors, before any worker starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_dos.bench import main
from lightning_dos.bench.arguments import parse_args
from lightning_dos.bench.compose import build, fit_args
from lightning_dos.bench.rows import load_rows, make_run, table_path
from lightning_dos.bench.settings import DEFAULT_RECIPE, ROW_TABLES, parse_set
from tests.support.bench import TINY, rows_file

ROOT = Path(__file__).resolve().parents[2]
#: The bench's own trainer settings, which a user's run of the recipe does not have.
BENCH_ONLY = {"max_steps", "devices", "default_root_dir", "logger", "enable_checkpointing", "enable_progress_bar",
              "enable_model_summary", "limit_val_batches", "num_sanity_val_steps", "val_check_interval", "callbacks"}


def _config(cli: Any) -> dict[str, Any]:
    """A CLI's parsed configuration as plain data, without the bench's own trainer settings."""
    data = cli.config.as_dict()
    data["trainer"] = {k: v for k, v in data["trainer"].items() if k not in BENCH_ONLY}
    data["data"]["init_args"].pop("num_batches", None)
    return data


def test_the_default_tables_are_the_studies_rows() -> None:
    compare = load_rows(table_path("compare", None))
    assert [row.label for row in compare] == [
        "zero3_offload", "static_split(0.25)", "static_split(0.5)", "static_split(0.75)", "dos(auto)", "no_offload",
        "plain", "torchao_offload", "superoffload", "zenflow", "zenflow(sequential)", "fsdp_offload"]  # every peer
    assert {row.label for row in compare if row.single_device} == {"plain", "torchao_offload"}
    sizes = {row.label: row for row in load_rows(table_path("sizes", None))}
    assert list(sizes) == ["zero3_offload", "static_split_0.5", "deep_optimizer_states", "torchao_offload",
                           "fsdp_offload", "plain", "zero3", "offload_opt_states"]
    assert "engine.compile()" in sizes["offload_opt_states"].cannot_run and not sizes["zero3"].cannot_run
    for path in sorted(ROW_TABLES.glob("*.yaml")):  # every shipped table loads, every fragment exists
        assert load_rows(path), path


def test_the_default_row_is_what_a_user_gets_from_the_recipe_and_the_fragment(tmp_path: Path) -> None:
    """``dos(auto)`` sets nothing over ``configs/strategy/dos_auto.yaml``: its model, data and strategy are those of
    ``lightning-dos fit --config recipes/gpt-2.7b.yaml --config configs/strategy/dos_auto.yaml`` (parsed by the same
    CLI; no Trainer built, which would want the recipe's GPU)."""
    (row,) = load_rows(table_path("compare", None), ["dos(auto)"])
    run = make_run(row, [], steps=10)
    assert (run.label, run.fragment, run.args, run.sets, run.plan) == ("dos(auto)", "dos_auto", {}, {}, "auto")
    bench = build(fit_args(DEFAULT_RECIPE, run, tmp_path), instantiate_trainer=False)
    user = build(["--config", str(ROOT / DEFAULT_RECIPE), "--config", str(ROOT / "configs/strategy/dos_auto.yaml")],
                 instantiate_trainer=False)
    assert _config(bench) == _config(user)
    assert bench.config["model"]["init_args"]["name"] == "gpt-2.7b" and bench.config["trainer"]["max_steps"] == 10


def test_overrides_reach_the_rows_that_take_them(tmp_path: Path) -> None:
    """``--set`` goes to every row, a strategy argument only to the fragments that list it (plain has no subgroups);
    the row's own set goes over both; results record what a row sets over its fragment, and its plan."""
    rows = {row.label: row for row in load_rows(rows_file(tmp_path / "rows.yaml", {
        "plain": {"fragment": "plain"},
        "split(0.3)": {"fragment": "zero3_offload", "strategy": "static_split",
                       "set": {"trainer.strategy.init_args.ratio": 0.3}},
        "dos(0.25,overlap)": {"fragment": "dos_auto", "strategy": "deep_optimizer_states",
                              "set": {"trainer.strategy.init_args.plan": 0.25,
                                      "trainer.strategy.init_args.overlap": True, "model.n_layer": 3}}}))}
    overrides = [parse_set(text) for text in [*TINY, "trainer.strategy.init_args.pin_memory=false"]]
    runs = {label: make_run(row, overrides, steps=3) for label, row in rows.items()}
    assert runs["plain"].args == {} and runs["plain"].plan is None and runs["plain"].sets["model.n_layer"] == 2
    assert (runs["split(0.3)"].args, runs["split(0.3)"].plan) == (
        {"sub_group_size": 40000, "pin_memory": False, "ratio": 0.3}, 0.3)
    dos = runs["dos(0.25,overlap)"]
    assert dos.args == {"sub_group_size": 40000, "pin_memory": False, "plan": 0.25, "overlap": True}
    assert (dos.plan, dos.sets["model.n_layer"]) == (0.25, 3)
    cli = build(fit_args(DEFAULT_RECIPE, dos, tmp_path), instantiate_trainer=False)
    strategy = cli.config_init["trainer"]["strategy"]
    assert strategy.plan_spec.fraction == 0.25 and strategy.overlap is True and cli.model.config.n_layer == 3
    assert build(fit_args(DEFAULT_RECIPE, runs["split(0.3)"], tmp_path),
                 instantiate_trainer=False).config_init["trainer"]["strategy"].ratio == 0.3


def test_a_row_table_reports_every_problem_at_once(tmp_path: Path) -> None:
    path = rows_file(tmp_path / "rows.yaml", {"a": {"fragment": "no_such"}, "b": {"fragment": "plain", "sett": {}},
                                              "c": {"cannot_run": "why"}})
    with pytest.raises(ValueError) as err:
        load_rows(path, ["a", "d"])
    for part in ("a: fragment 'no_such' is not in", "b: unknown keys ['sett']", "--only ['d']: not in"):
        assert part in str(err.value), part
    assert parse_set("model.n_layer=40") == ("model.n_layer", 40)
    assert parse_set("trainer.strategy.init_args.plan=host") == ("trainer.strategy.init_args.plan", "host")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_set("model.n_layer")


def test_every_study_parses_with_its_own_options(tmp_path: Path) -> None:
    settings, study, resume, dry_run = parse_args([])  # no verb: the comparison, as before the verbs
    assert (settings.study, settings.recipe, settings.steps, settings.devices, study) == (
        "compare", DEFAULT_RECIPE, 10, [1], None)
    settings, sweep, _, _ = parse_args(["sweep", "--plans", "host", "0.5", "--steps", "6", "--devices", "2"])
    assert (sweep.plans, sweep.auto_steps, sweep.process_steps, settings.devices) == (["host", "0.5"], 6, 12, [2])
    settings, rok, _, _ = parse_args(["rok", "--placements", "keep", "offload-nvme", "--nvme-path", str(tmp_path)])
    assert (rok.placements, rok.row, rok.nvme_path, settings.options["row"]) == (
        ["keep", "offload-nvme"], "dos(auto)", str(tmp_path), "dos(auto)")
    settings, sizes, resume, _ = parse_args(["sizes", "--from", "40x4096", "--out", str(tmp_path), "--resume"])
    assert [s.shape for s in sizes.ladder()][:3] == ["40x4096", "48x4096", "40x5120"] and resume
    listed = parse_args(["sizes", "--sizes", "2x64,2x128", "--head-dim", "32"])[1]
    assert [s.shape for s in listed.ladder()] == ["2x64", "2x128"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "3", "--warmup", "3"], "--warmup 3 leaves no measured iteration"),
    (["--steps", "4", "--warmup", "1", "--e2e-steps", "3"], "set --steps to 5 or more"),
    (["--resume"], "--resume: set --out"),
    (["--devices", "0", "--only", "zero2"], "--devices [0]"),
    (["--only", "zero2"], "--only ['zero2']: not in"),
    (["--set", "model.n_layer"], "KEY=VALUE"),
    (["--recipe", "no/such.yaml"], "--recipe no/such.yaml: no such file"),
    (["--model", "gpt-1b"], "unrecognized arguments: --model"),
    (["sweep", "--plans", "sideways", "auto", "--steps-per-plan", "1"], "--plans: "),
    (["sweep", "--budgets", "half"], "--budgets: 'half' is not a budget"),
    (["rok", "--placements", "keep", "keep", "sideways"], "--placements: 'sideways' is not one of"),
    (["rok", "--placements", "offload-nvme"], "--nvme-path: offload-nvme writes the activations"),
    (["rok", "--row", "zero2"], "--only ['zero2']"),
    (["sizes", "--sizes", "2x64,64", "--from", "2x64"], "--sizes and --from: give one"),
    (["sizes", "--sizes", "2x100"], "n_embd 100 is not a multiple of --head-dim 128"),
])
def test_bad_arguments_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err, err


def test_a_key_the_cli_does_not_know_stops_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--set", "model.n_layers=3", "--dry-run"]) == 2


def test_a_dry_run_prints_each_runs_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sizes", "--set", *TINY, "--sizes", "2x64,2x128", "--head-dim", "32", "--only", "plain",
                 "offload_opt_states", "--dry-run", "--out", str(tmp_path / "dry")]) == 0
    printed = capsys.readouterr().out
    assert '"model": "gpt-2.7b"' in printed and '"study": "sizes"' in printed
    assert ("2x64/plain: lightning-dos fit --config recipes/gpt-2.7b.yaml --config configs/strategy/plain.yaml "
            "--trainer.accelerator cpu") in printed
    assert "--model.n_layer 2 --model.n_embd 128 --model.n_head 4" in printed  # the second size, not stopped
    assert "offload_opt_states:" not in printed and not (tmp_path / "dry").exists()
