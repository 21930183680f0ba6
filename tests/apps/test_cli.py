"""The `lscore` command line as a user meets it: help, version, migrate's files and output,
its errors on bad files, and what `bench --only` prints."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest

import lscore
from lscore.bench import format_table
from lscore.cli import build_parser, main


def _parsers() -> list[argparse.ArgumentParser]:
    """The top-level parser and every command's."""
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [top, *sub.choices.values()]


def _commands() -> list[str]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


# ---- help and version ---------------------------------------------------------------------


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"lscore {lscore.__version__}"


def test_help_is_plain_text_naming_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    description = text.split("commands:", 1)[1]
    for command in _commands():
        assert re.search(rf"^\s+{command}\s", description, re.M), command
    assert set(_commands()) >= {"demo", "bench", "migrate"}


def test_every_option_has_help_and_its_default_is_shown() -> None:
    for parser in _parsers():
        text = parser.format_help()
        assert "``" not in text, parser.prog
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, (parser.prog, action.dest)
            if action.default not in (None, False, argparse.SUPPRESS):
                assert f"(default: {action.default})" in " ".join(text.split()), (
                    parser.prog,
                    action.dest,
                )


def test_demo_help_shows_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: numpy)" in text and "(default: 0)" in text
    assert re.search(r"--seed SEED \w", text)  # --seed has help


def test_demo_help_is_the_codes_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """The steps, the vocabulary, the batch and --full's and --tiny's settings are read from
    demo.config, so the help says what a run does."""
    from lscore.cli.demo import config

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    default, full, tiny = config(), config(full=True), config(tiny=True)
    assert (
        f"(default {default['steps']}; {full['steps']} with --full, {tiny['steps']} with --tiny)"
        in text
    )
    assert f"the long run of the documentation's figure: {full['steps']} steps per mode" in text
    assert f"vocabulary {full['vocab']}, {full['batch_size']} windows a batch" in text
    assert f"{tiny['steps']} steps per mode at the same vocabulary and batch" in text
    assert f"starting at 2**{math.log2(tiny['initial_scale']):g}" in text
    assert "small vocabulary" not in text


def test_bench_help_is_the_codes_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from lscore import bench as bench_cmd

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    opts, tiny = bench_cmd.Options(), bench_cmd.Options(tiny=True)
    assert f"timings per row (default {opts.repeat}; {tiny.repeat} with --tiny)" in text
    assert f"seconds per timing (default {opts.min_time:g}; {tiny.min_time:g} with" in text


def test_help_lists_the_commands_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in _commands():
        assert len(re.findall(rf"^\s+{command}\s", text, re.M)) == 1, (command, text)


# ---- user errors: one line, exit status 2, before any work -----------------------------------


def _user_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `lscore argv` prints for a user error: one line on stderr, status 2."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own checks
        status = e.code
    got = capsys.readouterr()
    assert status == 2, (argv, got)
    assert got.out == "", argv
    lines = got.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lscore {argv[0]}: error: "), (argv, got.err)
    return lines[0]


