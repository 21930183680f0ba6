"""``import lscore``'s namespace: the API, its submodules and dunders, nothing else."""

import types

import lscore


def test_dir_shows_no_stray_names():
    stray = [
        n
        for n in dir(lscore)
        if not n.startswith("_")
        and n not in lscore.__all__
        and not isinstance(getattr(lscore, n), types.ModuleType)
    ]
    assert stray == []
    assert "migrate" in lscore.__all__ and isinstance(lscore.migrate, types.ModuleType)
