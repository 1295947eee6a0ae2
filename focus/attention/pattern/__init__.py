"""The pattern: which (query, key) pairs hard Focus keeps (`rule`), and the dense masked attention built from it
(`reference`), the oracle every kernel is tested against and the path for what no kernel computes."""
