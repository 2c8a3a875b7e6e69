"""The composition roots of the command lines: the only modules that import every floor."""
