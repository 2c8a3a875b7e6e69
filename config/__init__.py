"""The typed configuration (ground floor: imports nothing of ours but `config` itself).

`settings` is the config file (engines, GPU, launch templates, the `loadgen:` section through
`loadgen`), `kinds` the engine kinds every branch on a kind reads.
"""
