"""`lscore migrate`: a peer's loss-scale config or checkpoint state to lscore's, and back."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from typing import Any

from lscore.migrate import PEERS, convert, peer_config, to_peer
from lscore.presets import json_config, preset, table, unjson_config
from lscore.state import parse_state


def _inert(qualified: str):
    """A stand-in class for `qualified`: it keeps what a checkpoint stored and runs nothing."""
    module, _, name = qualified.rpartition(".")

    class Inert:
        def __new__(cls, *args, **kwargs):
            obj = object.__new__(cls)
            if args or kwargs:
                obj.__dict__["_args"] = (args, kwargs)
            return obj

        def __init__(self, *args, **kwargs):
            pass

        def __setstate__(self, state):
            if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
                state = {**(state[0] or {}), **state[1]}  # (dict, slots) as pickle gives
            if isinstance(state, dict):
                self.__dict__.update(state)
            else:
                self.__dict__["_state"] = state

        def __repr__(self):
            return f"<{qualified} read as data>"

    Inert.__module__, Inert.__qualname__, Inert.__name__ = module, name, name.rpartition(".")[2]
    return Inert


def load_checkpoint(path: str, unsafe_pickle: bool = False):
    """(data, stand-ins) from a torch.save file, read with torch.load(weights_only=True).

    Whole training checkpoints hold objects of other packages (Megatron's
    argparse.Namespace of arguments and its enums, the scaler object DeepSpeed's
    ZeRO pickles): weights_only refuses them.  Each such class is then read as
    an inert stand-in holding the stored attributes (nothing of the class is
    imported or run); `stand-ins` lists their names.
    """
    import pickle

    import torch

    if unsafe_pickle:
        return torch.load(path, map_location="cpu", weights_only=False), []
    try:
        return torch.load(path, map_location="cpu", weights_only=True), []
    except pickle.UnpicklingError:
        serialization = torch.serialization
        if not hasattr(serialization, "get_unsafe_globals_in_checkpoint"):
            raise  # torch < 2.5
        names = sorted(serialization.get_unsafe_globals_in_checkpoint(path))
        if not names:
            raise
    with torch.serialization.safe_globals([(_inert(n), n) for n in names]):
        return torch.load(path, map_location="cpu", weights_only=True), names


_JSON_TYPES = {
    type(None): "null",
    bool: "boolean",
    int: "number",
    float: "number",
    str: "string",
    list: "array",
}

# the first bytes of a torch.save file: a zip archive, or (torch < 1.6) a pickle
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


class _Input:
    """The files one `lscore migrate` run read, and whether each was JSON."""

    def __init__(self, unsafe_pickle: bool) -> None:
        self.unsafe_pickle = unsafe_pickle
        self.notes: list[str] = []
        self.kinds: list[str] = []

    @property
    def all_json(self) -> bool:
        return bool(self.kinds) and all(k == "json" for k in self.kinds)

    def read(self, path: str) -> Any:
        """A JSON file, or a torch.save file when torch is installed."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        if not raw.strip():
            raise ValueError(f"{path} is empty: expected JSON or a torch.save file")
        text = None
        if not raw.startswith(_TORCH_MAGIC):
            # not text: perhaps a torch.save file of a format not listed above
            with contextlib.suppress(UnicodeDecodeError):
                text = raw.decode("utf-8-sig")
        if text is not None:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
                ) from None
            if not isinstance(data, dict):
                raise ValueError(
                    f"{path} holds a JSON {_JSON_TYPES.get(type(data), type(data).__name__)}; "
                    "expected a JSON object"
                )
            self.kinds.append("json")
            return data
        self.kinds.append("torch")
        return self._read_torch(path)

    def _read_torch(self, path: str) -> Any:
        import pickle

        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError(
                f"{path} is not JSON text; reading it as a torch.save file needs torch, "
                f"which is not installed"
            ) from None
        try:
            data, inert = load_checkpoint(path, self.unsafe_pickle)
        except Exception as e:  # torch raises many types for a file it cannot read
            hint = (
                " (objects other than tensors and plain containers need "
                "--unsafe-pickle, for files you trust)"
                if isinstance(e, pickle.UnpicklingError) and not self.unsafe_pickle
                else ""
            )
            raise ValueError(
                f"{path} is neither JSON nor a readable torch.save file: "
                f"{type(e).__name__}: {e}{hint}"
            ) from None
        if data is None:
            raise ValueError(f"{path} holds None; expected a config, a state or a checkpoint")
        if inert:
            self.notes.append(
                f"{path}: objects of {', '.join(inert)} were read as plain data "
                f"(torch.load weights_only=True; none of their code ran)"
            )
        return data


