"""The IO simulator: FlashLab's schedules counted by its C++ memory models (sim/)."""
from . import _core


def schedules():
    """The names of the registered schedules, in learning order."""
    return _core.schedule_names().split(",")
