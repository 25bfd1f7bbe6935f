"""The DeepSpeed seam: the only package that touches DeepSpeed ZeRO-3 private internals."""

from lightning_dos.zero.optimizer import InterleavedZeroOptimizer, interleaved_zero3_optimizer

__all__ = ["InterleavedZeroOptimizer", "interleaved_zero3_optimizer"]