def _as_json_spells(message: str) -> str:
    """`message` with Python's True/False/None as JSON writes them (for JSON inputs)."""
    return re.sub(r"\b(True|False|None)\b", lambda m: _JSON_WORDS[m.group()], message)


_JSON_WORDS = {"True": "true", "False": "false", "None": "null"}


def _snippet(config: dict, state_file: str | None) -> str:
    cfg = dict(config)
    name = cfg.pop("preset")
    args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
    lines = ["import lscore", f"loss_scale = lscore.preset({name!r}{', ' if args else ''}{args})"]
    if state_file is not None:
        lines[0] = "import json, lscore"
        lines.append(f"with open({state_file!r}) as f:")
        lines.append("    loss_scale.load_state_dict(json.load(f))")
    return "\n".join(lines)


def _write(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, allow_nan=False, default=str)
        f.write("\n")


def _to_peer(args: argparse.Namespace, read: _Input) -> tuple[dict, list[str]]:
    """--to: (the JSON result, the report lines for people)."""
    if (args.source is None) == (args.state is None):
        raise ValueError(
            "--to needs one FILE: an lscore state (lscore.state/1), as FILE or --state "
            'FILE, or an lscore config ({"preset": ...}) as FILE'
        )
    source = args.source if args.source is not None else args.state
    data = read.read(source)
    has_state = isinstance(data, dict) and "format" in data
    if args.state is not None and not has_state:
        raise ValueError(f"--state {source} is not an lscore state (lscore.state/1)")
    if has_state:
        config = parse_state(data)[2]
        if not config or "preset" not in config:
            raise ValueError(
                f"{source} holds an lscore state without a preset "
                f"config; save it from an lscore.preset object"
            )
        ls = preset(**unjson_config(config))
        ls.load_state_dict(data)
    elif isinstance(data, dict) and "preset" in data:
        ls = preset(**unjson_config(data))
    else:
        raise ValueError(f"{source} is neither an lscore state nor an lscore config")
    state = to_peer(args.to_peer, ls)  # fails first if the peer cannot hold it
    try:
        config_out: dict | None = peer_config(args.to_peer, ls)
        why = None
    except ValueError as e:
        config_out, why = None, str(e)
    if args.out is not None:
        if has_state:
            _write(args.out, state)
            read.notes.append(f"the {args.to_peer} state was written to {args.out}")
        elif config_out is None:
            raise ValueError(
                f"--out: {source} is an lscore config, and a {args.to_peer} config "
                f"cannot express it ({why}); nothing was written"
            )
        else:
            _write(args.out, config_out)
            read.notes.append(f"the {args.to_peer} config was written to {args.out}")
    lines = [f"# {args.to_peer} config"]
    lines.append(
        f"# not expressible: {why}" if config_out is None else json.dumps(config_out, indent=2)
    )
    lines += [f"# {args.to_peer} state", json.dumps(state, indent=2, default=str)]
    return {"peer": args.to_peer, "config": config_out, "state": state}, lines


