"""The peer ``fsdp_offload`` (torch FSDP with CPU offload) on a CPU: what it registers and resolves, what it refuses
before the model is built, the optimizer it gives the model, and the weight-decay groups under FSDP's flattening.

It cannot train here: torch FSDP needs an accelerator to compute on, and its CPU offload pins the host copies of the
parameters and gradients (``pin_memory``, which needs CUDA), so on a CPU it is refused when ``fit`` starts, and the
bench records that row with the reason (``tests/system/test_bench.py``'s data-parallel bench, at one and two devices).
Training, and its losses against torch AdamW without FSDP, are the GPU tier's: ``tests/gpu/test_fsdp_offload_gpu.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.distributed.fsdp import CPUOffload, ShardingStrategy

import lightning_dos
from lightning_dos import FSDPOffloadStrategy
from lightning_dos.models import GPTModule
from lightning_dos.models.gpt import GPT, Block, GPTConfig
from lightning_dos.optim import FULL_SHAPE, adamw, weight_decay_groups
from lightning_dos.strategies.fsdp_offload import block_wrap_policy, mark_full_shapes, wrap_blocks
from tests.support.parity import SEQ, VOCAB, token_loader
from tests.support.script_loader import SUPPORT_SCRIPTS, load_script


def _trainer(strategy: Any = "fsdp_offload", **kwargs: Any) -> pl.Trainer:
    settings: dict[str, Any] = dict(accelerator="cpu", devices=1, precision="32-true", max_steps=2, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    settings.update(kwargs)
    return pl.Trainer(strategy=strategy, **settings)


def _tiny_gpt(activation_checkpointing: bool = False) -> GPTModule:
    return GPTModule(name="debug", vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_embd=32, n_head=4, n_kv_head=2,
                     activation_checkpointing=activation_checkpointing, warmup_steps=0, max_steps=2)


# --- registration and the configuration it resolves ------------------------------------------------------------


def test_registered_on_import_and_exported() -> None:
    lightning_dos.register()
    lightning_dos.register()  # idempotent
    assert StrategyRegistry["fsdp_offload"]["strategy"] is FSDPOffloadStrategy
    assert "FSDPOffloadStrategy" in lightning_dos.__all__ and lightning_dos.FSDPOffloadStrategy is FSDPOffloadStrategy
    # a Trainer builds it by name at any device count, on any accelerator: the strategy itself refuses what it cannot
    # run when fit starts (Lightning refuses its own FSDP names on a CPU when the Trainer is built)
    for devices in (1, 2):
        strategy = _trainer(devices=devices).strategy
        assert type(strategy) is FSDPOffloadStrategy and isinstance(strategy, FSDPStrategy)
        assert strategy.strategy_name == "fsdp_offload" and strategy.num_processes == devices
    assert "fsdp_offload" not in FSDPStrategy.get_registered_strategies()


def test_resolves_cpu_offload_a_unit_per_block_full_shard_and_sharded_checkpoints() -> None:
    trainer = _trainer(precision="bf16-mixed", devices=2)
    strategy = trainer.strategy
    assert strategy.cpu_offload == CPUOffload(offload_params=True)
    assert strategy.sharding_strategy is ShardingStrategy.FULL_SHARD
    assert strategy.state_dict_type == "sharded"
    assert strategy.kwargs["use_orig_params"] is True
    policy = strategy.kwargs["auto_wrap_policy"]
    assert policy is wrap_blocks  # made from the model when FSDP wraps it
    gpt = GPT(GPTConfig.from_name("debug"))
    policy = block_wrap_policy(gpt)
    wrapped = [name for name, module in gpt.named_modules() if policy(module=module, recurse=False, nonwrapped_numel=0)]
    assert wrapped == [f"blocks.{i}" for i in range(gpt.config.n_layer)]  # every block, nothing else
    # the Trainer's precision becomes FSDP mixed precision: bf16 compute and gradient reduction over fp32 weights
    assert isinstance(strategy.precision_plugin, FSDPPrecision)
    mixed = strategy.mixed_precision_config
    assert (mixed.param_dtype, mixed.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    assert strategy._activation_checkpointing_kwargs == {}  # checkpointing is left to the model
    assert _trainer().strategy.mixed_precision_config.param_dtype is torch.float32


def test_accepts_its_own_settings_spelled_otherwise() -> None:
    strategy = FSDPOffloadStrategy(cpu_offload=CPUOffload(offload_params=True),
                                   sharding_strategy=ShardingStrategy.FULL_SHARD, state_dict_type="full",
                                   auto_wrap_policy={torch.nn.Linear})
    assert strategy.cpu_offload.offload_params and strategy.sharding_strategy is ShardingStrategy.FULL_SHARD
    assert strategy.state_dict_type == "full"
    policy = strategy.kwargs["auto_wrap_policy"]
    assert policy(module=torch.nn.Linear(2, 2), recurse=False, nonwrapped_numel=0)
    assert not policy(module=Block(GPTConfig.from_name("debug")), recurse=False, nonwrapped_numel=0)
    assert FSDPOffloadStrategy(sharding_strategy="full_shard").sharding_strategy is ShardingStrategy.FULL_SHARD


# --- refusals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cpu_offload": False}, r"^cpu_offload: fsdp_offload is FSDP with .* on the host, got cpu_offload=False; .*"
                             r"strategy='fsdp'"),
    ({"cpu_offload": None}, r"^cpu_offload: .* got cpu_offload=None; remove cpu_offload"),
    ({"cpu_offload": CPUOffload(offload_params=False)}, r"^cpu_offload: .*offload_params=False"),
    ({"sharding_strategy": "SHARD_GRAD_OP"}, r"^sharding_strategy: .* got 'SHARD_GRAD_OP'; set sharding_strategy: "
                                             r"FULL_SHARD$"),
    ({"sharding_strategy": ShardingStrategy.HYBRID_SHARD}, r"^sharding_strategy: .*HYBRID_SHARD"),
    ({"sharding_strategy": "NO_SHARD"}, r"^sharding_strategy: .*'NO_SHARD'"),
    ({"device_mesh": (1, 2)}, r"^device_mesh: fsdp_offload shards over every rank .* remove device_mesh$"),
    ({"use_orig_params": False}, r"^use_orig_params: .* remove use_orig_params$"),
    ({"state_dict_type": "local"}, r"^state_dict_type: 'local' .* set state_dict_type: sharded or full$"),
])
def test_refuses_what_it_is_not_when_built(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationException, match=match):
        FSDPOffloadStrategy(**kwargs)


class BatchCounter(pl.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches += 1


@pytest.mark.parametrize(("settings", "module_kwargs", "match"), [
    ({}, {}, r"^accelerator: fsdp_offload needs a CUDA GPU, got device cpu \(torch FSDP .* pins .*\); set "
             r"accelerator: gpu on a GPU host"),
    ({"precision": "bf16-true"}, {}, r"^precision: fsdp_offload keeps fp32 weights .* bf16-true .* set precision: "
                                     r"bf16-mixed or 32-true$"),
    ({"gradient_clip_val": 1.0}, {}, r"^gradient_clip_val: 1.0 clips by norm, .* set trainer.gradient_clip_val: null"),
    ({"gradient_clip_val": 0.5, "gradient_clip_algorithm": "norm"}, {}, r"^gradient_clip_val: 0.5 clips by norm"),
    ({"strategy": FSDPOffloadStrategy(activation_checkpointing_policy={Block})}, {"activation_checkpointing": True},
     r"^activation_checkpointing_policy: the model checkpoints its own blocks .* set the model's "
     r"activation_checkpointing: false$"),
])
def test_refuses_what_cannot_run_before_the_model_is_built(settings: dict[str, Any], module_kwargs: dict[str, Any],
                                                           match: str) -> None:
    """At one device: a fit at two here would have Lightning start this test's command again for rank 1 (the
    bench's data-parallel test meets the refusal at two devices, in its worker processes)."""
    counter = BatchCounter()
    trainer = _trainer(**{**settings, "callbacks": [counter]})
    model = _tiny_gpt(**module_kwargs)
    with pytest.raises(MisconfigurationException, match=match):
        trainer.fit(model, train_dataloaders=token_loader(2))
    assert model.model is None, "the model was built before the refusal"
    assert counter.batches == 0


