"""Framework adapters (installed as lscore.adapters).

Import the one you need: ``lscore.adapters.numpy``, ``lscore.adapters.cupy``
or ``lscore.adapters.torch``.  This package imports nothing by itself.
"""
