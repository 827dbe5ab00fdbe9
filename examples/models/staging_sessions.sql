-- Page views of examples/icefloe.toml's pageviews stream, cleaned up for the marts:
-- one row per view, with its day and a session key (the session id, else user + day).
-- materialized: view
-- target: staging.sessions
SELECT
  CAST(ts AS DATE) AS day,
  lower(url) AS url,
  coalesce(session_id, concat(user_id, ':', CAST(CAST(ts AS DATE) AS STRING))) AS session_key,
  user_id,
  coalesce(duration_ms, 0) AS duration_ms,
  _sequence
FROM web.pageviews
WHERE ts IS NOT NULL
