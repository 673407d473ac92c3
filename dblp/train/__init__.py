"""Training over DBLP: workloads, data, gradient exchanges and the worker training loop.

Typical use::

    from dblp.train import get_workload, train, TrainConfig, LocalExchange
    wl = get_workload("small_cnn")
    summary = train(wl, LocalExchange(), TrainConfig.for_workload(wl, epochs=5))

Any object with ``exchange(flat_grad) -> averaged`` (and optionally
``last_info()``) plugs in as the exchange; see :mod:`dblp.train.exchange`.
A ``DistributedDataParallel`` script switches to DBLP with
``DBLPComm(ddp_model)`` (:mod:`dblp.train.comm`: hook, worker and server).
"""

try:  # an optional dependency of the project (the [train] extra): say so instead of a bare ModuleNotFoundError
    import torch  # noqa: F401
except ImportError as exc:
    raise ImportError(f"dblp.train needs PyTorch, which is not installed ({exc}): "
                      "pip install 'dblp-testbed[train]' (scripts/setup.sh installs it)") from exc

from dblp.train.comm import DBLPComm, DBLPCommError
from dblp.train.data import ArrayDataset, DatasetMissingError
from dblp.train.ddp import ExchangeHookState, exchange_hook
from dblp.train.exchange import (
    AllreduceExchange,
    DropExchange,
    Exchange,
    LocalExchange,
    TolerancePolicyExchange,
    TorchDistExchange,
    exchange_group,
    phase_fraction,
)
from dblp.train.loop import (
    TrainConfig,
    TrainSummary,
    assign_flat_grad,
    export_grad_norms,
    flatten_grads,
    iterations_per_epoch,
    read_grad_norms,
    resolve_device,
    train,
)
from dblp.train.models import PAPER_WORKLOADS, WORKLOADS, Workload, get_workload

__all__ = [
    "DBLPComm",
    "DBLPCommError",
    "ExchangeHookState",
    "exchange_hook",
    "ArrayDataset",
    "DatasetMissingError",
    "AllreduceExchange",
    "DropExchange",
    "Exchange",
    "LocalExchange",
    "TolerancePolicyExchange",
    "TorchDistExchange",
    "exchange_group",
    "phase_fraction",
    "TrainConfig",
    "TrainSummary",
    "assign_flat_grad",
    "export_grad_norms",
    "flatten_grads",
    "iterations_per_epoch",
    "read_grad_norms",
    "resolve_device",
    "train",
    "PAPER_WORKLOADS",
    "WORKLOADS",
    "Workload",
    "get_workload",
]
