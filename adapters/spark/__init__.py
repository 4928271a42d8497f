"""tidelog.adapters.spark: the PySpark data source (not implemented yet; needs tidelog[spark])."""

from __future__ import annotations

from tidelog.errors import NotAvailable

__all__ = ["register"]


def register(spark: object) -> None:
    raise NotAvailable("the Spark data source is not available yet in this version of tidelog")
