"""Will it fit, and which tool: the memory model (`lab memory`) and the strategy chooser (`lab choose`)."""
