"""``python -m tidelog.backends.file.sealmain``: the seal worker process (spec/FORMATS-wal-tail.md
WTAIL-8). A module of its own, imported by nothing: running ``sealer`` itself with ``-m`` would
import it twice (the package imports it first). Importing it does nothing."""

from .sealer import main

if __name__ == "__main__":
    main()
