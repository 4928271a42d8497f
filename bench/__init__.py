"""tidelog's benchmark harness (bench/README.md): ``tidelog bench`` / ``nox -s bench``.

Everything runs in one command, side by side on the same machine and disk: the physical limits
(``limits``), tidelog's backends (``cases``), the Python peers a user would pick instead
(``peers``), crash recovery and peak memory in clean subprocesses (``isolated``); ``report``
turns repeated runs into medians with min–max, ratios, JSON, a table and a plot. Nothing here
is a test: speed targets are checked and reported, never asserted (see bench/README.md).
"""
