"""Who may do what in an organisation: each role's capabilities (README, "Roles").  Pure."""
from __future__ import annotations

from typing import Literal

from .i18n import N_

Role = Literal["owner", "member", "billing"]
Capability = Literal["keys", "key_limits", "usage", "billing", "members"]

ROLES: tuple[Role, ...] = ("owner", "member", "billing")

GRANTS: dict[str, frozenset[Capability]] = {
    "owner": frozenset({"keys", "key_limits", "usage", "billing", "members"}),
    "member": frozenset({"keys", "usage"}),
    "billing": frozenset({"billing", "usage"}),
}

# what a 403 page says to a role without the capability
REFUSALS: dict[Capability, str] = {
    "keys": N_("Keys are for the organisation's owners and members; ask an owner."),
    "key_limits": N_("Only the organisation's owners set a key's limits."),
    "usage": N_("Only the organisation's people can see its usage."),
    "billing": N_("Billing is for the organisation's owners and its billing role; ask an owner."),
    "members": N_("Only the organisation's owners can see this page."),
}


def may(role: str, capability: Capability) -> bool:
    return capability in GRANTS.get(role, frozenset())


def is_role(value: str) -> bool:
    return value in GRANTS
