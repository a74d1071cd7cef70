"""Acceptance traces: format and validation (``format``); synthesis, fitting, recording and stats
live in sibling modules."""

from .format import TRACE_VERSION, TraceError, TraceFault, check_trace_columns
from .trace import Trace, read_trace_file

__all__ = ["TRACE_VERSION", "Trace", "TraceError", "TraceFault", "check_trace_columns", "read_trace_file"]
