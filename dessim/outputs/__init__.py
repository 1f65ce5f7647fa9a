"""Exporters of simulation results: Chrome/Perfetto trace JSON, span tables, Gantt charts."""

from dessim.outputs.chrome_trace import chrome_trace, write_chrome_trace
from dessim.outputs.gantt import write_gantt
from dessim.outputs.tables import write_spans

__all__ = ["chrome_trace", "write_chrome_trace", "write_gantt", "write_spans"]
