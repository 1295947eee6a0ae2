"""A layer's group index: each cached key's groups, and per (batch row, key/value head, group) the positions of its
keys, kept beside the KV cache by `focus.attention.cache.decoding.FocusCache` so that a decoding step reads its window,
its sinks and the keys of its own groups, not the whole cache."""

from __future__ import annotations

import torch

from focus.attention.pattern.rule import GROUP_BITS, SINK_BITS, group_bits, group_membership

PAGE = 64
"""Positions per page of a group's member list. Each list grows a page at a time from a pool that every list of
the layer shares, so the index costs its entries plus under a page per list, however unbalanced the groups, where lists
sized by the largest group would cost several times their entries with unbalanced (k-means) groups. A step reads a
list through its page table: one more gather."""


class GroupIndex:
    """One layer's cached keys by group, per (batch row, key/value head).

    key_groups: (B, K, capacity, top_k) int8 (int16 beyond 127 groups), each indexed key's groups (-1 for padding).
    counts: (B, K, G) how many keys each group lists. Padding keys are in no group.
    pages: (N, PAGE) int32, a pool of pages of key positions (-1 where unfilled); page 0 is always empty.
    page_table: (B, K, G, capacity) int32, the pages of each group's list in order (0 past its last page); the
        list of positions in cache order is `pages[page_table[b, k, g]].flatten()[:counts[b, k, g]]`.
    sinks: (B, S) int64, the positions of the first S real keys of each row (-1 until seen).
    Buffers grow by an eighth of their size when full: appending a token costs O(1) amortised. The index costs
    about 1% (top-1) and 2% (top-2) of a float32 cache at head size 64 with balanced groups, a little more with
    unbalanced ones (`FocusCache.index_nbytes`; docs/decoding.md has SmolLM2's).
    """

    def __init__(
        self, batch: int, k_heads: int, num_groups: int, top_k: int, sink_tokens: int, device,
        scratch: ScratchRows | None = None, native: bool = False,
    ):
        self.num_groups, self.top_k, self.length = num_groups, top_k, 0
        self.native = native  # steps and prompts run as native calls (`focus.attention.native`)
        self.scratch = scratch or ScratchRows()  # where a step gathers its distant keys (one per cache, shared)
        group_dtype = torch.int8 if num_groups <= 127 else torch.int16  # a byte per group id where it fits
        self.key_groups = torch.full((batch, k_heads, 0, top_k), -1, dtype=group_dtype, device=device)
        self._counts = torch.zeros(batch, k_heads, num_groups, dtype=torch.int64, device=device)
        self.pages = torch.full((1, PAGE), -1, dtype=torch.int32, device=device)
        self.used_pages = 1
        self.page_table = torch.zeros(batch, k_heads, num_groups, 0, dtype=torch.int32, device=device)
        self.sinks = torch.full((batch, sink_tokens), -1, dtype=torch.int64, device=device)
        self._real = torch.zeros(batch, dtype=torch.int64, device=device)  # real keys seen per row (until sinks found)
        self._sinks_found = sink_tokens == 0
        self._query_head_rows: torch.Tensor | None = None
        # Each key's groups as bits (bit g for group g; 0 for padding, all bits for a sink) where they fit: a masked
        # step's mask is one AND per key. The group lists are brought up to date only when a sparse step reads them
        # (`listed`).
        self.key_bits = (torch.zeros(batch, k_heads, 0, dtype=torch.int64, device=device)
                         if num_groups <= GROUP_BITS else None)
        self.listed = 0

    @property
    def batch(self) -> int:
        return self._counts.shape[0]

    @property
    def device(self) -> torch.device:
        return self._counts.device

    def extend(self, groups: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Index the next keys: `groups` (B, K, n, top_k) their group ids, `valid` (B, n) False for padding."""
        b, k_heads, n, _ = groups.shape
        start = self.length
        self.reserve(start + n)
        padded = valid is not None and not bool(valid.all())
        self.key_groups[:, :, start : start + n] = (groups.masked_fill(~valid[:, None, :, None], -1) if padded
                                                   else groups)
        if self.key_bits is not None:
            bits = group_bits(groups)
            self.key_bits[:, :, start : start + n] = bits * valid[:, None, :] if padded else bits
        if self._sinks_found:
            self.length = start + n
            return
        valid = torch.ones(b, n, dtype=torch.bool, device=groups.device) if valid is None else valid

        # Until every row has its sinks (then later keys never are one, and the bookkeeping is skipped above).
        order = self._real[:, None] + valid.long().cumsum(dim=1)  # (B, n): 1-based rank among the row's real keys
        is_sink = valid & (order <= self.sinks.shape[1])
        rows, cols = is_sink.nonzero(as_tuple=True)
        self.sinks[rows, order[rows, cols] - 1] = start + cols
        if self.key_bits is not None:  # a sink is in every group: every bit set, so a masked step needs no sink rule
            self.key_bits[rows, :, start + cols] = SINK_BITS
        self._real += valid.sum(dim=1)
        self._sinks_found = bool((self._real >= self.sinks.shape[1]).all())
        self.length = start + n

    def reserve(self, length: int) -> None:
        """Room for `length` keys in the per-key buffers (`key_groups`, `key_bits`)."""
        self.key_groups = with_room(self.key_groups, 2, length)
        if self.key_bits is not None:
            self.key_bits = with_room(self.key_bits, 2, length, fill=0)

    @property
    def sinks_found(self) -> bool:
        """Whether every row has seen its sink tokens (later keys are then never a sink)."""
        return self._sinks_found

    @property
    def counts(self) -> torch.Tensor:
        """(B, K, G) how many keys each group lists (every indexed key listed)."""
        self.catch_up()
        return self._counts

    def catch_up(self) -> None:
        """List the keys indexed since the last sparse read in their groups' lists: a step that attends through the
        mask never pays for them, and a step that reads the lists lists many keys in one go."""
        start, n = self.listed, self.length - self.listed
        if n == 0:
            return
        groups = self.key_groups[:, :, start : self.length].long()  # (B, K, n, top_k), -1 for padding
        member = group_membership(groups.clamp_min(0), self.num_groups) & (groups[..., :1] >= 0)  # (B, K, n, G)
        slots = self._counts[:, :, None, :] + member.long().cumsum(dim=2) - 1  # (B, K, n, G) where each one lands
        before, self._counts = self._counts, self._counts + member.sum(dim=2)
        self._add_pages(_pages_for(before), _pages_for(self._counts))
        bi, ki, ni, gi = member.nonzero(as_tuple=True)
        slot = slots[bi, ki, ni, gi]
        self.pages[self.page_table[bi, ki, gi, slot // PAGE].long(), slot % PAGE] = (start + ni).to(torch.int32)
        self.listed = self.length

    def _add_pages(self, have: torch.Tensor, need: torch.Tensor) -> None:
        """Give every list (B, K, G) `need` pages where it has `have`: fresh pages from the pool, in order."""
        extra = (need - have).view(-1)
        total = int(extra.sum())
        if total == 0:
            return
        self.page_table = with_room(self.page_table, 3, int(need.max()), fill=0)
        self.pages = with_room(self.pages, 0, self.used_pages + total)
        device = extra.device
        owner = torch.repeat_interleave(torch.arange(extra.numel(), device=device), extra)  # (total,) list of each
        rank = torch.arange(total, device=device) - (extra.cumsum(0) - extra)[owner]  # its place among the new pages
        table = self.page_table.view(-1, self.page_table.shape[-1])
        table[owner, have.view(-1)[owner] + rank] = torch.arange(self.used_pages, self.used_pages + total,
                                                                 dtype=torch.int32, device=device)
        self.used_pages += total

    def members(self, lists: torch.Tensor, width: int) -> torch.Tensor:
        """(N, width) int64 the first `width` positions listed by each of the N lists `lists`, flat ids into
        (B, K, G); -1 past a list's count."""
        self.catch_up()
        if width == 0:
            return torch.empty(lists.numel(), 0, dtype=torch.int64, device=lists.device)
        table = self.page_table.view(-1, self.page_table.shape[-1])[:, : -(-width // PAGE)].index_select(0, lists)
        listed = self.pages.index_select(0, table.view(-1)).view(lists.numel(), -1)
        return listed[:, :width].long()

    def query_head_rows(self, heads: int) -> torch.Tensor:
        """(B, heads) the row of (B * K) key/value heads that each query head reads (grouped-query: K divides heads)."""
        rows = self._query_head_rows
        if rows is None or rows.shape[1] != heads:
            b, k_heads = self._counts.shape[:2]
            device = self._counts.device
            batch_rows = torch.arange(b, device=device)[:, None] * k_heads
            rows = self._query_head_rows = batch_rows + torch.arange(heads, device=device) // (heads // k_heads)
        return rows

    @property
    def sink_last(self) -> torch.Tensor:
        """(B,) the last sink's position (-1 before any): a real key is a sink exactly when its position <= it."""
        if self.sinks.shape[1] == 0:
            return torch.full(self.sinks.shape[:1], -1, dtype=torch.int64, device=self.sinks.device)
        return self.sinks.amax(dim=1)

    def groups(self, length: int | None = None) -> torch.Tensor:
        """(B, K, L, top_k) int64 group ids of the first `length` indexed keys (padding keys: -1)."""
        return self.key_groups[:, :, : self.length if length is None else length].long()

    def truncate(self, length: int) -> None:
        """Keep the first `length` keys (the cache was cropped or reset): the index rebuilt from their groups."""
        kept = self.key_groups[:, :, :length].long()
        valid = (kept[:, 0, :, 0] >= 0) if length else None
        b, k_heads = self._counts.shape[:2]
        self.__init__(b, k_heads, self.num_groups, self.top_k, self.sinks.shape[1], self._counts.device, self.scratch,
                      self.native)
        if length:
            self.extend(kept.clamp_min(0), valid)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows `rows` (beam search reordering, batch selection or repetition)."""
        self.catch_up()
        names = ["key_groups", "page_table", "_counts", "sinks", "_real"]
        if self.key_bits is not None:
            names.append("key_bits")
        for name in names:
            setattr(self, name, getattr(self, name).index_select(0, rows.to(self._counts.device)))
        # A row kept twice must not share its pages with its copy (each grows on its own): every row gets fresh
        # copies of its pages, and pages of rows let go return to the pool.
        table = self.page_table.view(-1)
        live = table > 0
        self.pages = torch.cat([self.pages[:1], self.pages.index_select(0, table[live].long())])
        table[live] = torch.arange(1, self.pages.shape[0], dtype=torch.int32, device=table.device)
        self.used_pages = self.pages.shape[0]
        self._query_head_rows = None

    def nbytes(self) -> int:
        """Bytes the index holds (allocated, growth headroom included)."""
        tensors = (self.key_groups, self.pages, self.page_table, self._counts, self.sinks, self._real)
        tensors += () if self.key_bits is None else (self.key_bits,)
        return sum(t.numel() * t.element_size() for t in tensors)


def _pages_for(counts: torch.Tensor) -> torch.Tensor:
    return (counts + PAGE - 1) // PAGE


def with_room(buffer: torch.Tensor, dim: int, needed: int, fill: int = -1) -> torch.Tensor:
    """`buffer` with room for `needed` entries along `dim`: itself, or a copy grown by an eighth (new room `fill`)."""
    have = buffer.shape[dim]
    if needed <= have:
        return buffer
    shape = list(buffer.shape)
    shape[dim] = max(needed, have + have // 8, 64)
    grown = torch.full(shape, fill, dtype=buffer.dtype, device=buffer.device)
    grown.narrow(dim, 0, have).copy_(buffer)
    return grown


class ScratchRows:
    """A reused buffer for gathered rows. A decoding step copies the distant keys it reads; allocating that copy
    afresh at every layer of every step page-faults it in each time."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def select_rows(self, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """rows (N, D) at `index` (any shape) -> (*index.shape, D), a view of the buffer: valid until the next call."""
        count = index.numel() * rows.shape[-1]
        buffer = self.buffer
        if buffer is None or buffer.numel() < count or buffer.dtype != rows.dtype or buffer.device != rows.device:
            buffer = self.buffer = torch.empty(count + count // 4, dtype=rows.dtype, device=rows.device)
        out = buffer[:count].view(index.numel(), rows.shape[-1])
        torch.index_select(rows, 0, index.flatten(), out=out)
        return out.view(*index.shape, rows.shape[-1])
