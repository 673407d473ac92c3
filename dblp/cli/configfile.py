"""The config-file half of the command-line parsers: ``--config FILE`` (TOML or JSON) sets a
parser's defaults from a file, ``--print-config`` prints the flags as the run's ``config.json``
records them, and every parse remembers the flags as they were given (units included) so that
:func:`dblp.cli.provenance.write_config` can write them back.

:func:`dblp.cli.args.parser` builds every command's parser on :class:`ConfigArgumentParser`;
``dblp.cli.args`` re-exports the names here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dblp.cli import provenance

__all__ = ["CONFIG_NOT_FLAGS", "ConfigArgumentParser", "add_config_flags"]

#: keys of a config file that are not flags: the run's provenance and what the run derived from its flags
CONFIG_NOT_FLAGS: tuple[str, ...] = ("_run", "derived")
#: dests that are never written as flags (they steer the parser, not the run)
_NOT_WRITTEN = ("help", "config", "print_config", "version", argparse.SUPPRESS)
#: the flags of the parse in progress: the strings each dest was given (command line, config file or a string
#: default), kept so that config.json records "500M", not the 500000000.0 bit/s it became (a stack, since a
#: subcommand's parser parses inside its parent's)
_COLLECTING: list[dict[str, Any]] = []


def _config_key(action: argparse.Action) -> str:
    """The key a flag is written under: its first long name without the dashes (``p-high``)."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    return longs[0][2:] if longs else action.dest


_UNSET = object()


class ConfigArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose ``--config FILE`` (TOML or JSON) sets its flags' defaults from a file.

    Keys are the long flag names, with dashes or underscores (``p-high``, ``p_high``, ``iterations``;
    the older destination names such as ``rounds`` are read too); values go through the same ``type=``
    converters as on the command line (``bandwidth = "500M"``, ``bursts = [50, 110]``), and flags given
    on the command line win. An unknown key is refused with the closest flag names ("did you mean"); a
    file that cannot be read is refused naming it. A run writes its flags back as ``config.json``
    (:func:`dblp.cli.provenance.write_config`) as they were given, units included, with what the run derived
    from them kept apart under ``derived`` and its provenance under ``_run``: ``--config
    results/X/config.json`` reruns X. ``--print-config`` prints that file's flags without running.
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]

        argv = list(sys.argv[1:] if args is None else args)
        top = not _COLLECTING
        if top:
            _COLLECTING.append({"raw": {}, "actions": {}})
        col = _COLLECTING[0]
        try:
            for a in self._actions:  # a dest several flags set (--gso, --paths): the one that takes a value
                if a.dest not in col["actions"] or (col["actions"][a.dest].nargs == 0 and a.nargs != 0):
                    col["actions"][a.dest] = a
            if any(a.dest == "config" for a in self._actions):
                path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
                path = path or next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
                if path:
                    self._apply_config(path)
            ns, rest = super().parse_known_args(argv, namespace)
        finally:
            if top:
                _COLLECTING.pop()
        if top:
            flags: dict[str, tuple[str, Any]] = {}
            for dest, action in col["actions"].items():
                if dest in _NOT_WRITTEN or isinstance(action, argparse._SubParsersAction):
                    continue
                value = col["raw"].get(dest, _UNSET)
                flags[dest] = (_config_key(action), getattr(ns, dest, None) if value is _UNSET else value)
            provenance.remember_flags(ns, flags, hidden=[d for d in col["actions"] if d in _NOT_WRITTEN])
            if getattr(ns, "print_config", False):
                import json

                # the checks a run makes after parsing (a scenario's print_checks): a config printed is
                # one that --config takes back, never one with a value the run would refuse
                for check in getattr(self, "print_checks", ()):
                    check(self, ns)

                print(json.dumps(provenance.plain(dict(flags.values())), indent=1))
                self.exit(0)
        return ns, rest

    def _get_values(self, action, arg_strings):  # type: ignore[override]
        value = super()._get_values(action, arg_strings)
        if _COLLECTING and not isinstance(action, argparse._SubParsersAction) and action.nargs != 0:
            raw = _COLLECTING[0]["raw"]
            if isinstance(action, argparse._AppendAction):
                raw[action.dest] = list(raw.get(action.dest) or []) + [arg_strings[0] if len(arg_strings) == 1
                                                                        else list(arg_strings)]
            elif action.nargs in (None, "?") and len(arg_strings) <= 1:
                raw[action.dest] = arg_strings[0] if arg_strings else _UNSET
            else:
                raw[action.dest] = list(arg_strings)
        return value

    def _get_value(self, action, arg_string):  # type: ignore[override]
        value = super()._get_value(action, arg_string)
        # a string default converted at the end of a parse (the flag was not given): record it as given
        if _COLLECTING and arg_string is action.default and action.dest not in _COLLECTING[0]["raw"]:
            _COLLECTING[0]["raw"][action.dest] = arg_string
        return value

    def _apply_config(self, path: str) -> None:
        import difflib
        import json
        import tomllib

        try:
            with open(path, "rb") as fh:
                data = fh.read()
            if path.endswith(".json") or data.lstrip()[:1] == b"{":
                # decoded here, as UTF-8 (a BOM allowed): json.loads(bytes) guesses UTF-16 from a NUL and
                # counts a BOM's bytes out, so its error named the wrong byte or offset
                values = json.loads(data.decode("utf-8").removeprefix("\ufeff"))
                if not isinstance(values, dict):
                    raise ValueError("not a JSON object")
            else:
                values = tomllib.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:  # TOML and JSON are UTF-8 text; the decoders raise this one bare
            self.error(f"argument --config: {path!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                       f"at offset {exc.start}); a TOML or JSON file is UTF-8")
        except (OSError, ValueError) as exc:  # TOMLDecodeError, JSONDecodeError: ValueErrors
            self.error(f"argument --config: cannot read {path!r}: {exc}")
        actions: dict[str, argparse.Action] = {}
        for a in self._actions:
            if a.dest in _NOT_WRITTEN or isinstance(a, argparse._SubParsersAction):
                continue
            for n in [o[2:] for o in a.option_strings if o.startswith("--")]:
                actions.setdefault(n.replace("_", "-"), a)
        for a in self._actions:  # the older files' keys: the dests (for a shared dest, the flag that takes a value)
            d = a.dest.replace("_", "-")
            if a.dest in _NOT_WRITTEN or isinstance(a, argparse._SubParsersAction):
                continue
            if d not in actions or (actions[d].dest == a.dest and actions[d].nargs == 0 and a.nargs != 0):
                actions[d] = a
        defaults: dict[str, Any] = {}
        raw = _COLLECTING[0]["raw"] if _COLLECTING else {}
        for key, v in values.items():
            if key in CONFIG_NOT_FLAGS:
                continue
            act = actions.get(key.replace("_", "-"))
            if act is None:
                close = difflib.get_close_matches(key.replace("_", "-"), list(actions), n=3, cutoff=0.6)
                hint = (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else
                        "; this command's flags are " + ", ".join(sorted({_config_key(a) for a in actions.values()})))
                self.error(f"argument --config: {path}: unknown key {key!r}{hint}")
            dest = act.dest
            if v is None:  # written for a flag left at its default None
                defaults[dest] = act.default
            elif isinstance(act, argparse._CountAction):  # -v/--verbose: verbose = 2 is -vv
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    self.error(f"argument --config: {path}: {key} must be a count (0, 1, 2 ...), got {v!r}")
                defaults[dest] = v
            elif act.nargs == 0:  # store_true/false/const
                if not isinstance(v, bool):
                    self.error(f"argument --config: {path}: {key} must be true or false, got {v!r}")
                if isinstance(act, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                    defaults[dest] = v
                elif v:  # a flag that sets a constant (--gso: paths = [gso])
                    defaults[dest] = act.const
            elif isinstance(act, argparse._AppendAction) or act.nargs not in (None, "?"):
                items = v if isinstance(v, list) else [v]
                try:
                    if isinstance(act, argparse._AppendAction) and act.nargs in (None, "?"):
                        defaults[dest] = [self._get_value(act, str(x)) for x in items]
                    elif isinstance(act, argparse._AppendAction):
                        defaults[dest] = [[self._get_value(act, str(y)) for y in x] for x in items]
                    else:
                        defaults[dest] = [self._get_value(act, str(x)) for x in items]
                except argparse.ArgumentError as exc:
                    self.error(f"argument --config: {path}: {key}: {exc.message}")
                raw[dest] = list(items)  # written back as the file had them
            elif isinstance(v, list):  # a comma list, as on the command line
                defaults[dest] = ",".join(str(x) for x in v)
                raw[dest] = v
            else:
                defaults[dest] = str(v) if not isinstance(v, bool) else str(v).lower()
                raw[dest] = v  # written back as the file had it (0.93 stays a number)
            if not act.option_strings and act.nargs is None:  # a positional the file gives: optional now
                act.nargs = "?"
        self.set_defaults(**defaults)


def add_config_flags(ap: argparse.ArgumentParser | Any) -> None:
    """``--config FILE`` and ``--print-config`` (on a :class:`ConfigArgumentParser` or its subcommands)."""
    ap.add_argument("--config", default=None, metavar="FILE",
                    help="take the defaults of these flags from a TOML or JSON file (keys: the long flag names, "
                         "dashes or underscores; a run's config.json reruns it); flags on the command line win")
    ap.add_argument("--print-config", action="store_true",
                    help="print the flags as config.json records them (JSON, units as given) and exit without "
                         "running; --config takes the output back")
