"""The course around the measurements: the workshop, the lessons' helpers, the report, comparisons and the checkpoint tour."""
