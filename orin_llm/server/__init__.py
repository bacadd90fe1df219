"""`orin-llm serve`: an OpenAI-compatible HTTP API on one model, run as a systemd service.

config.py reads the TOML file and flags; worker.py is the one thread that owns the engine, fed by
a bounded queue; app.py holds the aiohttp routes; metrics.py the Prometheus metrics; systemd.py
sd_notify, the watchdog and the journal; cli.py ties them together (see docs/SERVER.md)."""
