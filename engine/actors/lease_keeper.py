"""Acquires, renews and hands back this node's partition leases.

Design
------
Leases are liveness hints; the fencing token checked by every write is the safety mechanism.
Each cycle (every ``ttl / 3``):

1. **Renew** every held lease. Renewed ones are trusted until ``attempt start + ttl -
   margin`` on the local monotonic clock (the attempt start, because the database may have
   stamped the expiry at any point after it). Leases missing from the answer are lost:
   dropped at once, which cancels their planners.
2. **Expire locally** any lease whose trust window has passed (renewals failing because the
   database is unreachable): its planner was already cancelled by its deadline, *before*
   the database could consider the lease expired.
3. **Rebalance** with :func:`~engine.core.ownership.plan_ownership`: hand back extras first,
   then acquire free or expired partitions up to the fair share. A hand-back first *drains*
   the partition (:meth:`~engine.actors.partitions.PartitionTable.drain`): nothing more of
   it is claimed, while its planner plans on and the attempts already claimed there finish
   and their completions are written under the still-valid fence -- for at most
   :data:`HAND_BACK_DRAIN_S`, and for its folded attempts (docs/ledger.md, "Folded claims")
   to the end of its trust window, within which each of them ends. Then it drops the
   partition locally, waits briefly for the planner to stop, and releases the lease, so the
   joining node takes it at once. The hand-back runs beside the cycle, not inside it: the
   cycle goes on renewing every lease (the draining ones too) while a hand-back waits, so
   no lease passes its trust window because a hand-back was slow. Without the drain, those
   completions would be refused and the attempts run a second time after their attempt
   lease. A node of a standby region acquires nothing; after a region failover its leases
   were revoked in the ledger, so its next renewal drops them (step 1).

Between cycles the keeper also wakes as soon as the live set changes (a node joined, or a
crashed node's heartbeat ran out) and just after the earliest lease of another node is due
to expire, so a crashed node's partitions are taken over within moments of their leases
expiring rather than up to two cycles later.

A database outage never crashes the keeper: calls raise ``LedgerUnavailable``, the cycle is
cut short, and trust windows run out on their own -- the node steps down and retries.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.membership import Membership, wake_after_expiry
from engine.core.ownership import plan_ownership
from engine.errors import LedgerUnavailable
from engine.ledger.params import REGION_DEFAULT, Fence, LeasesAcquire, LeasesRelease, LeasesRenew
from engine.metrics import LEASE_LOST_EXPIRED, LEASE_LOST_REFUSED

log = logging.getLogger("carillon.leases")

PLANNER_STOP_WAIT_S: Final = 2.0
"""How long a hand-back waits for the partition's planner to stop."""
HAND_BACK_DRAIN_S: Final = 5.0
"""How long a hand-back waits for the attempts in flight in the partition to settle. One still
running then completes after the release: its completion is refused, and the new owner runs
it again once its attempt lease has run out (the at-least-once path). Short, because the
joining node waits for the partition meanwhile."""
SHORT_OF_SHARE_INTERVAL_S: Final = 0.5
"""Cycle period while this node holds less than its fair share: partitions another node hands
back are taken within about half a second, so a rebalance leaves no planning gap."""


class LeaseKeeperConfig(msgspec.Struct, frozen=True):
    node_id: str
    ttl_s: float
    safety_margin_s: float
    region: str = REGION_DEFAULT

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 3


class LeaseStatistics(msgspec.Struct, frozen=True):
    owned: list[int]
    acquired: int
    released: int
    lost: int
    expired_locally: int
    failures: int


