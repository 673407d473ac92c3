"""Training workloads: a model, its data, its loss and its test metric, by name.

The paper's four models (Table I) are built from their library definitions
with random initialisation - nothing is downloaded:

===================  ==========  ==========================================
name                 data        model
===================  ==========  ==========================================
``efficientnet_b0``  CIFAR-10    ``torchvision.models.efficientnet_b0``
``resnet50``         CIFAR-100   ``torchvision.models.resnet50``
``alexnet``          CIFAR-100   ``torchvision.models.alexnet`` behind a resize
``gpt2_s``           WikiText-2  ``transformers.GPT2LMHeadModel`` (GPT-2 small config)
``small_cnn``        digits      a 2-conv CNN, ~38k parameters (106 chunks)
``small_transformer`` tiny corpus a 2-layer causal transformer, char-level
``digits_mlp``       digits      a ~1M-parameter MLP (the emulation's default)
``mnist1d_cnn``      MNIST-1D    a 1-D CNN, 109,834 parameters (304 chunks)
===================  ==========  ==========================================

``mnist1d_cnn`` is the workload with a late phase: MNIST-1D (generated offline
from the ``mnist1d`` package's templates, :mod:`dblp.train.mnist1d`) keeps its
test accuracy climbing for ~1,000 iterations of 3 workers, where the digits
are learnt in ~60.

Why a resize for AlexNet: its stem (11x11 stride 4, then three 3x3 stride-2
max-pools) shrinks a 32x32 CIFAR image to nothing; the smallest input that
survives is 63x63.  ``alexnet`` therefore upsamples to ``alexnet_input``
(default 64) inside the model, keeping torchvision's architecture and its
~57M parameters (the 61M of Table I with 1000 classes) unchanged.
EfficientNet-B0 and ResNet50 accept 32x32 as is (their adaptive pooling ends
at 1x1); ``cifar_stem=True`` gives ResNet50 the common 3x3/no-max-pool CIFAR
stem instead (16x the compute).

GPT-2-S keeps GPT-2 small's shape (12 layers, 12 heads, 768 wide, 1024
positions); its vocabulary is the data's (word-level WikiText-2: ~33k,
~111M parameters; byte-level: 256), since GPT-2's BPE files cannot be
downloaded here.

Paper models need their data set path (``data_root``, or the environment
variable ``DBLP_DATA_ROOT``); ``synthetic=True`` replaces the data with random
tensors of the right shape, for smoke tests of the training path only.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from dblp.runs.gradients import MODEL_ALIASES, model_name
from dblp.train.data import (
    TEACHER_LIMITS,
    ArrayDataset,
    DatasetMissingError,
    load_cifar10,
    load_cifar100,
    load_digits,
    load_tiny_corpus,
    load_wikitext2,
    teacher_images,
)
from dblp.train.mnist1d import MNIST1D_SAMPLES, MNIST1D_SEED, build_mnist1d

__all__ = [
    "Workload",
    "WORKLOADS",
    "PAPER_WORKLOADS",
    "DATA_KINDS",
    "TEACHER_WORKLOADS",
    "TEACHER_TRAIN_SAMPLES",
    "get_workload",
    "WORKLOAD_DEFAULTS",
    "workload_key",
    "train_samples",
    "dataset_problem",
    "SmallCNN",
    "MNIST1DCNN",
    "SmallTransformer",
    "GPT2Logits",
    "build_model",
]

# Model initialisation draws from torch's global RNG, which threads share; seeding and
# building under one lock keeps "same seed -> same initial replica" true for workers
# run as threads in one process (loopback tests), not only for workers in processes.
_BUILD_LOCK = threading.Lock()


def _seeded_build(seed: int, name: str, **kw: Any) -> nn.Module:
    with _BUILD_LOCK:
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            return build_model(name, **kw)
        finally:
            torch.random.set_rng_state(state)


CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


# ----------------------------------------------------------------------------- models


class SmallCNN(nn.Module):
    """Two 3x3 convolutions and two linear layers for 8x8 digits; trains in seconds on CPU."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16, input_size: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * (input_size // 2) ** 2, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsMLP(nn.Module):
    """A ~1M-parameter MLP on the 8x8 digits: a gradient large enough (2,746 datagrams a
    direction) that a burst costs real time, compute small enough for 2 cores."""

    def __init__(self, num_classes: int = 10, hidden: tuple[int, int] = (1024, 896)) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden[0]), nn.ReLU(), nn.Linear(hidden[0], hidden[1]),
                                 nn.ReLU(), nn.Linear(hidden[1], num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MNIST1DCNN(nn.Module):
    """Three strided 1-D convolutions and a two-layer head for MNIST-1D's 40-sample signals.

    Why this shape: MNIST-1D separates models with a spatial bias from those
    without (an MLP stays near 70% test accuracy, a CNN passes 90%), and a
    CNN climbs slowly through many epochs - the late phase a phase-aware
    protocol needs. ``width`` 64 and ``hidden`` 256 give 109,834 parameters
    (304 datagrams a direction): a gradient whose rounds fit ~1,000
    iterations into a few minutes of the emulation on 2 cores.
    """

    def __init__(self, num_classes: int = 10, width: int = 64, hidden: int = 256, length: int = 40) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, width, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(),
        )
        out_len = length
        for _ in range(3):
            out_len = (out_len - 1) // 2 + 1
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width * out_len, hidden), nn.ReLU(),
                                  nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SmallTransformer(nn.Module):
    """A small causal (GPT-style, pre-norm) transformer language model."""

    def __init__(
        self,
        vocab_size: int,
        *,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        max_len: int = 256,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout=dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab_size)
        self.max_len = max_len

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len {self.max_len}")
        pos = torch.arange(t, device=ids.device)
        h = self.tok(ids) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.out(self.norm(h))


