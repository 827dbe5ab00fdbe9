"""The ingestor's HTTP front: the ASGI app, its fast lane and the uvicorn server that runs both."""
