"""The bench's DOS rows: the strategy arguments each row sets, recorded in results.json as ``strategy_args``, and the
strategy a worker builds from them (the strategy's own defaults for everything a row does not set)."""

from __future__ import annotations

from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.strategies import build_strategy, dos_rows, strategy_arguments


def _rows(**settings: object) -> dict[str, object]:
    config = BenchConfig(strategies=["deep_optimizer_states"], **settings)
    config.validate()
    return {spec.label: (spec, strategy_arguments(config, spec), config) for spec in dos_rows(config)}


def test_the_default_row_sets_only_what_every_bench_row_sets() -> None:
    rows = _rows()
    (spec, args, config), = rows.values()
    assert spec.label == "dos(auto)" and spec.resident_gib == "auto"
    assert args == {"sub_group_size": 100_000_000, "overlap": False}
    strategy = build_strategy(config, spec)
    assert strategy.resident_gib == "auto" and strategy.leaf_blocks == "auto" and strategy.plan_spec.kind == "auto"


def test_each_option_appears_in_the_label_and_in_the_arguments() -> None:
    rows = _rows(overlap=[True], leaf_blocks=[False], resident_gib=["auto", 3.5], plans=["0.25"],
                 memory_budget_gib=20.0, pin_memory=False)
    assert set(rows) == {"dos(auto,overlap,layer-hooks)", "dos(auto,overlap,layer-hooks,resident=3.5GiB)",
                         "dos(0.25,overlap,layer-hooks)", "dos(0.25,overlap,layer-hooks,resident=3.5GiB)"}
    spec, args, config = rows["dos(0.25,overlap,layer-hooks,resident=3.5GiB)"]
    assert args == {"sub_group_size": 100_000_000, "overlap": True, "plan": 0.25, "memory_budget_gib": 20.0,
                    "pin_memory": False, "leaf_blocks": False, "resident_gib": 3.5}
    strategy = build_strategy(config, spec)
    assert strategy.resident_gib == 3.5 and strategy.leaf_blocks is False and strategy.overlap is True


def test_rows_of_other_kinds_record_no_dos_arguments() -> None:
    config = BenchConfig(strategies=["zero3_offload"])
    from lightning_dos.bench.strategies import expand

    assert [strategy_arguments(config, spec) for spec in expand(config)] == [None]
