"""Trace metadata: what a trace is, where it came from, and how to read it.

The metadata travels inside the trace file (line 1, a ``#`` followed by one
JSON object) so a trace can never be separated from its provenance. Unknown
keys are refused rather than ignored: a misspelt ``loop`` silently ignored
would change what a replay does. Free-form additions go under ``extra``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .errors import TraceFormatError

FORMAT_NAME = "dblp-loss-trace"
FORMAT_VERSION = 1
FORMS = ("segments", "packets")
PROVENANCES = ("generated", "measured")

#: The only units the format uses; stated in every file so a reader never guesses.
UNITS: dict[str, str] = {
    "time": "us",
    "loss": "probability",
    "rate": "bit/s",
    "queue": "packets",
}

_REQUIRED = ("format", "version", "form", "provenance", "source", "description", "units", "seed")
_OPTIONAL = (
    "generator",
    "duration_us",
    "rows",
    "packets",
    "packet_interval_us",
    "loop",
    "link",
    "extra",
)


@dataclass(frozen=True)
class TraceMeta:
    """Metadata of one trace.

    ``provenance`` is ``"generated"`` for anything sampled from a model
    (including netem and mahimahi descriptions) and ``"measured"`` only for a
    trace derived from a capture of real traffic. ``generator`` is required
    for generated traces: ``{"name": ..., "params": {...}}``, enough to
    regenerate the file with the same ``seed``.
    """

    form: str = "segments"
    provenance: str = "generated"
    source: str = ""
    description: str = ""
    seed: int | None = None
    generator: dict[str, Any] | None = None
    packet_interval_us: float | None = None
    loop: bool = False
    link: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_header(self, **counts: int) -> dict[str, Any]:
        """The JSON object written on line 1; ``counts`` adds duration_us/rows/packets."""
        d: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "form": self.form,
            "provenance": self.provenance,
            "source": self.source,
            "description": self.description,
            "units": dict(UNITS),
            "seed": self.seed,
        }
        d.update(counts)
        if self.generator is not None:
            d["generator"] = self.generator
        if self.packet_interval_us is not None:
            d["packet_interval_us"] = self.packet_interval_us
        if self.loop:
            d["loop"] = True
        if self.link is not None:
            d["link"] = self.link
        if self.extra:
            d["extra"] = self.extra
        return d

    def with_(self, **changes: Any) -> "TraceMeta":
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_meta_fields(meta: TraceMeta) -> None:
    """Validate a TraceMeta built in code (files go through :func:`parse_header`)."""
    if meta.form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {meta.form!r}")
    if meta.provenance not in PROVENANCES:
        raise ValueError(f"provenance must be one of {PROVENANCES}, got {meta.provenance!r}")
    if meta.provenance == "generated" and not meta.generator:
        raise ValueError("a generated trace must name its generator and parameters")
    if meta.generator is not None:
        _check_generator(meta.generator, lambda r: ValueError(r))


def _check_generator(gen: Any, fail: Any) -> None:
    if not isinstance(gen, dict) or set(gen) - {"name", "params"} or "name" not in gen:
        raise fail('"generator" must be an object {"name": str, "params": object}')
    if not isinstance(gen["name"], str) or not isinstance(gen.get("params", {}), dict):
        raise fail('"generator" must be an object {"name": str, "params": object}')


def parse_header(line: str, *, path: str | None = None) -> tuple[TraceMeta, dict[str, Any]]:
    """Parse and validate line 1 of a trace file.

    Returns the :class:`TraceMeta` and the raw dict (which also holds the
    form-specific counts ``duration_us``, ``rows`` and ``packets``).
    Every refusal is a :class:`TraceFormatError` on line 1.
    """

    def fail(reason: str) -> TraceFormatError:
        return TraceFormatError(reason, 1, path)

    if not line.startswith("#"):
        raise fail('missing metadata: line 1 must be "#" followed by a JSON object')
    try:
        d = json.loads(line[1:])
    except json.JSONDecodeError as e:
        raise fail(f"metadata is not valid JSON ({e.msg} at column {e.colno + 1})") from None
    if not isinstance(d, dict):
        raise fail("metadata must be a JSON object")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise fail(f"metadata is missing required field(s): {', '.join(missing)}")
    unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise fail(f"metadata has unknown field(s): {', '.join(unknown)} (put free-form data under \"extra\")")
    if d["format"] != FORMAT_NAME:
        raise fail(f'metadata "format" must be "{FORMAT_NAME}", got {d["format"]!r}')
    if d["version"] != FORMAT_VERSION:
        raise fail(f'unsupported format version {d["version"]!r} (this reader knows {FORMAT_VERSION})')
    if d["form"] not in FORMS:
        raise fail(f'metadata "form" must be one of {list(FORMS)}, got {d["form"]!r}')
    if d["provenance"] not in PROVENANCES:
        raise fail(f'metadata "provenance" must be one of {list(PROVENANCES)}, got {d["provenance"]!r}')
    for k in ("source", "description"):
        if not isinstance(d[k], str):
            raise fail(f'metadata "{k}" must be a string')
    units = d["units"]
    if not isinstance(units, dict):
        raise fail('metadata "units" must be an object')
    for k, v in units.items():
        if k not in UNITS:
            raise fail(f'metadata "units" has unknown unit {k!r}')
        if v != UNITS[k]:
            raise fail(f'metadata "units.{k}" must be {UNITS[k]!r}, got {v!r}')
    for k in ("time", "loss"):
        if k not in units:
            raise fail(f'metadata "units" must state "{k}": {UNITS[k]!r}')
    if d["seed"] is not None and not _is_int(d["seed"]):
        raise fail('metadata "seed" must be an integer or null')
    gen = d.get("generator")
    if gen is not None:
        _check_generator(gen, fail)
    if d["provenance"] == "generated" and gen is None:
        raise fail('a generated trace must have a "generator" with its name and parameters')
    if "loop" in d and not isinstance(d["loop"], bool):
        raise fail('metadata "loop" must be true or false')
    if "link" in d and not isinstance(d["link"], str):
        raise fail('metadata "link" must be a string')
    if "extra" in d and not isinstance(d["extra"], dict):
        raise fail('metadata "extra" must be an object')
    piu = d.get("packet_interval_us")
    if piu is not None and not (_is_num(piu) and piu > 0):
        raise fail('metadata "packet_interval_us" must be a positive number')
    if d["form"] == "segments":
        for k in ("duration_us", "rows"):
            if k not in d:
                raise fail(f'metadata of a segments trace must have "{k}"')
        if not (_is_int(d["duration_us"]) and 0 < d["duration_us"] < 2**63):  # int64 microseconds
            raise fail(f'metadata "duration_us" must be a positive integer below 2**63, got {d["duration_us"]!r}')
        if not (_is_int(d["rows"]) and d["rows"] > 0):
            raise fail('metadata "rows" must be a positive integer')
        if "packets" in d:
            raise fail('metadata "packets" belongs to the packets form, not segments')
    else:
        if "packets" not in d:
            raise fail('metadata of a packets trace must have "packets"')
        if not (_is_int(d["packets"]) and d["packets"] > 0):
            raise fail('metadata "packets" must be a positive integer')
        for k in ("duration_us", "rows"):
            if k in d:
                raise fail(f'metadata "{k}" belongs to the segments form, not packets')
    meta = TraceMeta(
        form=d["form"],
        provenance=d["provenance"],
        source=d["source"],
        description=d["description"],
        seed=d["seed"],
        generator=gen,
        packet_interval_us=None if piu is None else float(piu),
        loop=bool(d.get("loop", False)),
        link=d.get("link"),
        extra=d.get("extra", {}),
    )
    return meta, d


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
