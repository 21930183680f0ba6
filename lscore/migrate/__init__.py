"""Convert a peer's loss-scale config or checkpoint to lscore's, and back.

``from_peer(name, config=None, state=None)`` returns an ``lscore.preset``
object in exactly the peer's state, so that training resumed with lscore
gives the scale sequence the peer itself would have given; ``convert`` does
the same and also returns the notes (defaults lscore chose where the input
left a value open, e.g. DeepSpeed's ``"auto"``), the peer's defaults taken for
arguments the input does not give, and where in a whole checkpoint it found
the scaler state.  ``to_peer(name, loss_scale)`` returns
the peer's native state and ``peer_config(name, loss_scale)`` its config,
where the peer can hold them.  Every preset name is a peer name.

`config` is what the peer is configured with: its scaler's constructor
arguments, or its own config (a ds_config, a NeMo or fairseq config, Megatron's
arguments).  `state` is the scaler's state, or a whole training checkpoint in
which the scaler state is found by the keys the peer writes.  Unknown keys are
errors that name them.  Tensors and NumPy values are read with ``.item()``;
nothing imports a framework.
"""

from __future__ import annotations

import warnings
from typing import Any

from lscore.migrate._base import (
    MISSING,
    Loaded,
    Migration,
    MigrationNote,
    PeerBase,
    path_text,
    walk_path,
)
from lscore.migrate._deepspeed import DeepSpeedPeer
from lscore.migrate._fairseq import FairseqPeer
from lscore.migrate._megatron import MegatronPeer
from lscore.migrate._others import (
    ApexFp16UtilsPeer,
    ApexPeer,
    ChainerPeer,
    ColossalAIPeer,
    JmpPeer,
    MXNetPeer,
    PaddlePeer,
)
from lscore.migrate._tf import Keras2Peer, Keras3Peer, TF1Peer, TF2Peer
from lscore.migrate._torch import NemoPeer, TorchPeer
from lscore.policy import json_float
from lscore.presets import PresetLossScale, preset, table

__all__ = ["PEERS", "Migration", "MigrationNote", "convert", "from_peer", "peer_config", "to_peer"]

# one reader per peer (_torch, _tf, _deepspeed, _megatron, _fairseq, _others), by preset name
_PEERS = {
    p.preset: p
    for p in (
        TorchPeer(),
        NemoPeer(),
        TF2Peer(),
        Keras2Peer(),
        Keras3Peer(),
        TF1Peer(),
        DeepSpeedPeer(),
        MegatronPeer(),
        ApexPeer(),
        ApexFp16UtilsPeer(),
        PaddlePeer(),
        JmpPeer(),
        FairseqPeer(),
        ColossalAIPeer(),
        ChainerPeer(),
        MXNetPeer(),
    )
}
#: every peer name `convert`, `from_peer` and `to_peer` accept
PEERS = tuple(sorted(_PEERS))


def _peer(name: str) -> PeerBase:
    if name not in _PEERS:
        raise ValueError(f"unknown peer {name!r}; expected one of: {', '.join(PEERS)}")
    return _PEERS[name]


def convert(name: str, config: Any = None, state: Any = None) -> Migration:
    """Peer `name`'s config and checkpoint `state` as an lscore preset, with notes.

    `state` may be the scaler's own state or a whole training checkpoint: the
    scaler state is then found at the keys the peer (or the tool around it:
    Lightning, accelerate, NeMo, Megatron, DeepSpeed, fairseq) writes, and
    ``Migration.state_at`` says where; a checkpoint without it is an error that
    lists the keys looked for.  With no `config`, a config the checkpoint
    carries (DeepSpeed's ds_config, Megatron's args, fairseq's cfg) is used.
    """
    peer = _peer(name)
    notes: list = []
    state_at = config_at = None
    if state is not None:
        checkpoint = state
        state, path = peer.locate(checkpoint)
        if path is not None:
            state_at = path_text(path)
            for place in peer.config_places if config is None else ():
                found = walk_path(checkpoint, place)
                if found is not MISSING and found is not None:
                    config, config_at = found, path_text(place)
                    notes.append(f"the {name} config was read from {config_at}")
                    break
    try:
        args = peer.args(config, notes) if config is not None else {}
    except (TypeError, ValueError) as e:
        if config_at is None:
            raise
        raise type(e)(f"{config_at}: {e}") from None
    loaded = Loaded()
    if state is not None:
        args = dict(args)
        loaded = peer.load(state, args, notes)
    ls = preset(peer.preset, **args)
    defaults = {k: v for k, v in table.TABLE[peer.preset].args.items() if k not in args}
    if loaded.scale is not None or loaded.counters or loaded.next_scale is not None:
        d = ls.state_dict()
        if loaded.scale is not None:
            d["scale"] = json_float(loaded.scale)
            if "next_scale" in d:
                d["next_scale"] = d["scale"]
        if loaded.next_scale is not None:
            d["next_scale"] = json_float(loaded.next_scale)
        d["counters"].update(loaded.counters)
        ls.load_state_dict(d)
    return Migration(ls, tuple(notes), state_at, config_at, defaults)


