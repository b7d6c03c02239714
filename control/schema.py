"""PostgreSQL schema as ordered migrations, applied once each (``gateway up`` and the tests run them)."""
from __future__ import annotations

import asyncpg

# control/console/trial.py's identity_hash of a lower-case address ``e``, in SQL (migration 9 records the
# trials granted before it with it; tests/test_console_trial_links.py checks the two agree)
TRIAL_IDENTITY_SQL = (
    "encode(sha256(convert_to(CASE WHEN split_part(e, '@', 2) IN ('gmail.com', 'googlemail.com')"
    " THEN replace(split_part(split_part(e, '@', 1), '+', 1), '.', '') || '@gmail.com'"
    " ELSE split_part(split_part(e, '@', 1), '+', 1) || '@' || split_part(e, '@', 2) END, 'UTF8')), 'hex')")

MIGRATIONS: list[str] = [
    # 1: organisations, hashed keys, the ledger, usage metadata (never any text)
    """
    CREATE TABLE orgs (
      id text PRIMARY KEY,
      name text NOT NULL,
      status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
      rpm integer CHECK (rpm > 0),
      concurrency integer CHECK (concurrency > 0),
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE api_keys (
      id text PRIMARY KEY,
      org_id text NOT NULL REFERENCES orgs(id),
      key_hash text NOT NULL UNIQUE,
      prefix text NOT NULL,
      name text,
      rpm integer CHECK (rpm > 0),
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz
    );
    CREATE TABLE ledger (
      id bigserial PRIMARY KEY,
      org_id text NOT NULL REFERENCES orgs(id),
      amount_micro_pln bigint NOT NULL,
      kind text NOT NULL CHECK (kind IN ('topup', 'trial', 'correction', 'usage')),
      ref text NOT NULL UNIQUE,
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ledger_org ON ledger (org_id);
    CREATE TABLE usage_records (
      request_id text PRIMARY KEY,
      org_id text NOT NULL,
      key_id text NOT NULL,
      alias text NOT NULL,
      upstream_model text NOT NULL,
      endpoint text NOT NULL,
      status integer NOT NULL,
      stream boolean NOT NULL,
      prompt_tokens integer NOT NULL,
      completion_tokens integer NOT NULL,
      estimated boolean NOT NULL,
      cost_micro_pln bigint NOT NULL,
      input_price bigint NOT NULL,
      output_price bigint NOT NULL,
      started_at timestamptz NOT NULL,
      ttfb_ms integer,
      ended_at timestamptz NOT NULL
    );
    CREATE INDEX usage_org_time ON usage_records (org_id, started_at DESC);
    """,
    # 2: the console: users, memberships, sessions, e-mail tokens, invitations, payments, login attempts
    """
    CREATE TABLE users (
      id text PRIMARY KEY,
      email text NOT NULL UNIQUE,
      password_hash text NOT NULL,
      verified_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE memberships (
      user_id text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
      org_id text NOT NULL REFERENCES orgs(id),
      role text NOT NULL CHECK (role IN ('owner', 'member')),
      created_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (user_id, org_id)
    );
    CREATE INDEX memberships_org ON memberships (org_id);
    CREATE TABLE console_sessions (
      token_hash text PRIMARY KEY,
      user_id text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
      org_id text NOT NULL REFERENCES orgs(id),
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL
    );
    CREATE TABLE email_tokens (
      token_hash text PRIMARY KEY,
      user_id text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
      purpose text NOT NULL CHECK (purpose IN ('confirm', 'reset')),
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL,
      used_at timestamptz
    );
    CREATE TABLE invites (
      id text PRIMARY KEY,
      org_id text NOT NULL REFERENCES orgs(id),
      email text NOT NULL,
      role text NOT NULL CHECK (role IN ('owner', 'member')),
      token_hash text NOT NULL UNIQUE,
      invited_by text REFERENCES users(id) ON DELETE SET NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL,
      accepted_at timestamptz
    );
    CREATE INDEX invites_org ON invites (org_id);
    CREATE TABLE payments (
      id text PRIMARY KEY,
      org_id text NOT NULL REFERENCES orgs(id),
      provider text NOT NULL,
      amount_micro_pln bigint NOT NULL CHECK (amount_micro_pln > 0),
      status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid', 'failed')),
      provider_ref text,
      created_by text REFERENCES users(id) ON DELETE SET NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      paid_at timestamptz
    );
    CREATE INDEX payments_org ON payments (org_id, created_at DESC);
    CREATE TABLE login_attempts (
      id bigserial PRIMARY KEY,
      email text NOT NULL,
      ip text NOT NULL,
      kind text NOT NULL DEFAULT 'login',
      at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX login_attempts_email ON login_attempts (email, at);
    CREATE INDEX login_attempts_ip ON login_attempts (ip, at);
    CREATE INDEX usage_org_key ON usage_records (org_id, key_id, started_at DESC);
    """,
    # 3: the console's attempt limits moved to Redis (counted atomically before the work they guard);
    # keys record who created them (members revoke only their own; NULL: the CLI, or before this)
    """
    DROP TABLE login_attempts;
    ALTER TABLE api_keys ADD COLUMN created_by text REFERENCES users(id) ON DELETE SET NULL;
    CREATE INDEX api_keys_creator ON api_keys (org_id, created_by) WHERE revoked_at IS NULL;
    """,
    # 4: the usage log lists every authenticated chat/embeddings request, refusals included: the interface
    # error code the client got (NULL: none); a status filter and a request-id lookup
    """
    ALTER TABLE usage_records ADD COLUMN error_code text;
    CREATE INDEX usage_org_status ON usage_records (org_id, status, started_at DESC);
    """,
    # 5: a pending top-up can be cancelled by its organisation (a provider's later "paid" still credits);
    # an owner's low-balance threshold and when its e-mail went out (NULL: not sent since the last rise)
    """
    ALTER TABLE orgs ADD COLUMN low_balance_micro_pln bigint CHECK (low_balance_micro_pln > 0);
    ALTER TABLE orgs ADD COLUMN low_balance_mailed_at timestamptz;
    ALTER TABLE payments DROP CONSTRAINT payments_status_check;
    ALTER TABLE payments ADD CONSTRAINT payments_status_check
      CHECK (status IN ('pending', 'paid', 'failed', 'cancelled'));
    """,
    # 6: VAT invoices: the organisation's billing details, a gap-free counter per year, one invoice per
    # paid top-up with the buyer's details as they were when it was issued (control/console/invoices.py)
    """
    ALTER TABLE orgs ADD COLUMN billing_name text;
    ALTER TABLE orgs ADD COLUMN billing_nip text;
    ALTER TABLE orgs ADD COLUMN billing_address text;
    ALTER TABLE orgs ADD COLUMN billing_person boolean NOT NULL DEFAULT false;
    CREATE TABLE invoice_counters (year integer PRIMARY KEY, last integer NOT NULL);
    CREATE TABLE invoices (
      id text PRIMARY KEY,
      number text NOT NULL UNIQUE,
      year integer NOT NULL,
      seq integer NOT NULL,
      org_id text NOT NULL REFERENCES orgs(id),
      payment_id text NOT NULL UNIQUE REFERENCES payments(id),
      issued_at timestamptz NOT NULL,
      gross_grosze bigint NOT NULL,
      net_grosze bigint NOT NULL,
      vat_grosze bigint NOT NULL,
      vat_pct integer NOT NULL,
      buyer_name text NOT NULL,
      buyer_nip text,
      buyer_address text,
      buyer_person boolean NOT NULL,
      UNIQUE (year, seq),
      CHECK (net_grosze + vat_grosze = gross_grosze)
    );
    CREATE INDEX invoices_org ON invoices (org_id, issued_at DESC);
    """,
    # 7: each account's language (the console's e-mails sent without a request: low balance, payments)
    """
    ALTER TABLE users ADD COLUMN lang text NOT NULL DEFAULT 'pl' CHECK (lang IN ('pl', 'en'));
    """,
    # 8: an organisation's own credit limit, how far below zero its balance may go once it has paid
    # (README, "Billing"): an amount, or none at all (credit_unlimited); neither: GATEWAY_CREDIT_LIMIT_PLN's
    """
    ALTER TABLE orgs ADD COLUMN credit_limit_micro_pln bigint CHECK (credit_limit_micro_pln >= 0);
    ALTER TABLE orgs ADD COLUMN credit_unlimited boolean NOT NULL DEFAULT false;
    ALTER TABLE orgs ADD CONSTRAINT orgs_credit_limit_one
      CHECK (NOT (credit_unlimited AND credit_limit_micro_pln IS NOT NULL));
    """,
    # 9: the trial credit once per person: a hash of the normalised address (control/console/trial.py)
    # of each one granted, those granted before included (under their organisations' owners' addresses)
    f"""
    CREATE TABLE trial_grants (
      identity_hash text PRIMARY KEY,
      org_id text NOT NULL REFERENCES orgs(id),
      created_at timestamptz NOT NULL DEFAULT now()
    );
    INSERT INTO trial_grants (identity_hash, org_id, created_at)
    SELECT DISTINCT ON (h) h, org_id, created_at FROM (
      SELECT {TRIAL_IDENTITY_SQL} AS h, l.org_id, l.created_at
      FROM ledger l JOIN memberships m ON m.org_id = l.org_id AND m.role = 'owner'
      JOIN users u ON u.id = m.user_id, lower(u.email) AS e
      WHERE l.kind = 'trial') AS granted
    ORDER BY h, created_at;
    """,
    # 10: the alias change policy (README, "Changing the model behind an alias"): each catalog that
    # `gateway catalog apply` put in force (its SHA-256: the ext_proc's reload takes one breaking the
    # policy only if it is here; forced: applied with --force), and each model change it announced,
    # mailed once to every owner (mailed_at: sent)
    """
    CREATE TABLE catalog_applies (
      sha256 text PRIMARY KEY,
      forced boolean NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE model_changes (
      id bigserial PRIMARY KEY,
      alias text NOT NULL,
      effective timestamptz NOT NULL,
      before text NOT NULL,
      after text NOT NULL,
      forced boolean NOT NULL,
      catalog_sha256 text NOT NULL REFERENCES catalog_applies(sha256),
      announced_at timestamptz NOT NULL DEFAULT now(),
      mailed_at timestamptz
    );
    CREATE INDEX model_changes_unmailed ON model_changes (id) WHERE mailed_at IS NULL;
    """,
    # 11: a key's own limits (docs/limits.md, "Key limits"): a monthly spending cap (micro-PLN, a calendar
    # month in Europe/Warsaw), the aliases it may use (NULL: all), the moment it stops working (NULL:
    # never), and the month whose near-the-cap e-mail went out to the owners (once a month)
    """
    ALTER TABLE api_keys ADD COLUMN monthly_limit_micro_pln bigint CHECK (monthly_limit_micro_pln > 0);
    ALTER TABLE api_keys ADD COLUMN models text[] CHECK (cardinality(models) > 0);
    ALTER TABLE api_keys ADD COLUMN expires_at timestamptz;
    ALTER TABLE api_keys ADD COLUMN limit_mailed_month text;
    """,
    # 12: each invoice as an FA(3) structured invoice and its way to KSeF, a queue that survives restarts
    # (control/ksef/store.py): recorded when the invoice is issued, made and sent by the console's loop
    """
    CREATE TABLE ksef_documents (
      number text PRIMARY KEY,
      org_id text NOT NULL REFERENCES orgs(id),
      state text NOT NULL DEFAULT 'new' CHECK (state IN ('new', 'kept', 'queued', 'sent', 'rejected')),
      xml bytea,
      issued_on date,
      seller_nip text,
      offline boolean NOT NULL DEFAULT false,
      attempts integer NOT NULL DEFAULT 0,
      next_at timestamptz,
      ksef_ref text,
      ksef_number text UNIQUE,
      problem text,
      created_at timestamptz NOT NULL DEFAULT now(),
      sent_at timestamptz,
      CHECK (state IN ('new', 'rejected') OR (xml IS NOT NULL AND issued_on IS NOT NULL AND seller_nip IS NOT NULL)),
      CHECK ((state = 'sent') = (ksef_number IS NOT NULL))
    );
    CREATE INDEX ksef_documents_due ON ksef_documents (next_at) WHERE state = 'queued';
    CREATE INDEX ksef_documents_org ON ksef_documents (org_id, created_at DESC);
    """,
    # 13: a third role, billing (top-ups, invoices and usage; no keys: control/console/roles.py), for
    # memberships and invitations; existing owners and members keep theirs
    """
    ALTER TABLE memberships DROP CONSTRAINT memberships_role_check;
    ALTER TABLE memberships ADD CONSTRAINT memberships_role_check CHECK (role IN ('owner', 'member', 'billing'));
    ALTER TABLE invites DROP CONSTRAINT invites_role_check;
    ALTER TABLE invites ADD CONSTRAINT invites_role_check CHECK (role IN ('owner', 'member', 'billing'));
    """,
    # 14: two-factor sign-in (control/console/totp.py): each account's TOTP secret once confirmed (the one
    # being enrolled apart), the last 30-second step whose code it took (never the same code twice), its
    # one-time recovery codes as hashes; an organisation whose owners require it of everyone
    """
    ALTER TABLE users ADD COLUMN totp_secret text;
    ALTER TABLE users ADD COLUMN totp_pending text;
    ALTER TABLE users ADD COLUMN totp_last_step bigint NOT NULL DEFAULT 0;
    ALTER TABLE users ADD COLUMN totp_enabled_at timestamptz;
    ALTER TABLE users ADD CONSTRAINT users_totp_both CHECK ((totp_secret IS NULL) = (totp_enabled_at IS NULL));
    CREATE TABLE recovery_codes (
      user_id text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
      code_hash text NOT NULL,
      used_at timestamptz,
      PRIMARY KEY (user_id, code_hash)
    );
    ALTER TABLE orgs ADD COLUMN require_2fa boolean NOT NULL DEFAULT false;
    """,
]


async def migrate(conn: asyncpg.Connection) -> int:
    """Apply pending migrations under an advisory lock; returns the schema version."""
    await conn.execute("SELECT pg_advisory_lock(7420001)")
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations"
                           " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for i, sql in enumerate(MIGRATIONS, start=1):
            if i not in done:
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", i)
        return len(MIGRATIONS)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(7420001)")
