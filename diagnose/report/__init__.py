"""Reports of diagnose/compare: HTML."""
