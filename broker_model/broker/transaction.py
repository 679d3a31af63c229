"""Transactional messages: half messages, end transaction, and the broker's check service.

As RocketMQ: the producer sends a half message (stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0,
the real topic and queue in its properties), runs its local transaction, and ends it. A commit
writes the final message to the real topic (commit type, ``prepared_transaction_offset`` = the
half's commit log offset) and then an op message (``RMQ_SYS_TRANS_OP_HALF_TOPIC``, tag ``d``, body
the half queue offset); a rollback writes only the op. The check service finds half messages
without an op, re-puts each into the half queue with its check count and asks a live producer of
the group for the outcome; after 15 checks (or 72 h) it discards the half message to
``TRANS_CHECK_MAX_TIME_TOPIC``. Its progress is the ``CID_RMQ_SYS_TRANS`` group's offsets on the
half and op queues.

Better than RocketMQ: a commit whose transaction already has a final message (the broker died
between the final message and the op) writes only the op, never a second final message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from broker_model.broker.config import InnerMessage
from broker_model.broker.controller import Broker
from broker_model.broker.service import PeriodicService
from broker_model.common import constants as c
from broker_model.store import MessageExt
from schemas.errors import BrokerError

TRANSACTION_GROUP = "CID_RMQ_SYS_TRANS"  # the internal consumer group of the check service
TRANSACTION_TIMEOUT_MS = 6000  # transactionTimeOut
TRANSACTION_CHECK_MAX = 15  # transactionCheckMax
TRANSACTION_CHECK_INTERVAL_MS = 60_000  # transactionCheckInterval
FILE_RESERVED_MS = 72 * 3600 * 1000  # fileReservedTime
OP_PULL_NUMS = 32  # op messages read per fill
REMOVE_TAG = "d"


class LocalTransactionState(Enum):
    """The producer's answer about its local transaction."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


class TransactionError(BrokerError):
    """End transaction refused (the broker's SYSTEM_ERROR / ILLEGAL_OPERATION answers)."""


@dataclass(frozen=True)
class EndTransactionRequest:
    """``EndTransactionRequestHeader``."""

    producer_group: str
    tran_state_table_offset: int  # the half message's queue offset
    commit_log_offset: int  # the half message's commit log offset
    commit_or_rollback: LocalTransactionState
    from_transaction_check: bool = False
    msg_id: str | None = None
    transaction_id: str | None = None


def end_transaction(broker: Broker, request: EndTransactionRequest) -> str:
    """``EndTransactionProcessor``: check the half message, then commit or roll back.

    Returns "SUCCESS", or "NONE" for UNKNOW (nothing is done, as RocketMQ answers nothing).

    Raises:
        TransactionError: the half message is not found, or its producer group, queue offset or
            commit log offset differ from the request's, or (5.x) an immunity-time rule forbids a
            commit outside a check; nothing is written.
    """
    if request.commit_or_rollback is LocalTransactionState.UNKNOW:
        return "NONE"
    half = _half_message(broker, request)
    if request.commit_or_rollback is LocalTransactionState.COMMIT_MESSAGE:
        uniq_key = half.uniq_key
        if uniq_key is None or not broker.store.final_offsets(uniq_key):
            broker.put_message(final_message(half, request.commit_log_offset))
    broker.put_message(_op_message(broker, half.queue_offset, half.queue_id))
    return "SUCCESS"