def from_peer(name: str, config: Any = None, state: Any = None) -> PresetLossScale:
    """An lscore preset object built from peer `name`'s config and in its checkpoint `state`.

    `config` holds the peer's constructor arguments or its own config (a
    ds_config or its "fp16" section for DeepSpeed, a NeMo or fairseq config,
    Megatron's arguments, a Keras ``get_config()``); `state` the peer's saved
    state or a whole checkpoint holding it (see ``convert``).  Either may be
    None.  Counters the peer does not save (steps, skipped steps) start at 0.
    Each choice lscore made where the input left a value open (an ``"auto"``, a
    default of the tool around the peer) is issued as a ``MigrationNote``
    warning; ``convert`` returns them instead.
    """
    m = convert(name, config=config, state=state)
    for note in m.notes:
        warnings.warn(note, MigrationNote, stacklevel=2)
    return m.loss_scale


def _behaviour(policy: Any) -> dict:
    """The policy's fields, without those that cannot change its scale sequence."""
    d = policy.to_dict()
    if d["hysteresis"] == 1:
        # every overflow reaches the trigger: refill points and saturation do not matter
        d["refill"], d["hysteresis_saturate"] = [], False
    if d["growth_mode"] != "modulo":
        d["growth_offset"] = 0
    if d["backoff_mode"] == "divide":
        d["backoff_factor"] = None
    return d


def _args_for(name: str, ls: Any) -> dict:
    """The peer arguments of `ls` as preset `name`, if `ls` follows exactly that policy."""
    if isinstance(ls, PresetLossScale) and ls.name == name:
        return ls.args
    policy = getattr(ls, "policy", None) or getattr(getattr(ls, "state", None), "policy", None)
    if policy is None:
        raise TypeError(f"expected an lscore loss scale, got {type(ls).__name__}")
    spec = table.TABLE[name]
    inverse = {field: arg for arg, field in spec.rename.items()}
    candidate = {inverse[k]: v for k, v in policy.to_dict().items() if k in inverse}
    if spec.invert is not None:
        candidate.update(spec.invert(policy))
    try:
        target = preset(name, **candidate)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the {policy.name!r} policy cannot be expressed as {name}: {e}") from None
    mine, theirs = _behaviour(policy), _behaviour(target.policy)
    diff = sorted(k for k in mine if k not in ("name", "init_scale") and mine[k] != theirs[k])
    if diff:
        raise ValueError(
            f"the {policy.name!r} policy cannot be held by {name}; it differs in: "
            + ", ".join(f"{k}={mine[k]!r} ({name}: {theirs[k]!r})" for k in diff)
        )
    return target.args


def to_peer(name: str, loss_scale: Any) -> dict:
    """Peer `name`'s native state for `loss_scale` (a preset of that peer, or an equal policy)."""
    peer = _peer(name)
    return peer.dump(loss_scale, _args_for(peer.preset, loss_scale))


def peer_config(name: str, loss_scale: Any) -> dict:
    """Peer `name`'s constructor arguments (a ds_config section for DeepSpeed) for `loss_scale`."""
    peer = _peer(name)
    return peer.config(_args_for(peer.preset, loss_scale))
