"""Replay (issue 31): recorded runs through a candidate config, their model and tools answered
from the record, against real sidecars; what the candidate's processors would decide otherwise.

`source` reads the record, `recorded` answers the model and the tools from it, `runner` runs the
candidate, `diff` compares decisions, `report` sums them up, `job` ties them together.
"""

from procmesh_orchestrator.replay.job import Selection, replay
from procmesh_orchestrator.replay.report import EXIT_CHANGED, EXIT_SAME, Report
from procmesh_orchestrator.replay.source import ReplayError

__all__ = ["EXIT_CHANGED", "EXIT_SAME", "ReplayError", "Report", "Selection", "replay"]
