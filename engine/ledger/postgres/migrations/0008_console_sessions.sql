-- Carillon schema, version 8: the operator console's sessions, kept on the server.
--
-- The console's cookie holds a random session id; only its SHA-256 is stored here (like an
-- API token's secret, computed by the node: the id itself never reaches the database, and
-- neither does the bearer token the session was opened with). A session acts as its token,
-- lasts while it is used at least every idle_timeout and until expires_at at the latest, and
-- ends early when revoked: by signing out, or by revoking its token (tokens_revoke revokes
-- the token's sessions in the same transaction). Every node judges validity by the
-- database's now(), so any node serves any session.
--
-- A new, empty table: creating it takes no lock on a live ledger's other tables (the foreign
-- key takes a SHARE ROW EXCLUSIVE lock on api_tokens for an instant; api_tokens is written
-- only when a token is created or revoked).
CREATE TABLE console_sessions (
    session_hash  bytea       PRIMARY KEY CHECK (length(session_hash) = 32),
    -- the primary key serves sessions_touch (every console request a node has not cached)
    -- and sessions_revoke (signing out)
    token_id      text        NOT NULL REFERENCES api_tokens (token_id),
    created_at    timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL,
    idle_timeout  interval    NOT NULL CHECK (idle_timeout > interval '0'),
    expires_at    timestamptz NOT NULL CHECK (expires_at >= created_at + idle_timeout),
    revoked_at    timestamptz
);

-- tokens_revoke ends the token's open sessions: one range of this index.
CREATE INDEX console_sessions_token_idx ON console_sessions (token_id) WHERE revoked_at IS NULL;

-- sessions_create deletes (at most 100 of) the sessions past their absolute expiry, oldest
-- first, so the table never holds a session for longer than its lifetime.
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
