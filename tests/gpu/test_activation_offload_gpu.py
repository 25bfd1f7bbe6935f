"""Activation offload on CUDA: bit-identical training with activations on the host or on disk, and device memory
freed (the CPU tier: tests/integration/test_activation_offload.py; the Lightning helpers both use:
tests/support/offload_fit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_dos.activations import ActivationOffload
from lightning_dos.models.gpt import GPT, GPTConfig
from tests.support.offload_fit import dos_strategy, fit, offload_callback

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["saved", "checkpointed"])
@pytest.mark.parametrize("placement", ["host", "nvme"])
def test_cuda_fp32_is_bit_identical_and_frees_device_memory(placement: str, checkpointing: bool,
                                                            tmp_path: Path) -> None:
    config = GPTConfig(n_layer=8, n_embd=512, n_head=8, vocab_size=512, block_size=512,
                       activation_checkpointing=checkpointing)
    x, y = torch.randint(0, 512, (2, 8, 512), device="cuda").unbind(0)

    def step(offload: ActivationOffload | None) -> tuple[float, list[torch.Tensor], int]:
        torch.manual_seed(0)
        model = GPT(config).cuda()
        if offload is not None:
            offload.attach(model)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = []
        for _ in range(2):  # the second step runs on a warm pool
            model.zero_grad(set_to_none=True)
            if offload is not None:
                offload.begin_step()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            if offload is not None:
                offload.end_step()
            out = [loss.item(), [p.grad.clone() for p in model.parameters()]]
        torch.cuda.synchronize()
        return out[0], out[1], torch.cuda.max_memory_allocated() - base

    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):  # deterministic backward
        ref_loss, ref_grads, ref_peak = step(None)
        again_loss, again_grads, _ = step(None)
        assert again_loss == ref_loss and all(torch.equal(a, b) for a, b in zip(again_grads, ref_grads))
        offload = ActivationOffload(placement, nvme_path=tmp_path if placement == "nvme" else None,
                                    min_tensor_bytes=1 << 16)
        loss, grads, peak = step(offload)
    assert loss == ref_loss
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    metrics = offload.metrics()
    assert metrics["act/offloaded_bytes"] > 0 and metrics["act/late_restores"] == 0
    assert peak < ref_peak  # the moved activations left device memory
    print(f"{placement} ckpt={checkpointing}: peak {ref_peak / 2**20:.1f} -> {peak / 2**20:.1f} MiB, "
          f"moved {metrics['act/offloaded_bytes'] / 2**20:.1f} MiB")
    offload.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("checkpointing", [False, True], ids=["saved", "checkpointed"])
def test_cuda_dos_strategy_is_bit_identical(checkpointing: bool, tmp_path: Path) -> None:
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = fit(dos_strategy(), checkpointing, accelerator="cuda")
        again = fit(dos_strategy(), checkpointing, accelerator="cuda")
        assert again["losses"] == ref["losses"] and torch.equal(again["masters"], ref["masters"]), "not deterministic"
        for placement in ("host", "nvme"):
            strategy = dos_strategy(activation_offload=placement, activation_min_tensor_bytes=0,
                                    activation_nvme_path=tmp_path if placement == "nvme" else None)
            run = fit(strategy, checkpointing, accelerator="cuda")
            assert run["losses"] == ref["losses"], placement
            assert torch.equal(run["masters"], ref["masters"]), placement
            assert offload_callback(run["trainer"]).offload.metrics()["act/offloaded_bytes"] > 0
            assert list(tmp_path.iterdir()) == []
