"""A token's groups as the bits of one int64 (bit g for group g), so that whether a query and a key share a group
is one AND: the decoding index's `GroupIndex.key_bits`, the masked steps, the decomposition's band and the segments
of single groups (`rectangle.rectangle_entries(once=True)`), in PyTorch and in the native kernels alike."""

GROUP_BITS = 63
"""Group ids below this fit as bits of one int64: bits 0 to 62. The sign bit is left out, because `1 << 63` overflows
a signed shift in the C++ kernels (which take this limit from here, `focus.attention.native.build`); a sink, in every
group, is written as -1, all bits set. Where a group id reaches it, the paths that need bits do without them."""
