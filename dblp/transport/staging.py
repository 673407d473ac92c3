"""Host staging of a worker's gradient: the one place where tensors become the flat buffer DBLP sends.

The transport sends from and receives into host memory (a flat float32
numpy array, chunked into datagrams), so every round a gradient that lives
elsewhere has to be brought to the host and the averaged result taken back.
:class:`HostStaging` does that with as few copies as the input allows:

* a numpy array, or a CPU float32 contiguous tensor: no copy at all - the
  buffer sent is a view of the caller's memory and the result is handed back
  as a view of the receive buffer (``torch.from_numpy``);
* a list of CPU tensors: one concatenation (the result comes back as views);
* CUDA tensors: flattened *on the device* (a list: one ``torch.cat`` there),
  then ONE non-blocking device->host copy into a page-locked (pinned) host
  buffer, and after the round ONE non-blocking host->device copy of the
  result from a second pinned buffer. Both buffers are allocated on first use
  and reused every round, so the DMA engines copy directly (a pageable
  ``.to("cpu")`` is staged through a driver buffer and blocks the host twice)
  and no round pays for fresh page-locked memory.

Synchronisation, only where the host touches the memory itself: the send
waits on a CUDA event recorded after the device->host copy (the transport
reads the buffer from Python, outside CUDA's stream order); a round's receive
waits on the event recorded after the previous round's host->device copy
(which must have finished reading the receive buffer before it is
overwritten). The result copy itself is queued on the caller's current
stream, so the optimizer step that follows sees it in stream order without a
host-side wait.

torch stays optional: it is only looked up in ``sys.modules`` (a tensor can
only come from a process that imported torch already; importing it here
would cost numpy users seconds).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, NamedTuple

import numpy as np

__all__ = ["HostStaging", "Staged"]


class Staged(NamedTuple):
    """One round's buffers: what to send, where to receive (``None``: the caller's own), how to map back."""

    send: np.ndarray
    recv: np.ndarray | None
    restore: Callable[[np.ndarray], Any]


class ResultPool:
    """Buffers for a round's result that no caller still holds.

    The averaged tensor is received straight into the array that
    ``allreduce`` returns, so there is no copy of it; a buffer is
    reused only once nothing outside this pool refers to it (a returned
    array, a view of it or a tensor made with ``torch.from_numpy`` all
    hold a reference), so a result kept by the caller is never
    overwritten. Fresh memory is not free either: on a VM its first
    touch costs more than the copy it replaces.
    """

    def __init__(self, elements: int, keep: int = 3) -> None:
        self.elements, self.keep = elements, keep
        self._bufs: list[np.ndarray] = []

    def __iter__(self):
        """The buffers kept (tests check which one a result came back in)."""
        return iter(list(self._bufs))

    def take(self) -> np.ndarray:
        """A float32 buffer of ``elements`` that nobody outside the pool holds."""
        for i in range(len(self._bufs)):
            if sys.getrefcount(self._bufs[i]) <= 2:  # references: the list's, and getrefcount's argument
                return self._bufs[i]
        buf = np.empty(self.elements, np.float32)
        self._bufs = [buf, *self._bufs[:self.keep - 1]]  # the pool forgets the oldest held buffer
        return buf


class HostStaging:
    """Flattens a worker's gradient into host float32 and maps the averaged result back (see the module)."""

    def __init__(self, elements: int) -> None:
        self.elements = int(elements)
        self._send_host: Any = None  # pinned torch tensors, CUDA inputs only
        self._recv_host: Any = None
        self._h2d_done: Any = None  # CUDA event after the last result copy

    @property
    def pinned(self) -> bool:
        """True once a CUDA gradient was staged through page-locked host buffers."""
        return self._send_host is not None and bool(self._send_host.is_pinned())

    def stage(self, x: Any) -> Staged:
        """This round's :class:`Staged` for ``x`` (numpy array, tensor, or list of tensors)."""
        torch = sys.modules.get("torch")
        if isinstance(x, np.ndarray):
            staged = _stage_numpy(x)
        elif torch is not None and isinstance(x, torch.Tensor):
            staged = self._stage_cuda([x], single=True) if x.is_cuda else _stage_cpu_tensor(torch, x)
        elif isinstance(x, (list, tuple)) and x and torch is not None and all(isinstance(t, torch.Tensor) for t in x):
            devices = {t.device for t in x}
            if len(devices) == 1 and next(iter(devices)).type == "cuda":
                staged = self._stage_cuda(list(x), single=False)
            else:
                staged = _stage_cpu_list(torch, list(x))
        else:
            raise TypeError(f"allreduce takes a numpy array, a torch tensor or a list of tensors, not {type(x).__name__}")
        if staged.send.size != self.elements:
            raise ValueError(f"tensor has {staged.send.size} elements; this worker was set up for {self.elements}")
        return staged

    # -- CUDA: one pinned buffer each way ------------------------------------------------
    def _pinned(self, torch: Any, which: str) -> Any:
        buf = getattr(self, which)
        if buf is None:
            buf = torch.empty(self.elements, dtype=torch.float32, pin_memory=torch.cuda.is_available())
            setattr(self, which, buf)
        return buf

    def _stage_cuda(self, tensors: list, *, single: bool) -> Staged:
        torch = sys.modules["torch"]
        device = tensors[0].device
        metas = [(t.shape, t.dtype, t.numel()) for t in tensors]
        n = sum(m[2] for m in metas)
        if n != self.elements:  # checked before any device work
            raise ValueError(f"tensor has {n} elements; this worker was set up for {self.elements}")
        if single:
            flat = tensors[0].detach().reshape(-1)
        else:
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        if flat.dtype != torch.float32:
            flat = flat.to(torch.float32)  # converted on the device, before the copy
        stream = torch.cuda.current_stream(device)
        send = self._pinned(torch, "_send_host")
        send.copy_(flat, non_blocking=True)  # device -> host, the round's one upload copy
        d2h = torch.cuda.Event()
        d2h.record(stream)
        recv = self._pinned(torch, "_recv_host")
        if self._h2d_done is not None:
            self._h2d_done.synchronize()  # the last result copy has read ``recv``
            self._h2d_done = None
        d2h.synchronize()  # the transport reads ``send`` from the host

        def restore(out: np.ndarray) -> Any:
            if out is not recv_np:
                raise RuntimeError("a CUDA round's result must arrive in the staging buffer it handed out")
            with torch.cuda.stream(stream):
                res = recv.to(device, non_blocking=True)  # host -> device, the round's one download copy
                done = torch.cuda.Event()
                done.record(stream)
            self._h2d_done = done
            if single:
                shape, dtype, _ = metas[0]
                res = res.view(shape)
                return res if dtype == torch.float32 else res.to(dtype)
            parts, off = [], 0
            for shape, dtype, k in metas:
                v = res[off : off + k].view(shape)
                parts.append(v if dtype == torch.float32 else v.to(dtype))
                off += k
            return parts

        recv_np = recv.numpy()
        return Staged(send.numpy(), recv_np, restore)


