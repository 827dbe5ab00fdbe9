"""The ingestor's HTTP front.

- :mod:`~ingestor.http.steps`: the steps of an ingest request, one copy for both fronts;
- :mod:`~ingestor.http.app`: the raw ASGI app (``HttpApp``) that serves every route;
- :mod:`~ingestor.http.fast`: the fast lane that answers plain ingest POSTs from callbacks;
- :mod:`~ingestor.http.server`: the uvicorn server that runs both, with the slow-client
  guard (:mod:`~ingestor.http.slow_clients`) and body inflaters (:mod:`~ingestor.http.inflate`);
- :mod:`~ingestor.http.openapi`: the OpenAPI document of the routes.
"""
