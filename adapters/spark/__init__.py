"""tidelog.adapters.spark: the ``tidelog`` PySpark data source (spec/BUNDLES.md SPK-*).

    from tidelog.adapters.spark import register
    register(spark)                                    # spark.dataSource.register(...)
    df = spark.read.format("tidelog").option("topic", "events").load("/var/lib/app/buf")

Importing this package never imports pyspark (it is the optional ``tidelog[spark]`` extra);
``register`` and ``data_source`` do, and raise ``NotAvailable`` when it is missing.
"""

from __future__ import annotations

from typing import Any

from tidelog.errors import NotAvailable

from .checkpoint import acknowledge_checkpoint, committed_offset

__all__ = ["register", "data_source", "available", "acknowledge_checkpoint", "committed_offset"]

NAME = "tidelog"


def available() -> bool:
    """True when pyspark can be imported (Java is only needed once a session starts)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def data_source() -> type[Any]:
    """The DataSource class (imports pyspark)."""
    if not available():
        raise NotAvailable(
            "the tidelog Spark data source needs PySpark: pip install 'tidelog[spark]'"
        )
    from .source import TidelogDataSource

    return TidelogDataSource


def register(spark: Any) -> None:
    """Register the ``tidelog`` format on a SparkSession (per session, SPK-1)."""
    source = data_source()  # NotAvailable first, whatever ``spark`` is
    spark.dataSource.register(source)