def _half_message(broker: Broker, request: EndTransactionRequest) -> MessageExt:
    queue_offset = broker.store.half_queue_offset(request.commit_log_offset)
    if queue_offset is None and broker.config.flush_mode == "ASYNC_FLUSH":
        broker.flush()  # an ASYNC_FLUSH put is visible once its group commit lands
        queue_offset = broker.store.half_queue_offset(request.commit_log_offset)
    half = None if queue_offset is None else stored_record(broker, c.RMQ_SYS_TRANS_HALF_TOPIC, queue_offset)
    if half is None:
        raise TransactionError(
            f"Find prepared transaction message failed: commit_log_offset={request.commit_log_offset!r}"
        )
    if half.properties.get(c.PROPERTY_PRODUCER_GROUP) != request.producer_group:
        raise TransactionError(f"The producer group wrong: producer_group={request.producer_group!r}")
    if half.queue_offset != request.tran_state_table_offset:
        raise TransactionError(
            f"The transaction state table offset wrong: tran_state_table_offset={request.tran_state_table_offset!r}"
        )
    if half.commit_log_offset != request.commit_log_offset:
        raise TransactionError(f"The commit log offset wrong: commit_log_offset={request.commit_log_offset!r}")
    _reject_outside_immunity(broker, half, request)
    return half


def stored_record(broker: Broker, topic: str, queue_offset: int) -> MessageExt | None:
    """A record of queue 0 of ``topic`` with its body as stored (compressed when flagged)."""
    return broker.store.message_at(topic, 0, queue_offset, decompress=False)


