"""Limits: the limit mode and policy, each member's proportion and cap, the pools, and settings by name.

Handed the registry, the registration, the device account and the stream groups, it turns a
user's change of a limit into one call of the account (the budget's only writer, which announces
the change to the schedulers itself). It never reaches the manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._accounting import DeviceAccount
from ._errors import ConfigurationError, RegistrationError
from ._groups import StreamGroups
from ._registration import Registration
from ._registry import Registry

__all__ = ["Limits"]

#: The settings ``update`` knows, as cubie 0.17 names them.
SETTINGS = frozenset({"memory_manager", "stream_group", "mem_proportion"})


class Limits:
    """The budget of one manager's members, as the user sets and reads it.

    Parameters
    ----------
    registry : Registry
        The groups, whose members a group's available memory is summed over.
    registration : Registration
        Finds the member of an instance.
    account : DeviceAccount
        Holds the options and the budget, changes them and announces the changes.
    groups : StreamGroups
        Moves a member to another group.
    """

    def __init__(
        self, registry: Registry, registration: Registration, account: DeviceAccount, groups: StreamGroups
    ) -> None:
        self._registry = registry
        self._registration = registration
        self._account = account
        self._groups = groups

    def configure(self, **changes: Any) -> None:
        """Change the mode or the policy (:class:`ConfigurationError` for a name neither knows)."""
        self._account.configure(**changes)

    def proportion(self, instance: object) -> float:
        """Share of VRAM ``instance`` may use."""
        return self._account.budget.proportion(self._registration.member(instance).key)

    def manual_proportion(self, instance: object) -> float | None:
        """``instance``'s manual proportion, or None in the auto pool."""
        return self._account.budget.manual_proportion(self._registration.member(instance).key)

    def cap(self, instance: object) -> int:
        """Bytes ``instance`` may use: proportion x total VRAM."""
        return self._account.budget.cap(self._registration.member(instance).key)

    def pools(self) -> tuple[float, float]:
        """The manual and the auto pool's shares of VRAM."""
        self._registration.reap()
        budget = self._account.budget
        return budget.manual_pool_proportion, budget.auto_pool_proportion

    def set_manual(self, instance: object, proportion: float) -> None:
        """Give ``instance`` a manual ``proportion``."""
        self._account.set_manual(self._registration.member(instance).key, proportion)

    def move_to_manual(self, instance: object, proportion: float) -> None:
        """Move ``instance`` from the auto pool to the manual pool (:class:`BudgetError` if it is manual)."""
        member = self._registration.member(instance)
        self._account.move_to_manual(member.key, proportion, member.name)

    def set_auto(self, instance: object) -> None:
        """Move ``instance`` to the auto pool."""
        self._account.set_auto(self._registration.member(instance).key)

    def available(self, group: str) -> int:
        """Bytes ``group`` may use now (warns above 95% use in active mode)."""
        self._registration.reap()
        members = self._registry.group(group).members
        free = self._account.free_memory(fresh=True)
        return self._account.available(members, free, group=group, warn=True)

    def update(self, instance: object, changes: Mapping[str, Any], *, silent: bool, manager: object) -> set[str]:
        """Change ``instance``'s settings by name (see ``MemoryManager.update``); ``manager``: the one it is in.

        Returns
        -------
        set of str
            The names it knows among those given.
        """
        member = self._registration.member(instance)
        unknown = sorted(set(changes) - SETTINGS)
        if unknown and not silent:
            raise ConfigurationError(
                f"update() does not know {', '.join(map(repr, unknown))}: the memory settings are "
                f"{', '.join(sorted(SETTINGS))} (pass silent=True to ignore other names)"
            )
        other = changes.get("memory_manager")
        if other is not None and other is not manager:
            raise RegistrationError(
                f"{member.name} cannot change memory manager: unregister it here and register it with the other"
            )
        group = changes.get("stream_group")
        if group is not None and group != member.group:
            self._groups.move(member, group)
        if "mem_proportion" in changes:
            proportion = changes["mem_proportion"]
            if proportion is None:
                if self._account.budget.is_manual(member.key):
                    self.set_auto(instance)
            else:
                self.set_manual(instance, proportion)
        return set(changes) & SETTINGS
