"""``python -m tidelog``: the ``tidelog`` command (spec/CLI.md)."""

from tidelog.cli import main

if __name__ == "__main__":
    main()