def _stage_numpy(x: np.ndarray) -> Staged:
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    shape, dtype = x.shape, x.dtype
    return Staged(flat, None, lambda out: out.reshape(shape).astype(dtype, copy=False))


def _stage_cpu_tensor(torch: Any, x: Any) -> Staged:
    """A CPU tensor: a view of it when it is float32 and contiguous (no copy), else one conversion."""
    flat = x.detach().to(torch.float32).contiguous().reshape(-1).numpy()
    shape, dtype, device = x.shape, x.dtype, x.device
    return Staged(flat, None, lambda out: torch.from_numpy(out).reshape(shape).to(device, dtype))


def _stage_cpu_list(torch: Any, xs: list) -> Staged:
    """Tensors on the CPU (or on mixed devices): one concatenation on the host; results come back as views."""
    flat = torch.cat([t.detach().to("cpu", torch.float32).reshape(-1) for t in xs]).numpy()
    metas = [(t.shape, t.dtype, t.device, t.numel()) for t in xs]

    def restore(out: np.ndarray) -> list:
        res, off = [], 0
        full = torch.from_numpy(out)
        for shape, dtype, device, n in metas:
            res.append(full[off : off + n].reshape(shape).to(device, dtype))
            off += n
        return res

    return Staged(flat, None, restore)
