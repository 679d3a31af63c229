"""The thin broker: a RocketMQ-style commit log written into Delta Lake tables.

Importing this package never starts a JVM and never imports pyspark.

Glossary (one name per concept, used everywhere in the product):

- ``broker_name``: the broker whose commit log holds a record; a lake holds several brokers.
- ``commit_log_offset``: physical byte offset of a record in its broker's commit log.
- ``segment``: base ``commit_log_offset`` of the segment (RocketMQ mapped file) holding a record.
- ``store_size``: exact byte length of a record (RocketMQ TOTALSIZE).
- ``queue_offset``: index of a record in its consume queue (``broker_name``, ``topic``, ``queue_id``).
- ``tags_code``: Java ``String.hashCode`` of the TAGS property, sign-extended to a long.
- ``born_timestamp`` / ``store_timestamp``: producer send time / broker append time, epoch ms.
- ``sys_flag``: RocketMQ MessageSysFlag bits.
- ``prepared_transaction_offset``: commit log offset of the half message a commit record ends.
- ``uniq_key``: the client message id (UNIQ_KEY property), what a SendResult calls msgId.
- ``msg_id``: the offset message id, store host plus ``commit_log_offset`` in hex.
"""

from __future__ import annotations
