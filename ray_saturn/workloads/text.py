"""Tiny GPT-style character language models on the corpus shipped in the package.

A decoder-only transformer (token and position embeddings, pre-norm blocks
of causal self-attention and an MLP, tied output head) trained on next
character prediction over ``data/corpus.txt`` (public domain, see its
README). Everything is deterministic given ``hparams["seed"]`` and
``hparams["data_seed"]``.

Example:
    >>> task = gpt_task(width=32, lr=3e-3, max_steps=5)
    >>> task.name
    'gpt-w32-lr0.003'
    >>> model = task.model(task.hparams)
    >>> batch = next(iter(task.data(task.hparams)))
    >>> float(task.loss(model(batch[0]), batch).detach()) > 0
    True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from importlib import resources
from typing import Any

import torch
from torch import nn

from ray_saturn.spec import Task

__all__ = ["TinyGPT", "corpus", "gpt_task", "vocabulary"]


@functools.lru_cache(maxsize=1)
def corpus() -> str:
    """The shipped corpus (a few KB of public-domain English)."""
    return resources.files("ray_saturn.workloads").joinpath("data/corpus.txt").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def vocabulary() -> str:
    """The characters of the corpus, sorted: token ``i`` is ``vocabulary()[i]``."""
    return "".join(sorted(set(corpus())))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small decoder-only transformer: ``(batch, context)`` token ids -> ``(batch, context, vocab)`` logits.

    Blocks sit in ``self.layers`` (an ``nn.Sequential``) so layer-wise strategies
    (pipeline, spill) can split the model.
    """

    def __init__(self, vocab: int, width: int, depth: int, heads: int, context: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(1, context, width))
        self.layers = nn.Sequential(*[_Block(width, heads, context) for _ in range(depth)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.ln(self.layers(x)))


def _model(hp: Mapping[str, Any], *, width: int, depth: int, heads: int, context: int) -> nn.Module:
    return TinyGPT(len(vocabulary()), width, depth, heads, context)


def _data(hp: Mapping[str, Any], *, context: int, batch_size: int, batches: int) -> list[tuple[torch.Tensor, ...]]:
    vocab = {ch: i for i, ch in enumerate(vocabulary())}
    ids = torch.tensor([vocab[ch] for ch in corpus()], dtype=torch.long)
    g = torch.Generator().manual_seed(int(hp.get("data_seed", 1234)))
    out = []
    for _ in range(batches):
        starts = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=g)
        x = torch.stack([ids[s : s + context] for s in starts.tolist()])
        y = torch.stack([ids[s + 1 : s + context + 1] for s in starts.tolist()])
        out.append((x, y))
    return out


def _loss(logits: torch.Tensor, batch: tuple) -> torch.Tensor:
    target = batch[1].to(logits.device)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _adamw(params, hp: Mapping[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=float(hp["lr"]), weight_decay=0.01)


def gpt_task(
    *,
    width: int = 64,
    depth: int = 2,
    heads: int = 4,
    context: int = 64,
    lr: float = 3e-3,
    batch_size: int = 16,
    max_steps: int = 200,
    batches: int = 64,
    seed: int = 0,
    name: str | None = None,
    strategies: tuple[str, ...] | None = None,
) -> Task:
    """A next-character-prediction task for a :class:`TinyGPT` of the given shape and learning rate."""
    return Task(
        name=name or f"gpt-w{width}-lr{lr:g}",
        model=functools.partial(_model, width=width, depth=depth, heads=heads, context=context),
        data=functools.partial(_data, context=context, batch_size=batch_size, batches=batches),
        loss=_loss,
        optimizer=_adamw,
        hparams={"lr": lr, "seed": seed, "width": width, "depth": depth},
        max_steps=max_steps,
        batch_size=batch_size,
        strategies=strategies,
    )
