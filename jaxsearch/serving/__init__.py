"""Serving a trained search agent over an OpenAI-compatible HTTP API (`server.py`; `launch/serve_agent.py`)."""
