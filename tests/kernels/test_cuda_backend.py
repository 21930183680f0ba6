"""Every backend lscore.cuda launches through provides the calls of its Backend protocol,
with the protocol's parameters."""

import inspect
import shutil

import pytest

from lscore.cuda import Backend, CupyBackend

CALLS = sorted(n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_"))


def test_the_protocol_declares_the_calls_of_the_launchers():
    assert CALLS == [
        "enter",
        "function",
        "get",
        "launch",
        "launch_packed",
        "leave",
        "ptr",
        "read_word",
        "stream",
        "to_device",
    ]


@pytest.mark.parametrize("name", CALLS)
def test_the_cupy_backend_takes_the_protocols_parameters(name):
    want = list(inspect.signature(getattr(Backend, name)).parameters)
    assert list(inspect.signature(getattr(CupyBackend, name)).parameters) == want


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is missing: no host harness")
def test_the_host_harness_backend_is_a_backend():
    from helpers import cuda_host

    backend = cuda_host.HostBackend()
    assert isinstance(backend, Backend)
    for name in CALLS:
        want = list(inspect.signature(getattr(Backend, name)).parameters)[1:]  # less self
        assert list(inspect.signature(getattr(backend, name)).parameters) == want, name
