-- @kind: merge
-- @unique_key: day
-- Visitors, page views and events per day; each run upserts the days new events touched.
SELECT
  day,
  count(*) AS visitors,
  sum(pageviews) AS pageviews,
  sum(events) AS events
FROM staging.sessions
GROUP BY day
