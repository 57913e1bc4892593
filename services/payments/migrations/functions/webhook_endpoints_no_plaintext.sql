-- Webhook endpoint secrets are stored encrypted (docs/webhooks-out.md "Secrets"): an insert carries
-- the ciphertext, and an update never puts a plaintext back.
CREATE OR REPLACE FUNCTION webhook_endpoints_no_plaintext() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.secret IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.secret IS DISTINCT FROM NEW.secret) THEN
        RAISE EXCEPTION 'webhook endpoint %: secrets are stored encrypted (secret_ciphertext), never in plaintext',
            NEW.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
