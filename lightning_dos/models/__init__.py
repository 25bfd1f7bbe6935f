"""Owns the model zoo: the GPT network, its presets and accounting, and its pretraining LightningModule."""

from lightning_dos.models.gpt import GPT, PRESETS, GPTConfig, flops_per_token, num_params
from lightning_dos.models.module import GPTModule, lr_factor

__all__ = ["GPT", "PRESETS", "GPTConfig", "GPTModule", "flops_per_token", "lr_factor", "num_params"]
