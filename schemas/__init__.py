"""Every lake table of the product, declared once (see :mod:`schemas.catalog`)."""

from __future__ import annotations

from schemas.catalog import TABLES, Column, TableSpec, spark_schema, table

__all__ = ["TABLES", "Column", "TableSpec", "spark_schema", "table"]