class GPT2Logits(nn.Module):
    """``GPT2LMHeadModel`` returning plain logits, so every workload's loss sees a tensor."""

    def __init__(self, vocab_size: int, n_positions: int = 1024, **config: Any) -> None:
        super().__init__()
        try:  # an optional dependency: only this workload needs it
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError as exc:
            raise ImportError("the gpt2_s workload needs Hugging Face transformers (for GPT-2's model "
                              "definition only; no download): pip install 'dblp-testbed[gpt2]' "
                              f"or pip install transformers ({exc})") from exc

        # GPT-2's bos/eos id 50256 does not exist in a smaller vocabulary; training needs neither.
        config.setdefault("bos_token_id", None)
        config.setdefault("eos_token_id", None)
        cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, **config)
        self.lm = GPT2LMHeadModel(cfg)  # random init; no from_pretrained, no download

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits


def build_model(name: str, *, num_classes: int | None = None, vocab_size: int | None = None, **kw: Any) -> nn.Module:
    """The bare model of a workload (see the module table); ``kw`` are model options."""
    import torchvision.models as tvm

    if name == "efficientnet_b0":
        return tvm.efficientnet_b0(weights=None, num_classes=num_classes or 10)
    if name == "resnet50":
        m = tvm.resnet50(weights=None, num_classes=num_classes or 100)
        if kw.get("cifar_stem"):
            m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            m.maxpool = nn.Identity()
        return m
    if name == "alexnet":
        size = int(kw.get("alexnet_input", 64))
        if size < 63:
            raise ValueError("alexnet_input must be >= 63 (smaller inputs vanish in AlexNet's stem)")
        return nn.Sequential(
            nn.Upsample(size=(size, size), mode="bilinear", align_corners=False),
            tvm.alexnet(weights=None, num_classes=num_classes or 100),
        )
    if name == "gpt2_s":
        if vocab_size is None:
            raise ValueError("gpt2_s needs vocab_size")
        return GPT2Logits(vocab_size, n_positions=int(kw.get("n_positions", 1024)))
    if name == "small_cnn":
        return SmallCNN(num_classes or 10)
    if name == "digits_mlp":
        return DigitsMLP(num_classes or 10)
    if name == "mnist1d_cnn":
        return MNIST1DCNN(num_classes or 10, width=int(kw.get("width", 64)), hidden=int(kw.get("hidden", 256)))
    if name == "small_transformer":
        if vocab_size is None:
            raise ValueError("small_transformer needs vocab_size")
        return SmallTransformer(vocab_size, max_len=int(kw.get("max_len", 256)))
    raise KeyError(f"unknown model {name!r}; known: {', '.join(WORKLOADS)}")


