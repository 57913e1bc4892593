-- IANA names only. Postgres also accepts POSIX strings ('+03' means UTC-3 there!) and
-- abbreviations in AT TIME ZONE, so "Postgres does not raise" is not the test: the name must be in
-- the zone database. The API checks the same with Python's zoneinfo (which renders local times),
-- this check keeps any other writer honest.
CREATE OR REPLACE FUNCTION booking_is_iana_zone(tz text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT tz NOT IN ('localtime', 'posixrules', 'Factory')
       AND EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz)
$$;
