-- The live holds of a resource near a time, found with operators Row-Level Security lets an index use.
-- The services' role is bound by RLS (docs/tenancy.md), and a condition whose operator is not
-- LEAKPROOF is evaluated only after the policy, never as an index condition: tstzrange `&&` is not
-- leakproof, so as the service role `h.during && x` cannot use holds_no_overlap's `during` column,
-- and every probe of "a resource's live holds overlapping x" read ALL of that resource's live holds
-- (each through the policy function): the cost of a hold, of an any-resource pick (twice per able
-- resource) and of availability grew with the resource's whole calendar.
-- timestamptz `<` and `>` are leakproof. A hold's blocked range is [start - buffer before, end +
-- buffer after) with both buffers at most 240 minutes (their CHECKs), so a hold overlapping [a, b)
-- has start_time < b + 240 minutes and end_time > a - 240 minutes. The probes say so beside their
-- exact `during && x` test, and this index answers those two bounds (GiST keeps both columns'
-- bounds per page, so it narrows by both at once, where a B-tree narrows by its first).
CREATE INDEX holds_live_times ON holds USING gist (merchant_id, resource_id, start_time, end_time)
    WHERE status IN ('held', 'confirmed');
