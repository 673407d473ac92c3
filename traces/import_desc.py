"""Loss traces from netem and mahimahi descriptions, where they map.

These tools describe *models*, not recordings, so a trace made from them is
sampled and carries ``provenance: "generated"``.

netem (tc-netem(8)) - what maps:

* ``loss random P [CORR]`` / ``loss P [CORR]``: Bernoulli loss P, only when
  the correlation is 0 or absent (netem's correlated "random" loss is not a
  Markov model with a stated loss process; refused).
* ``loss gemodel p [r [1-h [1-k]]]``: Gilbert-Elliott with iproute2's
  defaults ``r = 1-p``, ``1-h = 100%``, ``1-k = 0``.
* ``corrupt P``: a corrupted datagram fails DBLP's CRC-32 (or the UDP/TCP
  checksum) and is discarded, so it is folded in as independent extra loss:
  each state's loss becomes ``1 - (1 - loss)(1 - P)``.
* ``rate RATE`` -> ``rate_bps``; ``limit N`` -> ``queue_pkts``.
* ``loss state ...`` (the 4-state model) and ``slot`` are refused; delay,
  jitter, distribution, reorder, duplicate, ecn and seed have no loss
  meaning and are listed in ``extra.ignored``.

Percentages follow iproute2: a number is a percentage with or without the
``%`` sign (``loss 1`` means 1%).

mahimahi (mahimahi(1)) - what maps, for the chosen direction:

* ``mm-loss uplink|downlink RATE``: Bernoulli loss RATE (a fraction, 0..1);
  nested shells compose as ``1 - prod(1 - RATE)``.
* ``mm-onoff uplink|downlink MEAN_ON MEAN_OFF``: the link switches between
  connected and disconnected with exponentially distributed durations of the
  given means in seconds (its ``StochasticSwitchingLink``), dropping every
  packet while disconnected: an ON/OFF trace whose bursts (loss 1) are the
  disconnected periods.
* ``mm-delay`` and ``mm-link`` (delay, delivery-opportunity rate traces)
  carry no loss and are listed in ``extra.ignored``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import NotMappableError, TraceError
from .generators import (
    bernoulli_packets,
    gilbert_elliott_packets,
    gilbert_elliott_segments,
    onoff_segments,
)
from . import units
from .meta import TraceMeta
from .model import PacketTrace, SegmentTrace

_NETEM_KEYWORDS = {
    "limit",
    "delay",
    "latency",
    "distribution",
    "loss",
    "drop",
    "corrupt",
    "duplicate",
    "reorder",
    "gap",
    "rate",
    "slot",
    "ecn",
    "seed",
}


def parse_percent(tok: str) -> float:
    """iproute2's percent: ``"1.5%"`` or ``"1.5"`` both mean 0.015."""
    t = tok[:-1] if tok.endswith("%") else tok
    try:
        v = float(t) / 100.0
    except ValueError:
        raise TraceError(f"{tok!r} is not a percentage") from None
    if not 0.0 <= v <= 1.0:
        raise TraceError(f"{tok!r} is outside 0..100%")
    return v


def parse_rate(tok: str) -> float:
    """A tc rate (``100mbit``, ``1gbit``, ``125mbps`` = bytes/s, bare number = bit/s) in bit/s
    (:func:`traces.units.parse_rate`, tc's meaning of every suffix)."""
    try:
        return units.parse_rate(tok, "bit", allow_zero=False, tc=True)
    except units.UnitError as exc:
        raise TraceError(str(exc)) from None


def _is_number(tok: str) -> bool:
    return re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?%?", tok) is not None


