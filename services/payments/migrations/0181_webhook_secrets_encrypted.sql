-- Issue 12, item 6: webhook endpoint secrets encrypted at rest (docs/webhooks-out.md "Secrets").
-- Signing needs the secret itself, so it is stored as AES-256-GCM ciphertext under payments' own
-- keyring (CUTY_WEBHOOK_SECRET_KEYS; cutylib.keyring, the implementation the code pool's codes use),
-- with the key id per row for rotation; the associated data binds it to (merchant, endpoint).
--
-- The key never reaches the database, so SQL cannot encrypt the rows that exist: this migration
-- makes room for the ciphertext and refuses new plaintext, and every payments replica seals the
-- remaining plaintext rows at start, before it serves (payments/outbound/secrets.py,
-- SecretBox.encrypt_stored: SKIP LOCKED batches, one conditional UPDATE per row). A row is in
-- exactly one form at any time, and the delivery workers read either.
ALTER TABLE webhook_endpoints
    ALTER COLUMN secret DROP NOT NULL,
    ADD COLUMN secret_key_id text CHECK (length(secret_key_id) BETWEEN 1 AND 32),
    ADD COLUMN secret_nonce bytea CHECK (length(secret_nonce) = 12),
    ADD COLUMN secret_ciphertext bytea CHECK (length(secret_ciphertext) BETWEEN 17 AND 1040),
    ADD CONSTRAINT webhook_endpoints_secret_one_form CHECK (
        (secret IS NULL) = (secret_ciphertext IS NOT NULL)
        AND (secret_ciphertext IS NULL) = (secret_key_id IS NULL)
        AND (secret_ciphertext IS NULL) = (secret_nonce IS NULL));

-- No new plaintext: an insert carries the ciphertext, and an update never puts a plaintext back.
CREATE FUNCTION webhook_endpoints_no_plaintext() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.secret IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.secret IS DISTINCT FROM NEW.secret) THEN
        RAISE EXCEPTION 'webhook endpoint %: secrets are stored encrypted (secret_ciphertext), never in plaintext',
            NEW.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER webhook_endpoints_no_plaintext BEFORE INSERT OR UPDATE ON webhook_endpoints
    FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_no_plaintext();
