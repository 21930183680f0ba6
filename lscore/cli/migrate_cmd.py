"""`lscore migrate`: a peer's loss-scale config or checkpoint state to lscore's, and back."""

from __future__ import annotations

import json
import sys

from lscore.migrate import PEERS, convert, peer_config, to_peer
from lscore.presets import json_config, preset, unjson_config
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


def _read(path: str, unsafe_pickle: bool = False, notes: list | None = None):
    """A JSON file, or a torch.save file when torch is installed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        json_error = e
    try:
        import torch  # noqa: F401 - only whether torch imports matters here
    except ImportError:
        raise ValueError(
            f"{path} is not JSON ({json_error}), and torch is not installed to "
            f"read it as a torch.save file"
        ) from None
    try:
        data, inert = load_checkpoint(path, unsafe_pickle)
    except Exception as e:  # torch raises many types for a file it cannot read
        hint = (
            ""
            if unsafe_pickle
            else " (objects other than tensors and plain containers "
            "need --unsafe-pickle, for files you trust)"
        )
        raise ValueError(
            f"{path} is neither JSON nor a readable torch.save file: {type(e).__name__}: {e}{hint}"
        ) from None
    if inert and notes is not None:
        notes.append(
            f"{path}: objects of {', '.join(inert)} were read as plain data "
            f"(torch.load weights_only=True; none of their code ran)"
        )
    return data


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


def _print_notes(notes) -> None:
    for note in notes:
        print(f"# note: {note}")


def cli(args) -> int:
    """`lscore migrate`: print the lscore equivalent of a peer's config/state, or the reverse."""
    try:
        notes: list = []
        if args.to_peer is not None:
            if args.source is None:
                raise ValueError(
                    "--to needs a FILE: an lscore state (lscore.state/1) or an "
                    'lscore config ({"preset": ...})'
                )
            data = _read(args.source, args.unsafe_pickle)
            if isinstance(data, dict) and "format" in data:
                config: dict | None = parse_state(data)[2]
                if not config or "preset" not in config:
                    raise ValueError(
                        f"{args.source} holds an lscore state without a preset "
                        f"config; save it from an lscore.preset object"
                    )
                ls = preset(**unjson_config(config))
                ls.load_state_dict(data)
            elif isinstance(data, dict) and "preset" in data:
                ls = preset(**unjson_config(data))
            else:
                raise ValueError(f"{args.source} is neither an lscore state nor an lscore config")
            state: dict | None = to_peer(args.to_peer, ls)  # fails first if the peer cannot hold it
            print(f"# {args.to_peer} config")
            try:
                print(json.dumps(peer_config(args.to_peer, ls), indent=2, default=str))
            except ValueError as e:
                print(f"# not expressible: {e}")
            print(f"# {args.to_peer} state")
            print(json.dumps(state, indent=2, default=str))
            return 0
        config = _read(args.source, args.unsafe_pickle, notes) if args.source is not None else None
        state = _read(args.state, args.unsafe_pickle, notes) if args.state is not None else None
        m = convert(args.from_peer, config=config, state=state)
        notes += m.notes
        if m.state_at is not None:
            notes.insert(0, f"the scaler state is {m.state_at} of {args.state}")
        _print_notes(notes)
        ls = m.loss_scale
        print("# lscore config")
        print(json.dumps(json_config(ls.get_config()), indent=2))
        state_file = None
        if state is not None:
            d = ls.state_dict()
            if args.out is not None:
                with open(args.out, "w", encoding="utf-8") as f:
                    json.dump(d, f, indent=2, allow_nan=False)
                state_file = args.out
                print(f"# lscore state ({d['format']}) written to {args.out}")
            else:
                state_file = "lscore_state.json"
                print(f"# lscore state ({d['format']}); save it as {state_file}")
                print(json.dumps(d, indent=2, allow_nan=False))
        print("# Python")
        print(_snippet(ls.get_config(), state_file))
        return 0
    except (ValueError, TypeError, OSError) as e:
        print(f"lscore migrate: error: {e}", file=sys.stderr)
        return 2


def add_parser(sub) -> None:
    """The `migrate` subcommand of the `lscore` command line."""
    p = sub.add_parser(
        "migrate",
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
        help="the peer's scaler state, or a whole checkpoint holding it (Megatron, "
        "DeepSpeed, Lightning, accelerate's scaler.pt, fairseq, a torch "
        "{'model', 'optimizer', 'scaler'} dict): JSON, or a torch.save file if "
        "torch is installed (read with weights_only=True)",
    )
    p.add_argument("--out", metavar="FILE", help="write the lscore state here (JSON)")
    p.add_argument(
        "--unsafe-pickle",
        action="store_true",
        help="let torch.load unpickle arbitrary objects (only for files you trust)",
    )
    p.set_defaults(func=cli)