@dataclass
class LinkModel:
    """A loss model read from a description, ready to sample as either form.

    ``kind`` is ``"bernoulli"``, ``"gilbert-elliott"``, ``"onoff"`` or
    ``"none"`` (no loss); ``params`` holds the generator's arguments.
    """

    kind: str
    params: dict[str, Any]
    description: str
    tool: str
    rate_bps: float | None = None
    queue_pkts: int | None = None
    ignored: list[str] = field(default_factory=list)

    def mean_loss(self) -> float:
        p = self.params
        if self.kind == "bernoulli":
            return float(p["loss"])
        if self.kind == "gilbert-elliott":
            from .generators import gilbert_elliott_mean_loss

            return gilbert_elliott_mean_loss(p["p"], p["r"], p["bad_loss"], p["good_loss"])
        if self.kind == "onoff":
            from .generators import onoff_mean_loss

            return onoff_mean_loss(p["on_mean_us"], p["off_mean_us"], p["on_loss"], p["off_loss"])
        return 0.0

    def _meta(self, tr: SegmentTrace | PacketTrace) -> TraceMeta:
        gen = dict(tr.meta.generator or {})
        gen["params"] = {**gen.get("params", {}), "from": self.description}
        extra = {"ignored": self.ignored} if self.ignored else {}
        return tr.meta.with_(
            source=f"{self.tool}: {self.description}",
            description=f"sampled from the {self.tool} description '{self.description}'",
            generator=gen,
            extra=extra,
        )

    def packets(
        self, n_packets: int, *, seed: int | None = None, packet_interval_us: float | None = None
    ) -> PacketTrace:
        """Sample a per-packet trace of ``n_packets`` packets."""
        p = self.params
        if self.kind in ("bernoulli", "none"):
            tr: PacketTrace = bernoulli_packets(
                p.get("loss", 0.0), n_packets, seed=seed, packet_interval_us=packet_interval_us
            )
        elif self.kind == "gilbert-elliott":
            tr = gilbert_elliott_packets(
                p["p"], p["r"], p["bad_loss"], p["good_loss"], n_packets=n_packets, seed=seed,
                packet_interval_us=packet_interval_us,
            )
        else:
            if not packet_interval_us:
                raise TraceError("an ON/OFF model needs packet_interval_us to become a packet sequence")
            seg = self.segments(int(np.ceil(n_packets * packet_interval_us)), seed=seed)
            return seg.to_packets(packet_interval_us, np.random.default_rng(seed), n_packets)
        return PacketTrace(tr.drops, self._meta(tr))

    def segments(
        self, duration_us: int, *, seed: int | None = None, packet_interval_us: float | None = None
    ) -> SegmentTrace:
        """Sample a segment trace of ``duration_us``; rate/limit become constant columns."""
        p = self.params
        if self.kind in ("bernoulli", "none"):
            tr = SegmentTrace(
                np.array([0]),
                np.array([p.get("loss", 0.0)]),
                duration_us,
                meta=TraceMeta(
                    generator={"name": "bernoulli", "params": {"loss": p.get("loss", 0.0)}}, seed=seed
                ),
            )
        elif self.kind == "gilbert-elliott":
            if not packet_interval_us:
                raise TraceError(
                    "a Gilbert-Elliott model is per packet: give packet_interval_us to lay it out in time"
                )
            tr = gilbert_elliott_segments(
                p["p"], p["r"], p["bad_loss"], p["good_loss"], duration_us=duration_us,
                packet_interval_us=packet_interval_us, seed=seed,
            )
        else:
            tr = onoff_segments(duration_us=duration_us, seed=seed, **p)
        n = len(tr)
        rate = None if self.rate_bps is None else np.full(n, self.rate_bps)
        queue = None if self.queue_pkts is None else np.full(n, float(self.queue_pkts))
        return SegmentTrace(tr.start_us, tr.loss, tr.duration_us, rate, queue, self._meta(tr))


def _combine(a: float, b: float) -> float:
    """Loss of two independent droppers in series: 1 - (1-a)(1-b)."""
    return a + b - a * b


def parse_netem(desc: str) -> LinkModel:
    """Read a netem description (``tc qdisc ... netem OPTIONS`` or just the options)."""
    toks = shlex.split(desc)
    if "netem" in toks:
        toks = toks[toks.index("netem") + 1 :]
    i = 0
    loss_kind = "none"
    params: dict[str, Any] = {"loss": 0.0}
    corrupt = 0.0
    rate = None
    limit = None
    ignored: list[str] = []

    def args_from(j: int, numeric: bool = False) -> list[str]:
        out = []
        while j < len(toks) and toks[j] not in _NETEM_KEYWORDS and toks[j] not in ("random", "state", "gemodel"):
            if numeric and not (_is_number(toks[j]) or toks[j] == "ecn"):
                break
            out.append(toks[j])
            j += 1
        return out

    while i < len(toks):
        kw = toks[i]
        if kw not in _NETEM_KEYWORDS:
            raise NotMappableError(f"netem: unknown option {kw!r} in {desc!r}")
        if kw in ("loss", "drop"):
            sub = toks[i + 1] if i + 1 < len(toks) else ""
            if sub in ("random", "state", "gemodel"):
                a = args_from(i + 2, numeric=True)
                i += 2 + len(a)
            else:
                a = args_from(i + 1, numeric=True)
                i += 1 + len(a)
                sub = "random"
            if a and a[-1] == "ecn":
                a = a[:-1]
            if sub == "state":
                raise NotMappableError("netem 'loss state' (4-state Markov) has no equivalent generator here")
            if not a:
                raise TraceError(f"netem: 'loss {sub}' needs a percentage")
            if sub == "random":
                if len(a) > 1 and parse_percent(a[1]) != 0.0:
                    raise NotMappableError(
                        f"netem 'loss {a[0]} {a[1]}': correlated random loss does not define a loss "
                        "process to reproduce; describe bursts with 'loss gemodel' instead"
                    )
                loss_kind, params = "bernoulli", {"loss": parse_percent(a[0])}
            else:
                nums = [parse_percent(x) for x in a[:4]]
                p = nums[0]
                r = nums[1] if len(nums) > 1 else 1.0 - p
                bad = nums[2] if len(nums) > 2 else 1.0
                good = nums[3] if len(nums) > 3 else 0.0
                loss_kind, params = "gilbert-elliott", {"p": p, "r": r, "bad_loss": bad, "good_loss": good}
            continue
        a = args_from(i + 1, numeric=kw in ("corrupt", "duplicate", "reorder", "limit", "gap", "seed"))
        if kw == "corrupt":
            if not a:
                raise TraceError("netem: 'corrupt' needs a percentage")
            if len(a) > 1 and parse_percent(a[1]) != 0.0:
                raise NotMappableError("netem: correlated 'corrupt' does not map to a loss process")
            corrupt = parse_percent(a[0])
        elif kw == "rate":
            if not a:
                raise TraceError("netem: 'rate' needs a value")
            rate = parse_rate(a[0])
            if len(a) > 1:
                ignored.append("rate overhead/cell arguments " + " ".join(a[1:]))
        elif kw == "limit":
            if not a or not a[0].isdigit() or int(a[0]) < 1:
                raise TraceError("netem: 'limit' needs a positive packet count")
            limit = int(a[0])
        elif kw == "slot":
            raise NotMappableError("netem 'slot' (bursty delivery slots) has no loss-trace equivalent")
        else:
            ignored.append(" ".join([kw, *a]))
        i += 1 + len(a)

    if corrupt:
        if loss_kind == "gilbert-elliott":
            params["bad_loss"] = _combine(params["bad_loss"], corrupt)
            params["good_loss"] = _combine(params["good_loss"], corrupt)
        else:
            loss_kind, params = "bernoulli", {"loss": _combine(params.get("loss", 0.0), corrupt)}
    return LinkModel(loss_kind, params, " ".join(toks), "netem", rate, limit, ignored)