def _from_peer(args: argparse.Namespace, read: _Input) -> tuple[dict, list[str]]:
    """--from: (the JSON result, the report lines for people)."""
    if args.source is None and args.state is None:
        raise ValueError("--from needs a FILE (the peer's config), --state FILE, or both")
    config = read.read(args.source) if args.source is not None else None
    state = read.read(args.state) if args.state is not None else None
    m = convert(args.from_peer, config=config, state=state)
    notes = read.notes
    if m.state_at is not None:
        notes.insert(0, f"the scaler state is {m.state_at} of {args.state}")
    notes += m.notes
    if m.defaults:
        gave = " and ".join(
            what for what, given in (("config", config), ("state", state)) if given is not None
        )
        notes.append(
            f"the {gave} gives no {', '.join(m.defaults)}; lscore took the defaults of "
            f"{table.TABLE[m.loss_scale.name].peer}: "
            + ", ".join(f"{k}={json.dumps(v)}" for k, v in m.defaults.items())
            + (
                " (lscore records the device only: the scale follows the same steps on any)"
                if "device" in m.defaults
                else ""
            )
        )
    ls = m.loss_scale
    cfg = json_config(ls.get_config())
    d = ls.state_dict() if state is not None else None
    lines = ["# lscore config", json.dumps(cfg, indent=2)]
    state_file = None
    if args.out is not None:
        _write(args.out, d if d is not None else cfg)
        what = f"lscore state ({d['format']})" if d is not None else "lscore config"
        lines.append(f"# {what} written to {args.out}")
        state_file = args.out if d is not None else None
    elif d is not None:
        state_file = "lscore_state.json"
        lines.append(f"# lscore state ({d['format']}); save it as {state_file}")
        lines.append(json.dumps(d, indent=2, allow_nan=False))
    lines += ["# Python", _snippet(ls.get_config(), state_file)]
    return {"config": cfg, "state": d}, lines


def cli(args: argparse.Namespace) -> int:
    """`lscore migrate`: print the lscore equivalent of a peer's config/state, or the reverse."""
    read = _Input(args.unsafe_pickle)
    try:
        result, lines = (_to_peer if args.to_peer is not None else _from_peer)(args, read)
    except (ValueError, TypeError) as e:
        message = str(e)
        if read.all_json:
            message = _as_json_spells(message)
        print(f"lscore migrate: error: {message}", file=sys.stderr)
        return 2
    except OSError as e:  # --out could not be written
        print(f"lscore migrate: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    if args.json:
        for note in read.notes:
            print(f"lscore migrate: note: {note}", file=sys.stderr)
        print(json.dumps(result, indent=2, allow_nan=False, default=str))
    else:
        for note in read.notes:
            print(f"# note: {note}")
        print("\n".join(lines))
    return 0


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """The `migrate` subcommand of the `lscore` command line."""
    p = sub.add_parser(
        "migrate",
        formatter_class=formatter,
        help="convert a peer's loss-scale config/state to lscore's (--from) or back (--to)",
        description="Convert a peer's loss-scale config or checkpoint state into "
        "lscore's, or an lscore state back into a peer's. Peers: " + ", ".join(PEERS) + ".",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from",
        dest="from_peer",
        choices=PEERS,
        metavar="PEER",
        help="the peer the config/state comes from",
    )
    way.add_argument(
        "--to",
        dest="to_peer",
        choices=PEERS,
        metavar="PEER",
        help="the peer to convert an lscore state or config back to",
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="FILE",
        help="--from: the peer's config (JSON; a ds_config for deepspeed, a NeMo or "
        "fairseq config); --to: an lscore state or config (JSON)",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        help="--from: the peer's scaler state, or a whole checkpoint holding it (Megatron, "
        "DeepSpeed, Lightning, accelerate's scaler.pt, fairseq, a torch "
        "{'model', 'optimizer', 'scaler'} dict): JSON, or a torch.save file if "
        "torch is installed (read with weights_only=True); --to: an lscore state (JSON)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write what the conversion gives here (JSON): --from: the lscore state, or "
        "the lscore config when there is no --state; --to: the peer's state, or its "
        "config when FILE is an lscore config",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object on stdout ({"config", "state"}; with --to also '
        '"peer"), and the notes on stderr',
    )
    p.add_argument(
        "--unsafe-pickle",
        action="store_true",
        help="let torch.load unpickle arbitrary objects (only for files you trust)",
    )
    p.set_defaults(func=cli)
