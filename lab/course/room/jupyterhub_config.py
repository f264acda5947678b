# JupyterHub's configuration file for a workshop room (`jupyterhub -f` this file), as `lab room serve` starts it.
# Everything is in lab/course/room/hub.py; the room's folder comes from $LAB_ROOM_DIR (its plan.json and settings.json).
from typing import TYPE_CHECKING, Any

from lab.course.room import hub

if TYPE_CHECKING:  # JupyterHub defines get_config() in the namespace it runs its config files in

    def get_config() -> Any: ...


hub.configure(get_config())