class LeaseKeeper:
    def __init__(
        self,
        config: LeaseKeeperConfig,
        *,
        ctx: NodeContext,
        membership: Membership,
    ) -> None:
        self.config = config
        self._metrics = ctx.metrics
        self._ledger = ctx.ledger
        self._clock = ctx.clock
        self._table = ctx.table
        self._membership = membership
        self._rng = ctx.rng
        self._counts = {"acquired": 0, "released": 0, "lost": 0, "expired": 0, "failures": 0}
        self._target: int | None = None
        self._wake_at_expiry: float | None = None
        """Local monotonic time just after the earliest live lease of another node expires."""
        self._background: trio.Nursery | None = None
        self._handing_back = False
        """A hand-back is under way (one at a time; a later cycle plans the rest)."""

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._background = nursery
            task_status.started()
            try:
                await self._cycle_forever()
            finally:
                self._background = None

    async def _cycle_forever(self) -> None:
        while True:
            changes = self._membership.changes
            # The period runs from the start of a cycle, not its end: a renewal that took
            # most of a period (a starved node) is followed at once by the next, while the
            # trust windows still hold, instead of a full period later, when they may not.
            cycle_started = self._clock.monotonic()
            await self.step()
            short = self._target is not None and len(self._table) < self._target
            wake_at = cycle_started + (
                min(self.config.interval_s, SHORT_OF_SHARE_INTERVAL_S)
                if short
                else self.config.interval_s
            )
            if self._wake_at_expiry is not None:
                wake_at = min(wake_at, self._wake_at_expiry)
            with trio.move_on_at(wake_at):
                await self._membership.wait_changed(changes)

    async def step(self) -> None:
        """One cycle: renew, expire locally, rebalance."""
        self._wake_at_expiry = None  # read afresh, or not at all if the cycle is cut short
        try:
            await self._renew()
            self._expire_locally()
            await self._rebalance()
        except LedgerUnavailable as exc:
            self._counts["failures"] += 1
            log.warning("lease cycle cut short: %s", exc)
            self._expire_locally()

    async def release_all(self) -> None:
        """Hand back every lease (graceful shutdown); planners must be stopped already."""
        fences = self._table.fences()
        for fence in fences:
            self._table.drop(fence.partition_id)
        if fences:
            released = await self._ledger.leases_release(LeasesRelease(fences))
            self._counts["released"] += released
            self._metrics.lease_released(released)
            log.info("released %d leases", released)

    def statistics(self) -> LeaseStatistics:
        c = self._counts
        return LeaseStatistics(
            list(self._table), c["acquired"], c["released"], c["lost"], c["expired"], c["failures"]
        )

    def _trusted_until(self, attempt_start: float) -> float:
        return attempt_start + self.config.ttl_s - self.config.safety_margin_s

    async def _renew(self) -> None:
        fences = self._table.fences()
        if not fences:
            return
        started = self._clock.monotonic()
        renewed = await self._ledger.leases_renew(LeasesRenew(fences, self.config.ttl_s))
        took = self._clock.monotonic() - started
        if took > self.config.interval_s / 2:
            # Every second of it comes off the trust window; a sign of a starved node.
            log.warning("renewing %d leases took %.1f s", len(fences), took)
        still = {lease.partition_id for lease in renewed}
        for fence in fences:
            owned = self._table.get(fence.partition_id)
            if owned is None or owned.fence != fence:
                continue
            if fence.partition_id in still:
                owned.extend(self._trusted_until(started))
            else:
                self._counts["lost"] += 1
                self._metrics.lease_lost(LEASE_LOST_REFUSED)
                log.warning("lost the lease of partition %d", fence.partition_id)
                self._table.drop(fence.partition_id)

    def _expire_locally(self) -> None:
        now = self._clock.monotonic()
        for partition_id in list(self._table):
            owned = self._table.get(partition_id)
            if owned is not None and owned.trusted_until <= now:
                self._counts["expired"] += 1
                self._metrics.lease_lost(LEASE_LOST_EXPIRED)
                log.warning("partition %d: lease no longer trusted; stepping down", partition_id)
                self._table.drop(partition_id)

    async def _rebalance(self) -> None:
        if self.config.node_id not in self._membership.live_nodes:
            # Another region is active: take nothing (the ledger would refuse anyway), and
            # read nothing for it either.
            self._target = 0
            return
        leases = await self._ledger.leases_list()
        now = await self._ledger.database_now()
        read_at = self._clock.monotonic()
        self._wake_at_expiry = wake_after_expiry(
            read_at,
            now,
            (
                lease.expires_at
                for lease in leases
                if lease.owner_id not in (None, self.config.node_id)
                and lease.expires_at is not None
            ),
        )
        plan = plan_ownership(self.config.node_id, leases, self._membership.live_nodes, now)
        self._target = plan.target
        if plan.release and not self._handing_back:
            if self._background is None:
                await self._hand_back(plan.release)  # a step driven on its own (tests)
            else:
                self._handing_back = True
                self._background.start_soon(self._hand_back, plan.release)
        if plan.acquire:
            started = self._clock.monotonic()
            acquired = await self._ledger.leases_acquire(
                LeasesAcquire(
                    self.config.node_id, plan.acquire, self.config.ttl_s, self.config.region
                )
            )
            for lease in acquired:
                fence = Fence(lease.partition_id, self.config.node_id, lease.fencing_token)
                self._table.add(fence, self._trusted_until(started))
            self._counts["acquired"] += len(acquired)
            self._metrics.lease_acquired(len(acquired))
            if acquired:
                log.info(
                    "acquired partitions %s (target %d)",
                    [lease.partition_id for lease in acquired],
                    plan.target,
                )

    async def _hand_back(self, partition_ids: list[int]) -> None:
        try:
            await self._drain_and_release(partition_ids)
        except LedgerUnavailable as exc:
            # Dropped locally already: the lease runs out on its own within its TTL.
            log.warning("handing back partitions %s failed: %s", partition_ids, exc)
        finally:
            self._handing_back = False

    async def _drain_and_release(self, partition_ids: list[int]) -> None:
        drained = [owned for p in partition_ids if (owned := self._table.drain(p)) is not None]
        if not drained:
            return
        ids = [owned.fence.partition_id for owned in drained]
        with trio.move_on_at(self._clock.monotonic() + HAND_BACK_DRAIN_S):
            await self._table.wait_settled(ids)
        # A folded attempt has no attempt lease to hold the joining node back: released under
        # it, its execution (still queued) would run there at once, beside it. Each ends within
        # the trust window it started in (its bound must fit), so wait for them that long.
        with trio.move_on_at(max(owned.trusted_until for owned in drained)):
            await self._table.wait_folds_settled(ids)
        unsettled = sum(self._table.attempts_in_flight(p) for p in ids)
        if unsettled:
            log.warning(
                "handing back partitions %s with %d attempts still in flight: they run again "
                "once their attempt leases run out",
                ids,
                unsettled,
            )
        # Lost meanwhile (a refused renewal of another actor's write): already dropped.
        dropped = [owned for p in ids if (owned := self._table.drop(p)) is not None]
        with trio.move_on_after(PLANNER_STOP_WAIT_S):
            for owned in dropped:
                await owned.stopped.wait()
        released = await self._ledger.leases_release(LeasesRelease([o.fence for o in dropped]))
        self._counts["released"] += released
        self._metrics.lease_released(released)
        log.info("handed back partitions %s", ids)
