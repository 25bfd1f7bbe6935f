"""Owns the model zoo: the GPT network, its presets and accounting, and its pretraining LightningModule.

Importing it registers the GPT ``Block`` as the block type activation offload finds by default
(:func:`~lightning_dos.activations.layers.register_layer_type`): the model tells the engine, which imports no model.
"""

from lightning_dos.activations.layers import register_layer_type
from lightning_dos.models.gpt import GPT, PRESETS, Block, GPTConfig, flops_per_token, num_params
from lightning_dos.models.module import GPTModule, lr_factor

register_layer_type(Block)

__all__ = ["GPT", "PRESETS", "GPTConfig", "GPTModule", "flops_per_token", "lr_factor", "num_params"]
