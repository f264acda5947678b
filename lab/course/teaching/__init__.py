"""The course around the measurements: the workshop and its benchmarks' parts, the lessons' helpers, the report with
its sections and figures, comparisons and the checkpoint tour."""
