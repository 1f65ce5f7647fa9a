"""Task graphs: tasks on ranks and streams with dependencies, and their JSON format."""

from dessim.taskgraph.fold import Fold
from dessim.taskgraph.io import load_taskgraph, save_taskgraph, taskgraph_from_dict, taskgraph_to_dict
from dessim.taskgraph.model import DEFAULT_STREAM, TASK_KINDS, Task, TaskGraph, brief_ranks

__all__ = ["Task", "TaskGraph", "Fold", "TASK_KINDS", "DEFAULT_STREAM", "load_taskgraph", "save_taskgraph",
           "taskgraph_from_dict", "taskgraph_to_dict", "brief_ranks"]
