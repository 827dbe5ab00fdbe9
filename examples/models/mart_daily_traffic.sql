-- Views, sessions and time spent per day and page. Incremental: each run upserts only
-- the (day, url) rows that new page views touched, recomputed over the whole day.
-- materialized: merge
-- unique_key: day, url
-- target: mart.daily_traffic
-- dialect: duckdb
SELECT
  day,
  url,
  count(*) AS views,
  count(DISTINCT session_key) AS sessions,
  sum(duration_ms) AS duration_ms
FROM staging.sessions
GROUP BY day, url
