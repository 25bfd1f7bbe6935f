"""Checkpoints: DOS saves every subgroup's optimizer state in DeepSpeed's layout, so resumes work both ways.

Runs are 6 steps in 2 epochs of 3 batches; checkpoints are taken after the first epoch, so a resumed run
sees exactly the batches the uninterrupted run saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

from tests.support.parity import rel, train

CLIP = 0.05
TOL = 1e-5
PLAN = 0.5


def _run(plan: Any, steps: int, **kw: Any) -> Any:
    return train(plan, steps=steps, epoch_batches=3, clip=CLIP, **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ckpt")
    out: dict[str, Any] = {"root": root}
    out["dos_full"] = _run(PLAN, 6)
    out["vanilla_full"] = _run(None, 6)
    out["dos_half"] = _run(PLAN, 3, save_to=str(root / "dos.ckpt"))
    out["vanilla_half"] = _run(None, 3, save_to=str(root / "vanilla.ckpt"))
    return out


def _assert_same(a: list[float], b: list[float], tol: float) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert abs(x - y) <= tol * abs(y), f"{a} vs {b}"


def test_resume_dos_from_dos_gives_identical_losses(runs: dict[str, Any]) -> None:
    resumed = _run(PLAN, 6, ckpt_path=str(runs["root"] / "dos.ckpt"))
    _assert_same(resumed.losses, runs["dos_full"].losses[3:], 0.0)
    assert torch.equal(resumed.masters, runs["dos_full"].masters)


def test_dos_checkpoint_resumes_under_vanilla(runs: dict[str, Any]) -> None:
    resumed = _run(None, 6, ckpt_path=str(runs["root"] / "dos.ckpt"))
    _assert_same(resumed.losses, runs["vanilla_full"].losses[3:], TOL)
    assert rel(resumed.masters, runs["vanilla_full"].masters) <= TOL


def test_vanilla_checkpoint_resumes_under_dos(runs: dict[str, Any]) -> None:
    resumed = _run(PLAN, 6, ckpt_path=str(runs["root"] / "vanilla.ckpt"))
    _assert_same(resumed.losses, runs["dos_full"].losses[3:], TOL)
    assert rel(resumed.masters, runs["dos_full"].masters) <= TOL


def _optimizer_states(ckpt: Path) -> dict[int, dict[str, Any]]:
    files = sorted(ckpt.glob("checkpoint/*optim_states.pt"))
    assert files, f"no optimizer state files in {ckpt}"
    blob = torch.load(files[0], map_location="cpu", weights_only=False)
    inner = blob["optimizer_state_dict"]["optimizer_state_dict"]
    return inner["state"]


def test_every_subgroup_state_is_in_the_checkpoint(runs: dict[str, Any]) -> None:
    dos = runs["dos_half"]
    sizes = dos.strategy.manager.sizes
    states = _optimizer_states(runs["root"] / "dos.ckpt")
    assert sorted(states) == list(range(len(sizes)))
    device_lane = set(dos.strategy.manager.records[-1].plan.device_subgroups())
    assert device_lane and len(device_lane) < len(sizes), "the plan must use both lanes"
    opt = dos.strategy.model.optimizer
    for i, n in enumerate(sizes):
        state = states[i]
        assert state["step"] == 3
        assert state["exp_avg"].numel() == n and state["exp_avg_sq"].numel() == n
        assert float(state["exp_avg_sq"].abs().sum()) > 0.0, f"subgroup {i} has an empty second moment"
        live = opt.optimizer.state[opt.fp32_partitioned_groups_flat[i]]
        assert torch.equal(state["exp_avg"], live["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], live["exp_avg_sq"])


def test_convert_to_fp32_state_dict_gives_the_same_weights(runs: dict[str, Any], tmp_path: Path) -> None:
    dos_sd = convert_zero_checkpoint_to_fp32_state_dict(str(runs["root"] / "dos.ckpt"), str(tmp_path / "dos.pt"))
    van_sd = convert_zero_checkpoint_to_fp32_state_dict(
        str(runs["root"] / "vanilla.ckpt"), str(tmp_path / "vanilla.pt")
    )
    dos_sd = dos_sd.get("state_dict", dos_sd)
    van_sd = van_sd.get("state_dict", van_sd)
    assert dos_sd.keys() == van_sd.keys() and dos_sd
    flat_dos = torch.cat([dos_sd[k].float().flatten() for k in sorted(dos_sd)])
    flat_van = torch.cat([van_sd[k].float().flatten() for k in sorted(van_sd)])
    assert rel(flat_dos, flat_van) <= TOL
    # and they are the DOS run's own fp32 masters, exactly, each parameter where ZeRO-3 flattened it (one rank: its
    # partition is the whole parameter, in the subgroups' order)
    dos = runs["dos_half"]
    names = {id(p): name for name, p in dos.strategy.lightning_module.named_parameters()}
    order = [names[id(p)] for group in dos.strategy.model.optimizer.fp16_groups for p in group]
    assert sorted(order) == sorted(dos_sd)
    assert torch.equal(torch.cat([dos_sd[name].float().flatten() for name in order]), dos.masters)
