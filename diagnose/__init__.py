"""`llmb-loadgen diagnose` and `compare`: the procedure, its decision, the reports."""
