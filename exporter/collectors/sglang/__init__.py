"""SGLang: the collector (/metrics, /server_info, its log)."""
