"""Tools above the clients: the seeded workload generator and the offset reset tool (see docs/jobs.md)."""

from __future__ import annotations

from broker_model.tools.reset import (
    PLAN_COLUMNS,
    PlanRow,
    ResetTool,
    Strategy,
    TopicSelection,
    export_plan,
    plan_records,
    read_targets_file,
)
from broker_model.tools.segment_commands import add_import_export_commands
from broker_model.tools.workload import RETRY_GROUPS, TOPICS, plan_sends, run_workload, start_brokers

__all__ = [
    "PLAN_COLUMNS",
    "RETRY_GROUPS",
    "TOPICS",
    "PlanRow",
    "ResetTool",
    "Strategy",
    "TopicSelection",
    "add_import_export_commands",
    "export_plan",
    "plan_records",
    "plan_sends",
    "read_targets_file",
    "run_workload",
    "start_brokers",
]
