"""A Hugging Face ``transformers`` model trains under DOS, its torch AdamW taken as is (through ``lightning-dos fit``
in a fresh process: tests/system/test_hf_recipe.py).

``transformers`` comes with the test extra (pyproject.toml, installed by scripts/setup.sh): these tests import it, they
do not skip without it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_dos.activations import ActivationOffloadCallback
from lightning_dos.models import HFCausalLMModule
from lightning_dos.models.hf import hf_num_params, import_transformers
from tests.support.own_model import fit
from tests.support.parity import make_strategy

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _module(**kwargs: Any) -> HFCausalLMModule:
    torch.manual_seed(0)
    return HFCausalLMModule(config=TINY, vocab_size=61, block_size=12, learning_rate=1e-2, warmup_steps=2,
                            max_steps=6, **kwargs)


def test_the_module_returns_plain_torch_adamw_with_norms_undecayed() -> None:
    module = _module()
    module.configure_model()
    conf = module.configure_optimizers()
    optimizer = conf["optimizer"]
    assert type(optimizer) is torch.optim.AdamW
    decayed, undecayed = optimizer.param_groups
    names = {id(p): n for n, p in module.model.named_parameters()}
    assert {names[id(p)] for p in undecayed["params"]} == {
        "model.norm.weight", *(f"model.layers.{i}.{norm}.weight" for i in range(2)
                               for norm in ("input_layernorm", "post_attention_layernorm"))}
    assert decayed["weight_decay"] == 0.1 and undecayed["weight_decay"] == 0.0
    assert type(conf["lr_scheduler"]["scheduler"]) is torch.optim.lr_scheduler.LambdaLR
    assert sum(p.numel() for p in module.model.parameters()) == hf_num_params("llama", TINY, 61, 12)


def test_weights_are_initialised_as_hugging_face_does_under_zero3() -> None:
    """Built inside zero.Init (partitioned at construction), the weights are still normal(0, 0.02) with unit norms."""
    import lightning.pytorch as pl

    seen: dict[str, torch.Tensor] = {}

    class Weights(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            from deepspeed.utils import safe_get_full_fp32_param

            seen.update({n: safe_get_full_fp32_param(p) for n, p in pl_module.named_parameters()})

    fit(make_strategy(0.5, sub_group_size=3000), module=_module(), steps=1, callbacks=[Weights()])
    embed, q = seen["model.model.embed_tokens.weight"], seen["model.model.layers.0.self_attn.q_proj.weight"]
    assert 0.018 < float(embed.std()) < 0.022 and 0.018 < float(q.std()) < 0.022
    assert torch.equal(seen["model.model.norm.weight"], torch.ones(32))


def test_activation_offload_finds_the_decoder_layers(tmp_path: Path) -> None:
    """``activation_offload="host"`` on a transformers Llama: its two decoder layers are the blocks, activations move
    and come back, and the run is bit for bit the one without offload."""
    plain = fit(make_strategy(0.5, sub_group_size=3000), module=_module(), steps=3)
    strategy = make_strategy(0.5, sub_group_size=3000, activation_offload="host", activation_min_tensor_bytes=0)
    run = fit(strategy, module=_module(), steps=3)
    assert run.losses == plain.losses and torch.equal(run.flat, plain.flat)
    offload = next(cb for cb in run.trainer.callbacks if isinstance(cb, ActivationOffloadCallback)).offload
    assert offload.n_layers == 2 and offload.total.offloaded_bytes > 0
    assert run.trainer.strategy.leaf_block_names == ["model.model.layers.0", "model.model.layers.1"]


def test_a_missing_transformers_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an environment without it gives
    with pytest.raises(ImportError, match=r"pip install 'lightning-dos\[transformers\]'"):
        import_transformers()
    with pytest.raises(ImportError, match="HFCausalLMModule needs Hugging Face transformers"):
        _module()
