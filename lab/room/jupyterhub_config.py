# JupyterHub's configuration file for a workshop room (`jupyterhub -f` this file), as `lab room serve` starts it.
# Everything is in lab/room/hub.py; the room's folder comes from $LAB_ROOM_DIR (its plan.json and settings.json).
from lab.room import hub

hub.configure(get_config())  # noqa: F821 - JupyterHub defines get_config() for its config files
