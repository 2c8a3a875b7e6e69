"""Traffic sources (`--traffic SPEC`): traces, length mixes, shared prefixes, sessions."""