def _reject_outside_immunity(broker: Broker, half: MessageExt, request: EndTransactionRequest) -> None:
    """5.x ``rejectCommitOrRollback``: with an immunity time set, a late end outside a check is
    refused (ILLEGAL_OPERATION)."""
    immunity = half.properties.get(c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    if request.from_transaction_check or immunity is None or not immunity.isdigit():
        return
    limit = max(int(immunity) * 1000, TRANSACTION_TIMEOUT_MS)
    if broker.config.clock() - half.born_timestamp > limit:
        raise TransactionError(
            f"ILLEGAL_OPERATION: the half message is past its immunity time ({limit} ms); "
            "it is ended by a check-back only"
        )


def final_message(half: MessageExt, prepared_offset: int) -> InnerMessage:
    """``endMessageTransaction``: the half message restored to its real topic, commit type. Its
    stored properties keep REAL_TOPIC, REAL_QID and TRAN_MSG (computed before they are cleared)."""
    properties = dict(half.properties)
    properties.pop(c.PROPERTY_DELAY_TIME_LEVEL, None)
    sys_flag = half.sys_flag & ~c.TRANSACTION_ROLLBACK_TYPE & ~c.BORNHOST_V6_FLAG & ~c.STOREHOSTADDRESS_V6_FLAG
    return InnerMessage(
        topic=properties[c.PROPERTY_REAL_TOPIC],
        queue_id=int(properties[c.PROPERTY_REAL_QUEUE_ID]),
        body=half.body,
        properties=properties,
        flag=half.flag,
        sys_flag=sys_flag | c.TRANSACTION_COMMIT_TYPE,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=prepared_offset,
    )


def _op_message(broker: Broker, half_queue_offset: int, queue_id: int) -> InnerMessage:
    """The op (remove) message of one half queue offset (one op per end)."""
    return InnerMessage(
        topic=c.RMQ_SYS_TRANS_OP_HALF_TOPIC,
        queue_id=queue_id,
        body=str(half_queue_offset).encode(),
        properties={c.PROPERTY_WAIT_STORE_MSG_OK: "true", c.PROPERTY_TAGS: REMOVE_TAG},
        born_timestamp=broker.config.clock(),
        born_host=broker.store_host,
    )


def parse_op_body(body: bytes) -> list[int]:
    """Half queue offsets an op message ends: ``"123"`` or the 5.1+ form ``"5,6,9,"``."""
    return [int(part) for part in body.decode("utf-8").split(",") if part.strip()]


@dataclass(frozen=True)
class TransactionView:
    """The broker's view of one transaction (its original half message) at a time."""

    broker_name: str
    uniq_key: str
    producer_group: str | None
    half_queue_offset: int
    state: str  # COMMITTED, ROLLED_BACK, PENDING, CHECK_DUE, DISCARDED or EXPIRED
    check_times: int
    op_queue_offset: int | None
    final_commit_log_offset: int | None


@dataclass
class CheckReport:
    """What one check round did."""

    checked: list[str] = field(default_factory=list)  # UNIQ_KEYs checked back
    discarded: list[str] = field(default_factory=list)
    resolved: int = 0  # half offsets found ended by an op
    half_offset: int = 0
    op_offset: int = 0


class TransactionCheckService(PeriodicService):
    """``TransactionalMessageCheckService`` of one broker: :meth:`check` runs one round with an
    explicit ``now``; :meth:`start` runs rounds every ``interval_ms`` on the broker's clock."""

    thread_name = "tx-check"

    def __init__(
        self,
        broker: Broker,
        timeout_ms: int = TRANSACTION_TIMEOUT_MS,
        check_max: int = TRANSACTION_CHECK_MAX,
        interval_ms: int = TRANSACTION_CHECK_INTERVAL_MS,
        reserved_ms: int = FILE_RESERVED_MS,
    ) -> None:
        super().__init__(broker, interval_ms)
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self.reserved_ms = reserved_ms

    def run_round(self, now: int) -> object:
        """One round of the service at ``now`` (:meth:`check`)."""
        return self.check(now)

    def check(self, now: int) -> CheckReport:
        """One round of ``TransactionalMessageServiceImpl.check`` over half queue 0 at ``now``."""
        store, offsets = self.broker.store, self.broker.offsets
        self.broker.flush()  # the store serves what is committed: let every put so far land
        half_offset = max(offsets.query_offset(TRANSACTION_GROUP, c.RMQ_SYS_TRANS_HALF_TOPIC, 0), 0)
        op_offset = max(offsets.query_offset(TRANSACTION_GROUP, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, 0), 0)
        report = CheckReport(half_offset=half_offset, op_offset=op_offset)
        remove: dict[int, int] = {}
        done_ops: list[int] = []
        self._fill_ops(op_offset, half_offset, remove, done_ops)
        end = store.max_offset(c.RMQ_SYS_TRANS_HALF_TOPIC, 0)  # copies made in this round wait for the next
        i = new_offset = half_offset
        while i < end:
            if i in remove:
                done_ops.append(remove.pop(i))
                report.resolved += 1
            else:
                half = stored_record(self.broker, c.RMQ_SYS_TRANS_HALF_TOPIC, i)
                if half is None:
                    break
                if not self._process(half, now, report, remove, done_ops):
                    break
            i += 1
            new_offset = i
        if new_offset != half_offset:
            offsets.commit_offset(TRANSACTION_GROUP, c.RMQ_SYS_TRANS_HALF_TOPIC, 0, new_offset)
        new_op_offset = calculate_op_offset(done_ops, op_offset)
        if new_op_offset != op_offset:
            offsets.commit_offset(TRANSACTION_GROUP, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, 0, new_op_offset)
        report.half_offset, report.op_offset = new_offset, new_op_offset
        return report

    def view(self, as_of: int) -> dict[str, TransactionView]:
        """Every transaction of this broker by UNIQ_KEY, as its records stood at ``as_of``.

        States, in this precedence: an op ends it (COMMITTED with a final message, else
        ROLLED_BACK); else DISCARDED (a discard record, or the check limit reached); else EXPIRED
        (older than the file reserve time); else PENDING (inside its timeout or immunity time);
        else CHECK_DUE.
        """
        store = self.broker.store
        self.broker.flush()
        halves: dict[str, list[MessageExt]] = {}
        for message in self._queue(c.RMQ_SYS_TRANS_HALF_TOPIC, as_of):  # copies share the original's UNIQ_KEY
            halves.setdefault(message.uniq_key or f"half@{message.queue_offset}", []).append(message)
        ended: dict[int, int] = {}  # half queue offset -> first op queue offset ending it
        for op in self._queue(c.RMQ_SYS_TRANS_OP_HALF_TOPIC, as_of):
            if op.tags == REMOVE_TAG:
                for half_offset in parse_op_body(op.body):
                    ended.setdefault(half_offset, op.queue_offset)
        discarded = {m.uniq_key for m in self._queue(c.TRANS_CHECK_MAX_TIME_TOPIC, as_of)}
        views = {}
        for uniq_key, records in halves.items():
            original = records[0]
            offsets = {r.commit_log_offset for r in records}
            finals = [f for f in store.final_offsets(uniq_key) if self._final_before(f, offsets, as_of)]
            ops = [ended[r.queue_offset] for r in records if r.queue_offset in ended]
            first_op = min(ops) if ops else None  # the first op in time ends it
            checks = max(int(r.properties.get(c.PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0) for r in records)
            state = self._state(original, first_op is not None, bool(finals), uniq_key in discarded, checks, as_of)
            views[uniq_key] = TransactionView(
                self.broker.broker_name,
                uniq_key,
                original.properties.get(c.PROPERTY_PRODUCER_GROUP),
                original.queue_offset,
                state,
                checks,
                first_op,
                finals[0] if finals else None,
            )
        return views

    def _queue(self, topic: str, as_of: int) -> list[MessageExt]:
        store = self.broker.store
        stored = range(store.min_offset(topic, 0), store.max_offset(topic, 0))
        messages = (store.message_at(topic, 0, q, decompress=False) for q in stored)
        return [m for m in messages if m is not None and m.store_timestamp <= as_of]

    def _final_before(self, final_offset: int, half_offsets: set[int], as_of: int) -> bool:
        final = self.broker.store.message_by_offset(final_offset)
        if final is None or final.store_timestamp > as_of:
            return False
        return final.prepared_transaction_offset in half_offsets

    def _state(self, original: MessageExt, ended: bool, final: bool, discarded: bool, checks: int, as_of: int) -> str:
        age = as_of - original.born_timestamp
        if ended:
            return "COMMITTED" if final else "ROLLED_BACK"
        if discarded or checks >= self.check_max:
            return "DISCARDED"
        if age > self.reserved_ms:
            return "EXPIRED"
        if 0 <= age < self._immunity_ms(original):  # a negative age is checked back, as _process does
            return "PENDING"
        return "CHECK_DUE"

    def _fill_ops(self, op_offset: int, half_offset: int, remove: dict[int, int], done_ops: list[int]) -> None:
        """Read every op message from ``op_offset`` on (``fillOpRemoveMap``, all batches at once)."""
        store = self.broker.store
        position, end = op_offset, store.max_offset(c.RMQ_SYS_TRANS_OP_HALF_TOPIC, 0)
        while position < end:
            op = stored_record(self.broker, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, position)
            if op is not None and op.tags == REMOVE_TAG:
                halves = [h for h in parse_op_body(op.body) if h >= half_offset]
                for half in halves:
                    remove[half] = position
                if not halves:
                    done_ops.append(position)
            position += 1

    def _process(
        self, half: MessageExt, now: int, report: CheckReport, remove: dict[int, int], done_ops: list[int]
    ) -> bool:
        """Handle one unresolved half message; False stops the round (the message is too new)."""
        age = now - half.born_timestamp
        uniq_key = half.uniq_key or ""
        checks = int(half.properties.get(c.PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0)
        if checks >= self.check_max or age > self.reserved_ms:  # needDiscard / needSkip
            self._discard(half)
            report.discarded.append(uniq_key)
            return True
        if half.store_timestamp >= now:
            return False  # stored after the check began
        immunity_text = half.properties.get(c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        immunity = self._immunity_ms(half)
        if immunity_text is not None and 0 <= age < immunity:
            return self._check_prepare_queue_offset(half, checks + 1, remove, done_ops)
        if immunity_text is None and 0 <= age < self.timeout_ms:
            return False
        self._check_back(half, checks + 1, now)
        report.checked.append(uniq_key)
        return True

    def _check_prepare_queue_offset(
        self, half: MessageExt, check_times: int, remove: dict[int, int], done_ops: list[int]
    ) -> bool:
        """``checkPrepareQueueOffset``: inside its immunity time a half message is copied forward
        (remembering the original's offset) unless an op already ended the original."""
        prepared = half.properties.get(c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
        if prepared is not None and prepared.lstrip("-").isdigit() and int(prepared) in remove:
            done_ops.append(remove.pop(int(prepared)))
            return True
        self._reput_immunity(half, check_times)
        return True

    def _immunity_ms(self, half: MessageExt) -> int:
        value = half.properties.get(c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if value is not None and value.isdigit():
            return int(value) * 1000
        return self.timeout_ms

    def _check_back(self, half: MessageExt, check_times: int, now: int) -> None:
        """Re-put the half message with its check count, then ask a live producer of its group."""
        copy = self._reput(half, check_times)
        producers = self.broker.transaction_producers.get(half.properties.get(c.PROPERTY_PRODUCER_GROUP, ""), [])
        if producers and copy is not None:
            producers[0].check_transaction_state(self.broker, copy)

    def _reput(self, half: MessageExt, check_times: int) -> MessageExt | None:
        """``putBackHalfMsgQueue``: a copy in the half queue with TRANSACTION_CHECK_TIMES set;
        flag, reconsume times and prepared offset are not copied."""
        properties = dict(half.properties)
        properties[c.PROPERTY_TRANSACTION_CHECK_TIMES] = str(check_times)
        properties[c.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        result = self.broker.put_message(_half_copy(half, properties))
        self.broker.flush()  # the check-back names the copy, which must be readable
        return self.broker.store.message_at(c.RMQ_SYS_TRANS_HALF_TOPIC, 0, result.queue_offsets[0])

    def _reput_immunity(self, half: MessageExt, check_times: int) -> None:
        """``renewImmunityHalfMessageInner``: a copy that remembers the original's queue offset."""
        prepared = half.properties.get(c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, str(half.queue_offset))
        properties = dict(half.properties)
        properties[c.PROPERTY_TRANSACTION_CHECK_TIMES] = str(check_times)
        properties[c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = prepared
        self.broker.put_message(_half_copy(half, properties))

    def _discard(self, half: MessageExt) -> None:
        """``resolveDiscardMsg``: a copy in TRANS_CHECK_MAX_TIME_TOPIC queue 0."""
        properties = dict(half.properties)
        self.broker.ensure_topic(c.TRANS_CHECK_MAX_TIME_TOPIC, 1)
        self.broker.put_message(
            InnerMessage(
                c.TRANS_CHECK_MAX_TIME_TOPIC,
                0,
                half.body,
                properties,
                half.flag,
                _plain_flag(half.sys_flag),
                half.born_timestamp,
                half.born_host,
                half.reconsume_times,
            )
        )


def _half_copy(half: MessageExt, properties: dict[str, str]) -> InnerMessage:
    """A copy of ``half`` for half queue 0 with ``properties`` (a re-put or an immunity renewal)."""
    return InnerMessage(
        c.RMQ_SYS_TRANS_HALF_TOPIC,
        0,
        half.body,
        properties,
        0,
        _plain_flag(half.sys_flag),
        half.born_timestamp,
        half.born_host,
    )


def _plain_flag(sys_flag: int) -> int:
    """A stored record's sys flag without the host bits (the broker sets those itself)."""
    return sys_flag & ~c.BORNHOST_V6_FLAG & ~c.STOREHOSTADDRESS_V6_FLAG


def calculate_op_offset(done: list[int], old: int) -> int:
    """``calculateOpOffset``: advance over the contiguous run of done op offsets from ``old``."""
    offset = old
    for value in sorted(done):
        if value != offset:
            break
        offset += 1
    return offset
