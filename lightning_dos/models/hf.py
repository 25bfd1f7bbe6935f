"""Owns pretraining a Hugging Face ``transformers`` causal LM, as a module written for plain PyTorch would.

The model is built from a configuration written in the recipe (``AutoConfig.for_model(model_type, **config)``, then
``AutoModelForCausalLM.from_config``): nothing is downloaded. ``configure_optimizers`` returns a plain
``torch.optim.AdamW`` with a warm-up + cosine ``LambdaLR``, as such a module does anywhere: under
``deep_optimizer_states`` the strategy takes it as it is (:mod:`lightning_dos.strategies.torch_optimizers`), and the
repeated blocks (``model.layers``) are found for ZeRO-3's leaf blocks and for activation offload
(:mod:`lightning_dos.blocks`). The only line that makes it a DOS run is the strategy's.

The network is built in ``configure_model``, so that ZeRO-3 constructs it already partitioned (``zero.Init``), and
initialised there as Hugging Face initialises Llama-style models (normal(0, ``initializer_range``) linear and
embedding weights, zero biases, unit norms) through ``Module.apply``, which ``zero.Init`` gathers each module's
partitioned parameters around. ``transformers`` is an optional dependency (``pip install lightning-dos[transformers]``);
it is imported when the model is built, and a missing one is one clear error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric

from lightning_dos.models.module import CausalLMModule, check_training_args

__all__ = ["HFCausalLMModule", "hf_num_params", "import_transformers"]


def import_transformers() -> Any:
    """The ``transformers`` module, or one ``ImportError`` saying how to install it."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError("HFCausalLMModule needs Hugging Face transformers, which is not installed; install it with "
                          "pip install 'lightning-dos[transformers]' (or pip install transformers)") from error
    return transformers


def _hf_config(model_type: str, config: dict[str, Any], vocab_size: int | None, block_size: int | None) -> Any:
    transformers = import_transformers()
    values = dict(config)
    if vocab_size is not None:
        values["vocab_size"] = int(vocab_size)
    if block_size is not None:
        values["max_position_embeddings"] = int(block_size)
    values.setdefault("use_cache", False)  # training: no key/value cache
    return transformers.AutoConfig.for_model(model_type, **values)


def hf_num_params(model_type: str, config: dict[str, Any], vocab_size: int | None = None,
                  block_size: int | None = None) -> int:
    """Parameters of the model this configuration builds (counted on the meta device: nothing is allocated)."""
    transformers = import_transformers()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(_hf_config(model_type, config, vocab_size, block_size))
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


class HFCausalLMModule(CausalLMModule):
    """Pretrains a Hugging Face causal LM on batches ``(x, y)`` of token ids ``[B, T]`` (``y``: ``x`` shifted by one).

    Args:
        model_type: the ``transformers`` architecture (``"llama"``: ``LlamaConfig`` / ``LlamaForCausalLM``).
        config: that architecture's configuration fields (``hidden_size``, ``num_hidden_layers``, ...), as written in
            a recipe; ``vocab_size`` and ``block_size`` below replace its ``vocab_size`` and
            ``max_position_embeddings``.
        vocab_size: number of token ids (the data module's, linked by ``lightning-dos fit``).
        block_size: longest sequence (the data module's ``seq_len``).
        activation_checkpointing: recompute each decoder layer's activations in backward (non-reentrant).
        learning_rate: peak learning rate, reached at the end of warm-up.
        min_lr_ratio: final learning rate as a fraction of ``learning_rate``.
        warmup_steps: optimizer steps of linear warm-up from 0.
        max_steps: optimizer step at which the cosine decay ends; None: ``trainer.estimated_stepping_batches``.
        weight_decay: AdamW's decoupled weight decay, for every weight but norms' and biases.
        betas: AdamW moment coefficients.
        eps: AdamW denominator epsilon.
    """

    def __init__(
        self,
        model_type: str = "llama",
        config: dict[str, Any] | None = None,
        vocab_size: int | None = None,
        block_size: int | None = None,
        activation_checkpointing: bool = False,
        learning_rate: float = 3e-4,
        min_lr_ratio: float = 0.1,
        warmup_steps: int = 100,
        max_steps: int | None = None,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
    ) -> None:
        super().__init__()
        check_training_args(learning_rate, warmup_steps, min_lr_ratio, max_steps)
        self.save_hyperparameters()
        #: the ``transformers`` configuration the model is built from (known before it is built)
        self.config = _hf_config(model_type, config or {}, vocab_size, block_size)
        self.model: nn.Module | None = None
        self.val_loss = MeanMetric()
        self._num_params: int | None = None

    def configure_model(self) -> None:
        # called inside the strategy's sharded-construction context (ZeRO-3's zero.Init), possibly more than once
        if self.model is not None:
            return
        transformers = import_transformers()
        self.model = transformers.AutoModelForCausalLM.from_config(self.config)
        self.model.apply(self._init_weights)  # zero.Init gathers each module's parameters around the function
        if self.hparams.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = float(getattr(self.config, "initializer_range", 0.02))
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif "Norm" in type(module).__name__ and isinstance(getattr(module, "weight", None), nn.Parameter):
            nn.init.ones_(module.weight)
            if isinstance(getattr(module, "bias", None), nn.Parameter):
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx, use_cache=False).logits

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token at ``seq_len`` (read by ``PerfMetrics``): ``6 * N + 12 * layers * hidden * seq_len``
        (PaLM, Appendix B), ``N`` the parameters but the input embedding table."""
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        c = self.config
        if self._num_params is None:
            h = self.hparams
            self._num_params = hf_num_params(h.model_type, h.config or {}, h.vocab_size, h.block_size)
        n = self._num_params - c.vocab_size * c.hidden_size
        if getattr(c, "tie_word_embeddings", False):
            n += c.vocab_size * c.hidden_size  # the tied output projection is a matmul all the same
        return float(6 * n + 12 * c.num_hidden_layers * c.hidden_size * seq_len)

    def configure_optimizers(self) -> dict[str, Any]:
        """Plain torch AdamW, decay on every weight but the norms' and the biases', with the warm-up + cosine
        ``LambdaLR`` (a ``torch.optim.lr_scheduler``: ``with_schedule``)."""
        if self.model is None:
            raise RuntimeError("configure_model() must run before configure_optimizers()")
        no_decay = {id(p) for m in self.model.modules() if "Norm" in type(m).__name__ for p in m.parameters(False)}
        no_decay |= {id(p) for name, p in self.model.named_parameters() if name.endswith("bias")}
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if id(p) not in no_decay], "weight_decay": self.hparams.weight_decay},
                  {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=self.hparams.learning_rate,
                                      betas=tuple(self.hparams.betas), eps=self.hparams.eps)
        return self.with_schedule(optimizer)