@pytest.mark.parametrize(
    "argv,says",
    [
        (["bench", "--sizes", "abc"], "argument --sizes: must be comma-separated element counts"),
        (["bench", "--sizes", "1e6,0"], "got '1e6,0'"),
        (["bench", "--sizes", "1.5"], "got '1.5'"),
        (["bench", "--repeat", "0"], "argument --repeat: must be an integer >= 1, got '0'"),
        (["bench", "--min-time", "-1"], "argument --min-time: must be a number > 0, got '-1'"),
        (["bench", "--min-time", "nan"], "got 'nan'"),
        (["bench", "--json", "/nonexistent-lscore/rows.json"], "does not exist"),
        (["bench", "--suite", "tpu"], "argument --suite: invalid choice: 'tpu'"),
        (["demo", "--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
        (["demo", "--steps", "many"], "got 'many'"),
        (["demo", "--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
        (["demo", "--backend", "jax"], "argument --backend: invalid choice: 'jax'"),
        (["migrate", "--from", "deepspeed", "--to", "torch"], "not allowed with argument"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_user_errors_are_one_line_and_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in _user_error(argv, capsys)


def test_bench_json_folder_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lscore import bench as bench_cmd

    monkeypatch.setattr(bench_cmd, "run", lambda opts: pytest.fail("the benchmark ran"))
    assert "is a folder" in _user_error(["bench", "--json", str(tmp_path)], capsys)


def test_an_interrupted_command_ends_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lscore import bench as bench_cmd

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cmd, "main", interrupted)
    try:
        status = main(["bench", "--tiny"])
    except KeyboardInterrupt:  # caught here, so that a failure does not stop pytest itself
        pytest.fail("the interrupt left lscore.cli.main: the user sees a traceback")
    assert status == 130
    assert capsys.readouterr().err == "lscore bench: interrupted\n"


# ---- migrate: what --out and --json give ----------------------------------------------------


def _json_file(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_migrate_out_without_state_writes_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _json_file(tmp_path, "ds.json", {"fp16": {"enabled": True, "initial_scale_power": 12}})
    out = tmp_path / "lscore_config.json"
    assert main(["migrate", "--from", "deepspeed", str(cfg), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["preset"] == "deepspeed" and written["init_scale"] == 4096.0
    assert lscore.preset(**lscore.presets.unjson_config(written)).get_config()["init_scale"] == (
        4096.0
    )
    assert f"lscore config written to {out}" in capsys.readouterr().out


def test_migrate_to_out_writes_the_peer_state_or_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ls = lscore.preset("torch", init_scale=1024.0, growth_interval=10)
    ls.state.update(True)
    state_file = _json_file(tmp_path, "state.json", ls.state_dict())
    out = tmp_path / "peer.json"
    assert main(["migrate", "--to", "torch", str(state_file), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {
        "scale": 1024.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 10,
        "_growth_tracker": 1,
    }
    config_file = _json_file(tmp_path, "config.json", {"preset": "deepspeed", "init_scale": 1024})
    assert main(["migrate", "--to", "deepspeed", str(config_file), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["fp16"]["initial_scale_power"] == 10


def test_migrate_to_out_refuses_a_config_the_peer_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSpeed's config holds the initial scale as a power of 2: 1000 has none to write."""
    config_file = _json_file(tmp_path, "config.json", {"preset": "deepspeed", "init_scale": 1000})
    out = tmp_path / "peer.json"
    assert main(["migrate", "--to", "deepspeed", str(config_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "power of 2" in err and "nothing was written" in err
    assert not out.exists()


def test_migrate_json_prints_json_alone_and_notes_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _json_file(tmp_path, "ds.json", {"fp16": {"enabled": True}})
    assert main(["migrate", "--from", "deepspeed", str(cfg), "--json"]) == 0
    got = capsys.readouterr()
    result = json.loads(got.out)  # nothing else on stdout
    assert result["config"]["preset"] == "deepspeed" and result["state"] is None
    assert "note:" in got.err
    ls = lscore.preset("torch")
    state_file = _json_file(tmp_path, "state.json", ls.state_dict())
    assert main(["migrate", "--to", "nemo", str(state_file), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["peer"] == "nemo" and result["state"]["scale"] == 65536.0


def test_migrate_notes_every_default_the_ds_config_leaves_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _json_file(tmp_path, "ds.json", {"fp16": {"enabled": True, "hysteresis": 4}})
    assert main(["migrate", "--from", "deepspeed", str(cfg), "--json"]) == 0
    err = capsys.readouterr().err
    for taken in (
        "fp16.initial_scale_power=16",
        "fp16.loss_scale_window=1000",
        "fp16.min_loss_scale=1",
        "fp16.consecutive_hysteresis=false",
        "raise_error_at_min_scale",
    ):
        assert taken in err, taken
    assert "fp16.hysteresis=" not in err  # given, so not a default


def test_migrate_cpu_torch_scaler_keeps_its_scale_and_notes_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """accelerate's scaler.pt of a CPU run: torch's state_dict records no device and no
    init_scale.  The config shows the scale torch itself holds as _init_scale after
    load_state_dict, and the device taken by default is a note."""
    torch = pytest.importorskip("torch")
    scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)
    path = tmp_path / "scaler.pt"
    torch.save(scaler.state_dict(), path)
    assert main(["migrate", "--from", "torch", "--state", str(path), "--json"]) == 0
    got = capsys.readouterr()
    result = json.loads(got.out)
    assert result["config"]["init_scale"] == 4096.0
    assert result["state"]["scale"] == 4096.0
    resumed = torch.amp.GradScaler("cpu")
    resumed.load_state_dict(torch.load(path))
    assert resumed._init_scale == result["config"]["init_scale"]
    assert 'device="cuda"' in got.err and "init_scale" in got.err


# ---- migrate: bad files ---------------------------------------------------------------------


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert "Traceback" not in got.err
    return got.err


def test_migrate_json_error_gives_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "fp16": {"enabled": true,}\n}\n')
    err = _error(capsys, ["migrate", "--from", "deepspeed", str(bad)])
    assert "ds.json is not valid JSON" in err and "line 2, column 28" in err


def test_migrate_empty_and_unreadable_files_get_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("")
    err = _error(capsys, ["migrate", "--from", "deepspeed", str(empty)])
    assert "empty.json is empty" in err
    err = _error(capsys, ["migrate", "--from", "torch", "--state", str(tmp_path / "missing.pt")])
    assert "cannot read" in err and "No such file or directory" in err
    err = _error(capsys, ["migrate", "--from", "torch", "--state", str(tmp_path)])
    assert "cannot read" in err and "directory" in err


def test_migrate_errors_spell_values_as_the_json_input_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _json_file(tmp_path, "ds.json", {"fp16": {"enabled": False}})
    err = _error(capsys, ["migrate", "--from", "deepspeed", str(cfg)])
    assert "got false" in err and "False" not in err


# ---- bench ----------------------------------------------------------------------------------


def test_bench_only_prints_only_what_it_selects(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only rows of the groups named, and only the targets those rows measure: no skipped
    rows of other groups (here bfloat16's, as without ml_dtypes), no unmeasured targets."""
    from lscore.bench import _sections

    dtype_of = _sections.dtype_of
    monkeypatch.setattr(_sections, "dtype_of", lambda n: None if n == "bfloat16" else dtype_of(n))
    argv = ["bench", "--tiny", "--no-progress", "--no-torch", "--only", "all_finite float32 4096"]
    assert main(argv) == 0
    rows_table, *targets_tables = capsys.readouterr().out.split("\n\n")
    rows = rows_table.splitlines()[2:]
    assert rows
    assert all(line.split(" | ")[0].endswith("all_finite float32 4096") for line in rows), rows
    assert not any("skipped" in line for line in rows)
    targets = [line for t in targets_tables for line in t.splitlines()[2:]]
    assert targets and not any("not measured" in line for line in targets)


def test_bench_targets_table_has_one_unit_per_column() -> None:
    result = {
        "rows": [],
        "targets": [
            {"target": "per array", "measured": None, "required": 30e-9, "met": None, "unit": "s"},
            {"target": "import", "measured": 0.012, "required": 50e-3, "met": True, "unit": "s"},
            {
                "target": "host cost",
                "measured": 3.5,
                "required": 4.0,
                "met": True,
                "unit": "us_per_array",
            },
            {"target": "speed", "measured": 1.2, "required": 0.95, "met": True},
            {
                "target": "step",
                "measured": 0.8,
                "required": 1.0,
                "met": True,
                "unit": "time ratio",
            },
        ],
    }
    text = format_table(result)
    assert "| time target | measured (us) | required (us) | met |" in text
    assert "| ratio target | measured (ratio) | required (ratio) | met |" in text
    cells = {
        line.split(" | ")[0][2:]: line.split(" | ")[1:3]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| time", "| ratio", "| group"))
    }
    assert cells == {
        "per array": ["not measured", "0.0300"],
        "import": ["12,000", "50,000"],
        "host cost": ["3.50", "4.00"],
        "speed": ["1.20", "0.950"],
        "step": ["0.800", "1.00"],
    }


# ---- issue 46, item 10: usage errors, not tracebacks or empty tables ----------------------


@pytest.mark.parametrize("sizes", ["1e12", "1e20", "1e6,1e12"])
def test_bench_refuses_sizes_that_do_not_fit_in_memory(sizes, capsys) -> None:
    """1e20 ended in a ValueError traceback, 1e12 in a 3.64 TiB allocation error."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--sizes", sizes])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lscore bench: error: argument --sizes: ")
    assert "do not fit in memory" in err and "this machine has" in err


def test_bench_only_matching_nothing_is_an_error_naming_the_groups(capsys) -> None:
    """--only zzz printed an empty table and exited 0."""
    assert main(["bench", "--tiny", "--no-progress", "--no-torch", "--only", "zzz"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("lscore bench: error: argument --only: 'zzz' matches no row")
    assert "all_finite float32" in err


@pytest.mark.parametrize("command", ["demo", "bench", "migrate"])
def test_an_unknown_option_is_the_commands_usage_error(command, capsys) -> None:
    """The CLI reference promises "lscore COMMAND: error: ..."; argparse's top parser
    said "lscore: error:"."""
    with pytest.raises(SystemExit) as e:
        main([command, "--no-such"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(f"lscore {command}: error: ")


def test_missing_extra_messages_say_how_to_install_from_the_checkout() -> None:
    """lscore is not on the package index yet (README): `pip install 'lscore[demo]'` cannot
    work; every message names the extra as `pip install ".[demo]"` in the checkout."""
    root = Path(lscore.__file__).resolve().parents[1]
    offenders = [
        f"{p.relative_to(root)}:{i}"
        for folder in ("lscore", "adapters")
        for p in sorted((root / folder).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "lscore[" in line
    ]
    assert offenders == []
