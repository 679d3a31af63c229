"""The thin broker: a RocketMQ-style commit log written into Delta Lake tables.

Packages, from the ground up: ``common`` (constants, message model, codecs, the RocketMQ rules
several layers apply), ``store`` (record layout, the Delta tables a broker appends to, the message
store), ``broker`` (the broker and its services), ``client`` (producers and consumers) and
``tools`` (workload generator, offset reset, segment file import and export). Importing it never
starts a JVM. Names follow docs/glossary.md; the layers are drawn in docs/architecture.md.
"""

from __future__ import annotations
