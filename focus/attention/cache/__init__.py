"""The decoding cache: `FocusCache` (`decoding`) keeps each layer's group index (`group_index`) or key codes
(`key_codes`) beside a KV cache that grows in place (`growing_cache`), and its decoding steps read only the keys a
query keeps."""
