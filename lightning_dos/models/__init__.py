"""Owns the model zoo: the GPT network, its presets and accounting, its pretraining LightningModule, and a module
pretraining a Hugging Face ``transformers`` model (imported when one is built)."""

from lightning_dos.models.gpt import GPT, PRESETS, GPTConfig, flops_per_token, num_params
from lightning_dos.models.hf import HFCausalLMModule
from lightning_dos.models.module import GPTModule, lr_factor

__all__ = ["GPT", "PRESETS", "GPTConfig", "GPTModule", "HFCausalLMModule", "flops_per_token", "lr_factor",
           "num_params"]
