"""The host lane's CPU Adam op: DeepSpeed's kernel bit for bit (the gradient factor applied as it reads, as
vanilla's separate pass applies it), and a thread running it leaves the interpreter free."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam

from lightning_dos.update.subgroup import AdamHyper
from lightning_dos.zero.cpu_adam_nogil import HostAdam

BETAS = (0.9, 0.95)


def _lr(step: int) -> float:
    return 1e-2 / (1.0 + 0.3 * step)


def test_bitwise_equal_to_deepspeed_cpu_adam_with_an_lr_that_changes_every_step() -> None:
    torch.manual_seed(0)
    n = 10_000
    start = torch.randn(n)
    grads = [torch.randn(n) for _ in range(5)]
    reference = torch.nn.Parameter(start.clone())
    ds = DeepSpeedCPUAdam([reference], lr=_lr(0), betas=BETAS, eps=1e-8, weight_decay=0.1)
    master = start.clone()
    state = {"step": 0, "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}
    ours = HostAdam(ds.defaults, adamw=True)
    for step, grad in enumerate(grads):
        for group in ds.param_groups:
            group["lr"] = _lr(step)
        reference.grad = grad.clone()
        ds.step()
        ours.step(state, master, grad.clone(), AdamHyper(lr=_lr(step), beta1=BETAS[0], beta2=BETAS[1], eps=1e-8,
                                                         weight_decay=0.1, adamw=True))
        expected = ds.state[reference]
        assert torch.equal(master, reference.data), f"step {step}"
        assert torch.equal(state["exp_avg"], expected["exp_avg"]) and torch.equal(state["exp_avg_sq"],
                                                                                  expected["exp_avg_sq"])
        assert state["step"] == expected["step"] == step + 1
    assert not torch.equal(master, start)
    ours.close()
    ours.close()  # once only


def test_scaled_step_is_vanillas_multiply_then_cpu_adam_bit_for_bit() -> None:
    """``grad_scale`` gives what vanilla gives with ``grad.mul_(factor)`` before DeepSpeedCPUAdam: over several
    tiles, a length that leaves a vector and a scalar remainder, a factor and an lr changing every step; the host
    gradient is left unscaled."""
    torch.manual_seed(1)
    n = 5 * 16384 + 64 + 13
    start = torch.randn(n)
    reference = torch.nn.Parameter(start.clone())
    ds = DeepSpeedCPUAdam([reference], lr=_lr(0), betas=BETAS, eps=1e-8, weight_decay=0.1)
    master = start.clone()
    state = {"step": 0, "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}
    ours = HostAdam(ds.defaults, adamw=True)
    for step in range(4):
        grad = torch.randn(n) * 10.0 ** step
        factor = torch.tensor(1.0) / (torch.tensor(0.37 + step, dtype=torch.float32) * 3.3)  # an fp32 factor
        for group in ds.param_groups:
            group["lr"] = _lr(step)
        reference.grad = grad.clone().mul_(factor)  # vanilla: unscale_and_clip_grads, then CPU Adam
        ds.step()
        host_grad = grad.clone()
        ours.step(state, master, host_grad, AdamHyper(lr=_lr(step), beta1=BETAS[0], beta2=BETAS[1], eps=1e-8,
                                                      weight_decay=0.1, adamw=True), grad_scale=float(factor))
        expected = ds.state[reference]
        assert torch.equal(master, reference.data), f"step {step}"
        assert torch.equal(state["exp_avg"], expected["exp_avg"]), f"step {step}"
        assert torch.equal(state["exp_avg_sq"], expected["exp_avg_sq"]), f"step {step}"
        assert torch.equal(host_grad, grad), "the host gradient is read, not scaled in place"
    # the control: the factor matters (the same step without it gives other values)
    unscaled, grad = start.clone(), torch.randn(n)
    scaled = unscaled.clone()
    states = [{"step": 0, "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)} for _ in range(2)]
    hyper = AdamHyper(lr=1e-2, beta1=BETAS[0], beta2=BETAS[1], eps=1e-8, weight_decay=0.0, adamw=True)
    ours.step(states[0], unscaled, grad.clone(), hyper)
    ours.step(states[1], scaled, grad.clone(), hyper, grad_scale=0.25)
    assert not torch.equal(states[0]["exp_avg"], states[1]["exp_avg"])
    ours.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("factor", [1.0, 0.3], ids=["unscaled", "scaled"])
def test_a_16_bit_gradient_is_widened_as_read_bit_for_bit(dtype: torch.dtype, factor: float) -> None:
    """A host gradient kept in its 16-bit dtype gives what its fp32 widening gives (vanilla's host gradient), scaled or
    not, over several tiles and a remainder; the 16-bit gradient is left as it was."""
    torch.manual_seed(2)
    n = 3 * 16384 + 64 + 5
    start = torch.randn(n)
    hyper = AdamHyper(lr=1e-2, beta1=BETAS[0], beta2=BETAS[1], eps=1e-8, weight_decay=0.1, adamw=True)
    defaults = {"lr": 1e-2, "betas": BETAS, "eps": 1e-8, "weight_decay": 0.1}
    ours = HostAdam(defaults, adamw=True)
    masters = [start.clone(), start.clone()]
    states = [{"step": 0, "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)} for _ in range(2)]
    for _ in range(3):
        grad16 = (torch.randn(n) * 3).to(dtype)
        kept = grad16.clone()
        ours.step(states[0], masters[0], grad16.float(), hyper, grad_scale=factor)
        ours.step(states[1], masters[1], grad16, hyper, grad_scale=factor)
        assert torch.equal(grad16, kept)
    assert torch.equal(masters[0], masters[1]) and not torch.equal(masters[1], start)
    assert all(torch.equal(states[0][k], states[1][k]) for k in ("exp_avg", "exp_avg_sq"))
    with pytest.raises(RuntimeError, match="grads must be a contiguous fp32, bf16 or fp16 host tensor"):
        ours.step(states[1], masters[1], torch.zeros(n, dtype=torch.float64), hyper)
    ours.close()


def _main_thread_ran_during(update: object) -> bool:
    """Whether the main thread ran Python while a worker thread was inside ``update``.

    The GIL's switch interval is set far beyond the test, so a thread holding the GIL is never made to hand it over:
    the main thread, waiting for the worker to start, gets the GIL back during the update only if the update
    releases it. The answer is then a matter of order, not of timing: which of the two threads wrote first."""
    order: list[str] = []

    def work() -> None:
        update()
        order.append("update ended")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        worker = threading.Thread(target=work)
        worker.start()  # returns once the worker has started: the worker holds the GIL until it releases it
        order.append("main thread ran")
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    return order[0] == "main thread ran"


def test_a_thread_in_cpu_adam_does_not_hold_the_gil() -> None:
    """While a worker thread runs an update, the main thread runs Python; with DeepSpeed's own binding (the
    negative control) it cannot until the update is over."""
    n = 10_000_000
    master, grad = torch.zeros(n), torch.ones(n)
    state = {"step": 0, "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}
    defaults = {"lr": 1e-3, "betas": BETAS, "eps": 1e-8, "weight_decay": 0.0}
    adam = HostAdam(defaults, adamw=True)
    hyper = AdamHyper(lr=1e-3, beta1=BETAS[0], beta2=BETAS[1], eps=1e-8, weight_decay=0.0, adamw=True)
    assert _main_thread_ran_during(lambda: adam.step(state, master, grad, hyper))
    assert state["step"] == 1

    assert _main_thread_ran_during(lambda: adam.step(state, master, grad, hyper, grad_scale=0.5))  # the tiled path
    assert state["step"] == 2

    held = DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))], **defaults)
    assert not _main_thread_ran_during(lambda: held.ds_opt_adam.adam_update(
        held.opt_id, 1, 1e-3, BETAS[0], BETAS[1], 1e-8, 0.0, True, master, grad, state["exp_avg"],
        state["exp_avg_sq"]))
