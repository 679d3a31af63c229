"""The Spark side: pure DataFrame transforms per capability, thin job entry points, lake I/O."""

from __future__ import annotations
