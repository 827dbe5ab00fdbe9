-- @kind: view
-- One row per visitor and day: when the visit started and ended, what it did.
SELECT
  user_id,
  CAST(received_at AS DATE) AS day,
  min(received_at) AS session_start,
  max(received_at) AS session_end,
  count(*) AS events,
  sum(CASE WHEN event_name = 'pageview' THEN 1 ELSE 0 END) AS pageviews
FROM raw.events
WHERE user_id IS NOT NULL
GROUP BY user_id, CAST(received_at AS DATE)