def test_clipping_by_value_and_a_policy_without_the_models_own_checkpointing_reach_the_device_check() -> None:
    """What FSDP can do is not refused: clipping by value, and Lightning's checkpointing policy when the model does
    not checkpoint itself; on a CPU the device is then what stops it."""
    for trainer, module in [
        (_trainer(gradient_clip_val=0.5, gradient_clip_algorithm="value"), _tiny_gpt(activation_checkpointing=True)),
        (_trainer(FSDPOffloadStrategy(activation_checkpointing_policy={Block})), _tiny_gpt()),
    ]:
        with pytest.raises(MisconfigurationException, match=r"^accelerator: fsdp_offload needs a CUDA GPU"):
            trainer.fit(module, train_dataloaders=token_loader(2))


# --- the optimizer and its weight-decay groups ------------------------------------------------------------------


def test_adamw_under_fsdp_offload_is_fused_torch_adamw_over_host_tensors() -> None:
    """:func:`lightning_dos.optim.adamw` asks the strategy, which gives fused torch AdamW on the CPU: it steps CPU
    tensors exactly as the unfused (for-loop) AdamW does."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("debug", vocab_size=VOCAB, block_size=SEQ))
    reference = GPT(GPTConfig.from_name("debug", vocab_size=VOCAB, block_size=SEQ))
    reference.load_state_dict(model.state_dict())
    trainer = SimpleNamespace(strategy=FSDPOffloadStrategy())
    optimizer = adamw(trainer, weight_decay_groups(model.parameters(), 0.1), lr=1e-2, weight_decay=0.1)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True
    expected = torch.optim.AdamW(weight_decay_groups(reference.parameters(), 0.1), lr=1e-2, betas=(0.9, 0.95),
                                 eps=1e-8, weight_decay=0.1, foreach=False)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    for _ in range(3):
        for net, opt in ((model, optimizer), (reference, expected)):
            opt.zero_grad()
            x = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
            net(x).float().square().mean().backward()
            opt.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert all(v.device.type == "cpu" for state in optimizer.state.values() for v in state.values())


def test_configure_adamw_refuses_parameters_off_the_host() -> None:
    params = [torch.nn.Parameter(torch.empty(4, 4, device="meta"))]
    with pytest.raises(RuntimeError, match=r"^fsdp_offload: AdamW updates the host shards .* parameters are on meta; "
                                           r"build the optimizer in configure_optimizers"):
        FSDPOffloadStrategy().configure_adamw(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _flatten_as_fsdp_does(module: torch.nn.Module) -> None:
    """What FSDP with ``use_orig_params`` does to each parameter at two ranks: its data becomes a 1-D view of this
    rank's shard (the same ``Parameter`` object; half of it here, or none of it)."""
    for index, param in enumerate(module.parameters()):
        flat = param.data.flatten()
        param.data = flat[: flat.numel() // 2] if index % 2 else flat[:0]


def test_weight_decay_groups_see_the_whole_shapes_fsdp_flattens() -> None:
    gpt = GPT(GPTConfig.from_name("debug"))
    expected = [[id(p) for p in group["params"]] for group in weight_decay_groups(gpt.parameters(), 0.1)]
    assert len(expected) == 2 and expected[0]  # matrices and embeddings decay, norms and biases do not

    mark_full_shapes(gpt)
    assert all(getattr(p, FULL_SHAPE) == p.shape for p in gpt.parameters())
    _flatten_as_fsdp_does(gpt)
    assert all(p.dim() == 1 for p in gpt.parameters())
    groups = weight_decay_groups(gpt.parameters(), 0.1)
    assert [[id(p) for p in group["params"]] for group in groups] == expected
    assert [group["weight_decay"] for group in groups] == [0.1, 0.0]
    mark_full_shapes(gpt)  # set up again (validation after fit): the marks stay the whole shapes
    assert [[id(p) for p in group["params"]] for group in weight_decay_groups(gpt.parameters(), 0.1)] == expected

    unmarked = GPT(GPTConfig.from_name("debug"))  # what the groups would be without the marks: nothing decays
    _flatten_as_fsdp_does(unmarked)
    assert [group["weight_decay"] for group in weight_decay_groups(unmarked.parameters(), 0.1)] == [0.0]


def test_the_gpu_tests_runs_see_the_same_global_batches_in_order_at_every_rank_count() -> None:
    """tests/gpu/test_fsdp_offload_gpu.py compares FSDP at one and two ranks with ``plain`` step by step, so each
    step's global batch must be the same sequences in every run: the ranks' batches together are ``plain``'s batch of
    that step (Lightning's own distributed sampler shuffles a training set: on a GPU host the FSDP run at one rank
    started from another batch than ``plain``)."""
    run_script = load_script("fsdp_offload_run", SUPPORT_SCRIPTS)

    def batches(world_size: int, rank: int) -> list[torch.Tensor]:
        data = run_script.Batches()
        data.trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
        return [inputs for inputs, _ in data.train_dataloader()]

    plain = batches(1, 0)
    assert len(plain) == run_script.STEPS and all(len(b) == run_script.BATCH for b in plain)
    starts = torch.cat(plain)[:, 0]
    assert not torch.equal(starts, starts.sort().values)  # random starts, so an order change would show
    halves = [batches(2, rank) for rank in (0, 1)]
    assert all(len(h) == run_script.STEPS for h in halves)
    for step, whole in enumerate(plain):
        shares = [h[step] for h in halves]
        assert [len(s) for s in shares] == [run_script.BATCH // 2] * 2
        assert sorted(map(tuple, torch.cat(shares).tolist())) == sorted(map(tuple, whole.tolist()))
