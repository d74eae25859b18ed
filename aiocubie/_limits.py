"""The budget as the user sets and reads it (``mgr.budget``): the limit mode and policy, each member's
proportion and cap, the manual and auto pools, and settings by name.

Handed the registry, the registration, the device account and the stream groups, it turns a
user's change of a limit into one call of the account (the budget's only writer, which announces
the change to the schedulers itself). It never reaches the manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._accounting import DeviceAccount
from ._budget import LimitMode
from ._errors import ConfigurationError, RegistrationError
from ._groups import StreamGroups
from ._options import Policy
from ._registry import Members, Registry

__all__ = ["BudgetView"]

#: The settings ``update`` knows, as cubie 0.17 names them.
SETTINGS = frozenset({"memory_manager", "stream_group", "mem_proportion"})


class BudgetView:
    """A manager's budget: ``mgr.budget``.

    Every member has a proportion of the device's memory (``memory_limit`` if set): a manual
    one it was given, or an equal share of the auto pool. Its cap is that proportion of the
    memory; a batch is planned against its group's caps (see :class:`~aiocubie.Options`).
    """

    def __init__(self, registry: Registry, registration: Members, account: DeviceAccount, groups: StreamGroups) -> None:
        self._registry = registry
        self._registration = registration
        self._account = account
        self._groups = groups

    @property
    def mode(self) -> LimitMode:
        """``passive`` or ``active`` (change it with :meth:`set_mode`)."""
        return self._account.options.mode

    @property
    def policy(self) -> Policy:
        """``chunk``, ``wait`` or ``fail`` (see :class:`~aiocubie.Policy`; change it with :meth:`set_policy`)."""
        return self._account.options.policy

    def set_mode(self, mode: LimitMode | str) -> None:
        """Switch between ``"passive"`` and ``"active"`` (:class:`ConfigurationError` for another name)."""
        self._account.configure(mode=mode)  # the account announces the change

    def set_policy(self, policy: Policy | str) -> None:
        """Set the policy: ``"chunk"``, ``"wait"`` or ``"fail"`` (:class:`ConfigurationError` else)."""
        self._account.configure(policy=policy)

    def proportion(self, instance: object) -> float:
        """Share of the memory ``instance`` may use."""
        return self._account.budget.proportion(self._registration.member(instance).key)

    def manual_proportion(self, instance: object) -> float | None:
        """The share reserved for ``instance`` (its manual proportion), or None in the auto pool
        (as cubie 0.17's ``manual_proportion``)."""
        return self._account.budget.manual_proportion(self._registration.member(instance).key)

    def cap(self, instance: object) -> int:
        """Bytes ``instance`` may use: its proportion of the memory.

        A batch is offered less than its group's caps: less what the members hold (active mode),
        then the headroom and the allocator's granule. Planning errors name the bytes offered.
        """
        return self._account.budget.cap(self._registration.member(instance).key)

    @property
    def manual_pool(self) -> float:
        """Share of the memory assigned to manual members."""
        self._registration.reap()
        return self._account.budget.manual_pool_proportion

    @property
    def auto_pool(self) -> float:
        """Share of the memory split among auto members."""
        self._registration.reap()
        return self._account.budget.auto_pool_proportion

    def set_manual(self, instance: object, proportion: float) -> None:
        """Give ``instance`` a manual ``proportion`` (moving it out of the auto pool if it is there).

        :class:`BudgetError` if ``proportion`` is outside (0, 1] or does not fit.
        """
        self._account.set_manual(self._registration.member(instance).key, proportion)

    def move_to_manual(self, instance: object, proportion: float) -> None:
        """Move ``instance`` from the auto pool to the manual pool with ``proportion``.

        :class:`BudgetError` if it has a manual proportion already (:meth:`set_manual` changes one).
        """
        member = self._registration.member(instance)
        self._account.move_to_manual(member.key, proportion, member.name)

    def set_auto(self, instance: object) -> None:
        """Move ``instance`` from the manual pool to the auto pool."""
        self._account.set_auto(self._registration.member(instance).key)

    def available(self, group: str) -> int:
        """Bytes ``group`` may use now (warns above 95% use in active mode)."""
        self._registration.reap()
        members = self._registry.group(group).members
        free = self._account.free_memory(fresh=True)
        return self._account.available(members, free, group=group, warn=True)

    def update(
        self, instance: object, updates: Mapping[str, Any] | None = None, *, silent: bool = False, **more: Any
    ) -> set[str]:
        """Change ``instance``'s memory settings by name, as cubie 0.17's ``update`` does.

        Parameters
        ----------
        instance : object
            A registered instance.
        updates : mapping, optional
            Setting name -> new value: ``stream_group`` (moves it, see
            :meth:`GroupsView.move <aiocubie.GroupsView.move>`; None changes nothing),
            ``mem_proportion`` (a manual proportion; None puts it in the auto pool) and
            ``memory_manager`` (only this manager or None: an instance cannot change manager).
        silent : bool
            Ignore names it does not know instead of raising.
        **more
            Further settings, by keyword.

        Returns
        -------
        set of str
            The names it knows among those given (whether or not their value changed anything).

        Raises
        ------
        ConfigurationError
            For names it does not know (unless ``silent``); nothing is changed then.
        RegistrationError
            If ``instance`` is not registered, or ``memory_manager`` names another manager.
        BudgetError
            If the proportion is invalid or does not fit the budget.
        """
        changes = {**(updates or {}), **more}
        member = self._registration.member(instance)
        unknown = sorted(set(changes) - SETTINGS)
        if unknown and not silent:
            raise ConfigurationError(
                f"update() does not know {', '.join(map(repr, unknown))}: the memory settings are "
                f"{', '.join(sorted(SETTINGS))} (pass silent=True to ignore other names)"
            )
        other = changes.get("memory_manager")
        if other is not None and getattr(other, "budget", None) is not self:
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
