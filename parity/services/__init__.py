"""The parity app's use cases (docs/design/resume.md#restore-report, #parity)."""

from parity.services.restore import clean_restore_report, restore_report_record
from parity.services.segments import segment_restore_snapshot, segment_verdict_refresh
from parity.services.tolerance import clean_tolerance, parity_tolerance_set
from parity.services.verdict import parity_after_batch, parity_open, parity_recompute

__all__ = [
    "clean_restore_report",
    "clean_tolerance",
    "parity_after_batch",
    "parity_open",
    "parity_recompute",
    "parity_tolerance_set",
    "restore_report_record",
    "segment_restore_snapshot",
    "segment_verdict_refresh",
]