# ----------------------------------------------------------------------------- workloads


def _cifar_transform(x: torch.Tensor) -> torch.Tensor:
    """uint8 (N,3,32,32) -> normalised float32, on whatever device ``x`` is."""
    mean = torch.tensor(CIFAR_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=x.device).view(1, 3, 1, 1)
    return (x.float() / 255.0 - mean) / std


def _cifar_augment(x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """Random 4-pixel-padded crop and horizontal flip per image (standard CIFAR augmentation)."""
    n = x.shape[0]
    padded = F.pad(x, (4, 4, 4, 4))
    ox = torch.randint(0, 9, (n,), generator=gen)
    oy = torch.randint(0, 9, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    out = torch.empty_like(x)
    for i in range(n):
        img = padded[i, :, int(oy[i]) : int(oy[i]) + 32, int(ox[i]) : int(ox[i]) + 32]
        out[i] = img.flip(-1) if flip[i] else img
    return out


@dataclass
class Workload:
    """Everything the loop needs for one experiment.

    ``transform`` turns a stored batch into model input (on the device),
    ``augment`` (train only) runs before it on the stored batch, and
    ``defaults`` are sensible :class:`~dblp.train.loop.TrainConfig` overrides.
    ``metric`` is ``"accuracy"`` (higher is better) or ``"perplexity"`` (lower).
    """

    name: str
    model: nn.Module
    train_set: ArrayDataset
    test_set: ArrayDataset
    task: str  # "classification" | "lm"
    metric: str  # "accuracy" | "perplexity"
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    augment: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    synthetic: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def prepare(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        x = x.to(device, non_blocking=True)
        return self.transform(x) if self.transform else x

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy; for language models over every position (mean per token)."""
        if self.task == "lm":
            return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        return F.cross_entropy(out.float(), y)

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, device: torch.device, *, batch_size: int = 256, max_batches: int | None = None
    ) -> dict[str, float]:
        """Test metric: ``{"accuracy", "test_loss"}`` or ``{"perplexity", "test_loss"}``."""
        was_training = model.training
        model.eval()
        total_loss, correct, count = 0.0, 0, 0
        ds = self.test_set
        for b, start in enumerate(range(0, len(ds), batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            x = self.prepare(ds.x[start : start + batch_size], device)
            y = ds.y[start : start + batch_size].to(device)
            out = model(x)
            n = y.numel()
            total_loss += float(self.loss(out, y)) * n
            if self.task == "classification":
                correct += int((out.argmax(dim=-1) == y).sum())
            count += n
        model.train(was_training)
        mean_loss = total_loss / max(count, 1)
        if self.task == "lm":
            return {"perplexity": math.exp(min(mean_loss, 700.0)), "test_loss": mean_loss}
        return {"accuracy": correct / max(count, 1), "test_loss": mean_loss}


def _synthetic_images(n: int, num_classes: int, gen: torch.Generator) -> ArrayDataset:
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen)
    return ArrayDataset(x, torch.randint(0, num_classes, (n,), generator=gen))


def _synthetic_tokens(n: int, seq_len: int, vocab: int, gen: torch.Generator) -> ArrayDataset:
    ids = torch.randint(0, vocab, (n, seq_len + 1), generator=gen)
    return ArrayDataset(ids[:, :-1].clone(), ids[:, 1:].clone())


def _data_root(data_root: str | os.PathLike | None, sub: str) -> Path | None:
    """``data_root`` as given, or ``$DBLP_DATA_ROOT/<sub>`` / ``$DBLP_DATA_ROOT``."""
    if data_root:
        return Path(data_root)
    env = os.environ.get("DBLP_DATA_ROOT")
    if env:
        p = Path(env)
        return p / sub if (p / sub).is_dir() else p
    return None


def _cifar_workload(
    name: str, loader: Callable, num_classes: int, data_root: Any, synthetic: bool, synthetic_size: int,
    seed: int, defaults: dict[str, Any], model_kw: dict[str, Any], data: str = "real", data_size: int | None = None,
) -> Workload:
    gen = torch.Generator().manual_seed(seed)
    info: dict[str, Any] = {"num_classes": num_classes, "data": "real"}
    if synthetic:
        train, test = _synthetic_images(synthetic_size, num_classes, gen), _synthetic_images(synthetic_size, num_classes, gen)
        info["data"] = "random"
    elif data == "teacher":
        n = int(data_size or TEACHER_TRAIN_SAMPLES)
        train, test = teacher_images(n, max(256, n // 10), num_classes, seed=0)
        info.update(data="teacher", data_limits=TEACHER_LIMITS)
    else:
        train, test = loader(_data_root(data_root, "cifar"))
    model = _seeded_build(seed, name, num_classes=num_classes, **model_kw)
    return Workload(
        name=name, model=model, train_set=train, test_set=test, task="classification", metric="accuracy",
        transform=_cifar_transform, augment=_cifar_augment, defaults=defaults, synthetic=synthetic,
        info=info,
    )


def get_workload(
    name: str,
    data_root: str | os.PathLike | None = None,
    *,
    synthetic: bool = False,
    synthetic_size: int = 64,
    seq_len: int | None = None,
    tokenizer: str = "word",
    vocab_size: int | None = None,
    seed: int = 0,
    data: str = "real",
    data_size: int | None = None,
    **model_kw: Any,
) -> Workload:
    """Build workload ``name`` (see :data:`WORKLOADS`) with a model seeded by ``seed``.

    ``data_root``: folder of the data set (paper workloads only; default
    ``$DBLP_DATA_ROOT``).  ``synthetic``: random inputs of the right shape and
    ``synthetic_size`` samples instead of the data set (paper workloads only).
    ``seq_len``: language-model context (gpt2_s default 128, small_transformer
    64).  ``tokenizer``: WikiText-2 tokenizer, ``"word"`` or ``"byte"``.
    ``vocab_size``: GPT-2 vocabulary for synthetic runs (default 50257).
    ``model_kw``: e.g. ``alexnet_input=224``, ``cifar_stem=True``.
    ``data``: ``"real"`` (the data set from ``data_root``) or ``"teacher"`` (the CIFAR-shaped
    workloads only: :func:`dblp.train.data.teacher_images`, a learnable synthetic set of
    ``data_size`` training images, default :data:`TEACHER_TRAIN_SAMPLES`, nothing read from disk).
    """
    key = workload_key(name)
    if synthetic and key not in PAPER_WORKLOADS:
        raise ValueError(f"{key} uses its shipped real data set; synthetic=True is for paper workloads")
    if data not in DATA_KINDS:
        raise ValueError(f"data {data!r}: one of {', '.join(DATA_KINDS)}")
    if data == "teacher" and key not in TEACHER_WORKLOADS:
        raise ValueError(f"data teacher: only the image workloads ({', '.join(TEACHER_WORKLOADS)}) have a "
                         f"teacher-labelled synthetic set; {key} trains on {'its shipped data' if key not in PAPER_WORKLOADS else 'WikiText-2'}")
    if data_size is not None and data_size < 1:
        raise ValueError(f"data_size must be at least 1, got {data_size}")
    dkw: dict[str, Any] = {"data": data, "data_size": data_size}

    if key == "efficientnet_b0":
        return _cifar_workload(key, load_cifar10, 10, data_root, synthetic, synthetic_size, seed,
                               dict(WORKLOAD_DEFAULTS[key]), model_kw, **dkw)
    if key == "resnet50":
        return _cifar_workload(key, load_cifar100, 100, data_root, synthetic, synthetic_size, seed,
                               dict(WORKLOAD_DEFAULTS[key]), model_kw, **dkw)
    if key == "alexnet":
        return _cifar_workload(key, load_cifar100, 100, data_root, synthetic, synthetic_size, seed,
                               dict(WORKLOAD_DEFAULTS[key]), model_kw, **dkw)
    if key == "gpt2_s":
        sl = seq_len or 128
        gen = torch.Generator().manual_seed(seed)
        info: dict[str, Any] = {"seq_len": sl}
        if synthetic:
            v = vocab_size or 50257
            train, test = _synthetic_tokens(synthetic_size, sl, v, gen), _synthetic_tokens(synthetic_size, sl, v, gen)
            info["tokenizer"] = "synthetic"
        else:
            train, valid, test, tok = load_wikitext2(_data_root(data_root, "wikitext-2"), seq_len=sl, tokenizer=tokenizer)
            v = tok.vocab_size
            info.update(tokenizer=tokenizer, valid_blocks=len(valid))
        info["vocab_size"] = v
        model = _seeded_build(seed, "gpt2_s", vocab_size=v, **model_kw)
        return Workload(key, model, train, test, "lm", "perplexity", synthetic=synthetic, info=info,
                        defaults=dict(WORKLOAD_DEFAULTS[key]))
    if key == "digits_mlp":
        train, test = load_digits(seed=0)
        model = _seeded_build(seed, "digits_mlp", num_classes=10)
        return Workload(key, model, train, test, "classification", "accuracy",
                        defaults=dict(WORKLOAD_DEFAULTS[key]), info={"num_classes": 10})
    if key == "mnist1d_cnn":
        train, test = build_mnist1d()  # one fixed set (the package's seed): compared runs see the same test set
        model = _seeded_build(seed, "mnist1d_cnn", num_classes=10, **model_kw)
        return Workload(key, model, train, test, "classification", "accuracy",
                        defaults=dict(WORKLOAD_DEFAULTS[key]),
                        info={"num_classes": 10, "data": f"MNIST-1D ({MNIST1D_SAMPLES:,} signals, seed {MNIST1D_SEED})"})
    if key == "small_cnn":
        train, test = load_digits(seed=0)
        model = _seeded_build(seed, "small_cnn", num_classes=10)
        return Workload(key, model, train, test, "classification", "accuracy",
                        defaults=dict(WORKLOAD_DEFAULTS[key]), info={"num_classes": 10})
    # small_transformer
    sl = seq_len or 64
    train, test, tok = load_tiny_corpus(seq_len=sl)
    model = _seeded_build(seed, "small_transformer", vocab_size=tok.vocab_size, max_len=max(sl, 64))
    return Workload(key, model, train, test, "lm", "perplexity",
                    defaults=dict(WORKLOAD_DEFAULTS[key]),
                    info={"seq_len": sl, "vocab_size": tok.vocab_size, "tokenizer": "char"})


WORKLOADS: tuple[str, ...] = (
    "efficientnet_b0",
    "resnet50",
    "alexnet",
    "gpt2_s",
    "small_cnn",
    "small_transformer",
    "digits_mlp",
    "mnist1d_cnn",
)
PAPER_WORKLOADS: tuple[str, ...] = WORKLOADS[:4]
#: the ``data`` choices of :func:`get_workload` (and of ``--data``)
DATA_KINDS: tuple[str, ...] = ("real", "teacher")
#: the workloads with a teacher-labelled synthetic image set (CIFAR's shapes)
TEACHER_WORKLOADS: tuple[str, ...] = ("efficientnet_b0", "resnet50", "alexnet")
#: default training images of a teacher set: 3 workers x batch 128 x 93 iterations, so the paper's
#: 930 (EfficientNet-B0) and 1395 (ResNet50) iterations are whole epochs (10 and 15) of 3 workers
TEACHER_TRAIN_SAMPLES = 3 * 128 * 93


#: the language-model workloads: their test metric is perplexity (lower is better), the others' accuracy
LM_WORKLOADS: tuple[str, ...] = ("gpt2_s", "small_transformer")


def workload_metric(name: str) -> str:
    """Workload ``name``'s test metric without building it (``--target-accuracy`` is checked by it
    before any process starts); KeyError if unknown."""
    return "perplexity" if workload_key(name) in LM_WORKLOADS else "accuracy"


def workload_key(name: str) -> str:
    """The canonical workload name of ``name`` (spellings: :func:`dblp.runs.gradients.model_name`); KeyError if unknown."""
    key = model_name(name)
    if key not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return key


#: Each workload's :class:`~dblp.train.loop.TrainConfig` defaults (``batch_size`` is per worker),
#: readable without building the model or loading the data (the hosts inventory checks with them).
WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    "efficientnet_b0": dict(batch_size=128, lr=0.05, momentum=0.9, weight_decay=5e-4),
    "resnet50": dict(batch_size=128, lr=0.05, momentum=0.9, weight_decay=5e-4),
    "alexnet": dict(batch_size=128, lr=0.01, momentum=0.9, weight_decay=5e-4),
    "gpt2_s": dict(batch_size=8, lr=2.5e-4, optimizer="adamw", weight_decay=0.01, clip_grad_norm=1.0,
                   warmup_iters=200, eval_batch_size=8),
    "small_cnn": dict(batch_size=32, lr=0.05, momentum=0.9, epochs=5),
    "small_transformer": dict(batch_size=16, lr=3e-3, optimizer="adamw", epochs=10, clip_grad_norm=1.0),
    "digits_mlp": dict(batch_size=32, lr=0.05, momentum=0.9, epochs=10),
    # 3 workers: 100 iterations an epoch; 12 epochs reach the plateau (docs/training.md, MNIST-1D)
    "mnist1d_cnn": dict(batch_size=32, lr=0.1, momentum=0.9, epochs=12),
}

#: Training-set sizes fixed by the data set itself (CIFAR-10/100: 50,000 images), known without it.
_FIXED_TRAIN_SAMPLES = {"efficientnet_b0": 50_000, "resnet50": 50_000, "alexnet": 50_000}


def train_samples(name: str) -> int | None:
    """Samples in workload ``name``'s training set before sharding, without building the model.

    CIFAR's size is fixed; the bundled digits and tiny corpus are read (small
    files, shipped); ``None`` for WikiText-2, whose block count depends on the
    tokenizer and the data on the host.
    """
    key = workload_key(name)
    if key in _FIXED_TRAIN_SAMPLES:
        return _FIXED_TRAIN_SAMPLES[key]
    if key in ("small_cnn", "digits_mlp"):
        return len(load_digits(seed=0)[0])
    if key == "small_transformer":
        return len(load_tiny_corpus(seq_len=64)[0])
    if key == "mnist1d_cnn":
        return int(MNIST1D_SAMPLES * 0.8)  # make_dataset's 80/20 split
    return None


_ALIASES = MODEL_ALIASES  # one table of spellings: dblp.runs.gradients


#: The data set each paper workload reads, and the ``$DBLP_DATA_ROOT`` subfolder it is looked for in.
_DATASETS: dict[str, tuple[str, str]] = {"efficientnet_b0": ("CIFAR-10", "cifar"), "resnet50": ("CIFAR-100", "cifar"),
                                         "alexnet": ("CIFAR-100", "cifar"), "gpt2_s": ("WikiText-2", "wikitext-2")}


def dataset_problem(name: str, data_root: str | os.PathLike | None = None, *, synthetic: bool = False) -> str | None:
    """Why workload ``name`` cannot find its data set on this machine, or None when it can.

    Why: a training worker that misses its data set dies inside ``torchrun``,
    whose error box does not say why; the real-host launcher asks every host
    this first (``python -m emulation.hosts facts``) and refuses the run by
    the data set's name. The check is the loader itself (the one place that
    knows the files and layouts), so it reads the data once; the shipped data
    sets (digits, the tiny corpus) and ``synthetic`` data need nothing;
    MNIST-1D needs the ``mnist1d`` package (it is generated, never read).
    """
    key = workload_key(name)
    if key == "mnist1d_cnn":
        import importlib.util

        if importlib.util.find_spec("mnist1d") is None:
            return ("MNIST-1D (mnist1d_cnn's data set) is generated by the mnist1d package, which is not installed: "
                    "pip install 'dblp-testbed[train]'")
        return None
    if synthetic or key not in _DATASETS:
        return None
    what, sub = _DATASETS[key]
    root = _data_root(data_root, sub)
    try:
        if key == "efficientnet_b0":
            load_cifar10(root)
        elif key == "gpt2_s":
            load_wikitext2(root)
        else:
            load_cifar100(root)
    except DatasetMissingError as exc:
        return f"{what} ({key}'s data set): {exc}"
    return None
