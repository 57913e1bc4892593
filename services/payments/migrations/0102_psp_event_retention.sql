-- Issue 10, item 10: PSP events were stored for ever with the intent's client secret and 3-D Secure
-- redirect. New events are stored without them (webhooks.without_secrets); this scrubs the ones
-- stored before. Handled events are purged after CUTY_PSP_EVENT_RETENTION_DAYS by the payments
-- service's purge worker, oldest first through this index.
UPDATE psp_events
   SET payload = payload #- '{data,object,client_secret}' #- '{data,object,next_action}'
 WHERE payload -> 'data' -> 'object' ?| ARRAY['client_secret', 'next_action'];

CREATE INDEX psp_events_handled ON psp_events (processed_at) WHERE status IN ('processed', 'ignored');
