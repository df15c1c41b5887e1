"""`dlmrt serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn, the `serve` extra).

`build_app(llm)` (dlmrt.server.app) returns the ASGI app; `dlmrt.server.launcher` runs it under
uvicorn with graceful shutdown. Importing this package imports neither fastapi nor torch.
"""
