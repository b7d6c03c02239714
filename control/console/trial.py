"""Who gets the trial credit: once per person, at most a set number per client address a day, never
an address at a disposable-mail domain.  A person is their normalised address (``identity``): the case,
a ``+tag`` and, where the provider ignores them (Gmail), the dots of the local part do not make a new
person.  The disposable domains are the ``disposable-email-domains`` package's maintained list."""
from __future__ import annotations

import enum
import hashlib

from disposable_email_domains import blocklist

# providers that deliver "a.b.c@" to "abc@", each with the domain that stands for the provider
_DOTS_IGNORED = {"gmail.com": "gmail.com", "googlemail.com": "gmail.com"}


class NoTrial(enum.Enum):
    """Why an organisation got no trial credit (the console tells its owner)."""
    USED = "no_trial_used"              # this person (normalised address) had one
    CLIENT = "no_trial_client"          # too many from this client address today
    DISPOSABLE = "no_trial_disposable"  # a disposable-mail domain


def identity(email: str) -> str:
    """The person behind an address: lower case, no ``+tag``, no dots where the provider ignores them."""
    local, _, domain = email.strip().lower().rpartition("@")
    local = local.split("+", 1)[0]
    if domain in _DOTS_IGNORED:
        local, domain = local.replace(".", ""), _DOTS_IGNORED[domain]
    return f"{local}@{domain}"


def identity_hash(email: str) -> str:
    """What the trial ledger keeps of a person: a hash of ``identity``, not the address."""
    return hashlib.sha256(identity(email).encode()).hexdigest()


def disposable(email: str) -> bool:
    """The address's domain, or a domain it is under, is on the disposable-mail list."""
    labels = email.strip().lower().rpartition("@")[2].split(".")
    return any(".".join(labels[i:]) in blocklist for i in range(len(labels) - 1))
