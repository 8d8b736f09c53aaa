"""Short-horizon bookkeeping of one tenant: what keeps requests and limits true
over any 100 ms and any 1 s, not only over the policy's sliding window.

Two kinds of record, both pure (times are passed in, in nanoseconds):

- `RateBucket`: credit earned at a fixed percent of wall time and spent by
  holding the GPU. At the limit's rate it paces a capped tenant (no burst
  after idle: idle time earns little); at the request's rate it says whether
  the tenant is below its request *now* (idle time earns little there too,
  debt for surplus time stops at a floor). Time spent waiting for the token
  earns more: it is owed.
- `Trail`: the tenant's holds of the last second, so the GPU time it held over
  an exact interval ([now - 100 ms, now], [now - 1 s, now]) is one binary search.
"""

from __future__ import annotations

from bisect import bisect_right


class RateBucket:
    """Credit in ns: +percent/100 per ns of wall time, -1 per ns held.

    Credit earned while idle (no process of the tenant waiting) stops at `idle_cap`;
    while waiting for the token, at `cap`, so that waiting for another tenant's lease
    loses nothing. Debt stops at `floor`."""

    __slots__ = ("percent", "idle_cap", "cap", "floor", "balance", "at")

    def __init__(self, percent: int, idle_cap: int, cap: int, floor: int, now: int,
                 initial: int | None = None) -> None:
        self.percent = percent
        self.idle_cap = idle_cap
        self.cap = cap
        self.floor = floor
        self.balance = idle_cap if initial is None else initial  # default: as back from a long idle
        self.at = now

    def level(self, now: int, waiting_since: int | None) -> int:
        """The credit at `now`, no hold since the last charge; `waiting_since`: the
        tenant waits for the token since then (None: it does not)."""
        if now <= self.at:
            return self.balance
        turn = now if waiting_since is None else min(now, max(waiting_since, self.at))
        balance = self.balance
        if turn > self.at:
            earned = balance + self.percent * (turn - self.at) // 100
            balance = earned if earned <= self.idle_cap else max(balance, self.idle_cap)
        if now > turn:
            balance = min(self.cap, balance + self.percent * (now - turn) // 100)
        return balance

    def settle(self, now: int, waiting_since: int | None) -> None:
        """Fix the credit at `now` (a grant: the wait it earned from ends here)."""
        self.balance, self.at = self.level(now, waiting_since), max(now, self.at)

    def restart(self, percent: int, cap: int, now: int) -> None:
        """A live quota change: from now on at the new rate, neither credit nor debt."""
        self.percent, self.cap = percent, cap
        self.balance, self.at = 0, max(now, self.at)

    def level_holding(self, now: int, since: int) -> int:
        """The credit at `now` of a tenant holding the token since `since` (settled at
        its grant, not yet charged)."""
        before = self.level(since, since)
        held = max(0, now - since)
        return max(-self.floor, before + self.percent * held // 100 - held)

    def charge(self, start: int, end: int) -> None:
        """The tenant held the GPU over [start, end] (earning while it held)."""
        if end <= start:
            return
        if start < self.at:  # a late report of time already past: spend it, no earning
            self.balance = max(-self.floor, self.balance - (end - start))
            return
        self.balance = self.level_holding(end, start)
        self.at = end

    def ns_until_even(self, now: int, waiting_since: int | None) -> int:
        """How long until the credit is no longer negative, no hold meanwhile."""
        missing = -self.level(now, waiting_since)
        if missing <= 0:
            return 0
        return -(-missing * 100 // self.percent) + max(0, self.at - now)


class Trail:
    """A tenant's holds ending within `keep_ns` of the newest, with running totals.

    Holds are appended in order of their end; one that ends before the newest
    (a late report) is placed at the newest end, which can only overstate
    recent use."""

    __slots__ = ("keep", "starts", "ends", "totals", "head")

    def __init__(self, keep_ns: int) -> None:
        self.keep = keep_ns
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.totals: list[int] = []  # held ns of every hold up to and including this one
        self.head = 0  # holds before it ended long ago

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        if self.ends and end < self.ends[-1]:
            start, end = self.ends[-1] - (end - start), self.ends[-1]
        self.starts.append(start)
        self.ends.append(end)
        self.totals.append((self.totals[-1] if self.totals else 0) + end - start)
        low = end - self.keep
        while self.head < len(self.ends) and self.ends[self.head] <= low:
            self.head += 1
        if self.head > 64 and self.head * 2 > len(self.ends):
            del self.starts[: self.head], self.ends[: self.head], self.totals[: self.head]
            self.head = 0

    def newer_than(self, low: int) -> bool:
        """Whether a hold ended after `low`."""
        return bool(self.ends) and self.ends[-1] > low

    def held_since(self, low: int) -> int:
        """GPU time held after `low` (low at least newest end - keep)."""
        ends = self.ends
        i = bisect_right(ends, low, self.head)
        if i == len(ends):
            return 0
        held = self.totals[-1] - self.totals[i] + self.ends[i] - self.starts[i]
        if self.starts[i] < low:
            held -= low - self.starts[i]
        return held

    def shed_until(self, low: int, amount: int) -> int:
        """The smallest low' >= low with held_since(low') <= held_since(low) - amount."""
        ends, starts = self.ends, self.starts
        i = bisect_right(ends, low, self.head)
        for j in range(i, len(ends)):
            start = max(starts[j], low)
            if ends[j] - start >= amount:
                return start + amount
            amount -= ends[j] - start
        return ends[-1] if ends else low


class Frame:
    """A capped tenant's place on a grid of frames (one frame = the shortest horizon):
    once its budget for the current frame is spent it waits for the next frame's
    start, on the grid, not for a fixed time after its last lease. A lease served
    a little late then does not push every later one back: leases stay in phase,
    so every 1 s interval holds the same number of them, and lateness is not carried.

    `at`: start of the current frame (None: none yet); `used`: GPU time charged
    since the frame's first grant; `carry`: how much more than its `share` the frames
    since it last came back from idle held (negative: less), within `carry_cap` either
    way (after a frame served late, what it is owed down to twice that). The next lease
    is that much shorter: a frame's hold varies by a few milliseconds (where the
    holder's work ends), and ten frames' deviations would otherwise add up in a
    second's share. `asked`: what the frame's leases would have held had a longer
    horizon not cut them (set for an elastic tenant only): the carry counts the larger
    of that and `used`, so what a limit over a longer horizon kept back is not owed.
    `revoked`: a lease of this frame was revoked (for a `high` tenant): the rest of its
    share is the tenant's at once, however little (`Policy._capped_fit`). `cut`: a lease
    of this frame was cut by a longer horizon (the tenant is at its limit there): past
    the frame's half, the rest of its share waits for the next frame, through the carry."""

    __slots__ = ("length", "share", "carry_cap", "at", "used", "carry", "asked", "revoked", "cut")

    def __init__(self, length: int, share: int, carry_cap: int) -> None:
        self.length = length
        self.share = share
        self.carry_cap = carry_cap
        self.at: int | None = None
        self.used = 0
        self.carry = 0
        self.asked = 0
        self.revoked = False
        self.cut = False

    def next_carry(self) -> int:
        """The carry into the next frame if it begins on the grid: this frame's hold counted
        (the lease that begins it is decided on that, not on the frames before only: a lag
        of one frame would make the correction swing)."""
        if self.at is None:
            return 0
        return max(-self.carry_cap, min(self.carry_cap, self.carry + max(self.used, self.asked) - self.share))

    def cut_short(self, lease: int, cut: int) -> None:
        """A lease granted `cut` ns shorter by a longer horizon: the frame counts it as
        asked for (`asked`), not as owed."""
        if cut > 0:
            self.asked = max(self.asked, self.used + lease + cut)

    def wait(self, now: int, used: int, budget: int, early: int) -> int:
        """How long until a tenant that would use `used` ns of this frame (its next lease
        counted) may start: 0 within the budget, else until `early` before the next frame
        (a lease that starts that early counts in the next frame: the GPU does not idle
        for a few milliseconds only to keep the grid)."""
        if self.at is None or used <= budget:
            return 0
        return max(0, self.at + self.length - early - now)

    def next_begins(self, now: int, early: int) -> bool:
        """Whether a lease from `now` counts in the next frame (from `early` before the
        current one's end), or begins the first."""
        return self.at is None or now >= self.at + self.length - early

    def deadline(self, now: int, early: int, waiting_since: int) -> int:
        """The end of the frame on the grid that a lease from `now` counts in (from `early`
        before a frame's end, the next one), as a neighbour would see it: a tenant served
        late keeps the deadline it missed, so it comes before those with time to spare.
        Before its first frame, one frame from when it began to wait: a deadline that moved
        with `now` came after every neighbour's (their frames' ends are fixed), and a 1/1
        tenant among seven busy ones waited 2.5 s for its first lease."""
        if self.at is None:
            return waiting_since + self.length
        return self.at + (2 if self.next_begins(now, early) else 1) * self.length

    def start(self, now: int, early: int, tolerance: int, waiting_since: int, below_request: bool,
              behind_elastic: bool = False) -> bool:
        """A grant at `now` to a tenant waiting since `waiting_since`: within the current
        frame, nothing changes; from `early` before its end, the next frame begins on the
        grid, or at `now` when that is later by over `tolerance` (the tenant idled, or was
        served that late: its phase moves to where it was served, away from the neighbour
        that delayed it). A frame served late owes the share of the time it lost if the
        tenant is below its request (above it, a neighbour within its own request came
        first, rightly), more when the token was last an elastic tenant's (`behind_elastic`);
        one back from idle starts with no carry. Returns whether the frames begin afresh
        (the first one, or back from idle)."""
        if not self.next_begins(now, early):
            return False
        self.revoked = self.cut = False
        if self.at is None:
            self.at, self.used, self.carry, self.asked = now, 0, 0, 0
            return True
        on_grid = self.at + self.length
        carry = self.next_carry()
        floor = -self.carry_cap
        afresh = False
        if now - on_grid <= tolerance:
            self.at = on_grid
        elif waiting_since <= on_grid + tolerance:  # served late
            if below_request:
                # Behind an elastic tenant's lease, owed up to twice the carry (the
                # allowance): a 11/11 tenant served 48 ms late behind uncapped neighbours'
                # 50 ms leases, its grid moved each time, was owed 5.3 ms a frame and got 4
                # of it: 9.3 % of the GPU. (Late by its own pace, a lone tenant's leases
                # grew with what it was owed, and it was later still; behind capped
                # neighbours' overruns, the 100 ms lows on the simulator fell.)
                carry -= self.share * (now - on_grid) // self.length
                if behind_elastic:
                    floor = -2 * self.carry_cap
            self.at = now
        else:  # back from idle
            carry, self.at, afresh = 0, now, True
        self.carry = max(floor, min(self.carry_cap, carry))
        self.used = self.asked = 0
        return afresh


class ShortHorizon:
    """One tenant's short-horizon records, charged together with its window."""

    __slots__ = ("pace", "due", "trail", "frame", "credit_afresh")

    def __init__(self, pace: RateBucket, due: RateBucket, trail: Trail, frame: Frame) -> None:
        self.pace = pace  # at the limit's rate
        self.due = due  # at the request's rate
        self.trail = trail
        self.frame = frame
        # Its credit toward its request (`due`) when its frames last began afresh: what it
        # idled for, or starts with, not what it was owed while busy (`Policy._early`).
        self.credit_afresh = 0

    def settle(self, now: int, waiting_since: int) -> None:
        self.pace.settle(now, waiting_since)
        self.due.settle(now, waiting_since)

    def charge(self, start: int, end: int, in_frame: bool = True) -> None:
        self.pace.charge(start, end)
        self.due.charge(start, end)
        self.trail.add(start, end)
        if in_frame:
            self.frame.used += max(0, end - start)
