"""Time the forward and backward pass of a GPT preset on its own: no strategy, no optimizer, no DeepSpeed.

The floor a training strategy's fwd / bwd can reach on this device. The model is built on the device in the
compute dtype (``--dtype``, as DeepSpeed's bf16 mode casts it), the loss is the training module's (cross-entropy
on float32 logits), and each pass is timed between device synchronisations; the median over ``--steps`` passes
after ``--warmup`` is reported. Compare with ``lightning-dos bench``'s fwd / bwd to see what a strategy adds.

GPU host example::

    python scripts/time_model.py --model gpt-2.7b --style llama --style gpt2

One JSON line per style goes to stdout, then a short table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

DTYPES = ("bfloat16", "float16", "float32")


def build_parser() -> argparse.ArgumentParser:
    from lightning_dos.models.gpt import PRESETS

    p = argparse.ArgumentParser(description="Time a GPT preset's forward and backward without any strategy.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="gpt-2.7b", choices=sorted(PRESETS), help="model preset")
    p.add_argument("--style", action="append", choices=("llama", "gpt2"), default=None,
                   help="block style, repeatable (default: the preset's own)")
    p.add_argument("--n-layer", type=int, default=None, help="override the preset's transformer blocks")
    p.add_argument("--n-embd", type=int, default=None, help="override the preset's hidden size")
    p.add_argument("--n-head", type=int, default=None, help="override the preset's query heads")
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per pass")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="parameter and activation dtype")
    p.add_argument("--no-activation-checkpointing", action="store_true", help="keep block activations")
    p.add_argument("--steps", type=int, default=6, help="timed passes")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes first")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check")
    return p


def time_style(args: argparse.Namespace, style: str | None) -> dict[str, Any]:
    """Median forward and backward milliseconds (and peak device memory) of one block style."""
    import torch
    import torch.nn.functional as F

    from lightning_dos.models.gpt import GPT, GPTConfig, num_params

    overrides = {k: v for k, v in (("n_layer", args.n_layer), ("n_embd", args.n_embd), ("n_head", args.n_head),
                                   ("vocab_size", args.vocab_size)) if v is not None}
    if style is not None:
        overrides["style"] = style
        if style == "gpt2":
            overrides["n_kv_head"] = None  # GPT-2 blocks use plain multi-head attention
    config = GPTConfig.from_name(args.model, block_size=args.seq_len, activation_checkpointing=not
                                 args.no_activation_checkpointing, **overrides)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    with device:
        model = GPT(config).to(dtype)
    model.train()
    tokens = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    forward_ms: list[float] = []
    backward_ms: list[float] = []
    for step in range(args.warmup + args.steps):
        sync()
        started = time.perf_counter()
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        sync()
        forwarded = time.perf_counter()
        loss.backward()
        sync()
        done = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if step >= args.warmup:
            forward_ms.append((forwarded - started) * 1e3)
            backward_ms.append((done - forwarded) * 1e3)
    peak = torch.cuda.max_memory_allocated(device) / 1024**3 if device.type == "cuda" else None
    row = {"model": args.model, "style": config.style, "params": num_params(config), "dtype": args.dtype,
           "activation_checkpointing": config.activation_checkpointing, "micro_batch": args.micro_batch,
           "seq_len": args.seq_len, "device": str(device), "steps": args.steps, "warmup": args.warmup,
           "fwd_ms": statistics.median(forward_ms), "bwd_ms": statistics.median(backward_ms), "peak_gib": peak,
           "loss": float(loss.detach())}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    rows = []
    for style in args.style or [None]:
        row = time_style(args, style)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"{'style':6s} {'params':>14s} {'fwd ms':>8s} {'bwd ms':>8s}")
    for row in rows:
        print(f"{row['style']:6s} {row['params']:14,d} {row['fwd_ms']:8.1f} {row['bwd_ms']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
