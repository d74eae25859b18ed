"""Policy "wait" in passive mode: a batch that does not fit the free memory waits for releases,
first come first served across stream groups; cancellable; one that could never fit fails at once.
A request that waits on memory its own member holds warns, at the program's line even when the group's
task planned the batch.

On asyncio and trio. ``fail_after`` only guards hangs; nothing is asserted on time.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.abc
import pytest
from simkit import HANG_GUARD, TOTAL, Part, assert_all_released, vec, wait_until

from aiocubie import ArrayResponse, MemoryManager
from aiocubie._waiting import WaitingLine
from aiocubie.errors import UnchunkableTooLargeError
from aiocubie.simulator import SimulatorBackend

KB = 1000


def blob(nbytes: int) -> dict[str, object]:
    """One unchunkable device array of ``nbytes`` bytes."""
    return {"blob": vec(nbytes, "u1", unchunkable=True)}


def passive_wait(sim: SimulatorBackend, **options: object) -> MemoryManager:
    return MemoryManager(sim, policy="wait", batch_window=0, free_cache_seconds=0, **options)  # type: ignore[arg-type]


def waiting(mgr: MemoryManager) -> int:
    """Requests waiting for memory in every group (being planned, not allocated)."""
    return sum(group.planning for group in mgr.statistics().groups.values())


class Asker:
    """Awaits one request in a task; keeps the response, the error, and the order it ended in."""

    def __init__(self, mgr: MemoryManager, part: Part, nbytes: int, ended: list[str], name: str) -> None:
        self.mgr, self.part, self.nbytes, self.ended, self.name = mgr, part, nbytes, ended, name
        self.response: ArrayResponse | None = None
        self.error: BaseException | None = None
        self.scope = anyio.CancelScope()

    async def __call__(self) -> None:
        with self.scope:
            try:
                self.response = await self.mgr.request(self.part, blob(self.nbytes))
            except Exception as exc:
                self.error = exc
            self.ended.append(self.name)


class Line:
    """Group a holds two 400 kB arrays; b's ``big`` request, then c's ``small`` one, wait for memory in
    that order (three groups), started in ``tg``."""

    def __init__(self, mgr: MemoryManager, big: int, small: int) -> None:
        self.parts = a, b, c = Part(), Part(), Part()
        for part, group in ((a, "a"), (b, "b"), (c, "c")):
            mgr.register(part, stream_group=group)
        self.mgr, self.ended = mgr, []
        self.big, self.small = Asker(mgr, b, big, self.ended, "big"), Asker(mgr, c, small, self.ended, "small")

    async def start(self, tg: anyio.abc.TaskGroup) -> tuple[ArrayResponse, ArrayResponse]:
        """Hold a's two arrays, then line up big and small; return a's two responses."""
        mgr, a = self.mgr, self.parts[0]
        first, second = await mgr.request(a, blob(400 * KB)), await mgr.request(a, blob(400 * KB))
        tg.start_soon(self.big)
        await wait_until(lambda: waiting(mgr) == 1)
        tg.start_soon(self.small)
        await wait_until(lambda: waiting(mgr) == 2)
        return first, second


@pytest.mark.anyio
async def test_a_request_waits_for_another_groups_release_then_is_served(sim: SimulatorBackend) -> None:
    a, b = Part(), Part()
    async with passive_wait(sim) as mgr:
        mgr.register(a, stream_group="a")
        mgr.register(b, stream_group="b")
        held = await mgr.request(a, blob(700 * KB))
        ended: list[str] = []
        asker = Asker(mgr, b, 500 * KB, ended, "b")
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(asker)
                await wait_until(lambda: waiting(mgr) == 1)
                assert not ended  # waits: not refused, not served
                # the holder of what b waits for asks again before it releases: a batch that fits is
                # served, not held behind the waiting one (that would wait forever)
                more = await mgr.request(a, blob(100 * KB))
                assert not ended
                mgr.release(more)
                mgr.release(held)
        assert asker.error is None and asker.response is not None
        assert asker.response.arrays["blob"].nbytes == 500 * KB
        mgr.release(asker.response)
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_a_waiting_batch_whose_members_hold_memory_is_served_once_it_fits(sim: SimulatorBackend) -> None:
    """b waits at the head for what a holds; a asks for more before releasing and waits behind b:
    once a's request fits it is served (behind b it would wait forever), then a releases and b goes."""
    a, b, c = Part(), Part(), Part()
    async with passive_wait(sim) as mgr:
        for part, group in ((a, "a"), (b, "b"), (c, "c")):
            mgr.register(part, stream_group=group)
        held_a, held_c = await mgr.request(a, blob(500 * KB)), await mgr.request(c, blob(300 * KB))
        ended: list[str] = []
        big, more = Asker(mgr, b, 900 * KB, ended, "big"), Asker(mgr, a, 300 * KB, ended, "more")
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(big)
                await wait_until(lambda: waiting(mgr) == 1)
                tg.start_soon(more)
                await wait_until(lambda: waiting(mgr) == 2)  # 200 kB free: a's waits too, behind b's
                mgr.release(held_c)  # a's fits now
                await wait_until(lambda: more.response is not None)
                assert ended == ["more"]
                mgr.release(more.response)
                mgr.release(held_a)
        assert ended == ["more", "big"] and big.response is not None
        mgr.release(big.response)
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_set_policy_wait_makes_a_passive_request_wait(sim: SimulatorBackend) -> None:
    a, b = Part(), Part()
    async with MemoryManager(sim, batch_window=0, free_cache_seconds=0) as mgr:
        mgr.register(a, stream_group="a")
        mgr.register(b, stream_group="b")
        held = await mgr.request(a, blob(800 * KB))
        with pytest.raises(UnchunkableTooLargeError):  # policy chunk: refused at once
            await mgr.request(b, blob(500 * KB))
        mgr.budget.set_policy("wait")
        ended: list[str] = []
        asker = Asker(mgr, b, 500 * KB, ended, "b")
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(asker)
                await wait_until(lambda: waiting(mgr) == 1)
                mgr.release(held)
        assert asker.response is not None
        mgr.release(asker.response)
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_waiting_requests_are_served_first_come_first_served_across_groups(sim: SimulatorBackend) -> None:
    async with passive_wait(sim) as mgr:
        # the big one first; the second one needs less, but not so little that both fit at once
        line = Line(mgr, 600 * KB, 450 * KB)
        big, small, ended = line.big, line.small, line.ended
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                first, second = await line.start(tg)
                mgr.release(first)  # room for the small one, not the big one: it stays behind the big one
                await anyio.sleep(0.1)
                assert not ended and waiting(mgr) == 2
                mgr.release(second)
                await wait_until(lambda: big.response is not None)
                await anyio.sleep(0.05)
                assert ended == ["big"] and waiting(mgr) == 1  # no room left for the small one
                assert big.response is not None
                mgr.release(big.response)
        assert ended == ["big", "small"] and small.response is not None
        mgr.release(small.response)
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_a_request_cancelled_while_waiting_leaks_nothing_and_lets_the_next_go(sim: SimulatorBackend) -> None:
    async with passive_wait(sim) as mgr:
        line = Line(mgr, 600 * KB, 300 * KB)
        big, small, ended = line.big, line.small, line.ended
        b = line.parts[1]
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                first, second = await line.start(tg)
                mgr.release(first)  # the small one fits, behind the big one
                big.scope.cancel()  # the head of the line goes: the small one is served now
        assert ended == ["small"] and big.response is None and big.error is None
        assert small.response is not None
        with anyio.fail_after(HANG_GUARD):
            with anyio.move_on_after(0.05):  # a timeout while waiting: withdrawn too
                await mgr.request(b, blob(600 * KB))
        assert waiting(mgr) == 0
        mgr.release(small.response)
        mgr.release(second)
        assert_all_released(mgr, sim)
        with anyio.fail_after(HANG_GUARD):  # the line holds nothing of them: a new request is served
            async with mgr.request(b, blob(600 * KB)) as response:
                assert response.arrays["blob"].nbytes == 600 * KB
        assert_all_released(mgr, sim)


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [None, 500 * KB])
async def test_a_request_that_could_never_fit_fails_at_once(sim: SimulatorBackend, limit: int | None) -> None:
    a, b = Part(), Part()
    budget = TOTAL if limit is None else limit
    async with passive_wait(sim, memory_limit=limit) as mgr:
        mgr.register(a, stream_group="a")
        mgr.register(b, stream_group="b")
        held = await mgr.request(a, blob(budget // 2))
        with anyio.fail_after(HANG_GUARD), pytest.raises(UnchunkableTooLargeError) as info:
            await mgr.request(b, blob(budget + 1))  # more than the device (or the limit) has
        message = str(info.value)
        assert f"need {budget + 1} bytes" in message and "proportion" not in message
        assert "release arrays" in message
        mgr.release(held)
        assert_all_released(mgr, sim)


def test_a_warning_from_a_batch_the_group_task_closed_points_at_the_programs_line(tmp_path: Path) -> None:
    # the batch is planned in the group's task (two requesters, a batch window): no user frame is on the
    # stack, so the warning points past the event loop's frames, at the line that started it
    script = tmp_path / "program.py"
    script.write_text(
        "import warnings\n"
        "import anyio, numpy as np\n"
        "import aiocubie as ac\n"
        "async def main():\n"
        "    async with ac.MemoryManager(ac.simulator.SimulatorBackend(1 << 20), batch_window=0.01, policy='wait') as mgr:\n"
        "        a, b = type('A', (), {})(), type('B', (), {})()\n"
        "        mgr.register(a); mgr.register(b)\n"
        "        held = await mgr.request(a, {'x': ac.ArrayRequest((700_000,), np.uint8, unchunkable=True)})\n"
        "        async def ask(x):  # a batch of both waits on what a holds: the self-wait warning\n"
        "            with anyio.move_on_after(0.1):\n"
        "                await mgr.request(x, {'x': ac.ArrayRequest((200_000,), np.uint8, unchunkable=True)})\n"
        "        async with anyio.create_task_group() as tg:\n"
        "            tg.start_soon(ask, a)\n"
        "            tg.start_soon(ask, b)\n"
        "        mgr.release(held)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    anyio.run(main)  # line 18\n"
        "print(*{(w.filename, w.lineno) for w in caught if issubclass(w.category, ac.errors.AiocubieWarning)})\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str((str(script), 18)), result.stdout


def test_the_waiting_line_is_first_come_first_served_within_a_priority_and_wakes_the_rest_when_one_leaves() -> None:
    woken: list[None] = []
    line = WaitingLine(lambda: woken.append(None))
    first, second, third = object(), object(), object()
    assert line.first(first) and not line  # an empty line holds no one back
    for since, batch in enumerate((first, second, third)):
        line.join(batch, 0, float(since))
    line.join(first, 0, 9.0)  # joining twice keeps the first place
    assert len(line) == 3 and line.first(first) and not line.first(second)
    line.leave(second)  # withdrawn: the rest check again (one of them may go first now)
    assert len(line) == 2 and len(woken) == 1
    line.leave(first)
    assert line.first(third) and len(woken) == 2
    line.leave(third)
    line.leave(third)  # leaving twice is harmless
    assert not line and len(woken) == 2  # nobody left to wake


def test_the_waiting_line_puts_a_higher_priority_first_and_holds_back_a_lower_newcomer() -> None:
    line = WaitingLine(lambda: None)
    low, high, newcomer = object(), object(), object()
    line.join(low, 0, 1.0)
    line.join(high, 5, 2.0)
    assert line.first(high, 2.0) and not line.first(low, 2.0)
    assert line.ahead(newcomer, 0, 3.0, 3.0, None)  # a newcomer of a lower priority waits behind high
    assert not line.ahead(newcomer, 5, 3.0, 3.0, None)  # one of high's priority that fits is not held back
    # aging: low gains a level every 0.1 s; by 1.0 s after it came it has overtaken a 5 that came later
    assert line.first(low, 1.6, aging=0.1) and not line.first(high, 1.6, aging=0.1)