def parse_mahimahi(cmd: str, direction: str = "uplink") -> LinkModel:
    """Read a (possibly nested) mahimahi shell command line for one direction."""
    if direction not in ("uplink", "downlink"):
        raise TraceError("direction must be 'uplink' or 'downlink'")
    toks = shlex.split(cmd)
    loss = 0.0
    onoff: tuple[float, float] | None = None
    ignored: list[str] = []
    used: list[str] = []
    i = 0
    while i < len(toks):
        t = toks[i].rsplit("/", 1)[-1]
        if t == "mm-loss":
            if i + 2 >= len(toks):
                raise TraceError("mm-loss needs: uplink|downlink RATE")
            d, v = toks[i + 1], toks[i + 2]
            if d not in ("uplink", "downlink"):
                raise NotMappableError(f"mm-loss {d!r}: only the 'mm-loss uplink|downlink RATE' form maps")
            try:
                rate = float(v)
            except ValueError:
                raise TraceError(f"mm-loss rate {v!r} is not a number") from None
            if not 0.0 <= rate <= 1.0:
                raise TraceError(f"mm-loss rate {v} must be between 0 and 1")
            if d == direction:
                loss = _combine(loss, rate)
                used.append(f"mm-loss {d} {v}")
            i += 3
        elif t == "mm-onoff":
            if i + 3 >= len(toks):
                raise TraceError("mm-onoff needs: uplink|downlink MEAN_ON MEAN_OFF")
            d = toks[i + 1]
            try:
                on_s, off_s = float(toks[i + 2]), float(toks[i + 3])
            except ValueError:
                raise TraceError("mm-onoff mean times must be numbers (seconds)") from None
            if on_s <= 0 or off_s <= 0:
                raise TraceError("mm-onoff mean times must be positive")
            if d == direction:
                if onoff is not None:
                    raise NotMappableError("two mm-onoff shells on one direction do not compose into one trace")
                onoff = (on_s, off_s)
                used.append(f"mm-onoff {d} {toks[i + 2]} {toks[i + 3]}")
            i += 4
        elif t == "mm-delay":
            ignored.append(f"mm-delay {toks[i + 1] if i + 1 < len(toks) else ''}".strip())
            i += 2
        elif t in ("mm-link", "mm-meter"):
            ignored.append(t)
            i += 1
        else:
            i += 1  # link-shell arguments, '--', or the command run inside
    desc = " ".join(used) or "no loss on " + direction
    if onoff is None:
        kind = "bernoulli" if loss > 0 else "none"
        return LinkModel(kind, {"loss": loss}, desc, "mahimahi", ignored=ignored)
    on_s, off_s = onoff
    params = {
        "on_mean_us": off_s * 1e6,  # a burst is mahimahi's disconnected ("off") period
        "off_mean_us": on_s * 1e6,
        "on_loss": 1.0,
        "off_loss": loss,
        "dist": "exponential",
    }
    return LinkModel("onoff", params, desc, "mahimahi", ignored=ignored)
