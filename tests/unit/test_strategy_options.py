"""The strategy's options: every problem reported at once, each naming its key and the fix; the constructor's
arguments and the options' fields kept the same; the constructor's ``Args:`` made from the field docstrings."""

from __future__ import annotations

import dataclasses
import inspect

import docstring_parser
import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.strategies.options import AUTO_SUB_GROUP_MAX, DOSOptions, DOSOptionsError, field_docs

FIELDS = [field.name for field in dataclasses.fields(DOSOptions)]

#: one bad value per key, in the order ``problems`` checks them
BAD = {
    "plan": "strid:2",
    "sub_group_size": 0,
    "memory_budget_gib": -1,
    "resident_gib": "lots",
    "buffers": 0,
    "cost_overrides": {"pcie": 1.0},
    "param_persistence": -1,
    "leaf_blocks": "maybe",
    "layers": 3,
    "stage": 2,
    "offload_optimizer": False,
    "activation_offload": "keep",
    "activation_min_tensor_bytes": -1,
    "overlap": "sometimes",
}


def test_the_defaults_are_fine() -> None:
    options = DOSOptions()
    assert options.problems() == []
    options.validate()
    assert options.plan_spec.kind == "auto" and options.resident == "auto" and options.auto_sub_group_size
    assert options.initial_sub_group_size == AUTO_SUB_GROUP_MAX


def test_checked_values_resolve() -> None:
    options = DOSOptions(plan="stride:3", sub_group_size=5e7, resident_gib=2, memory_budget_gib=float("inf"))
    assert options.problems() == []
    assert (options.plan_spec.kind, options.plan_spec.stride) == ("stride", 3)
    assert options.initial_sub_group_size == 50_000_000 and not options.auto_sub_group_size
    assert options.resident == 2.0 and isinstance(options.resident, float)


def test_every_bad_argument_is_reported_together() -> None:
    problems = DOSOptions(**BAD).problems()
    assert [problem.split(":")[0] for problem in problems] == list(BAD)
    for problem in problems:
        assert "; set " in problem or "; use " in problem, problem  # each says what to set instead


@pytest.mark.parametrize(("key", "value"), list(BAD.items()))
def test_one_bad_argument_is_one_problem(key: str, value: object) -> None:
    problems = DOSOptions(**{key: value}).problems()
    assert len(problems) == 1 and problems[0].startswith(f"{key}: "), problems


def test_a_resident_size_beyond_the_budget_is_refused() -> None:
    problems = DOSOptions(resident_gib=8, memory_budget_gib=6).problems()
    assert len(problems) == 1 and problems[0].startswith("resident_gib: 8 GiB is more than memory_budget_gib (6 GiB)")
    assert DOSOptions(resident_gib=6, memory_budget_gib=6).problems() == []
    # a budget that is itself wrong is reported once, not compared
    assert [p.split(":")[0] for p in DOSOptions(resident_gib=8, memory_budget_gib=-1).problems()] == [
        "memory_budget_gib"]


def test_the_error_is_a_configuration_error_and_a_value_error_with_one_line_each() -> None:
    with pytest.raises(DOSOptionsError) as info:
        DOSOptions(buffers=0, overlap="sometimes").validate()
    error = info.value
    assert isinstance(error, MisconfigurationException) and isinstance(error, ValueError)
    lines = str(error).splitlines()
    assert lines[0] == "deep_optimizer_states cannot run with these arguments:"
    assert [line.split(":")[0] for line in lines[1:]] == ["  - buffers", "  - overlap"]
    assert error.problems == [line[4:] for line in lines[1:]]


def test_the_constructor_takes_the_options_fields_with_their_defaults() -> None:
    """The constructor keeps its keyword arguments (recipes name them); the options must not drift from them."""
    parameters = inspect.signature(DeepOptimizerStatesStrategy.__init__).parameters
    for field in dataclasses.fields(DOSOptions):
        assert field.name in parameters, field.name
        assert parameters[field.name].default == field.default, field.name
        assert parameters[field.name].annotation == field.type, field.name
    strategy = DeepOptimizerStatesStrategy(plan=0.5, buffers=3, overlap=False, param_persistence=5000)
    assert strategy.options == DOSOptions(plan=0.5, buffers=3, overlap=False, param_persistence=5000)
    # the attributes callbacks and tools read stay on the strategy
    assert (strategy.plan_spec.fraction, strategy.buffers, strategy.overlap, strategy.param_persistence) == (
        0.5, 3, False, 5000)
    for name in ("resident_gib", "memory_budget_gib", "cost_overrides", "leaf_blocks", "layers", "layer_types",
                 "bind_cores", "overlapped", "activation_offload_callback"):
        assert hasattr(strategy, name), name


def test_each_field_is_documented_once_and_shown_as_an_argument() -> None:
    docs = field_docs(DOSOptions)
    assert list(docs) == FIELDS
    shown = {param.arg_name: " ".join(param.description.split())
             for param in docstring_parser.parse(DeepOptimizerStatesStrategy.__doc__).params}
    for name in FIELDS:
        assert shown[name] == docs[name], name
    assert {"config", "**kwargs"} <= set(shown)
