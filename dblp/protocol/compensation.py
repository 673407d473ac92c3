"""Loss compensation: what a round makes of the chunks it did not deliver, each rule stated once.

The paper zero-fills every chunk a receiver does not hold (core R7): the server's mean counts a
missing upload chunk as zeros (``sum / N``) and a worker applies zeros for a missing chunk of the
mean. Under the paper's early stop (core R5/R6) that is not only loss: every ``P_high`` round leaves
about ``p`` of each transfer unsent, so zero-fill is random sparsification with a shrunken, biased
update. The options here are the known cures, each a protocol option with the paper's behaviour as
its default. The sessions (:mod:`dblp.protocol.session`) apply them, so the socket server and worker, the
simulator and the training exchange all get the same arithmetic:

C1  Upload estimate (the server's reduce, :mod:`dblp.protocol.reduce`): ``zero`` (the paper: a chunk's
    mean is its sum over the N workers divided by N) or ``unbiased`` (divided by the number of
    workers whose chunk arrived; a chunk nobody delivered is zero).
C2  Broadcast fill (each worker): ``zero`` (the paper) or ``local``: a chunk of the mean the worker
    does not hold is taken from the worker's own contribution of the round - the local estimate of
    that part of the mean (OptiReduce keeps the local value for a lost slice the same way). The
    replicas then differ where their broadcasts differed; the worker's record reports the chunks it
    filled, and ``--save-weights`` runs report the replicas' divergence.
C3  Upload error feedback (``feedback`` ``upload`` or ``both``, each worker): the worker sends its
    gradient plus the residual ``e`` it carries; once the upload's STOP is in, ``e`` becomes the sent
    values on the chunks its sender knows were not delivered - the chunks the pass that STOP ended
    never handed out (under R6's early stop, every chunk never sent) - and zero elsewhere. A chunk
    lost in flight in that last pass is not known to the sender and is not carried.
C4  Broadcast error feedback (``feedback`` ``broadcast`` or ``both``, the server): the server
    broadcasts the mean plus its residual ``r``; when the round's broadcasts are over, ``r``
    becomes the broadcast values on the chunks no worker was sent (every stream stopped before
    them) - or, under consistency ``intersect`` (S7), exactly the chunks outside the round's COMMON
    set, which no replica applied. The policy's norm (S3) is the mean's, without ``r``.
C5  The feedback bound: a residual whose L2 norm exceeds ``bound`` times the norm of the values it
    is added to (the round's gradient in C3, its mean in C4) is scaled down to that, so a burst
    that delivers little round after round cannot grow it without limit.
C6  Composition with consistency ``intersect``: C1, C3 and C4 compose (C4 then carries exactly what
    no replica applied); C2 ``local`` is refused, because it makes the replicas differ, which
    ``intersect`` exists to prevent.

The stop rule that decides *how much* is left undelivered is the core's (R5b, :data:`STOP_RULES`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dblp.protocol.receiver import DEADLINE_FACTOR, STOP_RULES  # core R5b: early (the paper's), once, deadline
from dblp.protocol.wire import ChunkLayout, ParameterError

UPLOAD_ESTIMATES = ("zero", "unbiased")  # C1 (dblp.protocol.reduce.MODES)
BROADCAST_FILLS = ("zero", "local")  # C2
FEEDBACK = ("off", "upload", "broadcast", "both")  # C3, C4
DEFAULT_FEEDBACK_BOUND = 1.0  # C5

#: one line of --help per option, shared by every driver's flags
HELP = {
    "upload_estimate": "server's estimate of a missing upload chunk (C1): zero (the paper: sum / N) or unbiased "
                       "(mean over the workers whose chunk arrived)",
    "broadcast_fill": "worker's fill for a chunk of the mean it does not hold (C2): zero (the paper) or local "
                      "(its own contribution's chunk)",
    "feedback": "error feedback (C3/C4): off (the paper), upload (workers carry undelivered upload chunks into "
                "the next round), broadcast (the server carries mean chunks no worker was sent), or both",
    "feedback_bound": "error feedback's bound (C5): a residual is scaled down to at most this times the norm of the "
                      "values it is added to (dimensionless)",
    "stop_rule": "when a receiver stops (core R5b): early (the paper: STOP once ceil((1-p) n) chunks are in, also "
                 "mid-pass), once (every chunk is sent once; the loss bound applies to retransmissions only) or "
                 f"deadline (as once, but a first pass still arriving {DEADLINE_FACTOR:g}x its running clean-pass "
                 "estimate after its first chunk is closed there once ceil((1-p) n) chunks are in; the in-memory "
                 "training exchange has no network time, so there it is once)",
}


@dataclass(frozen=True)
class Compensation:
    """The run's compensation and stop rule: one value the server announces to its workers (META)."""

    upload_estimate: str = "zero"
    broadcast_fill: str = "zero"
    feedback: str = "off"
    feedback_bound: float = DEFAULT_FEEDBACK_BOUND
    stop_rule: str = "early"

    def __post_init__(self) -> None:
        for name, allowed in (("upload_estimate", UPLOAD_ESTIMATES), ("broadcast_fill", BROADCAST_FILLS),
                              ("feedback", FEEDBACK), ("stop_rule", STOP_RULES)):
            if getattr(self, name) not in allowed:
                raise ParameterError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        b = self.feedback_bound
        if not (isinstance(b, (int, float)) and math.isfinite(b) and b > 0):
            raise ParameterError(f"feedback_bound must be a positive number, got {b!r}")

    @property
    def paper(self) -> bool:
        """The paper's behaviour: nothing compensated, early stop."""
        return self == Compensation(feedback_bound=self.feedback_bound)

    @property
    def upload_feedback(self) -> bool:
        return self.feedback in ("upload", "both")

    @property
    def broadcast_feedback(self) -> bool:
        return self.feedback in ("broadcast", "both")

    def check_consistency(self, consistency: str) -> None:
        """C6: refuse a combination that contradicts the consistency mode, naming the conflict."""
        if consistency == "intersect" and self.broadcast_fill == "local":
            raise ParameterError("broadcast_fill local conflicts with consistency intersect: a local fill makes "
                                 "the replicas differ, which intersect exists to prevent (use one of them)")

    def label(self) -> str:
        """A short name for tables and run folders: ``paper``, or the options that differ from it."""
        parts = []
        if self.upload_estimate != "zero":
            parts.append(self.upload_estimate)
        if self.broadcast_fill != "zero":
            parts.append(f"fill-{self.broadcast_fill}")
        if self.feedback != "off":
            parts.append(f"ef-{self.feedback}")
        if self.stop_rule != "early":
            parts.append(f"stop-{self.stop_rule}")
        return "+".join(parts) or "paper"

    @classmethod
    def from_label(cls, label: str) -> "Compensation":
        """The inverse of :meth:`label`: ``paper``, or options joined by ``+`` (``unbiased``,
        ``fill-local``, ``ef-upload``/``ef-broadcast``/``ef-both``, ``stop-once``, ``stop-deadline``); refuses a
        part it does not know, naming it and what it accepts."""
        kw: dict[str, Any] = {}
        known = {"unbiased": ("upload_estimate", "unbiased"), "fill-local": ("broadcast_fill", "local"),
                 **{f"ef-{f}": ("feedback", f) for f in FEEDBACK if f != "off"},
                 **{f"stop-{r}": ("stop_rule", r) for r in STOP_RULES if r != "early"}}
        parts = [x.strip() for x in label.split("+") if x.strip()]
        if not parts:
            raise ParameterError("an empty compensation label (use paper, or e.g. unbiased+fill-local)")
        for part in parts:
            if part == "paper" and len(parts) == 1:
                return cls()
            if part not in known:
                raise ParameterError(f"{part!r} is not a compensation option; use paper or a '+'-joined "
                                     f"set of {', '.join(known)}")
            name, value = known[part]
            if name in kw:
                raise ParameterError(f"{label!r} sets {name} twice")
            kw[name] = value
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The options as META, records and config.json carry them."""
        return {"upload_estimate": self.upload_estimate, "broadcast_fill": self.broadcast_fill,
                "feedback": self.feedback, "feedback_bound": self.feedback_bound, "stop_rule": self.stop_rule}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Compensation":
        """From META (a server that states none is the paper's)."""
        d = d or {}
        return cls(str(d.get("upload_estimate", "zero")), str(d.get("broadcast_fill", "zero")),
                   str(d.get("feedback", "off")), float(d.get("feedback_bound", DEFAULT_FEEDBACK_BOUND)),
                   str(d.get("stop_rule", "early")))

    @classmethod
    def from_args(cls, a: Any) -> "Compensation":
        """From parsed flags (:func:`dblp.cli.args.add_compensation_args`); absent flags keep the paper's."""
        def get(name: str, default: Any) -> Any:
            v = getattr(a, name, None)
            return default if v is None else v

        return cls(get("upload_estimate", "zero"), get("broadcast_fill", "zero"), get("feedback", "off"),
                   get("feedback_bound", DEFAULT_FEEDBACK_BOUND), get("stop_rule", "early"))

    def flags(self) -> list[str]:
        """The command-line flags that give these options to ``python -m dblp server`` (none: the paper's)."""
        out: list[str] = []
        for name, default in (("upload_estimate", "zero"), ("broadcast_fill", "zero"), ("feedback", "off"),
                              ("stop_rule", "early")):
            if getattr(self, name) != default:
                out += [f"--{name.replace('_', '-')}", getattr(self, name)]
        if self.feedback != "off" and self.feedback_bound != DEFAULT_FEEDBACK_BOUND:
            out += ["--feedback-bound", repr(self.feedback_bound)]
        return out


PAPER = Compensation()


# -- the flags: one vocabulary for every driver ---------------------------------------------------

def add_compensation_args(p: argparse.ArgumentParser | Any) -> None:
    """The loss-compensation options and the stop rule (:mod:`dblp.protocol.compensation`, C1-C6, core R5b),
    one flag each, with the paper's behaviour as every default; read back with
    :meth:`dblp.protocol.compensation.Compensation.from_args`."""
    from traces.argtypes import float_arg

    p.add_argument("--upload-estimate", "--reduce", dest="upload_estimate", choices=list(UPLOAD_ESTIMATES),
                   default="zero", help=HELP["upload_estimate"])
    p.add_argument("--broadcast-fill", choices=list(BROADCAST_FILLS), default="zero", help=HELP["broadcast_fill"])
    p.add_argument("--feedback", choices=list(FEEDBACK), default="off", help=HELP["feedback"])
    p.add_argument("--feedback-bound", type=float_arg(0.0, lo_open=True), default=DEFAULT_FEEDBACK_BOUND,
                   help=HELP["feedback_bound"])
    p.add_argument("--stop-rule", choices=list(STOP_RULES), default="early", help=HELP["stop_rule"])


def check_compensation_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> Any:
    """The options as one :class:`dblp.protocol.compensation.Compensation`, refused in one line when they
    contradict ``--consistency`` (C6)."""
    try:
        c = Compensation.from_args(a)
        c.check_consistency(getattr(a, "consistency", "none"))
    except ParameterError as exc:
        ap.error(str(exc))
    return c


def add_configs_arg(ap: argparse.ArgumentParser) -> None:
    """``--configs``: DBLP configurations run beside ``--policies``, each a compensation label."""
    ap.add_argument("--configs", default="",
                    help="DBLP configurations run beside --policies, comma-separated compensation labels "
                         "(dblp.protocol.compensation): paper, or '+'-joined unbiased, fill-local, ef-upload, "
                         "ef-broadcast, ef-both, stop-once, stop-deadline; e.g. unbiased+fill-local,stop-once. "
                         "Each runs as dblp with those options into dblp-<label>/ (calm too, unless --no-calm) "
                         "and gets its rows in every table (default: none)")


def check_configs_arg(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Parse ``--configs`` into ``a.config_list`` = [(run label, Compensation)], refusing a bad label or
    one that contradicts ``--consistency`` by name."""
    out: list[tuple[str, Any]] = []
    for part in (x.strip() for x in (a.configs or "").split(",")):
        if not part:
            continue
        try:
            c = Compensation.from_label(part)
            c.check_consistency(getattr(a, "consistency", "none"))
        except ParameterError as exc:
            ap.error(f"--configs {part}: {exc}")
        label = f"dblp-{c.label()}"
        if label in [x[0] for x in out]:
            ap.error(f"--configs names {part} twice")
        out.append((label, c))
    a.config_list = out


def chunk_mask_floats(mask: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """A per-chunk boolean mask spread to one entry per float of the tensor (the last chunk may be short)."""
    return np.repeat(mask, layout.chunk_floats)[: layout.elements]


def bounded(residual: np.ndarray, reference: np.ndarray, bound: float) -> float:
    """C5, in place: scale ``residual`` down to at most ``bound`` times ``reference``'s L2 norm.
    Returns the residual's norm after the bound."""
    rn = float(np.linalg.norm(residual))
    cap = bound * float(np.linalg.norm(reference))
    if rn > cap:
        residual *= np.float32(cap / rn) if rn > 0 else np.float32(0.0)
        return cap
    return rn


def fill_local(out: np.ndarray, own: np.ndarray, held: np.ndarray, layout: ChunkLayout) -> int:
    """C2 ``local``: copy ``own``'s values into ``out`` on every chunk ``held`` is False for.
    Vectorised (one masked copy); returns the number of chunks filled."""
    missing = ~held
    n = int(missing.sum())
    if n:
        np.copyto(out.reshape(-1), own.reshape(-1), where=chunk_mask_floats(missing, layout))
    return n


class UploadFeedback:
    """C3 and C5 for one worker: the residual of its undelivered upload chunks, carried across rounds.

    A round that delivered everything leaves no residual, and the next costs nothing: no copy, no
    norm, the caller's values sent as they are (a lossless round pays for no option it does not use)."""

    def __init__(self, layout: ChunkLayout, bound: float = DEFAULT_FEEDBACK_BOUND) -> None:
        self.layout = layout
        self.bound = bound
        self.residual = np.zeros(layout.elements, np.float32)
        self._buf = np.zeros(layout.elements, np.float32)
        self._sent: np.ndarray = self._buf
        self._empty = True  # the residual is all zeros
        self.norm = 0.0  # the residual's norm after the last round
        self.added = 0.0  # the norm of the residual the current round's contribution carries

    def contribution(self, values: np.ndarray) -> np.ndarray:
        """The round's values plus the carried residual (C5-bounded against the values), in a buffer of
        this object's own: the caller's gradient is never written."""
        if self._empty:
            self.norm = self.added = 0.0
            self._sent = values.reshape(-1)
            return self._sent
        self.norm = self.added = bounded(self.residual, values, self.bound)
        np.add(values.reshape(-1), self.residual, out=self._buf)
        self._sent = self._buf
        return self._sent

    def delivered(self, undelivered: np.ndarray) -> float:
        """The upload's STOP is in: carry the sent values of the ``undelivered`` chunks (indices).
        Returns the new residual's norm."""
        if not self._empty:
            self.residual.fill(0.0)
            self._empty = True
        if undelivered.size:
            miss = np.zeros(self.layout.chunks, bool)
            miss[undelivered] = True
            np.copyto(self.residual, self._sent, where=chunk_mask_floats(miss, self.layout))
            self._empty = False
        self.norm = 0.0 if self._empty else float(np.linalg.norm(self.residual))
        return self.norm


class BroadcastFeedback:
    """C4 and C5 for the server: the residual of the mean's chunks no replica was given (free while
    every broadcast delivers everything, as :class:`UploadFeedback`)."""

    def __init__(self, layout: ChunkLayout, bound: float = DEFAULT_FEEDBACK_BOUND) -> None:
        self.layout = layout
        self.bound = bound
        self.residual = np.zeros(layout.elements, np.float32)
        self._empty = True
        self.norm = 0.0

    def add_to(self, mean: np.ndarray) -> float:
        """Add the carried residual (C5-bounded against the mean) to the mean about to be broadcast,
        in place. Returns the residual's norm as added."""
        if self._empty:
            self.norm = 0.0
            return 0.0
        self.norm = bounded(self.residual, mean, self.bound)
        if self.norm > 0:
            mean.reshape(-1).__iadd__(self.residual)
        return self.norm

    def round_over(self, sent: np.ndarray, undelivered: np.ndarray) -> float:
        """The broadcast is over: carry ``sent``'s values on the chunks in ``undelivered`` (a per-chunk
        boolean mask). Returns the new residual's norm."""
        if not self._empty:
            self.residual.fill(0.0)
            self._empty = True
        if undelivered.any():
            np.copyto(self.residual, sent.reshape(-1), where=chunk_mask_floats(undelivered, self.layout))
            self._empty = False
        self.norm = 0.0 if self._empty else float(np.linalg.norm(self.residual))
        return self.norm
