"""Engine simulators that speak llama-server's and SGLang's HTTP APIs (test doubles and demo)."""
