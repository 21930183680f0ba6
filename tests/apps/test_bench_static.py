"""`lscore bench --suite gpu-static`: the kernels' sm_90 machine code holds its targets.

Not timed: NVRTC's output for a given version is deterministic, so the
instruction counts of each kernel's hottest loop are a property of the
source, read on the CPU (NVRTC and cuobjdump from the test extra's wheels).
"""

import pytest

from lscore.bench import _static

try:
    _static.cuobjdump()
    _static._nvrtc()
except RuntimeError as e:  # pragma: no cover - the test extra installs both
    pytest.skip(str(e), allow_module_level=True)


@pytest.fixture(scope="module")
def rows():
    return _static.figures()


@pytest.mark.slow
def test_every_streaming_kernel_and_dtype_is_measured(rows):
    assert [(r.label, r.dtype) for r in rows] == [(k[2], k[3]) for k in _static.HOT_LOOPS]
    assert all(r.loop and r.bytes > 0 for r in rows)


def test_instructions_per_byte_within_target(rows):
    over = [(r.label, r.dtype, round(r.per_byte, 2)) for r in rows if r.per_byte > r.limit]
    assert not over


@pytest.mark.parametrize("label", ["unscale", "unscale + norm", "clip", "all_finite"])
def test_scan_kernels_move_16_byte_accesses(rows, label):
    assert {r.dtype: r.widest for r in rows if r.label == label} == dict.fromkeys(
        ("float16", "bfloat16", "float32", "float64"), 16
    )


def test_hottest_loop_is_the_innermost_with_the_widest_accesses():
    body = [
        (0x00, "MOV R1, R2"),
        (0x10, "LDG.E R4, desc[UR4][R2.64]"),  # outer loop: 4-byte
        (0x20, "LD.E.128 R4, desc[UR4][R2.64]"),  # inner loop: 16-byte in, out
        (0x30, "FMUL R4, R4, R5"),
        (0x40, "ST.E.128 desc[UR4][R2.64], R4"),
        (0x50, "@P0 BRA 0x20"),
        (0x60, "@!P1 BRA 0x10"),
        (0x70, "EXIT"),
        (0x80, "BRA 0x80"),
    ]
    assert _static.hottest_loop(body) == (4, 32, 16, True)
    assert _static.hottest_loop(body[:1] + body[7:8]) == (2, 0, 0, False)


@pytest.mark.slow
def test_cli_prints_the_table(capsys):
    from lscore import cli

    assert cli.main(["bench", "--suite", "gpu-static"]) == 0
    out = capsys.readouterr().out
    assert "| unscale float16 |" in out and "fused Adam float32" in out


def test_cuobjdump_is_taken_from_the_path_without_the_wheel(monkeypatch):
    monkeypatch.setattr(_static.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(_static.shutil, "which", lambda name: f"/opt/cuda/bin/{name}")
    assert _static.cuobjdump() == "/opt/cuda/bin/cuobjdump"
    monkeypatch.setattr(_static.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="cuobjdump not found"):
        _static.cuobjdump()
