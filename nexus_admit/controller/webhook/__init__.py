"""The pod webhook: its decision (`review.py`), its HTTPS endpoint (`server.py`), the thread
it runs on (`thread.py`) and its serving certificate (`tls.py`)."""
