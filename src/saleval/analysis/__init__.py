"""saleval.analysis: what the runs' tables mean: human scores, human against automated, study planning, reports and plots (docs/architecture.md, "Where things are")."""
