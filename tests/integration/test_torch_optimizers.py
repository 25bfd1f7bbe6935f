"""A module written for plain PyTorch, returning ``torch.optim.AdamW``/``Adam``, trains under DOS unchanged.

Every run is fp32 on the CPU with gradient clipping active and a per-step LR schedule (``own_model.warmup``), on the
same batches in the same order. Three comparisons:

- with the plain torch optimizer, no DeepSpeed (``strategy="auto"``): the same lr at every step, each loss within
  :data:`LOSS_ULPS` fp32 units in the last place of torch's and the final weights within :data:`PARAM_TOL`
  (relative norm). The host lane is DeepSpeed's CPU Adam, whose fp32 arithmetic is torch's up to the order of its
  operations (fused multiply-adds, the bias correction as a multiplied reciprocal square root, ``beta ** step`` carried
  from step to step), about one rounding of each weight per step: measured on a 2-core x86 CPU, the weights ended
  8.4e-8 from torch's (1.15e-7 with another LR schedule), the device lane's (torch's fused kernel) 1.8e-8, and the
  losses were equal or 1 to 2 units in the last place apart (one unit is 1.1e-7 of a loss of 4.3). The bounds are
  therefore 2e-7 and 3 units, not 1e-7;
- with the same module returning DeepSpeed's CPU Adam with the same hyperparameters (what
  ``lightning_dos.optim.adamw`` returns), under the same strategy: bit for bit, so taking torch's optimizer changes
  nothing the strategy computes;
- ``Adam`` (L2 weight decay) against ``AdamW``: far apart, so the test tells decoupled from coupled decay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dos.strategies.torch_optimizers import adopt_optimizer, refusal
from tests.support.own_model import OwnModel, fit, rel, warmup
from tests.support.parity import make_strategy

LOSS_ULPS = 3
PARAM_TOL = 2e-7
SUB_GROUP = 3000  # several subgroups of the 20k-parameter model
#: plan -> strategy arguments; ``None``: vanilla ZeRO-3 offload (``zero3_offload``)
PLANS: dict[str, Any] = {
    "host": {"plan": "host"},
    "device": {"plan": "device"},
    "half": {"plan": 0.5},
    "half-overlap": {"plan": 0.5, "overlap": True},
    "zero3_offload": {"plan": None},
}


def _strategy(case: str) -> Any:
    return make_strategy(sub_group_size=SUB_GROUP, **PLANS[case])


def _init_flat() -> torch.Tensor:
    params = dict(OwnModel().named_parameters())
    return torch.cat([params[name].detach().flatten() for name in sorted(params)])


@pytest.fixture(scope="module")
def torch_runs() -> dict[str, Any]:
    """The plain-torch controls: AdamW and Adam, one param group; AdamW with two groups."""
    return {"adamw": fit("auto"), "adam": fit("auto", module=OwnModel("adam")),
            "groups": fit("auto", module=OwnModel(groups=True))}


def _assert_exact(run: Any, ref: Any) -> None:
    assert run.lrs == ref.lrs and len(set(map(tuple, ref.lrs))) == len(ref.lrs), "the lr must change at every step"
    for a, b in zip(run.losses, ref.losses, strict=True):
        assert abs(a - b) <= LOSS_ULPS * _spacing(b), f"losses {run.losses} vs torch {ref.losses}"
    assert rel(run.flat, ref.flat) <= PARAM_TOL, f"weights {rel(run.flat, ref.flat):.3g} from torch's"
    assert rel(ref.flat, _init_flat()) > 1e-3  # the weights moved: a no-op update cannot pass


def _spacing(x: float) -> float:
    """The distance from ``x`` to the next fp32 value away from zero (one unit in the last place)."""
    x32 = torch.tensor(abs(x), dtype=torch.float32)
    return float(torch.nextafter(x32, torch.tensor(float("inf"))) - x32)


def _assert_bitwise(run: Any, native: Any) -> None:
    assert run.losses == native.losses
    assert torch.equal(run.flat, native.flat)


@pytest.mark.parametrize("case", list(PLANS))
def test_torch_adamw_trains_like_plain_torch(case: str, torch_runs: dict[str, Any]) -> None:
    run = fit(_strategy(case))
    _assert_exact(run, torch_runs["adamw"])
    _assert_bitwise(run, fit(_strategy(case), module=OwnModel("ds-adamw")))
    # the engine steps DeepSpeed's CPU Adam in AdamW mode, and the user's scheduler drives that very optimizer
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    stepped = run.extra["stepped"]
    assert type(stepped) is DeepSpeedCPUAdam and stepped.adam_w_mode is True
    assert run.extra["driven"] is stepped
    strategy = run.trainer.strategy
    if PLANS[case]["plan"] is not None:
        assert strategy.manager.active and len(strategy.manager.records) == 6
        assert strategy.overlapped == PLANS[case].get("overlap", False)


@pytest.mark.parametrize("case", ["half", "zero3_offload"])
def test_torch_adam_keeps_its_l2_weight_decay(case: str, torch_runs: dict[str, Any]) -> None:
    """torch's Adam with weight_decay adds it to the gradient (L2): both lanes run it so, not as AdamW's decay."""
    adam, adamw = torch_runs["adam"], torch_runs["adamw"]
    assert rel(adam.flat, adamw.flat) > 1e-4  # the two decays lead elsewhere: this test tells them apart
    run = fit(_strategy(case), module=OwnModel("adam"))
    _assert_exact(run, adam)
    _assert_bitwise(run, fit(_strategy(case), module=OwnModel("ds-adam")))
    assert run.extra["stepped"].adam_w_mode is False


def test_param_groups_keep_their_own_lr_and_weight_decay(torch_runs: dict[str, Any]) -> None:
    """Two groups (matrices with decay; the rest without, at half the lr), both lanes, the schedule on each."""
    run = fit(_strategy("half"), module=OwnModel(groups=True))
    _assert_exact(run, torch_runs["groups"])
    assert all(lrs[1] == lrs[0] / 2 for lrs in run.lrs)
    assert [group["weight_decay"] for group in run.extra["stepped"].param_groups] == [0.1, 0.0]


def test_resume_restores_the_schedule_and_the_checkpoint_loads_into_the_module(tmp_path: Path) -> None:
    """6 steps in 2 epochs of 3 batches, against 3 steps, a checkpoint and 3 more: the same losses, lrs and weights,
    bit for bit (the resumed scheduler drives the optimizer the loaded engine steps); LearningRateMonitor logs the
    engine's lr under the user's optimizer's name; the checkpoint's weights load into a fresh module as they are."""
    full = fit(_strategy("half"), batches=3)
    ckpt = tmp_path / "half.ckpt"
    half = fit(_strategy("half"), steps=3, batches=3, save_to=str(ckpt))
    resumed = fit(_strategy("half"), batches=3, ckpt_path=str(ckpt), callbacks=[LearningRateMonitor("step")],
                  logger=CSVLogger(tmp_path, name="resumed"), log_every_n_steps=1)
    assert len(set(map(tuple, full.lrs))) == 6
    assert resumed.lrs == full.lrs[3:]
    assert resumed.losses == full.losses[3:]
    assert torch.equal(resumed.flat, full.flat)
    logged = (tmp_path / "resumed" / "version_0" / "metrics.csv").read_text().splitlines()
    column = logged[0].split(",").index("lr-AdamW")
    assert [float(row.split(",")[column]) for row in logged[1:] if row.split(",")[column]] == \
        [lrs[0] for lrs in full.lrs[3:]]
    # the checkpoint's fp32 weights load into the module as written (strict: every name, nothing else)
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    convert_zero_checkpoint_to_fp32_state_dict(str(ckpt), str(tmp_path / "fp32.pt"))
    state = torch.load(tmp_path / "fp32.pt", weights_only=False)["state_dict"]
    fresh = OwnModel()
    fresh.load_state_dict(state, strict=True)
    for name, param in fresh.named_parameters():
        assert torch.equal(param.detach(), half.params[name])


# ---------------------------------------------------------------------- what is refused, and what passes through
class _MyAdamW(torch.optim.AdamW):
    pass


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2, 2))]


def _stepped() -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(_params())
    opt.param_groups[0]["params"][0].grad = torch.ones(4)
    opt.step()
    return opt


def _mixed_decay() -> torch.optim.Optimizer:
    opt = torch.optim.Adam(_params()[:1])
    opt.add_param_group({"params": _params()[1:], "decoupled_weight_decay": True})
    return opt


REFUSED: dict[str, tuple[Any, str]] = {
    "sgd": (lambda: torch.optim.SGD(_params(), lr=0.1), r"torch\.optim\.sgd\.SGD, an optimizer it does not"),
    "adafactor": (lambda: torch.optim.Adafactor(_params()), r"Adafactor, an optimizer it does not implement"),
    "subclass": (lambda: _MyAdamW(_params()), r"_MyAdamW, a subclass of torch's AdamW whose step may differ"),
    "amsgrad": (lambda: torch.optim.AdamW(_params(), amsgrad=True), r"torch\.optim\.AdamW with amsgrad=True"),
    "maximize": (lambda: torch.optim.Adam(_params(), maximize=True), r"torch\.optim\.Adam with maximize=True"),
    "differentiable": (lambda: torch.optim.AdamW(_params(), differentiable=True), r"differentiable=True"),
    "tensor-lr": (lambda: torch.optim.AdamW(_params(), lr=torch.tensor(1e-3)), r"param group 0's lr as a tensor"),
    "mixed-decay": (_mixed_decay, r"decoupled_weight_decay differing between param groups"),
    "stepped": (_stepped, r"optimizer state already"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_run_exactly_is_refused_with_what_to_return_instead(case: str) -> None:
    make, named = REFUSED[case]
    optimizer = make()
    with pytest.raises(MisconfigurationException, match=named) as error:
        adopt_optimizer(optimizer, [], "deep_optimizer_states")
    message = str(error.value)
    assert "deep_optimizer_states" in message
    assert "return torch.optim.AdamW(...)" in message and "lightning_dos.optim.adamw(self.trainer, ...)" in message


def test_flags_that_only_choose_the_implementation_are_taken() -> None:
    """foreach, fused and capturable compute the same update: taken, as the plain flags are."""
    for flags in ({"foreach": True}, {"fused": True}, {"capturable": True}, {}):
        assert refusal(torch.optim.AdamW(_params(), **flags), "deep_optimizer_states") is None


def test_deepspeeds_own_optimizers_pass_through_and_others_too_when_deepspeed_is_told_to_step_them() -> None:
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    native = DeepSpeedCPUAdam(_params())
    assert adopt_optimizer(native, [], "deep_optimizer_states") is native
    sgd = torch.optim.SGD(_params(), lr=0.1)  # DeepSpeed's zero_force_ds_cpu_optimizer: false
    assert adopt_optimizer(sgd, [], "deep_optimizer_states", force_ds_cpu_optimizer=False) is sgd
    with pytest.raises(MisconfigurationException, match="amsgrad"):  # not what the user wrote: still refused
        adopt_optimizer(torch.optim.AdamW(_params(), amsgrad=True), [], "x", force_ds_cpu_optimizer=False)


def test_chained_schedulers_are_pointed_at_the_optimizer_the_engine_steps() -> None:
    from types import SimpleNamespace

    opt = torch.optim.AdamW(_params(), lr=1e-3)
    first = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    second = torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5)
    chained = torch.optim.lr_scheduler.SequentialLR(opt, [first, second], milestones=[2])
    config = SimpleNamespace(scheduler=chained, name=None)
    taken = adopt_optimizer(opt, [config], "deep_optimizer_states")
    assert chained.optimizer is taken and first.optimizer is taken and second.optimizer is taken
    assert all(a is b for a, b in zip(taken.param_groups, opt.param_groups))  # the user's groups, the same dicts
    assert config.name == "lr-AdamW"
    taken.param_groups[0]["lr"] = 0.0  # what a checkpoint load does: the scheduler writes the engine's groups
    taken.param_groups = [dict(group) for group in taken.param_groups]
    chained.step()
    assert taken.param_groups[0]["lr"] == pytest.approx(1e-3 * warmup(1))


@pytest.mark.parametrize("case", ["sgd", "amsgrad"])
@pytest.mark.parametrize("plan", ["half", "zero3_offload"])
def test_refused_before_training_under_the_strategy(case: str, plan: str) -> None:
    make = {"sgd": lambda params: torch.optim.SGD(params, lr=0.1),
            "amsgrad": lambda params: torch.optim.AdamW(params, amsgrad=True)}[case]
    module = OwnModel(make, schedule=False)
    name = "deep_optimizer_states" if PLANS[plan]["plan"] is not None else "zero3_offload"
    with pytest.raises(MisconfigurationException, match=f"configure_optimizers returned .*{name} "):
        fit(_strategy(plan), module=module)
    assert module.steps_run == 0


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_several_optimizers_are_refused_before_training(manual: bool) -> None:
    class TwoOptimizers(OwnModel):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = not manual

        def configure_optimizers(self) -> Any:
            return [torch.optim.AdamW(self.blocks.parameters()), torch.optim.AdamW(self.head.parameters())]

    module = TwoOptimizers()
    with pytest.raises(MisconfigurationException, match="steps one optimizer .*return a single torch.optim.AdamW"):
        fit(_strategy("half"), module=module, clip=None)  # Lightning clips under automatic optimization only
    assert module.steps_run == 0
