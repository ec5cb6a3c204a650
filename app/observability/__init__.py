"""Making memory visible: per-turn token accounting, compaction history, feedback, metrics."""
